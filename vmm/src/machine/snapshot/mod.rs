//! A machine saved to a directory, and read back.
//!
//! A snapshot is three files in a directory of its own, owner-only:
//!
//! - `memory`: guest RAM, region after region (sparse: pages that are all
//!   zeros are holes, so a freshly booted guest's file is small on disk);
//! - `state.json`: the [`MachineState`] (vCPUs, the VM's in-kernel
//!   devices, every device in the registry, the memory layout);
//! - `manifest.json`: the format version, the mvm version, the SHA-256
//!   of the state and the XXH3-128 of the memory's data pages.
//!
//! It is written under a temporary name and renamed into place, so a
//! reader finds a whole snapshot or none. Reading checks the manifest
//! first and refuses a snapshot of another format, or whose files do not
//! match their checksums, with one line that says which.

pub mod vcpu_state;
pub mod vm_state;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use twox_hash::XxHash3_128;
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
};

use super::memory;
use super::registry::DeviceStates;
use vcpu_state::VcpuState;
use vm_state::VmState;

/// Bumped whenever what is saved, or how, changes: an older snapshot is
/// then refused rather than misread.
pub const FORMAT_VERSION: u32 = 4;

const MANIFEST: &str = "manifest.json";
const STATE: &str = "state.json";
const MEMORY: &str = "memory";
const PAGE: usize = 4096;
/// Memory is copied out in pieces this large.
const CHUNK: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{0} exists already: remove it first")]
    Exists(PathBuf),
    #[error("{path} is not a snapshot mvm can read: {why}")]
    Invalid { path: PathBuf, why: String },
    #[error("cannot read guest memory at {addr:#x}: {why}")]
    Memory { addr: u64, why: String },
}

fn io_err<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> Error + 'p {
    move |source| Error::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn invalid(path: &Path, why: impl Into<String>) -> Error {
    Error::Invalid {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

/// One guest RAM region and where it lies in the memory file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionLayout {
    pub guest_addr: u64,
    pub len: u64,
    pub file_offset: u64,
}

/// Everything but guest RAM.
#[derive(Debug, Serialize, Deserialize)]
pub struct MachineState {
    pub mem_size: u64,
    /// The command line the guest was booted with (for the record; a
    /// restored guest does not read it again).
    pub cmdline: String,
    pub vm: VmState,
    pub vcpus: Vec<VcpuState>,
    pub devices: DeviceStates,
    pub regions: Vec<RegionLayout>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    mvm_version: String,
    state_sha256: String,
    /// XXH3-128 of the data pages ([`hash_page`]): it finds a damaged or
    /// altered file as SHA-256 did, without being most of a template's
    /// save (docs/snapshots.md); it proves nothing about who wrote the
    /// file, which the owner-only store does (anyone who could change the
    /// file could change this line too).
    memory_xxh3_128: String,
    memory_len: u64,
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Which parts of a region may hold data (offsets in the region); reading
/// anywhere else must give zeros.
pub type DataRanges<'a> = &'a dyn Fn(usize, &GuestRegionMmap) -> Vec<Range<u64>>;

/// Writes `state` and `mem` as a snapshot at `dir`, which must not exist.
pub fn write(dir: &Path, state: &MachineState, mem: &GuestMemoryMmap) -> Result<(), Error> {
    write_with(dir, state, mem, &|_, region| memory::data_ranges(region))
}

/// [`write`], reading only `data`'s ranges of region `i` (a copy that
/// knows what it holds: `machine::capture`).
pub fn write_with(
    dir: &Path,
    state: &MachineState,
    mem: &GuestMemoryMmap,
    data: DataRanges,
) -> Result<(), Error> {
    if dir.exists() {
        return Err(Error::Exists(dir.to_path_buf()));
    }
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.with_file_name(format!(
        ".{}.tmp-{}",
        name.unwrap_or_default(),
        std::process::id()
    ));
    let result = write_into(&tmp, state, mem, data)
        .and_then(|()| fs::rename(&tmp, dir).map_err(io_err("rename the snapshot into", dir)));
    if result.is_err() {
        // Nothing half-written stays behind.
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

fn write_into(
    tmp: &Path,
    state: &MachineState,
    mem: &GuestMemoryMmap,
    data: DataRanges,
) -> Result<(), Error> {
    fs::DirBuilder::new()
        .mode(0o700)
        .create(tmp)
        .map_err(io_err("create", tmp))?;
    let memory_path = tmp.join(MEMORY);
    let (memory_xxh3_128, memory_len) = write_memory(&memory_path, mem, &state.regions, data)?;
    let state_json = serde_json::to_vec(state).map_err(|e| invalid(tmp, e.to_string()))?;
    write_file(&tmp.join(STATE), &state_json)?;
    let manifest = Manifest {
        format: FORMAT_VERSION,
        mvm_version: env!("CARGO_PKG_VERSION").to_string(),
        state_sha256: hex(&Sha256::digest(&state_json)),
        memory_xxh3_128,
        memory_len,
    };
    let manifest = serde_json::to_vec_pretty(&manifest).map_err(|e| invalid(tmp, e.to_string()))?;
    write_file(&tmp.join(MANIFEST), &manifest)?;
    Ok(())
}

fn create_private(path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), Error> {
    let mut file = create_private(path)?;
    file.write_all(data).map_err(io_err("write", path))?;
    file.sync_all().map_err(io_err("sync", path))
}

/// The regions in order, zero pages as holes; returns the XXH3-128 of the
/// non-zero pages ([`hash_page`]) and the file's length. Only the parts of
/// each region that can hold data are read (`data`; by default
/// `memory::data_ranges`: a shared region's data extents, a private one's
/// resident pages), not the whole of a guest that touched little of its
/// RAM; the pages hashed and written, and their order, are those of a
/// read of everything.
fn write_memory(
    path: &Path,
    mem: &GuestMemoryMmap,
    regions: &[RegionLayout],
    data: DataRanges,
) -> Result<(String, u64), Error> {
    let file = create_private(path)?;
    let mut hasher = XxHash3_128::new();
    let mut buf = vec![0u8; CHUNK];
    let mut end = 0;
    for (index, region) in regions.iter().enumerate() {
        let mapped = mem
            .find_region(GuestAddress(region.guest_addr))
            .filter(|r| r.start_addr().0 == region.guest_addr && r.len() == region.len)
            .ok_or_else(|| Error::Memory {
                addr: region.guest_addr,
                why: format!("no region of {} bytes starts there", region.len),
            })?;
        for range in data(index, mapped) {
            let mut done = range.start;
            while done < range.end {
                let n = CHUNK.min((range.end - done) as usize);
                let addr = region.guest_addr + done;
                mem.read_slice(&mut buf[..n], GuestAddress(addr))
                    .map_err(|e| Error::Memory {
                        addr,
                        why: e.to_string(),
                    })?;
                let base = region.file_offset + done;
                // Runs of data pages are written whole: one call each, not
                // one per page.
                for run in data_page_runs(&buf[..n]) {
                    for (i, page) in buf[run.clone()].chunks(PAGE).enumerate() {
                        hash_page(&mut hasher, base + (run.start + i * PAGE) as u64, page);
                    }
                    write_pages(&file, path, &buf[run.clone()], base + run.start as u64)?;
                }
                done += n as u64;
            }
        }
        end = end.max(region.file_offset + region.len);
    }
    file.set_len(end).map_err(io_err("size", path))?;
    file.sync_all().map_err(io_err("sync", path))?;
    Ok((hex128(hasher.finish_128()), end))
}

/// The runs of whole pages in `buf` that are not all zeros (offsets in
/// `buf`, in order): what a snapshot keeps of a piece of guest memory.
pub(crate) fn data_page_runs(buf: &[u8]) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    for (i, page) in buf.chunks(PAGE).enumerate() {
        if page.iter().all(|&b| b == 0) {
            continue;
        }
        let (start, end) = (i * PAGE, i * PAGE + page.len());
        match runs.last_mut() {
            Some(last) if last.end == start => last.end = end,
            _ => runs.push(start..end),
        }
    }
    runs
}

fn write_pages(file: &File, path: &Path, pages: &[u8], at: u64) -> Result<(), Error> {
    file.write_all_at(pages, at).map_err(io_err("write", path))
}

fn hex128(digest: u128) -> String {
    format!("{digest:032x}")
}

/// The memory checksum covers each page that is not all zeros, with its
/// offset: a hole and a page of zeros are the same memory, and the reader
/// then needs to read only the file's data (SEEK_DATA), not the holes of
/// a mostly untouched guest.
fn hash_page(hasher: &mut XxHash3_128, offset: u64, page: &[u8]) {
    hasher.write(&offset.to_le_bytes());
    hasher.write(page);
}

/// [`hash_page`] over every non-zero page of the file's data extents.
fn hash_data_pages(file: &File, len: u64) -> io::Result<XxHash3_128> {
    let mut hasher = XxHash3_128::new();
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    while at < len {
        let Some(data) = seek(file, at, libc::SEEK_DATA)? else {
            break; // only a hole is left
        };
        let hole = seek(file, data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        let mut pos = data;
        while pos < hole {
            let n = CHUNK.min((hole - pos) as usize);
            file.read_exact_at(&mut buf[..n], pos)?;
            for (i, page) in buf[..n].chunks(PAGE).enumerate() {
                if page.iter().any(|&b| b != 0) {
                    hash_page(&mut hasher, pos + (i * PAGE) as u64, page);
                }
            }
            pos += n as u64;
        }
        at = hole;
    }
    Ok(hasher)
}

/// The data extents of `file` between `from` and `to` (clipped to both),
/// in order; reading anywhere else between them gives zeros.
pub(crate) fn data_extents(file: &File, from: u64, to: u64) -> io::Result<Vec<Range<u64>>> {
    let mut extents = Vec::new();
    let mut at = from;
    while at < to {
        let Some(data) = seek(file, at, libc::SEEK_DATA)? else {
            break; // only a hole is left
        };
        if data >= to {
            break;
        }
        let hole = seek(file, data, libc::SEEK_HOLE)?.unwrap_or(to).min(to);
        extents.push(data..hole);
        at = hole;
    }
    Ok(extents)
}

/// lseek with SEEK_DATA or SEEK_HOLE; None where no data follows (ENXIO).
fn seek(file: &File, from: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: lseek on an fd this File owns; it only moves the offset.
    let at = unsafe { libc::lseek(file.as_raw_fd(), from as libc::off_t, whence) };
    if at >= 0 {
        return Ok(Some(at as u64));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// The layout of `mem` in a memory file: its regions back to back.
pub fn layout(mem: &GuestMemoryMmap) -> Vec<RegionLayout> {
    let mut offset = 0;
    mem.iter()
        .map(|r| {
            let layout = RegionLayout {
                guest_addr: r.start_addr().0,
                len: r.len(),
                file_offset: offset,
            };
            offset += r.len();
            layout
        })
        .collect()
}

/// A snapshot read back and checked: its state, and its memory file (open
/// read-only, to be mapped privately or copied into shared memory).
pub struct Loaded {
    pub state: MachineState,
    pub memory: File,
}

/// Reads the snapshot at `dir`, checking its format and both checksums.
pub fn read(dir: &Path) -> Result<Loaded, Error> {
    read_with(dir, MemoryCheck::Full)
}

/// How much of the memory file a read checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryCheck {
    /// Its length and the checksum of its data pages (reads them all).
    Full,
    /// Its length only: for a file the caller has verified in full before
    /// and knows unchanged since (a template, docs/snapshots.md).
    LengthOnly,
}

/// [`read`], with the memory file checked as `check` says; the manifest,
/// the state's checksum and the layout are always checked.
pub fn read_with(dir: &Path, check: MemoryCheck) -> Result<Loaded, Error> {
    let manifest_path = dir.join(MANIFEST);
    let manifest: Manifest =
        serde_json::from_slice(&fs::read(&manifest_path).map_err(io_err("read", &manifest_path))?)
            .map_err(|e| invalid(dir, format!("{MANIFEST}: {e}")))?;
    if manifest.format != FORMAT_VERSION {
        return Err(invalid(
            dir,
            format!(
                "format {} (written by mvm {}), this mvm reads format {FORMAT_VERSION}",
                manifest.format, manifest.mvm_version
            ),
        ));
    }
    let state_path = dir.join(STATE);
    let state_json = fs::read(&state_path).map_err(io_err("read", &state_path))?;
    if hex(&Sha256::digest(&state_json)) != manifest.state_sha256 {
        return Err(invalid(dir, format!("{STATE} does not match its checksum")));
    }
    let state: MachineState =
        serde_json::from_slice(&state_json).map_err(|e| invalid(dir, format!("{STATE}: {e}")))?;
    let memory_path = dir.join(MEMORY);
    let memory = File::open(&memory_path).map_err(io_err("open", &memory_path))?;
    let len = memory
        .metadata()
        .map_err(io_err("read", &memory_path))?
        .len();
    if len != manifest.memory_len {
        return Err(invalid(
            dir,
            format!(
                "{MEMORY} is {len} bytes, {} were written",
                manifest.memory_len
            ),
        ));
    }
    let covered = state
        .regions
        .iter()
        .map(|r| r.file_offset.checked_add(r.len))
        .try_fold(0u64, |end, r| r.map(|r| end.max(r)));
    if covered != Some(len) {
        return Err(invalid(
            dir,
            "the memory layout does not match the memory file",
        ));
    }
    if check == MemoryCheck::LengthOnly {
        return Ok(Loaded { state, memory });
    }
    let hasher = hash_data_pages(&memory, len).map_err(io_err("read", &memory_path))?;
    if hex128(hasher.finish_128()) != manifest.memory_xxh3_128 {
        return Err(invalid(
            dir,
            format!("{MEMORY} does not match its checksum"),
        ));
    }
    Ok(Loaded { state, memory })
}

#[cfg(test)]
mod tests;
