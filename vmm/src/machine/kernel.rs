//! Loading the guest kernel (ELF vmlinux first, bzImage as fallback) and the
//! initramfs into guest memory.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{self, bzimage::BzImage, elf::Elf, KernelLoader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::arch::x86_64::layout::{HIMEM_START, MMIO_GAP_START, PAGE_SIZE};

/// A bzImage's 64-bit entry point sits 0x200 bytes into the protected-mode
/// code (boot protocol: `startup_64`).
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} '{}' does not exist: run 'make' to build it, or pass --{flag} PATH", path.display())]
    Missing {
        what: &'static str,
        flag: &'static str,
        path: PathBuf,
    },
    #[error("cannot read {what} '{}': {source}", path.display())]
    Open {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("'{}' is not a loadable x86-64 Linux kernel (ELF vmlinux or bzImage): {source}", path.display())]
    BadKernel {
        path: PathBuf,
        source: loader::Error,
    },
    #[error("the initramfs '{}' ({size} bytes) does not fit in guest memory above the kernel: raise --memory", path.display())]
    InitrdTooBig { path: PathBuf, size: u64 },
    #[error("cannot copy the initramfs '{}' into guest memory: {source}", path.display())]
    InitrdWrite {
        path: PathBuf,
        source: vm_memory::GuestMemoryError,
    },
}

/// Where the kernel went and how to enter it.
#[derive(Debug, Clone, Copy)]
pub struct LoadedKernel {
    pub entry: GuestAddress,
    /// Where the image was loaded (for a vmlinux its entry, `startup_64`,
    /// which opens its first segment).
    pub start: u64,
    /// First byte after the loaded image.
    pub end: u64,
    pub setup_header: Option<setup_header>,
}

fn open(what: &'static str, flag: &'static str, path: &Path) -> Result<File, Error> {
    File::open(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => Error::Missing {
            what,
            flag,
            path: path.to_owned(),
        },
        _ => Error::Open {
            what,
            path: path.to_owned(),
            source,
        },
    })
}

/// Both files can be opened: checked before anything is started for a run,
/// so a wrong path is the first (and only) error the user sees.
pub fn check_readable(kernel: &Path, initrd: Option<&Path>) -> Result<(), Error> {
    open("kernel image", "kernel", kernel)?;
    if let Some(initrd) = initrd {
        open("initramfs", "initrd", initrd)?;
    }
    Ok(())
}

pub fn load_kernel(mem: &GuestMemoryMmap, path: &Path) -> Result<LoadedKernel, Error> {
    let mut file = open("kernel image", "kernel", path)?;
    let himem = Some(GuestAddress(HIMEM_START));
    match Elf::load(mem, None, &mut file, himem) {
        Ok(r) => Ok(LoadedKernel {
            entry: r.kernel_load,
            start: r.kernel_load.0,
            end: r.kernel_end,
            setup_header: None,
        }),
        Err(loader::Error::Elf(loader::elf::Error::InvalidElfMagicNumber)) => {
            let r =
                BzImage::load(mem, None, &mut file, himem).map_err(|source| Error::BadKernel {
                    path: path.to_owned(),
                    source,
                })?;
            Ok(LoadedKernel {
                entry: GuestAddress(r.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET),
                start: r.kernel_load.0,
                end: r.kernel_end,
                setup_header: r.setup_header,
            })
        }
        Err(source) => Err(Error::BadKernel {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Where an initramfs of `size` bytes goes: page aligned at the top of RAM
/// below the MMIO gap, as far from the kernel as possible (the kernel
/// decompresses and grows upward from its load address).
pub fn initrd_address(mem_size: u64, kernel_end: u64, size: u64) -> Option<GuestAddress> {
    let top = mem_size.min(MMIO_GAP_START);
    let addr = top.checked_sub(size)? & !(PAGE_SIZE - 1);
    (addr >= kernel_end).then_some(GuestAddress(addr))
}

pub fn load_initrd(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    kernel_end: u64,
    path: &Path,
) -> Result<(GuestAddress, usize), Error> {
    let mut file = open("initramfs", "initrd", path)?;
    let size = file
        .metadata()
        .map_err(|source| Error::Open {
            what: "initramfs",
            path: path.to_owned(),
            source,
        })?
        .len();
    let addr = initrd_address(mem_size, kernel_end, size).ok_or_else(|| Error::InitrdTooBig {
        path: path.to_owned(),
        size,
    })?;
    mem.read_exact_volatile_from(addr, &mut file, size as usize)
        .map_err(|source| Error::InitrdWrite {
            path: path.to_owned(),
            source,
        })?;
    Ok((addr, size as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const MIB: u64 = 1 << 20;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), (64 * MIB) as usize)]).unwrap()
    }

    #[test]
    fn initrd_goes_page_aligned_below_top() {
        assert_eq!(
            initrd_address(64 * MIB, 32 * MIB, 0x1234),
            Some(GuestAddress(64 * MIB - 0x2000))
        );
        assert_eq!(initrd_address(64 * MIB, 63 * MIB, 2 * MIB), None);
        assert_eq!(initrd_address(MIB, 0, 2 * MIB), None);
    }

    #[test]
    fn missing_kernel_says_what_to_do() {
        let err = load_kernel(&mem(), Path::new("/nonexistent/vmlinux")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("does not exist"), "{msg}");
        assert!(msg.contains("--kernel"), "{msg}");
    }

    #[test]
    fn garbage_is_not_a_kernel() {
        let f = vmm_sys_util::tempfile::TempFile::new().unwrap();
        f.as_file().write_all(&[0x42; 4096]).unwrap();
        let err = load_kernel(&mem(), f.as_path()).unwrap_err();
        assert!(matches!(err, Error::BadKernel { .. }), "{err}");
    }

    #[test]
    fn initrd_bytes_land_in_guest_memory() {
        let f = vmm_sys_util::tempfile::TempFile::new().unwrap();
        f.as_file().write_all(b"070701cpio").unwrap();
        let m = mem();
        let (addr, size) = load_initrd(&m, 64 * MIB, 16 * MIB, f.as_path()).unwrap();
        assert_eq!(size, 10);
        let mut buf = [0u8; 10];
        m.read_slice(&mut buf, addr).unwrap();
        assert_eq!(&buf, b"070701cpio");
    }
}
