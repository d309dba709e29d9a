//! create, start, kill and delete, as runc does them for containerd's
//! shim: `create` forks the container's process, which waits on the
//! container's FIFO; `start` lets it go, and it becomes `mvm run` with the
//! bundle's options (exec: the same pid), so the pid the shim waits for is
//! the VMM's, and its exit status the workload's. Signals sent with `kill`
//! reach that process, which forwards SIGTERM, SIGINT and SIGHUP to the
//! command in the guest (SIGKILL ends the VMM, and the VM with it).

use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::bundle;
use super::container::{self, Container, Record, Status};

/// How long `delete --force` waits for a killed container's process.
const KILL_WAIT: Duration = Duration::from_secs(10);

pub struct CreateArgs<'a> {
    pub root: &'a Path,
    pub bundle: &'a Path,
    pub pid_file: Option<&'a Path>,
    pub console_socket: Option<&'a Path>,
    pub id: &'a str,
}

pub fn create(args: &CreateArgs) -> Result<(), String> {
    let id = args.id;
    if !container::id_is_valid(id) {
        return Err(format!(
            "invalid container id {id:?}: use 1 to 1024 of A-Z a-z 0-9 _ + - ."
        ));
    }
    let bundle = args
        .bundle
        .canonicalize()
        .map_err(|e| format!("bundle {}: {e}", args.bundle.display()))?;
    let plan = bundle::plan(&bundle, args.console_socket.is_some()).map_err(|e| e.to_string())?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(args.root)
        .map_err(|e| {
            format!(
                "cannot create the runtime root {}: {e}",
                args.root.display()
            )
        })?;
    let c = Container::at(args.root, id);
    match fs::DirBuilder::new().mode(0o700).create(&c.dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(format!("container {id} already exists"))
        }
        Err(e) => return Err(format!("cannot create {}: {e}", c.dir.display())),
    }
    // From here on a failure removes what it made.
    let made = create_in(&c, args, &bundle, plan);
    if made.is_err() {
        let _ = fs::remove_dir_all(&c.dir);
    }
    made
}

fn create_in(
    c: &Container,
    args: &CreateArgs,
    bundle: &Path,
    plan: bundle::Plan,
) -> Result<(), String> {
    let fifo = cstring(&c.fifo())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) } != 0 {
        return Err(format!(
            "cannot make {}: {}",
            c.fifo().display(),
            io::Error::last_os_error()
        ));
    }
    let terminal = match args.console_socket {
        Some(socket) if plan.terminal => Some(send_console(socket)?),
        _ => None,
    };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find mvm itself: {e}"))?;
    let mut argv = vec![cstring(&exe)?, CString::new("run").expect("no NUL")];
    for arg in &plan.run_args {
        argv.push(CString::new(arg.as_str()).map_err(|_| format!("NUL in argument {arg:?}"))?);
    }
    let pid = fork_waiting(&fifo, &argv, terminal.as_ref())?;
    drop(terminal);
    let Some(pid_start) = container::start_time(pid) else {
        return Err("the container's process died at once".into());
    };
    let record = Record {
        id: args.id.to_string(),
        bundle: bundle.to_path_buf(),
        rootfs: plan.rootfs,
        pid,
        pid_start,
        created: container::now_rfc3339(),
    };
    let written = c
        .write(&record)
        .map_err(|e| format!("cannot write the container's state: {e}"))
        .and_then(|()| match args.pid_file {
            Some(path) => write_pid_file(path, pid),
            None => Ok(()),
        });
    if written.is_err() {
        // SAFETY: our own child, still waiting on the FIFO.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    written
}

/// Forks the container's process: it opens the FIFO (blocking until
/// `start` opens it too), reads `start`'s byte and execs `argv`. With a
/// terminal, the pty's other end becomes its stdin, stdout, stderr and
/// controlling terminal. Returns its pid.
fn fork_waiting(
    fifo: &CString,
    argv: &[CString],
    terminal: Option<&OwnedFd>,
) -> Result<i32, String> {
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: this process has no other thread (mvm oci starts none), so
    // the child may run ordinary code; it only calls async-signal-safe
    // functions anyway, on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("cannot fork: {}", io::Error::last_os_error()));
    }
    if pid > 0 {
        return Ok(pid);
    }
    // The child.
    // SAFETY: async-signal-safe calls on valid fds and NUL-terminated
    // strings; every path ends in execv or _exit.
    unsafe {
        if let Some(slave) = terminal {
            let fd = slave.as_raw_fd();
            if libc::setsid() < 0
                || libc::ioctl(fd, libc::TIOCSCTTY, 0) < 0
                || libc::dup2(fd, 0) < 0
                || libc::dup2(fd, 1) < 0
                || libc::dup2(fd, 2) < 0
            {
                libc::_exit(125);
            }
        }
        let fd = libc::open(fifo.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        let mut byte = 0u8;
        if fd < 0 || libc::read(fd, (&raw mut byte).cast(), 1) != 1 {
            // Deleted before it was started.
            libc::_exit(137);
        }
        libc::close(fd);
        libc::execv(ptrs[0], ptrs.as_ptr());
        let msg = b"mvm oci: cannot exec mvm run\n";
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(125);
    }
}

/// A new pty: its controlling side goes to the shim over the console
/// socket (SCM_RIGHTS, as runc does); the other side is returned, for the
/// container's process.
pub(super) fn send_console(socket: &Path) -> Result<OwnedFd, String> {
    use std::os::fd::FromRawFd;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two fds into the given ints; no name, termios
    // or size is asked for.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!("cannot open a pty: {}", io::Error::last_os_error()));
    }
    // SAFETY: openpty just returned both fds, owned by nothing else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let stream = UnixStream::connect(socket).map_err(|e| {
        format!(
            "cannot connect to the console socket {}: {e}",
            socket.display()
        )
    })?;
    stream
        .send_with_fd(&b"/dev/ptmx"[..], master.as_raw_fd())
        .map_err(|e| format!("cannot send the console to {}: {e}", socket.display()))?;
    Ok(slave)
}

/// runc's way: the pid written under a temporary name, then renamed, so
/// that the shim never reads half a number.
pub(super) fn write_pid_file(path: &Path, pid: i32) -> Result<(), String> {
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    fs::write(&tmp, pid.to_string())
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(|e| format!("cannot write the pid file {}: {e}", path.display()))
}

/// The container's record and status; a missing one is runc's error.
pub fn find(root: &Path, id: &str) -> Result<(Container, Record, Status), String> {
    let c = Container::at(root, id);
    if !container::id_is_valid(id) || !c.exists() {
        return Err(format!("container {id} does not exist"));
    }
    let record = c
        .read()
        .map_err(|e| format!("cannot read the state of container {id}: {e}"))?;
    let status = c.status(&record);
    Ok((c, record, status))
}

pub fn start(root: &Path, id: &str) -> Result<(), String> {
    let (c, _, status) = find(root, id)?;
    match status {
        Status::Created => {}
        Status::Running => return Err(format!("container {id} is already running")),
        Status::Stopped => {
            return Err(format!(
                "container {id} is stopped: a container starts once (delete it and create it again)"
            ))
        }
    }
    // Non-blocking: with no process waiting on the FIFO, ENXIO at once.
    let mut fifo = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(c.fifo())
        .map_err(|e| format!("container {id} is not waiting to start: {e}"))?;
    fs::write(c.started_marker(), "")
        .map_err(|e| format!("cannot mark container {id} started: {e}"))?;
    fifo.write_all(&[1]).map_err(|e| {
        // Not started after all: its status stays `created`.
        let _ = fs::remove_file(c.started_marker());
        format!("cannot start container {id}: {e}")
    })
}

/// `SIGTERM`, `TERM` or `15`.
pub fn parse_signal(name: &str) -> Result<i32, String> {
    if let Ok(n) = name.parse::<i32>() {
        return match n {
            1..=64 => Ok(n),
            _ => Err(format!("signal {n} is out of range (1-64)")),
        };
    }
    let bare = name.strip_prefix("SIG").unwrap_or(name);
    let signal = match bare {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "PIPE" => libc::SIGPIPE,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "TSTP" => libc::SIGTSTP,
        "WINCH" => libc::SIGWINCH,
        _ => return Err(format!("unknown signal {name:?}")),
    };
    Ok(signal)
}

pub fn kill(root: &Path, id: &str, signal: &str) -> Result<(), String> {
    let signal = parse_signal(signal)?;
    let (_, record, status) = find(root, id)?;
    if status == Status::Stopped {
        return Err(format!("container {id} is not running"));
    }
    // SAFETY: a plain kill(2) of the container's own process, checked
    // above to be the one recorded.
    if unsafe { libc::kill(record.pid, signal) } != 0 {
        return Err(format!(
            "cannot signal container {id}: {}",
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

pub fn delete(root: &Path, id: &str, force: bool) -> Result<(), String> {
    let (c, record, status) = match find(root, id) {
        Ok(found) => found,
        // runc: a missing container is no error with --force.
        Err(_) if force => {
            if container::id_is_valid(id) {
                let _ = fs::remove_dir_all(Container::at(root, id).dir);
            }
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    if status != Status::Stopped {
        if !force {
            return Err(format!(
                "container {id} is {}: kill it first, or delete --force",
                status.as_str()
            ));
        }
        // SAFETY: as in `kill`.
        unsafe { libc::kill(record.pid, libc::SIGKILL) };
        let deadline = Instant::now() + KILL_WAIT;
        while container::alive(record.pid, record.pid_start) {
            if Instant::now() > deadline {
                return Err(format!(
                    "container {id}'s process {} did not die after SIGKILL",
                    record.pid
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // A VMM that was killed (or crashed) left its session directory: the
    // container's files go with the container.
    crate::session::dir::remove_sessions_of(record.pid);
    fs::remove_dir_all(&c.dir).map_err(|e| format!("cannot remove {}: {e}", c.dir.display()))
}

fn cstring(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("NUL in path {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_and_number() {
        assert_eq!(parse_signal("SIGTERM"), Ok(libc::SIGTERM));
        assert_eq!(parse_signal("KILL"), Ok(libc::SIGKILL));
        assert_eq!(parse_signal("9"), Ok(9));
        assert!(parse_signal("0").is_err());
        assert!(parse_signal("SIGBOGUS").is_err());
    }

    #[test]
    fn a_container_that_is_not_there() {
        let root = std::env::temp_dir().join(format!("mvm-oci-none-{}", std::process::id()));
        assert_eq!(
            start(&root, "nope").unwrap_err(),
            "container nope does not exist"
        );
        assert!(kill(&root, "nope", "TERM").is_err());
        assert!(delete(&root, "nope", false).is_err());
        assert_eq!(delete(&root, "nope", true), Ok(()));
        assert!(find(&root, "../x").is_err());
    }
}
