//! `mvm ls`, `stop`, `rm` and `logs`: read the records and runtime
//! directories (`crate::sandboxes`), signal a supervisor, remove what a
//! sandbox left. Only the caller's own sandboxes are ever seen: both
//! directories are private to the user.

use std::fs;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::super::{setup_failure, Failure};
use super::sandbox_failure;
use super::supervise::STOP_GRACE;
use crate::sandboxes::{Paths, Record, State, PID};

/// How long `stop` waits beyond the supervisor's own grace before it
/// kills the supervisor.
const KILL_AFTER: Duration = Duration::from_secs(5);

#[derive(Args, Debug)]
pub struct LsArgs {
    /// One JSON object per sandbox, in an array
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// Stop a running sandbox first (otherwise it is refused)
    #[arg(short, long)]
    pub force: bool,
}

/// One line of `ls`.
#[derive(Serialize)]
struct Row {
    name: String,
    state: State,
    image: String,
    /// Seconds the supervisor has run (running sandboxes only).
    uptime_s: Option<u64>,
    memory: String,
    cpus: u32,
    shares: Vec<String>,
    /// Hosts the egress proxy allows; empty: no network.
    allow: Vec<String>,
    pid: Option<i32>,
    /// The disk's size as given, and the host space it takes now.
    disk: String,
    disk_used_bytes: Option<u64>,
}

fn row(paths: &Paths, record: Record) -> Row {
    let state = paths.state();
    let alive = matches!(state, State::Running | State::Starting);
    let uptime_s = alive
        .then(|| fs::metadata(paths.runtime_file(PID)).ok())
        .flatten()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.elapsed().ok())
        .map(|d| d.as_secs());
    Row {
        name: record.name,
        state,
        image: record.image,
        uptime_s,
        memory: record.memory,
        cpus: record.cpus,
        shares: record.shares,
        allow: record.allow,
        pid: alive.then(|| paths.pid()).flatten(),
        disk: record.disk,
        disk_used_bytes: fs::metadata(paths.disk_path())
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512),
    }
}

pub fn ls(args: &LsArgs) -> Result<i32, Failure> {
    let mut rows = Vec::new();
    for paths in Paths::all().map_err(sandbox_failure)? {
        match paths.read_record() {
            Ok(record) => rows.push(row(&paths, record)),
            // One broken record must not hide the others.
            Err(e) => eprintln!("mvm: {e}"),
        }
    }
    let mut out = io::stdout().lock();
    if args.json {
        let json = serde_json::to_string_pretty(&rows)
            .map_err(|e| setup_failure(format!("cannot write JSON: {e}")))?;
        let _ = writeln!(out, "{json}");
        return Ok(0);
    }
    let _ = writeln!(
        out,
        "{:<16} {:<9} {:<20} {:>8} {:>7} {:>4} {:>8} {:>12}  SHARES / ALLOW",
        "NAME", "STATE", "IMAGE", "UPTIME", "MEMORY", "CPUS", "PID", "DISK"
    );
    for r in rows {
        let uptime = r.uptime_s.map_or("-".into(), |s| format!("{s}s"));
        let pid = r.pid.map_or("-".into(), |p| p.to_string());
        let disk = match r.disk_used_bytes {
            Some(used) => format!("{}M/{}", used >> 20, r.disk),
            None => "-".into(),
        };
        let policy = match r.allow.is_empty() {
            true => "no network".to_string(),
            false => format!("allow {}", r.allow.join(",")),
        };
        let _ = writeln!(
            out,
            "{:<16} {:<9} {:<20} {:>8} {:>7} {:>4} {:>8} {:>12}  {} / {}",
            r.name,
            r.state.name(),
            r.image,
            uptime,
            r.memory,
            r.cpus,
            pid,
            disk,
            r.shares.join(" "),
            policy
        );
    }
    Ok(0)
}

/// `mvm stop NAME`: SIGTERM to the supervisor (which asks the guest to
/// power off, and stops the machine after its grace), SIGKILL if it is
/// still there after that.
pub fn stop(name: &str) -> Result<i32, Failure> {
    let paths = Paths::of(name).map_err(sandbox_failure)?;
    paths.read_record().map_err(sandbox_failure)?;
    match paths.state() {
        State::Stopped => {
            eprintln!("mvm: sandbox '{name}' is not running");
            return Ok(0);
        }
        State::Dead => {
            return Err(setup_failure(format!(
                "sandbox '{name}' is dead (its supervisor was killed): mvm rm {name}, or mvm start {name}"
            )))
        }
        State::Running | State::Starting => {}
    }
    stop_supervisor(&paths)?;
    eprintln!("mvm: sandbox '{name}' stopped");
    Ok(0)
}

fn stop_supervisor(paths: &Paths) -> Result<(), Failure> {
    let pid = paths.pid().ok_or_else(|| {
        setup_failure(format!(
            "sandbox '{}' has no readable pid file in {}",
            paths.name,
            paths.runtime.display()
        ))
    })?;
    signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE + KILL_AFTER;
    while paths.supervised() {
        if Instant::now() > deadline {
            eprintln!(
                "mvm: sandbox '{}': the supervisor did not end: killing it",
                paths.name
            );
            signal(pid, libc::SIGKILL);
            while paths.supervised() {
                std::thread::sleep(Duration::from_millis(20));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = fs::remove_file(paths.runtime_file(PID));
    Ok(())
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: plain syscall; the kernel refuses another user's process.
    unsafe { libc::kill(pid, sig) };
}

/// `mvm rm [-f] NAME`: the record and the runtime directory; a running
/// sandbox only with -f (stopped first).
pub fn rm(name: &str, args: &RmArgs) -> Result<i32, Failure> {
    let paths = Paths::of(name).map_err(sandbox_failure)?;
    if !paths.exists() && !paths.runtime.exists() {
        return Err(sandbox_failure(crate::sandboxes::Error::NotFound(
            name.to_string(),
        )));
    }
    match paths.state() {
        State::Running | State::Starting if !args.force => {
            return Err(setup_failure(format!(
                "sandbox '{name}' is running: mvm stop {name} first, or mvm rm -f {name}"
            )))
        }
        State::Running | State::Starting => stop_supervisor(&paths)?,
        // A killed supervisor's helpers died with it (PR_SET_PDEATHSIG);
        // what it left are files.
        State::Dead | State::Stopped => {}
    }
    for dir in [&paths.runtime, &paths.data] {
        match fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(setup_failure(format!(
                    "cannot remove {}: {e}",
                    dir.display()
                )))
            }
        }
    }
    crate::sandboxes::remove_empty_roots();
    Ok(0)
}

/// `mvm logs NAME`: the guest console, then the egress proxy's audit log
/// and the supervisor's messages where there are any.
pub fn logs(name: &str) -> Result<i32, Failure> {
    let paths = Paths::of(name).map_err(sandbox_failure)?;
    paths.read_record().map_err(sandbox_failure)?;
    let mut out = io::stdout().lock();
    let mut any = false;
    for (file, title) in [
        ("console.log", "guest console"),
        ("net.log", "egress audit log"),
        ("supervisor.log", "supervisor"),
    ] {
        let Ok(text) = fs::read(paths.runtime_file(file)) else {
            continue;
        };
        if text.is_empty() {
            continue;
        }
        any = true;
        let _ = writeln!(out, "==> {title} ({file}) <==");
        let _ = out.write_all(&text);
    }
    if !any {
        eprintln!("mvm: sandbox '{name}' has no logs yet");
    }
    Ok(0)
}
