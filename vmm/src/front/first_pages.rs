//! The pages a template's runs touch first (machine/working_set.rs), kept
//! as `pages` in the template's directory: read by a restore, which maps
//! them ahead; where there is none yet, recorded by the run that finds
//! none, at the agent's "machine set up" marker (docs/snapshots.md, "The
//! pages a run touches first").
//!
//! The file is only a hint (a wrong one changes what is mapped, never
//! what the guest reads), so it gets no checksum: one that does not parse
//! is removed, unless a run is still writing it (it holds a lock on it
//! until then), and the next run records it again.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

use mvm_protocol::boot::MARKER_MACHINE_SET_UP;

use super::{vmm_failure, Failure};
use crate::machine::event_loop::Wait;
use crate::machine::working_set::{WorkingSet, MAX_SHARE};
use crate::machine::Machine;
use crate::timeline::Timeline;

/// The file's name in a template's directory.
pub const PAGES_FILE: &str = "pages";

/// What a restore does about the pages its runs touch first.
pub enum FirstPages {
    /// Maps these ahead.
    Ahead(WorkingSet),
    /// There are none yet: this run records them.
    Record(Recorder),
    /// Neither: another run is recording them, this one removed a file
    /// nobody finished (a later run records them), or this one may not
    /// record (a sandbox, whose agent serves many commands and sends no
    /// marker).
    Neither,
}

/// The file this run records into, locked, and its page table.
pub struct Recorder {
    out: File,
    /// `/proc/self/pagemap`, opened before confinement.
    pagemap: File,
}

/// The pages for a restore of the template in `dir`, of `mem_size`
/// bytes of guest RAM; `may_record`: this run's agent sends the marker.
/// Everything here happens before confinement.
pub fn for_restore(dir: &Path, mem_size: u64, may_record: bool) -> FirstPages {
    let path = dir.join(PAGES_FILE);
    match fs::read(&path) {
        Ok(bytes) => match WorkingSet::parse(&bytes, mem_size) {
            Ok(set) => FirstPages::Ahead(set),
            Err(_) => {
                if !is_being_written(&path) {
                    let _ = fs::remove_file(&path);
                }
                FirstPages::Neither
            }
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound && may_record => {
            Recorder::create(&path).map_or(FirstPages::Neither, FirstPages::Record)
        }
        Err(_) => FirstPages::Neither,
    }
}

impl Recorder {
    fn create(path: &Path) -> io::Result<Recorder> {
        let pagemap = File::open("/proc/self/pagemap")?;
        // Only one run records: the others find the file.
        let out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        // SAFETY: flock on an fd this File owns; the lock goes with it.
        if unsafe { libc::flock(out.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Recorder { out, pagemap })
    }

    /// Records the pages `machine` maps now (at the marker: those its
    /// run touched since the restore), at most 1/[`MAX_SHARE`] of its
    /// RAM, and writes them; returns the bytes recorded. The file is
    /// closed, and so unlocked, either way.
    pub fn record(self, machine: &Machine) -> io::Result<u64> {
        let set = machine.working_set(&self.pagemap)?;
        self.write(set)
    }

    fn write(mut self, mut set: WorkingSet) -> io::Result<u64> {
        set.truncate(set.mem_size / MAX_SHARE);
        let bytes = serde_json::to_vec(&set).map_err(io::Error::other)?;
        self.out.write_all(&bytes)?;
        Ok(set.len())
    }
}

/// Serves `machine` (restored, started) until its agent has set it up,
/// then records there the pages it touched so far: the run that found
/// none. A machine that stops first records nothing. Marks the timeline
/// when it recorded; a recording that fails is a warning.
pub fn record_at_marker(
    machine: &mut Machine,
    recorder: Recorder,
    deadline: Option<Instant>,
    front: &mut Timeline,
) -> Result<(), Failure> {
    let wait = machine
        .run_until_marker(MARKER_MACHINE_SET_UP, deadline)
        .map_err(vmm_failure)?;
    if wait != Wait::Done {
        return Ok(());
    }
    match recorder.record(machine) {
        Ok(_) => front.mark("pages touched so far recorded"),
        Err(e) => eprintln!(
            "mvm: warning: cannot record the pages this template's runs touch first ({e}); runs go on without them, and a later run records them again"
        ),
    }
    Ok(())
}

/// Whether a run holds the lock on `path` (it is recording into it).
fn is_being_written(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    // SAFETY: flock on an fd this File owns; a lock taken is released
    // when it closes, here.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
}

#[cfg(test)]
mod tests;
