//! The disk the block targets serve: an in-memory file, open read-write
//! (so that a device that wrote to it could), every sector filled with its
//! own number, and the check that it is still exactly that afterwards.

use std::ffi::CStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use mvm_devices::virtio::block::defs::SECTOR_SIZE;

/// 16 sectors: small, so that reads past the end are easy to find.
pub const SECTORS: u64 = 16;

fn pattern(sector: u64) -> u8 {
    sector as u8 + 1
}

/// A fresh disk file of `SECTORS` patterned sectors.
pub fn patterned() -> File {
    let name: &CStr = c"mvm-fuzz-disk";
    // SAFETY: a plain syscall with a valid C string; the fd it returns is
    // owned by the File below and by nothing else.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just created and is not owned elsewhere.
    let mut file = unsafe { File::from_raw_fd(fd) };
    for s in 0..SECTORS {
        file.write_all(&[pattern(s); SECTOR_SIZE as usize])
            .expect("write the fuzz disk");
    }
    file
}

/// Panics (a finding) if any byte of the disk changed: the block device is
/// read-only whatever the guest asks.
pub fn assert_unchanged(file: &File) {
    let len = file.metadata().expect("fuzz disk metadata").len();
    assert_eq!(len, SECTORS * SECTOR_SIZE, "the disk's length changed");
    let mut sector = vec![0u8; SECTOR_SIZE as usize];
    for s in 0..SECTORS {
        file.read_exact_at(&mut sector, s * SECTOR_SIZE)
            .expect("read the fuzz disk");
        assert!(
            sector.iter().all(|&b| b == pattern(s)),
            "sector {s} of the read-only disk was written"
        );
    }
}

/// Panics (a finding) if the disk's length changed: a writable disk is
/// written only inside its capacity.
pub fn assert_same_length(file: &File) {
    let len = file.metadata().expect("fuzz disk metadata").len();
    assert_eq!(len, SECTORS * SECTOR_SIZE, "the disk's length changed");
}
