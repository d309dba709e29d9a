//! Where named sandboxes live on the host, and what state each is in
//! (docs/sandboxes.md). No daemon keeps this: every sandbox has
//!
//! - a record, `$XDG_DATA_HOME/mvm/sandboxes/NAME/sandbox.json` (else
//!   `~/.local/share/...`; `$MVM_SANDBOXES` overrides the directory): the
//!   options it was created with and where, written once by `mvm create`;
//! - a runtime directory, `<session base>/sandboxes/NAME` (the base of
//!   `mvm run`'s session directories, private to the user): the
//!   supervisor's `lock` (an flock held as long as it lives), its `pid`,
//!   the vsock socket `mvm exec` connects to, the helpers' sockets, the
//!   logs, `ready` once the guest serves commands, and `exec.json`, the
//!   defaults each exec starts from.
//!
//! The lock is the truth about liveness: a pid can be reused or belong to
//! another PID namespace, a held lock cannot lie. A runtime directory
//! whose `pid` file is still there but whose lock nobody holds belongs to
//! a supervisor that was killed: the sandbox is `dead`.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The supervisor's lock file in the runtime directory.
pub const LOCK: &str = "lock";
/// The supervisor's pid, removed when it ends cleanly.
pub const PID: &str = "pid";
/// Made empty before the machine starts, written once the guest serves
/// commands (the supervisor's threads may write, not create, files).
pub const READY: &str = "ready";
/// The defaults each exec's request starts from.
pub const EXEC_DEFAULTS: &str = "exec.json";
/// The supervisor's own messages.
pub const SUPERVISOR_LOG: &str = "supervisor.log";
/// The record's file name in the data directory.
const RECORD: &str = "sandbox.json";
/// The sandbox's disk in the data directory: its root's writable layer.
pub const DISK: &str = "disk.img";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("'{0}' is not a sandbox name: use 1 to 63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit")]
    BadName(String),
    #[error("no sandbox named '{0}' (mvm ls lists them)")]
    NotFound(String),
    #[error("a sandbox named '{0}' exists already: pick another name or remove it (mvm rm {0})")]
    Exists(String),
    #[error(
        "cannot find a directory for sandbox records: set XDG_DATA_HOME, HOME or MVM_SANDBOXES"
    )]
    NoDataDir,
    #[error("the sandbox record {} is unreadable or corrupt: {why} (remove it with mvm rm -f)", path.display())]
    Corrupt { path: PathBuf, why: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{} is not owned by you or is accessible to others: remove it or set XDG_RUNTIME_DIR", .0.display())]
    Unsafe(PathBuf),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// What `mvm create` was given, kept for `start` and shown by `ls`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    /// The options after the name, as given: `start` parses them again,
    /// so a share is checked anew each time the sandbox starts.
    pub args: Vec<String>,
    /// The directory `mvm create` ran in (the default workspace, and
    /// where relative paths in `args` start).
    pub cwd: PathBuf,
    /// Seconds since the epoch.
    pub created: u64,
    /// For `ls`: the image, the size and the shares as given.
    pub image: String,
    pub memory: String,
    pub cpus: u32,
    pub shares: Vec<String>,
    /// The hosts the egress proxy allows (empty: no network).
    pub allow: Vec<String>,
    /// The disk's size as given (`--disk`); empty: no disk (no image
    /// root).
    #[serde(default)]
    pub disk: String,
}

/// The state `ls` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Its supervisor is alive and the guest serves commands.
    Running,
    /// Its supervisor is alive, the guest not yet (or no longer) serving.
    Starting,
    /// Not running; `start` brings it back.
    Stopped,
    /// Its supervisor was killed: `rm` cleans up, `start` restarts.
    Dead,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Starting => "starting",
            State::Stopped => "stopped",
            State::Dead => "dead",
        }
    }
}

/// A sandbox name: also a directory name, so no '/', no leading dot.
pub fn check_name(name: &str) -> Result<(), Error> {
    let ok = (1..=63).contains(&name.len())
        && name.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && b"._-".contains(&b))
        });
    if ok {
        Ok(())
    } else {
        Err(Error::BadName(name.to_string()))
    }
}

/// The directory the records live in.
pub fn data_root() -> Result<PathBuf, Error> {
    let nonempty = |v: &str| {
        std::env::var_os(v)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = nonempty("MVM_SANDBOXES") {
        return Ok(dir);
    }
    let data = nonempty("XDG_DATA_HOME")
        .or_else(|| crate::shares::home_dir().map(|h| h.join(".local/share")))
        .ok_or(Error::NoDataDir)?;
    Ok(data.join("mvm").join("sandboxes"))
}

/// The directory the runtime directories live in.
pub fn runtime_root() -> PathBuf {
    crate::session::dir::base_dir().join(crate::session::dir::SANDBOXES)
}

/// [`runtime_root`], created private if missing (by `create` and `start`
/// only: looking never leaves a directory behind).
pub fn ensure_runtime_root() -> Result<PathBuf, Error> {
    let root = runtime_root();
    if let Some(base) = root.parent() {
        make_private(base)?;
    }
    make_private(&root)?;
    Ok(root)
}

/// After `rm`: the two roots go too when no sandbox is left in them.
pub fn remove_empty_roots() {
    if let Ok(data) = data_root() {
        let _ = fs::remove_dir(data);
    }
    let _ = fs::remove_dir(runtime_root());
}

/// Creates `dir` mode 0700 if missing; refuses one others can enter.
fn make_private(dir: &Path) -> Result<(), Error> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(dir)(e)),
    }
    let meta = fs::symlink_metadata(dir).map_err(io_err(dir))?;
    if !meta.is_dir()
        || meta.uid() != crate::session::dir::current_uid()
        || meta.mode() & 0o077 != 0
    {
        return Err(Error::Unsafe(dir.to_owned()));
    }
    Ok(())
}

/// One sandbox's two directories.
#[derive(Debug, Clone)]
pub struct Paths {
    pub name: String,
    pub data: PathBuf,
    pub runtime: PathBuf,
}

impl Paths {
    pub fn of(name: &str) -> Result<Paths, Error> {
        check_name(name)?;
        Ok(Paths::under(&data_root()?, &runtime_root(), name))
    }

    /// The paths of `name` under the given roots (tests use their own).
    pub fn under(data_root: &Path, runtime_root: &Path, name: &str) -> Paths {
        Paths {
            name: name.to_string(),
            data: data_root.join(name),
            runtime: runtime_root.join(name),
        }
    }

    pub fn record_path(&self) -> PathBuf {
        self.data.join(RECORD)
    }

    pub fn disk_path(&self) -> PathBuf {
        self.data.join(DISK)
    }

    pub fn runtime_file(&self, name: &str) -> PathBuf {
        self.runtime.join(name)
    }

    pub fn exists(&self) -> bool {
        self.data.exists()
    }

    /// Writes the record of a new sandbox; refuses a name in use. The
    /// directory's creation is what claims the name, so two `create`s of
    /// one name cannot both succeed.
    pub fn create_record(&self, record: &Record) -> Result<(), Error> {
        if let Some(parent) = self.data.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        match fs::DirBuilder::new().mode(0o700).create(&self.data) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(Error::Exists(self.name.clone()))
            }
            Err(e) => return Err(io_err(&self.data)(e)),
        }
        let json = serde_json::to_vec_pretty(record).map_err(|e| Error::Corrupt {
            path: self.record_path(),
            why: e.to_string(),
        })?;
        let path = self.record_path();
        let tmp = self.data.join(".sandbox.json.tmp");
        fs::write(&tmp, json)
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(io_err(&path))
    }

    pub fn read_record(&self) -> Result<Record, Error> {
        let path = self.record_path();
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound && !self.data.exists() => {
                return Err(Error::NotFound(self.name.clone()))
            }
            Err(e) => {
                return Err(Error::Corrupt {
                    path,
                    why: e.to_string(),
                })
            }
        };
        serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
            path,
            why: e.to_string(),
        })
    }

    /// Whether a supervisor holds the lock right now.
    pub fn supervised(&self) -> bool {
        match File::open(self.runtime_file(LOCK)) {
            // Taken (and dropped with the file): nobody held it.
            Ok(lock) => !crate::session::dir::try_lock(&lock).unwrap_or(false),
            Err(_) => false,
        }
    }

    pub fn state(&self) -> State {
        if self.supervised() {
            let ready = fs::metadata(self.runtime_file(READY)).is_ok_and(|m| m.len() > 0);
            match ready {
                true => State::Running,
                false => State::Starting,
            }
        } else if self.runtime_file(PID).exists() {
            State::Dead
        } else {
            State::Stopped
        }
    }

    /// The supervisor's pid as its file says (only meaningful while
    /// [`supervised`](Self::supervised)).
    pub fn pid(&self) -> Option<i32> {
        fs::read_to_string(self.runtime_file(PID))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Every sandbox with a record, by name.
    pub fn all() -> Result<Vec<Paths>, Error> {
        let data_root = data_root()?;
        let runtime_root = runtime_root();
        let mut names: Vec<String> = match fs::read_dir(&data_root) {
            Ok(entries) => entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| check_name(n).is_ok())
                .collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_err(&data_root)(e)),
        };
        names.sort();
        Ok(names
            .iter()
            .map(|n| Paths::under(&data_root, &runtime_root, n))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(test: &str) -> (PathBuf, PathBuf) {
        let base =
            std::env::temp_dir().join(format!("mvm-sandboxes-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let (data, run) = (base.join("data"), base.join("run"));
        fs::create_dir_all(&run).unwrap();
        (data, run)
    }

    fn record(name: &str) -> Record {
        Record {
            name: name.into(),
            args: vec!["--memory".into(), "1G".into()],
            cwd: "/src".into(),
            created: 1,
            image: "default".into(),
            memory: "1G".into(),
            cpus: 1,
            shares: vec![".:/workspace:ro".into()],
            allow: vec![],
            disk: "4G".into(),
        }
    }

    #[test]
    fn names_are_plain_directory_names() {
        for ok in ["a", "dev", "agent-1", "x.y_z", &"a".repeat(63)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "..",
            "Upper",
            "sp ace",
            &"a".repeat(64),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_name_is_claimed_once_and_its_record_read_back() {
        let (data, run) = scratch("claim");
        let paths = Paths::under(&data, &run, "dev");
        paths.create_record(&record("dev")).unwrap();
        assert!(matches!(
            paths.create_record(&record("dev")),
            Err(Error::Exists(_))
        ));
        assert_eq!(paths.read_record().unwrap(), record("dev"));
        let missing = Paths::under(&data, &run, "nope");
        assert!(matches!(missing.read_record(), Err(Error::NotFound(_))));
        fs::remove_dir_all(data.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_corrupt_record_is_reported_with_its_path() {
        let (data, run) = scratch("corrupt");
        let paths = Paths::under(&data, &run, "dev");
        paths.create_record(&record("dev")).unwrap();
        fs::write(paths.record_path(), b"{\"name\":").unwrap();
        let err = paths.read_record().unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }));
        assert!(err.to_string().contains("sandbox.json"), "{err}");
        fs::remove_dir_all(data.parent().unwrap()).unwrap();
    }

    #[test]
    fn the_state_follows_the_lock_not_the_pid() {
        let (data, run) = scratch("state");
        let paths = Paths::under(&data, &run, "dev");
        assert_eq!(paths.state(), State::Stopped);
        fs::create_dir_all(&paths.runtime).unwrap();
        let lock = File::create(paths.runtime_file(LOCK)).unwrap();
        fs::write(paths.runtime_file(PID), b"999999999\n").unwrap();
        // A pid file and nobody holding the lock: killed.
        assert_eq!(paths.state(), State::Dead);
        assert!(crate::session::dir::try_lock(&lock).unwrap());
        assert_eq!(paths.state(), State::Starting);
        fs::write(paths.runtime_file(READY), b"").unwrap();
        assert_eq!(paths.state(), State::Starting, "made, not yet written");
        fs::write(paths.runtime_file(READY), b"ready\n").unwrap();
        assert_eq!(paths.state(), State::Running);
        assert_eq!(paths.pid(), Some(999_999_999));
        drop(lock);
        fs::remove_file(paths.runtime_file(PID)).unwrap();
        assert_eq!(paths.state(), State::Stopped);
        fs::remove_dir_all(data.parent().unwrap()).unwrap();
    }
}
