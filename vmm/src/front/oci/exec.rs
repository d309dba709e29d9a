//! `mvm oci exec`: another process in a running container's VM, as runc's
//! exec does it for containerd (`ctr task exec`, `kubectl exec`). The
//! container's `mvm run --serve-exec` keeps its guest agent serving; this
//! joins it through that run's vsock socket with the process of
//! `--process` (process.json) or of the command line, started from the
//! defaults the run wrote (`exec.json`: the container's identity and
//! environment).
//!
//! With `--detach` (the shim's way) a process of its own runs the exec
//! client: its pid goes to `--pid-file`, its exit status is the guest
//! process's, SIGTERM, SIGINT and SIGHUP sent to it reach the guest
//! process and SIGKILL ends it there too (the channel closes, the agent
//! kills what it ran). `mvm oci exec` itself returns once the guest
//! agent has taken the process.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use mvm_protocol::{ExecRequest, AGENT_PORT};

use super::super::join;
use super::bundle::{self, ProcessPlan};
use super::container::{self, Status};
use super::lifecycle;
use crate::exit_code;
use crate::sandboxes::EXEC_DEFAULTS;
use crate::session::client;

/// How long an exec waits for the container's agent to take it.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

pub struct ExecArgs<'a> {
    pub root: &'a Path,
    pub id: &'a str,
    /// process.json; else the command line's ARGS and flags.
    pub process: Option<&'a Path>,
    pub detach: bool,
    pub pid_file: Option<&'a Path>,
    pub console_socket: Option<&'a Path>,
    pub tty: bool,
    pub cwd: Option<&'a str>,
    pub env: &'a [String],
    pub user: Option<&'a str>,
    pub args: &'a [String],
}

/// Runs the exec; the exit status to leave with: the guest process's
/// without `--detach`, 0 once it started with.
pub fn exec(a: &ExecArgs) -> Result<i32, String> {
    let (_, record, status) = lifecycle::find(a.root, a.id)?;
    match status {
        Status::Running => {}
        Status::Created => {
            return Err(format!(
                "container {} is not running: start it first (its VM boots at start)",
                a.id
            ))
        }
        Status::Stopped => return Err(format!("container {} is stopped", a.id)),
    }
    let process = process_of(a)?;
    if process.terminal && a.detach && a.console_socket.is_none() {
        return Err(bundle::Error::NoConsoleSocket.to_string());
    }
    let session = crate::session::dir::live_session_of(record.pid).ok_or_else(|| {
        format!(
            "container {}'s VM has no session to join (its process {} is not an mvm run of this user)",
            a.id, record.pid
        )
    })?;
    let request = request(&session.join(EXEC_DEFAULTS), &process, a.id)?;
    let deadline = Instant::now() + CONNECT_LIMIT;
    let gone = || !container::alive(record.pid, record.pid_start) || Instant::now() > deadline;
    let stream = client::connect(&session.join("vsock.sock"), AGENT_PORT, &gone)
        .map_err(|e| format!("cannot reach container {}'s guest agent: {e}", a.id))?;
    let terminal = match (process.terminal, a.console_socket) {
        (true, Some(socket)) => Some(lifecycle::send_console(socket)?),
        _ => None,
    };
    let call = join::Call {
        request,
        // Whatever the caller gave as stdin is the process's.
        interactive: true,
        raw_terminal: process.terminal,
        timeout: None,
    };
    if !a.detach {
        if let Some(slave) = &terminal {
            use_terminal(slave).map_err(|e| format!("cannot use the console's pty: {e}"))?;
        }
        return Ok(finish(join::run(stream, call, || {})));
    }
    detach(stream, call, terminal.as_ref(), a.pid_file)
}

/// The process to run: process.json's, or the command line's.
fn process_of(a: &ExecArgs) -> Result<ProcessPlan, String> {
    if let Some(path) = a.process {
        let flags = a.tty || a.cwd.is_some() || !a.env.is_empty() || a.user.is_some();
        if flags || !a.args.is_empty() {
            return Err(
                "with --process, give the command, --tty, --cwd, --env and --user in process.json"
                    .into(),
            );
        }
        return bundle::load_process(path).map_err(|e| e.to_string());
    }
    if a.args.is_empty() {
        return Err("no process: give --process FILE or the command after the container id".into());
    }
    let mut env = Vec::new();
    for item in a.env {
        match item.split_once('=') {
            Some((key, value)) if !key.is_empty() => env.push((key.to_string(), value.to_string())),
            _ => return Err(format!("--env {item:?} is not KEY=VALUE")),
        }
    }
    let cwd = a.cwd.unwrap_or("/").to_string();
    if !cwd.starts_with('/') {
        return Err(format!("--cwd {cwd:?} must be an absolute path"));
    }
    Ok(ProcessPlan {
        argv: a.args.to_vec(),
        env,
        cwd,
        user: a.user.unwrap_or("0:0").to_string(),
        terminal: a.tty,
        size: None,
    })
}

/// The container's exec defaults with `process` applied: its own argv,
/// environment (all of it, as runc gives a process.json's), directory,
/// user and terminal.
fn request(defaults: &Path, process: &ProcessPlan, id: &str) -> Result<ExecRequest, String> {
    let mut request: ExecRequest = std::fs::read(defaults)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(|| {
            format!("container {id}'s VM takes no exec (no {EXEC_DEFAULTS}): create it again")
        })?;
    request.argv = process.argv.clone();
    request.env = process.env.clone();
    request.cwd = process.cwd.clone();
    request.user = Some(process.user.clone());
    request.user_name = None;
    request.tty = process.terminal;
    (request.rows, request.cols) = match (process.terminal, process.size) {
        (false, _) => (0, 0),
        (true, Some(size)) => size,
        (true, None) => crate::session::terminal::size(),
    };
    Ok(request)
}

/// The exit status for how the joined process ended, saying why when it
/// is not the process's own.
fn finish(ended: Result<join::Ended, String>) -> i32 {
    match ended {
        Ok(join::Ended::Exited(exit)) => i32::from(exit.status),
        Ok(join::Ended::Cut { by }) => 128 + by.max(0),
        Ok(join::Ended::Lost(e)) => {
            eprintln!("mvm oci: the exec's channel to the guest broke: {e}");
            exit_code::GUEST_CRASHED
        }
        Err(e) => {
            eprintln!("mvm oci: {e}");
            1
        }
    }
}

/// Makes the pty's other end this process's stdin, stdout, stderr and
/// controlling terminal.
fn use_terminal(slave: &OwnedFd) -> io::Result<()> {
    let fd = slave.as_raw_fd();
    // SAFETY: plain syscalls on an fd this process owns.
    let ok = unsafe {
        libc::setsid() >= 0
            && libc::ioctl(fd, libc::TIOCSCTTY, 0) >= 0
            && libc::dup2(fd, 0) >= 0
            && libc::dup2(fd, 1) >= 0
            && libc::dup2(fd, 2) >= 0
    };
    match ok {
        true => Ok(()),
        false => Err(io::Error::last_os_error()),
    }
}

/// Forks the exec client and waits until the agent took the process (the
/// child says `+`) or the child gives up (its reason, or nothing); then
/// writes the child's pid to `pid_file`. Returns 0.
fn detach(
    stream: UnixStream,
    call: join::Call,
    terminal: Option<&OwnedFd>,
    pid_file: Option<&Path>,
) -> Result<i32, String> {
    let (mut report_r, report_w) = pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
    // SAFETY: `mvm oci` has started no thread, so the child is a full copy
    // that may run ordinary code; it leaves only through `exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("cannot fork: {}", io::Error::last_os_error()));
    }
    if pid == 0 {
        drop(report_r);
        std::process::exit(run_detached(stream, call, terminal, report_w));
    }
    drop((stream, report_w));
    let mut said = String::new();
    let _ = report_r.read_to_string(&mut said);
    if said != "+" {
        let mut raw = 0;
        // SAFETY: our own child; raw is a valid out-pointer.
        unsafe { libc::waitpid(pid, &mut raw, 0) };
        return Err(match said.strip_prefix('-') {
            Some(why) => format!("the guest did not start the process: {why}"),
            None => "the exec client ended before the guest took the process".into(),
        });
    }
    if let Some(path) = pid_file {
        if let Err(e) = lifecycle::write_pid_file(path, pid) {
            // SAFETY: our own child, which must not run unseen.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return Err(e);
        }
    }
    Ok(0)
}

/// The detached client: the process's end as its exit status.
fn run_detached(
    stream: UnixStream,
    call: join::Call,
    terminal: Option<&OwnedFd>,
    report: std::fs::File,
) -> i32 {
    let report = std::cell::RefCell::new(Some(report));
    let say = |what: &str| {
        if let Some(mut f) = report.borrow_mut().take() {
            let _ = f.write_all(what.as_bytes());
        }
    };
    if let Some(slave) = terminal {
        if let Err(e) = use_terminal(slave) {
            say(&format!("-cannot use the console's pty: {e}"));
            return 1;
        }
    }
    let ended = join::run(stream, call, || say("+"));
    match &ended {
        Ok(join::Ended::Lost(e)) => say(&format!("-{e}")),
        Err(e) => say(&format!("-{e}")),
        _ => {}
    }
    finish(ended)
}

fn pipe() -> io::Result<(std::fs::File, std::fs::File)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned both fds, owned by nothing else.
    Ok(unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    })
}
