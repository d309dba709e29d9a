//! The session directory: a private runtime directory per `mvm run` that
//! holds the vsock socket and the guest console log, and is removed when
//! the run ends, however it ends (errors, timeouts and signals all unwind
//! through `Drop`; only SIGKILL skips it, and the next run sweeps what a
//! killed one left).
//!
//! Each session holds an exclusive `flock` on its `lock` file for as long
//! as it lives, and the sweep removes only directories whose lock it can
//! take: a PID says nothing across PID namespaces (a run in a container
//! sharing the runtime directory has PIDs this one cannot see), a lock
//! does.

use std::fs::{self, DirBuilder, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The lock file in each session directory.
const LOCK: &str = "lock";
/// The directory of the named sandboxes' runtime directories, inside the
/// base: never swept (each sandbox's supervisor and `mvm rm` look after
/// their own, `crate::sandboxes`).
pub const SANDBOXES: &str = "sandboxes";
/// A directory without a lock file is either being created right now or
/// from before locks; it is swept only once older than this.
const UNLOCKED_GRACE: Duration = Duration::from_secs(60);
/// How long a supervisor asks again for a sandbox's lock that is held
/// (`SessionDir::claim`): far longer than any prober holds it, far
/// shorter than a running supervisor does.
const CLAIM_PATIENCE: Duration = Duration::from_secs(2);
const CLAIM_RETRY: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the session directory {}: {source}", path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("{} is not owned by you or is accessible to others: remove it or set XDG_RUNTIME_DIR", .0.display())]
    Unsafe(PathBuf),
}

pub struct SessionDir {
    path: PathBuf,
    /// Held (flock) for the session's lifetime; released when it closes.
    _lock: File,
    /// A sandbox's directory outlives its supervisor: only its sockets
    /// and pid go at the end, its logs stay for `mvm logs`.
    keep_logs: bool,
}

/// `$XDG_RUNTIME_DIR/mvm`, or `/tmp/mvm-<uid>` without one.
pub fn base_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("mvm"),
        _ => std::env::temp_dir().join(format!("mvm-{}", current_uid())),
    }
}

pub fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

pub fn current_gid() -> u32 {
    // SAFETY: getgid has no preconditions and cannot fail.
    unsafe { libc::getgid() }
}

fn mkdir_private(path: &Path) -> io::Result<()> {
    DirBuilder::new().mode(0o700).create(path)
}

impl SessionDir {
    pub fn create() -> Result<Self, Error> {
        Self::create_in(&base_dir())
    }

    pub fn create_in(base: &Path) -> Result<Self, Error> {
        let create_err = |path: &Path, source| Error::Create {
            path: path.to_owned(),
            source,
        };
        match mkdir_private(base) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(create_err(base, e)),
        }
        // A shared /tmp lets anyone pre-create the base: refuse one we do
        // not own or that others can enter.
        let meta = fs::symlink_metadata(base).map_err(|e| create_err(base, e))?;
        if !meta.is_dir() || meta.uid() != current_uid() || meta.mode() & 0o077 != 0 {
            return Err(Error::Unsafe(base.to_owned()));
        }
        sweep_stale(base);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let path = base.join(format!("{}-{nanos:x}", std::process::id()));
        mkdir_private(&path).map_err(|e| create_err(&path, e))?;
        // Waiting, not trying: another run's sweep may hold it for a moment
        // (it takes every lock it can to tell live sessions from dead).
        let lock = File::create(path.join(LOCK))
            .and_then(|f| lock_waiting(&f).map(|()| f))
            .map_err(|e| {
                let _ = fs::remove_dir_all(&path);
                create_err(&path, e)
            })?;
        Ok(Self {
            path,
            _lock: lock,
            keep_logs: false,
        })
    }

    /// A named sandbox's runtime directory `path` (its parent private
    /// already), for its supervisor: created if missing, and taken only
    /// if no other supervisor holds its lock (`Ok(None)`: one does).
    /// Whoever asks whether the sandbox runs (`Paths::supervised`: `mvm
    /// create` waiting for it, `ls`, `exec`) holds the lock for an instant
    /// too, so a lock held is asked again for [`CLAIM_PATIENCE`] before
    /// it counts as another supervisor's (a create once failed with
    /// "running already" on its own new sandbox, under load).
    pub fn claim(path: &Path) -> Result<Option<Self>, Error> {
        Self::claim_within(path, CLAIM_PATIENCE)
    }

    fn claim_within(path: &Path, patience: Duration) -> Result<Option<Self>, Error> {
        let create_err = |source| Error::Create {
            path: path.to_owned(),
            source,
        };
        match mkdir_private(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(create_err(e)),
        }
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join(LOCK))
            .map_err(create_err)?;
        let deadline = Instant::now() + patience;
        loop {
            match try_lock(&lock) {
                Ok(true) => {
                    return Ok(Some(Self {
                        path: path.to_owned(),
                        _lock: lock,
                        keep_logs: true,
                    }))
                }
                Ok(false) if Instant::now() < deadline => thread::sleep(CLAIM_RETRY),
                Ok(false) => return Ok(None),
                Err(e) => return Err(create_err(e)),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn vsock_path(&self) -> PathBuf {
        self.path.join("vsock.sock")
    }

    pub fn console_path(&self) -> PathBuf {
        self.path.join("console.log")
    }
}

impl Drop for SessionDir {
    fn drop(&mut self) {
        if !self.keep_logs {
            let _ = fs::remove_dir_all(&self.path);
            return;
        }
        let Ok(entries) = fs::read_dir(&self.path) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let keep = name
                .to_str()
                .is_some_and(|n| n.ends_with(".log") || n == LOCK);
            if !keep {
                remove_file_at(&entry.path());
            }
        }
    }
}

/// `unlinkat(2)`, the call the confined VMM thread has (std's
/// `remove_file` makes `unlink`, which it does not).
fn remove_file_at(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: path is a valid NUL-terminated string for the call.
    unsafe { libc::unlinkat(libc::AT_FDCWD, path.as_ptr(), 0) };
}

/// An exclusive flock without waiting: Ok(true) taken, Ok(false) held by
/// someone else (also how `crate::sandboxes` tells a live supervisor).
pub fn try_lock(file: &File) -> io::Result<bool> {
    // SAFETY: flock on an fd this File owns; no memory is involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(e),
    }
}

/// An exclusive flock, waiting for it.
fn lock_waiting(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: flock on an fd this File owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Whether `path` was last changed more than [`UNLOCKED_GRACE`] ago.
fn older_than_grace(meta: io::Result<fs::Metadata>) -> bool {
    meta.ok()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > UNLOCKED_GRACE)
}

/// Removes the session directories no live session holds the lock of.
/// A lock file younger than [`UNLOCKED_GRACE`] is left alone even when
/// nobody holds it: its session may be between creating it and locking
/// it (two runs started together, one sweeping the other's new
/// directory, was seen in the tests).
fn sweep_stale(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) || entry.file_name() == SANDBOXES {
            continue;
        }
        let stale = match File::open(path.join(LOCK)) {
            // Taken: nobody holds it. The lock is dropped with the file.
            Ok(lock) => older_than_grace(lock.metadata()) && try_lock(&lock).unwrap_or(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => older_than_grace(entry.metadata()),
            Err(_) => false,
        };
        if stale {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// Removes the session directories of process `pid` that no live
/// session holds the lock of: what a run killed with SIGKILL left, for a
/// caller that knows that process is gone (`mvm oci delete` after its
/// container's VMM died). No grace: a process that reused the pid and made
/// its own directory holds that directory's lock.
pub fn remove_sessions_of(pid: i32) {
    remove_sessions_in(&base_dir(), pid);
}

fn remove_sessions_in(base: &Path, pid: i32) {
    for path in sessions_in(base, pid) {
        if lock_held(&path) == Some(false) {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// The session directory of the live `mvm run` with process id `pid`
/// (`mvm oci exec` joins a container's run through its vsock socket).
pub fn live_session_of(pid: i32) -> Option<PathBuf> {
    live_session_in(&base_dir(), pid)
}

fn live_session_in(base: &Path, pid: i32) -> Option<PathBuf> {
    sessions_in(base, pid)
        .into_iter()
        .find(|path| lock_held(path) == Some(true))
}

/// The session directories `pid` made in `base`, live or not.
fn sessions_in(base: &Path, pid: i32) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(base) else {
        return Vec::new();
    };
    let prefix = format!("{pid}-");
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| entry.path())
        .collect()
}

/// Whether a live session holds the lock of the directory at `path`
/// (taken for a moment when nobody does); None without a lock to ask.
fn lock_held(path: &Path) -> Option<bool> {
    let lock = File::open(path.join(LOCK)).ok()?;
    try_lock(&lock).ok().map(|taken| !taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_claim_waits_out_a_prober_but_not_a_supervisor() {
        let base = scratch("claim");
        fs::create_dir_all(&base).unwrap();
        let path = base.join("sbx");
        // A prober (Paths::supervised) holds the lock for a moment.
        let first = SessionDir::claim(&path).unwrap().unwrap();
        let prober = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            drop(first);
        });
        let second = SessionDir::claim_within(&path, Duration::from_secs(2)).unwrap();
        assert!(
            second.is_some(),
            "the lock a prober held briefly was not taken"
        );
        prober.join().unwrap();
        // A supervisor that keeps it: refused once the patience is over.
        let third = SessionDir::claim_within(&path, Duration::from_millis(50)).unwrap();
        assert!(third.is_none(), "claimed a lock someone holds");
        drop(second);
        let _ = fs::remove_dir_all(&base);
    }

    /// A base of its own per test (they run in parallel).
    fn scratch(test: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("mvm-dir-test-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn private_and_removed_on_drop() {
        let base = scratch("private");
        let dir = SessionDir::create_in(&base).unwrap();
        let path = dir.path().to_owned();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o700);
        assert_eq!(fs::metadata(&base).unwrap().mode() & 0o777, 0o700);
        fs::write(dir.console_path(), b"log").unwrap();
        drop(dir);
        assert!(!path.exists());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_dead_process_s_sessions_go_and_a_held_one_stays_and_is_found() {
        let base = scratch("sessions-of");
        fs::create_dir_all(&base).unwrap();
        // Two of pid 4242's, one of them held by a live session (a process
        // that reused the pid), and another pid's.
        for name in ["4242-a", "4242-b", "42420-c"] {
            fs::create_dir(base.join(name)).unwrap();
            File::create(base.join(name).join(LOCK)).unwrap();
        }
        let held = File::open(base.join("4242-b").join(LOCK)).unwrap();
        assert!(try_lock(&held).unwrap());
        assert_eq!(live_session_in(&base, 4242), Some(base.join("4242-b")));
        remove_sessions_in(&base, 4242);
        assert!(!base.join("4242-a").exists());
        assert!(base.join("4242-b").exists(), "a held session was removed");
        assert!(base.join("42420-c").exists(), "another pid's was removed");
        drop(held);
        assert_eq!(live_session_in(&base, 4242), None, "no live session left");
        let _ = fs::remove_dir_all(&base);
    }

    #[test]
    fn sweeps_only_dirs_whose_lock_nobody_holds() {
        let base = scratch("sweep");
        fs::create_dir_all(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
        // A session killed with SIGKILL a while ago: its lock file, nobody
        // holding it.
        let dead = base.join("99999999-1");
        fs::create_dir(&dead).unwrap();
        let old = std::time::SystemTime::now() - UNLOCKED_GRACE * 2;
        File::create(dead.join(LOCK))
            .unwrap()
            .set_modified(old)
            .unwrap();
        // One that has just made its lock file and not yet locked it.
        let locking = base.join("99999996-1");
        fs::create_dir(&locking).unwrap();
        File::create(locking.join(LOCK)).unwrap();
        // A live session of another PID namespace: a PID this process
        // cannot see (above the kernel's maximum), its lock held.
        let other_ns = base.join("99999998-1");
        fs::create_dir(&other_ns).unwrap();
        let held = File::create(other_ns.join(LOCK)).unwrap();
        assert!(try_lock(&held).unwrap());
        // One being created this instant: no lock file yet, and new.
        let creating = base.join("99999997-1");
        fs::create_dir(&creating).unwrap();
        let dir = SessionDir::create_in(&base).unwrap();
        assert!(!dead.exists(), "an unlocked session is swept");
        assert!(
            other_ns.exists(),
            "a locked session is live, whatever its PID"
        );
        assert!(
            creating.exists(),
            "a new directory without a lock is left alone"
        );
        assert!(
            locking.exists(),
            "a new lock file nobody holds yet is left alone"
        );
        // The new session's own lock is held: a second sweep keeps it.
        let second = SessionDir::create_in(&base).unwrap();
        assert!(dir.path().exists());
        drop((dir, second, held));
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn refuses_a_base_others_can_enter() {
        let base = scratch("open");
        fs::create_dir_all(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            SessionDir::create_in(&base),
            Err(Error::Unsafe(_))
        ));
        fs::remove_dir_all(&base).unwrap();
    }
}
