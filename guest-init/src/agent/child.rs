//! Starting the requested command: fork, then in the child set up stdio
//! (three pipes or a pseudo-terminal), the user, limits and directory, and
//! exec. A setup step that fails sends (step, errno) through a close-on-exec
//! pipe, which the parent turns into the `Error` message; exec succeeding
//! closes that pipe empty.
//!
//! Forking and exec'ing as PID 1 are guest-only; `Failure` (what the parent
//! reports) is pure and unit-tested. The relay's host test drives `spawn`
//! for real where it can run as root.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::ptr;

use super::fd::{self, check};
use mvm_protocol::{ErrorReport, Message};

use super::request::Prepared;
use super::{pty, signals};
use crate::errno::strerror;
use crate::status::{EXEC_FAILED, EXEC_NOT_FOUND, INIT_FAILURE};

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot create the command's pipes: {0}")]
    Pipe(#[source] io::Error),
    #[error("cannot create the command's terminal: {0}")]
    Pty(#[source] io::Error),
    #[error("fork: {0}")]
    Fork(#[source] io::Error),
}

/// The parent's ends of the command's stdio, all non-blocking.
pub enum ChildIo {
    Pipes {
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
    /// The pty master: the command's stdin, stdout and stderr at once.
    Pty { master: OwnedFd },
}

pub struct Child {
    /// Also the process group id: the child is a session leader.
    pub pid: libc::pid_t,
    pub io: ChildIo,
    /// Set when a setup step or exec failed; the child exits with its status.
    pub failure: Option<Failure>,
}

impl Child {
    /// The `Error` frame for a command that could not start (sent before
    /// anything else), or none.
    pub fn failure_reports(&self, prepared: &Prepared) -> Vec<Message> {
        self.failure
            .map(|f| {
                Message::Error(ErrorReport {
                    message: f.message(prepared),
                })
            })
            .into_iter()
            .collect()
    }
}

/// The setup step that failed in the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    Stdio = 1,
    Home = 2,
    Limit = 3,
    Groups = 4,
    Gid = 5,
    Uid = 6,
    Chdir = 7,
    NoNewPrivs = 8,
    Exec = 9,
    Ports = 10,
}

const STEPS: [Step; 10] = [
    Step::Stdio,
    Step::Home,
    Step::Limit,
    Step::Groups,
    Step::Gid,
    Step::Uid,
    Step::Chdir,
    Step::NoNewPrivs,
    Step::Exec,
    Step::Ports,
];

/// What the child reports through the error pipe: step byte + errno (LE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub step: Step,
    pub errno: i32,
}

const REPORT_LEN: usize = 5;

impl Failure {
    fn to_bytes(self) -> [u8; REPORT_LEN] {
        let e = self.errno.to_le_bytes();
        [self.step as u8, e[0], e[1], e[2], e[3]]
    }

    /// Parses a report; `None` for anything malformed.
    pub fn from_bytes(bytes: &[u8]) -> Option<Failure> {
        let [step, e0, e1, e2, e3] = bytes.try_into().ok()?;
        let step = STEPS.into_iter().find(|s| *s as u8 == step)?;
        Some(Failure {
            step,
            errno: i32::from_le_bytes([e0, e1, e2, e3]),
        })
    }

    /// The status the child exits with: 127 command not found, 126 found
    /// but not executable, 125 anything before exec.
    pub fn status(self) -> i32 {
        match (self.step, self.errno) {
            (Step::Exec, libc::ENOENT) => EXEC_NOT_FOUND,
            (Step::Exec, _) => EXEC_FAILED,
            _ => INIT_FAILURE as i32,
        }
    }

    /// The message for the host's user.
    pub fn message(self, prep: &Prepared) -> String {
        let why = strerror(self.errno);
        let lossy = |s: &CStr| s.to_string_lossy().into_owned();
        let argv0 = prep.argv.first().map(|a| lossy(a)).unwrap_or_default();
        match self.step {
            Step::Exec => format!("cannot run '{argv0}': {why}"),
            Step::Chdir => format!("cannot change to directory '{}': {why}", lossy(&prep.cwd)),
            Step::Home => format!(
                "cannot create home directory '{}': {why}",
                lossy(&prep.home)
            ),
            Step::Stdio => format!("cannot set up the command's stdio: {why}"),
            Step::Limit => format!("cannot limit processes to {}: {why}", prep.max_procs),
            Step::Groups => format!("cannot clear supplementary groups: {why}"),
            Step::Gid => format!("cannot switch to group {}: {why}", prep.gid),
            Step::Uid => format!("cannot switch to user {}: {why}", prep.uid),
            Step::NoNewPrivs => format!("cannot set no_new_privs: {why}"),
            Step::Ports => format!("cannot give up the VMM's I/O ports: {why}"),
        }
    }
}

/// Starts the command. Returns once the child has exec'd or failed.
/// SIGCHLD must already be blocked (`signals::setup`).
pub fn spawn(prep: &Prepared) -> Result<Child, SpawnError> {
    let stdio = Stdio::new(prep)?;
    let (report_r, report_w) = fd::pipe().map_err(SpawnError::Pipe)?;
    // Built before fork so the child allocates only in setenv.
    let mut argv: Vec<*const libc::c_char> = prep.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(ptr::null());

    // SAFETY: the agent is single-threaded, so the child is a full copy
    // with no locks held by other threads; it only runs `child_main`,
    // which never returns.
    let pid = match unsafe { libc::fork() } {
        -1 => return Err(SpawnError::Fork(io::Error::last_os_error())),
        0 => child_main(prep, &stdio, &argv, report_w.as_raw_fd()),
        pid => pid,
    };
    // Our copies of the child's ends must go, or EOF never comes.
    drop(report_w);
    let io = stdio.into_parent_ends().map_err(SpawnError::Pipe)?;
    let failure = read_report(report_r);
    Ok(Child { pid, io, failure })
}

/// Both ends of the command's stdio until the fork.
enum Stdio {
    Pipes {
        stdin: (OwnedFd, OwnedFd),
        stdout: (OwnedFd, OwnedFd),
        stderr: (OwnedFd, OwnedFd),
    },
    Pty(pty::Pty),
}

impl Stdio {
    fn new(prep: &Prepared) -> Result<Stdio, SpawnError> {
        if prep.tty {
            let pty = pty::open(prep.rows, prep.cols).map_err(SpawnError::Pty)?;
            return Ok(Stdio::Pty(pty));
        }
        let pipe = || fd::pipe().map_err(SpawnError::Pipe);
        Ok(Stdio::Pipes {
            stdin: pipe()?,
            stdout: pipe()?,
            stderr: pipe()?,
        })
    }

    /// The child's three fds (0, 1, 2 to be).
    fn child_ends(&self) -> [RawFd; 3] {
        match self {
            Stdio::Pipes {
                stdin,
                stdout,
                stderr,
            } => [
                stdin.0.as_raw_fd(),
                stdout.1.as_raw_fd(),
                stderr.1.as_raw_fd(),
            ],
            Stdio::Pty(pty) => [pty.slave.as_raw_fd(); 3],
        }
    }

    /// Keeps the parent's ends (non-blocking) and closes the child's.
    fn into_parent_ends(self) -> io::Result<ChildIo> {
        let io = match self {
            Stdio::Pipes {
                stdin,
                stdout,
                stderr,
            } => ChildIo::Pipes {
                stdin: stdin.1,
                stdout: stdout.0,
                stderr: stderr.0,
            },
            Stdio::Pty(pty) => ChildIo::Pty { master: pty.master },
        };
        match &io {
            ChildIo::Pipes {
                stdin,
                stdout,
                stderr,
            } => {
                for fd in [stdin, stdout, stderr] {
                    fd::set_nonblocking(fd.as_fd())?;
                }
            }
            ChildIo::Pty { master } => fd::set_nonblocking(master.as_fd())?,
        }
        Ok(io)
    }
}

/// Blocks until the child execs (the pipe closes empty) or reports.
fn read_report(report: OwnedFd) -> Option<Failure> {
    let mut buf = [0u8; REPORT_LEN];
    let mut got = 0;
    while got < REPORT_LEN {
        match fd::read(report.as_fd(), &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    Failure::from_bytes(&buf[..got])
}

/// The child between fork and exec: only syscalls and libc calls, and on
/// any failure a report and `_exit`, never a return or a panic.
fn child_main(prep: &Prepared, stdio: &Stdio, argv: &[*const libc::c_char], report: RawFd) -> ! {
    signals::reset_in_child();
    let failure = match setup(prep, stdio) {
        Err(failure) => failure,
        Ok(()) => {
            // SAFETY: argv is a NULL-terminated array of pointers to live
            // CStrings; execvp only returns on failure.
            unsafe { libc::execvp(argv[0], argv.as_ptr()) };
            fail(Step::Exec)
        }
    };
    let bytes = failure.to_bytes();
    // SAFETY: writes our own buffer to the report pipe, then exits without
    // running the parent's atexit handlers or flushing its stdio copies.
    unsafe {
        libc::write(report, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(failure.status())
    }
}

/// The failure of `step`, with the errno the last call left.
fn fail(step: Step) -> Failure {
    Failure {
        step,
        errno: io::Error::last_os_error().raw_os_error().unwrap_or(0),
    }
}

/// Maps a libc result of -1 to a failure of `step`.
fn step(step: Step, rc: libc::c_int) -> Result<(), Failure> {
    check(rc).map(drop).map_err(|e| Failure {
        step,
        errno: e.raw_os_error().unwrap_or(0),
    })
}

/// Everything between fork and exec, in the order that keeps each step
/// possible: stdio and the home directory need root; the process limit
/// must be set before setuid drops the right to raise it; chdir runs as the
/// user, so the user's permissions apply to it.
fn setup(prep: &Prepared, stdio: &Stdio) -> Result<(), Failure> {
    // SAFETY: plain syscalls and libc calls in the child of a
    // single-threaded process, on fds it owns and C strings that outlive
    // the calls.
    unsafe {
        // PID 1's access to the status port survives fork, setuid and exec:
        // with it the command could write its own exit status (or a boot
        // marker) to the VMM. Dropping it needs no privilege.
        step(Step::Ports, crate::vmm_port::revoke())?;
        // A session of its own: the command's process group is its pid, and
        // a pty can become its controlling terminal.
        step(Step::Stdio, libc::setsid())?;
        if let Stdio::Pty(pty) = stdio {
            pty::make_controlling(pty.slave.as_fd()).map_err(|_| fail(Step::Stdio))?;
        }
        for (target, src) in stdio.child_ends().into_iter().enumerate() {
            fd::dup_onto(src, target as RawFd).map_err(|_| fail(Step::Stdio))?;
        }
        if prep.create_home {
            make_home(prep)?;
        }
        libc::clearenv();
        for (name, value) in &prep.env {
            step(Step::Stdio, libc::setenv(name.as_ptr(), value.as_ptr(), 1))?;
        }
        if prep.max_procs > 0 {
            let limit = libc::rlimit {
                rlim_cur: prep.max_procs,
                rlim_max: prep.max_procs,
            };
            step(Step::Limit, libc::setrlimit(libc::RLIMIT_NPROC, &limit))?;
        }
        step(Step::Groups, libc::setgroups(0, ptr::null()))?;
        step(Step::Gid, libc::setgid(prep.gid))?;
        step(Step::Uid, libc::setuid(prep.uid))?;
        step(Step::Chdir, libc::chdir(prep.cwd.as_ptr()))?;
        step(
            Step::NoNewPrivs,
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0),
        )?;
    }
    Ok(())
}

/// Creates the user's home (still as root) and hands it to the user.
fn make_home(prep: &Prepared) -> Result<(), Failure> {
    let home: &CString = &prep.home;
    // SAFETY: home is a valid C string; plain syscalls.
    unsafe {
        if libc::mkdir(home.as_ptr(), 0o700) == -1
            && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
        {
            return Err(fail(Step::Home));
        }
        step(Step::Home, libc::chown(home.as_ptr(), prep.uid, prep.gid))?;
        step(Step::Home, libc::chmod(home.as_ptr(), 0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::request;
    use mvm_protocol::ExecRequest;

    fn prepared() -> Prepared {
        request::prepare(&ExecRequest {
            argv: vec!["frobnicate".into()],
            env: vec![],
            cwd: "/nope".into(),
            uid: 1000,
            gid: 100,
            tty: false,
            rows: 0,
            cols: 0,
            max_procs: 64,
            user_name: None,
            user: None,
            egress: false,
            setup: None,
            keep_serving: false,
        })
        .unwrap()
    }

    #[test]
    fn report_round_trip() {
        for step in STEPS {
            let f = Failure { step, errno: 1234 };
            assert_eq!(Failure::from_bytes(&f.to_bytes()), Some(f));
        }
        assert_eq!(Failure::from_bytes(&[]), None, "exec succeeded");
        assert_eq!(Failure::from_bytes(&[9, 1, 0]), None, "short");
        assert_eq!(Failure::from_bytes(&[0, 1, 0, 0, 0]), None, "no step 0");
    }

    #[test]
    fn statuses() {
        let f = |step, errno| Failure { step, errno }.status();
        assert_eq!(f(Step::Exec, libc::ENOENT), 127);
        assert_eq!(f(Step::Exec, libc::EACCES), 126);
        assert_eq!(f(Step::Exec, libc::ENOEXEC), 126);
        assert_eq!(f(Step::Chdir, libc::ENOENT), 125);
        assert_eq!(f(Step::Uid, libc::EPERM), 125);
    }

    #[test]
    fn messages() {
        let p = prepared();
        let m = |step, errno| Failure { step, errno }.message(&p);
        assert_eq!(
            m(Step::Exec, libc::ENOENT),
            "cannot run 'frobnicate': No such file or directory"
        );
        assert_eq!(
            m(Step::Exec, libc::EACCES),
            "cannot run 'frobnicate': Permission denied"
        );
        assert_eq!(
            m(Step::Chdir, libc::ENOENT),
            "cannot change to directory '/nope': No such file or directory"
        );
        assert_eq!(
            m(Step::Home, libc::EROFS),
            "cannot create home directory '/run/home': Read-only file system"
        );
        assert_eq!(
            m(Step::Limit, libc::EPERM),
            "cannot limit processes to 64: Operation not permitted"
        );
        assert_eq!(
            m(Step::Uid, libc::EPERM),
            "cannot switch to user 1000: Operation not permitted"
        );
    }
}
