//! A container's record under the runtime's root directory (`--root`):
//! `ROOT/ID/state.json` (its bundle, its process's pid and that process's
//! start time, so that a reused pid is not taken for it), the `start` FIFO
//! its process waits on until `start`, and `started` once it was. Its
//! status is worked out from these and the process, never stored, so it
//! stays true when the process dies in any way (a crashed VMM included).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The runtime spec version `state` reports.
pub const OCI_VERSION: &str = "1.0.2";

/// Default `--root` for root: runc's own is /run/runc.
const SYSTEM_ROOT: &str = "/run/mvm-oci";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    pub pid: i32,
    /// The process's start time (field 22 of /proc/PID/stat, in clock
    /// ticks since boot).
    pub pid_start: u64,
    /// RFC 3339, UTC.
    pub created: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The process waits for `start`.
    Created,
    Running,
    /// The process is gone (or a zombie its parent has yet to reap).
    Stopped,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Stopped => "stopped",
        }
    }
}

/// The runtime's root: `--root`, else /run/mvm-oci for root, else
/// `$XDG_RUNTIME_DIR/mvm-oci`, else a directory of the user's own in
/// /tmp.
pub fn runtime_root(given: Option<&Path>) -> PathBuf {
    if let Some(dir) = given {
        return dir.to_path_buf();
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from(SYSTEM_ROOT);
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => Path::new(&dir).join("mvm-oci"),
        None => PathBuf::from(format!("/tmp/mvm-oci-{uid}")),
    }
}

/// A container id as runc takes them: 1 to 1024 of A-Z a-z 0-9 _ + - .,
/// not `.` or `..` (it names a directory).
pub fn id_is_valid(id: &str) -> bool {
    (1..=1024).contains(&id.len())
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_+-.".contains(&b))
}

/// One container's directory.
pub struct Container {
    pub dir: PathBuf,
}

impl Container {
    pub fn at(root: &Path, id: &str) -> Container {
        Container { dir: root.join(id) }
    }

    pub fn exists(&self) -> bool {
        self.dir.join("state.json").is_file()
    }

    pub fn fifo(&self) -> PathBuf {
        self.dir.join("start")
    }

    pub fn started_marker(&self) -> PathBuf {
        self.dir.join("started")
    }

    pub fn read(&self) -> io::Result<Record> {
        let text = fs::read(self.dir.join("state.json"))?;
        serde_json::from_slice(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Written whole under a temporary name, then renamed: a reader sees
    /// the old record or the new one.
    pub fn write(&self, record: &Record) -> io::Result<()> {
        let tmp = self.dir.join(".state.json.tmp");
        fs::write(
            &tmp,
            serde_json::to_vec(record).expect("plain data serialises"),
        )?;
        fs::rename(tmp, self.dir.join("state.json"))
    }

    pub fn status(&self, record: &Record) -> Status {
        if !alive(record.pid, record.pid_start) {
            Status::Stopped
        } else if self.started_marker().exists() {
            Status::Running
        } else {
            Status::Created
        }
    }
}

/// The runtime spec's state of a container, as `state` prints it.
pub fn state_json(record: &Record, status: Status) -> serde_json::Value {
    let pid = match status {
        Status::Stopped => 0,
        _ => record.pid,
    };
    serde_json::json!({
        "ociVersion": OCI_VERSION,
        "id": record.id,
        "status": status.as_str(),
        "pid": pid,
        "bundle": record.bundle,
        "rootfs": record.rootfs,
        "created": record.created,
        "annotations": {},
    })
}

/// A process's start time, from /proc/PID/stat; None when it is gone.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields after it start after its last ')'.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): field 22 is at index 19.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Whether `pid` is still the process that was recorded, and not a
/// zombie.
pub fn alive(pid: i32, recorded_start: u64) -> bool {
    pid > 0 && start_time(pid) == Some(recorded_start)
}

/// Now as RFC 3339 in UTC.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for good in ["a", "abc-1.2_3+4", &"x".repeat(1024)] {
            assert!(id_is_valid(good), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(1025)] {
            assert!(!id_is_valid(bad), "{bad}");
        }
    }

    #[test]
    fn status_follows_the_process() {
        let dir = std::env::temp_dir().join(format!("mvm-oci-state-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let c = Container { dir: dir.clone() };
        let me = std::process::id() as i32;
        let record = Record {
            id: "c".into(),
            bundle: "/b".into(),
            rootfs: "/b/rootfs".into(),
            pid: me,
            pid_start: start_time(me).unwrap(),
            created: now_rfc3339(),
        };
        c.write(&record).unwrap();
        assert_eq!(c.read().unwrap(), record);
        assert_eq!(c.status(&record), Status::Created);
        fs::write(c.started_marker(), "").unwrap();
        assert_eq!(c.status(&record), Status::Running);
        // The same pid with another start time is another process.
        let reused = Record {
            pid_start: record.pid_start + 1,
            ..record.clone()
        };
        assert_eq!(c.status(&reused), Status::Stopped);
        let state = state_json(&reused, Status::Stopped);
        assert_eq!(state["status"], "stopped");
        assert_eq!(state["pid"], 0);
        assert_eq!(state_json(&record, Status::Running)["pid"], me);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rfc3339_has_the_shape() {
        let now = now_rfc3339();
        assert!(now.starts_with("20") && now.ends_with('Z'), "{now}");
        assert_eq!(&now[10..11], "T", "{now}");
    }
}
