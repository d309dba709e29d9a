//! Temp files in the store's tmp/ directory. A writer holds an exclusive
//! flock on its temp file for as long as the file lives; the lock goes
//! away with the process, so `sweep` can tell an abandoned file (lockable)
//! from one being written (locked) without any pid bookkeeping.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

pub(crate) struct TempFile {
    pub file: File,
    path: PathBuf,
    kept: bool,
}

fn flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    // SAFETY: flock on a descriptor this File owns; no memory is involved.
    let r = unsafe { libc::flock(file.as_raw_fd(), op) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

pub(crate) fn lock_exclusive(file: &File) -> io::Result<()> {
    flock(file, libc::LOCK_EX).map(|_| ())
}

impl TempFile {
    /// A new locked temp file in `dir`.
    pub(crate) fn new(dir: &Path, what: &str) -> io::Result<TempFile> {
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("{what}.{}.{n}", std::process::id()));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            flock(&file, libc::LOCK_EX)?;
            // A sweep may have taken the lock between create and flock and
            // deleted the file: then this one is unlinked, so make another.
            if file.metadata()?.nlink() == 0 {
                continue;
            }
            return Ok(TempFile {
                file,
                path,
                kept: false,
            });
        }
    }

    /// fsyncs the file and renames it to `to` (same filesystem).
    pub(crate) fn persist(mut self, to: &Path) -> io::Result<()> {
        self.file.sync_all()?;
        fs::rename(&self.path, to)?;
        self.kept = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.kept {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Deletes temp files whose writers are gone (their flock is free).
pub(crate) fn sweep(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if flock(&file, libc::LOCK_EX | libc::LOCK_NB)? {
            // Ours now: nobody writes it. Unlink while holding the lock so
            // that a writer that raced us sees nlink 0 and starts over.
            if fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
    }
    Ok(removed)
}

/// fsyncs a directory so that renames into it survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
