//! The session directory: a private runtime directory per `mvm run` that
//! holds the vsock socket and the guest console log, and is removed when
//! the run ends, however it ends (errors, timeouts and signals all unwind
//! through `Drop`; only SIGKILL skips it, and the next run sweeps what a
//! killed one left).

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the session directory {}: {source}", path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("{} is not owned by you or is accessible to others: remove it or set XDG_RUNTIME_DIR", .0.display())]
    Unsafe(PathBuf),
}

pub struct SessionDir {
    path: PathBuf,
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
        Ok(Self { path })
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
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Removes session directories whose mvm process no longer exists.
fn sweep_stale(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch() -> PathBuf {
        let p = std::env::temp_dir().join(format!("mvm-dir-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn private_and_removed_on_drop() {
        let base = scratch();
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
    fn sweeps_dirs_of_dead_processes_only() {
        let base = scratch().with_extension("sweep");
        fs::create_dir_all(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
        // PIDs above the kernel's maximum (4194304) never exist.
        let dead = base.join("99999999-1");
        let live = base.join(format!("{}-stale", std::process::id()));
        fs::create_dir(&dead).unwrap();
        fs::create_dir(&live).unwrap();
        let dir = SessionDir::create_in(&base).unwrap();
        assert!(!dead.exists());
        assert!(live.exists());
        drop(dir);
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn refuses_a_base_others_can_enter() {
        let base = scratch().with_extension("open");
        fs::create_dir_all(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            SessionDir::create_in(&base),
            Err(Error::Unsafe(_))
        ));
        fs::remove_dir_all(&base).unwrap();
    }
}
