//! virtiofsd, the virtio-fs backend, as a helper process: one per shared
//! directory, started before the VM is built and gone when `mvm run` ends.
//!
//! The VMM binds the vhost-user socket itself and hands virtiofsd the
//! listening fd (`--fd`), so the VMM can connect at once instead of waiting
//! for a socket file to appear. virtiofsd runs with its own sandbox on
//! (`--sandbox=namespace`: a new mount, pid and net namespace with the
//! shared directory as its root, and as an unprivileged caller a user
//! namespace too; seccomp in kill mode), refuses writes itself for a
//! read-only share (`--readonly`), and creates every file as the caller:
//! whatever uid the guest asks for is squashed to the caller's uid and gid.
//!
//! mvm also puts a seccomp filter on it before exec
//! (`virtiofsd_filter.rs`): no setuid or setgid file can appear on the
//! host through a share.
//!
//! Lifetime: virtiofsd serves one connection and exits when the VMM's end
//! closes. Beyond that it is in a process group of its own (a Ctrl-C at the
//! terminal is mvm's to handle), gets SIGKILL if mvm dies
//! (PR_SET_PDEATHSIG), and dropping a [`Virtiofsd`] kills the whole group,
//! the sandboxed child included, and reaps it.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::helper_log::{self, LogPump};

/// The fd number the listening socket has in virtiofsd.
const SOCKET_FD: RawFd = 3;
/// Every uid and gid the guest can name (virtiofsd's count is a u32 range
/// starting at 0, so the largest count is 2^32 - 1).
const ALL_IDS: &str = "4294967295";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the virtio-fs socket {0}: {1}")]
    Socket(String, io::Error),
    #[error("cannot create the virtiofsd log {0}: {1}")]
    Log(String, io::Error),
    #[error(
        "cannot start virtiofsd ({0}): {1}: run 'make', or pass --virtiofsd PATH or --no-workspace"
    )]
    Spawn(String, io::Error),
    #[error("cannot build virtiofsd's set-user-ID filter: {0}")]
    Filter(String),
}

/// What one virtiofsd serves and where it talks.
pub struct Request<'a> {
    pub binary: &'a Path,
    /// The shared directory, open: virtiofsd starts in it and serves `.`,
    /// so the directory is never looked up by name again.
    pub shared_dir: &'a OwnedFd,
    pub read_only: bool,
    /// Keep the files the host runs later read-only in this writable
    /// share: mvm's virtiofsd's `--guard` (virtiofsd/src/guard.rs).
    pub guard: bool,
    /// Let the guest cache this share's entries, attributes and pages
    /// for as long as it runs (`--cache=always`) instead of a second
    /// (`auto`): only for a read-only share whose guest will not be
    /// asked to see the host's later edits (docs/architecture.md).
    pub cache_always: bool,
    /// Created here; must not exist yet.
    pub socket: &'a Path,
    /// virtiofsd's stderr, capped (helper_log.rs).
    pub log: &'a Path,
    /// Who owns what the guest creates.
    pub uid: u32,
    pub gid: u32,
    /// Who the command is in the guest: the caller's files are shown as
    /// this user's, so the command owns what the caller owns.
    pub guest_uid: u32,
    pub guest_gid: u32,
}

pub struct Virtiofsd {
    child: Child,
    log: PathBuf,
    /// Copies its stderr into `log`, capped; handed to the machine's event
    /// loop once there is one ([`Virtiofsd::take_log_pump`]).
    pump: Option<LogPump>,
}

/// The arguments virtiofsd gets, apart from the binary.
pub fn arguments(req: &Request) -> Vec<String> {
    let mut args = vec![
        format!("--fd={SOCKET_FD}"),
        // The working directory virtiofsd starts in: the open share.
        "--shared-dir=.".into(),
        "--sandbox=namespace".into(),
        "--seccomp=kill".into(),
        // Without CAP_MKNOD a guest (even one whose uids map to root) cannot
        // make device nodes on the host; FIFOs and sockets need no
        // capability and still work.
        "--modcaps=-mknod".into(),
        "--log-level=error".into(),
        // Guest uids map to the caller, whatever they are, so everything
        // the guest creates is the caller's.
        format!("--translate-uid=squash-guest:0:{}:{ALL_IDS}", req.uid),
        format!("--translate-gid=squash-guest:0:{}:{ALL_IDS}", req.gid),
    ];
    // The other way, the caller's files are shown as the command's (other
    // owners as they are), when the two differ (a root caller's command
    // runs unprivileged).
    if req.guest_uid != req.uid {
        args.push(format!(
            "--translate-uid=host:{}:{}:1",
            req.uid, req.guest_uid
        ));
    }
    if req.guest_gid != req.gid {
        args.push(format!(
            "--translate-gid=host:{}:{}:1",
            req.gid, req.guest_gid
        ));
    }
    if req.read_only {
        args.push("--readonly".into());
    } else if req.guard {
        args.push("--guard".into());
    }
    if req.cache_always {
        args.push("--cache=always".into());
    }
    args
}

pub fn spawn(req: &Request) -> Result<Virtiofsd, Error> {
    let listener = UnixListener::bind(req.socket)
        .map_err(|e| Error::Socket(req.socket.display().to_string(), e))?;
    let log = File::create(req.log).map_err(|e| Error::Log(req.log.display().to_string(), e))?;
    let (stderr, pump) =
        helper_log::pipe(log).map_err(|e| Error::Log(req.log.display().to_string(), e))?;
    let listen_fd = listener.as_raw_fd();
    let dir_fd = req.shared_dir.as_raw_fd();
    // Built here: the child between fork and exec only applies them.
    let filters = crate::virtiofsd_filter::programs().map_err(|e| Error::Filter(e.to_string()))?;
    let mut command = Command::new(req.binary);
    command
        .args(arguments(req))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr))
        .env_clear();
    // SAFETY: the closure runs in the forked child before exec and only
    // makes system calls (dup2, fcntl, setpgid, prctl, getppid, seccomp);
    // the filters were built before the fork.
    unsafe {
        let parent = std::process::id() as libc::pid_t;
        command.pre_exec(move || {
            child_setup(listen_fd, dir_fd, parent)?;
            for filter in &filters {
                seccompiler::apply_filter(filter).map_err(|e| io::Error::other(e.to_string()))?;
            }
            Ok(())
        });
    }
    let child = command
        .spawn()
        .map_err(|e| Error::Spawn(req.binary.display().to_string(), e))?;
    // virtiofsd has its copy; ours would only keep the socket alive.
    drop(listener);
    Ok(Virtiofsd {
        child,
        log: req.log.to_owned(),
        pump: Some(pump),
    })
}

/// In the child, before exec: the shared directory as the working
/// directory, the socket on fd 3 (inheritable), a process group of its
/// own, and death with the parent.
fn child_setup(listen_fd: RawFd, dir_fd: RawFd, parent: libc::pid_t) -> io::Result<()> {
    let check = |ret: libc::c_int| {
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: plain syscalls on fds and ids this process owns.
    unsafe {
        check(libc::fchdir(dir_fd))?;
        if listen_fd == SOCKET_FD {
            // dup2 onto itself keeps FD_CLOEXEC; clear it by hand.
            check(libc::fcntl(SOCKET_FD, libc::F_SETFD, 0))?;
        } else {
            check(libc::dup2(listen_fd, SOCKET_FD))?;
        }
    }
    crate::helper_process::own_group_and_die_with(parent)
}

impl Virtiofsd {
    /// Its process group (its pid: `setpgid(0, 0)` in `child_setup`), the
    /// one the VMM kills at the end.
    pub fn process_group(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// The pump of its log, for the machine's event loop.
    pub fn take_log_pump(&mut self) -> Option<LogPump> {
        self.pump.take()
    }

    /// If virtiofsd has exited: how (its last log line, or its status).
    pub fn exit_report(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok().flatten()?;
        if let Some(pump) = &mut self.pump {
            pump.drain();
        }
        let lines: Vec<String> = File::open(&self.log)
            .map(|f| BufReader::new(f).lines().map_while(Result::ok).collect())
            .unwrap_or_default();
        Some(exit_message(&status.to_string(), &lines))
    }
}

/// How a virtiofsd that exited is reported: its last log line, or, for a
/// virtiofsd that is not mvm's (a `--virtiofsd` of another build refuses
/// `--guard`), what to do about it.
fn exit_message(status: &str, log: &[String]) -> String {
    if log
        .iter()
        .any(|l| l.contains("unexpected argument '--guard'"))
    {
        return format!(
            "virtiofsd exited ({status}): it is not mvm's own virtiofsd, which a writable share needs to keep the files the host runs later read-only (--guard): use mvm's (run 'make'; ../libexec/mvm/virtiofsd next to mvm), or pass --write-hooks"
        );
    }
    match log.iter().rev().find(|l| !l.trim().is_empty()) {
        Some(line) => format!("virtiofsd exited ({status}): {}", line.trim()),
        None => format!("virtiofsd exited ({status})"),
    }
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        crate::helper_process::end_group(&mut self.child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> OwnedFd {
        File::open("/").unwrap().into()
    }

    fn request(read_only: bool) -> Vec<String> {
        guarded(read_only, false)
    }

    fn guarded(read_only: bool, guard: bool) -> Vec<String> {
        cached(read_only, guard, false)
    }

    fn cached(read_only: bool, guard: bool, cache_always: bool) -> Vec<String> {
        arguments(&Request {
            binary: Path::new("virtiofsd"),
            shared_dir: &dir(),
            read_only,
            guard,
            cache_always,
            socket: Path::new("/run/fs.sock"),
            log: Path::new("/run/fs.log"),
            uid: 1000,
            gid: 100,
            guest_uid: 1000,
            guest_gid: 100,
        })
    }

    #[test]
    fn read_only_and_sandbox_are_always_asked_for() {
        let ro = request(true);
        assert!(ro.contains(&"--readonly".to_string()));
        assert!(ro.contains(&"--sandbox=namespace".to_string()));
        assert!(ro.contains(&"--seccomp=kill".to_string()));
        assert!(ro.contains(&"--modcaps=-mknod".to_string()));
        assert!(
            ro.contains(&"--shared-dir=.".to_string()),
            "served from its open directory"
        );
        assert!(!request(false).contains(&"--readonly".to_string()));
    }

    #[test]
    fn another_virtiofsd_refusing_the_guard_is_named_with_the_fix() {
        let stock: Vec<String> = [
            "error: unexpected argument '--guard' found",
            "",
            "For more information, try '--help'.",
        ]
        .map(String::from)
        .to_vec();
        let said = exit_message("exit status: 2", &stock);
        assert!(
            said.contains("not mvm's own virtiofsd") && said.contains("--write-hooks"),
            "{said}"
        );
        let other = [
            "[ERROR] cannot enter the sandbox".to_string(),
            String::new(),
        ];
        assert_eq!(
            exit_message("exit status: 1", &other),
            "virtiofsd exited (exit status: 1): [ERROR] cannot enter the sandbox"
        );
        assert_eq!(
            exit_message("signal: 9", &[]),
            "virtiofsd exited (signal: 9)"
        );
    }

    #[test]
    fn only_a_share_asked_to_cache_caches_for_its_whole_run() {
        let always = "--cache=always".to_string();
        assert!(cached(true, false, true).contains(&always));
        assert!(!cached(true, false, false).contains(&always));
        assert!(!request(false).iter().any(|a| a.starts_with("--cache")));
    }

    #[test]
    fn a_guarded_share_asks_for_the_guard() {
        let guard = "--guard".to_string();
        assert!(guarded(false, true).contains(&guard));
        assert!(!guarded(false, false).contains(&guard));
        // A read-only share needs none: nothing in it changes.
        let ro = guarded(true, true);
        assert!(ro.contains(&"--readonly".to_string()) && !ro.contains(&guard));
    }

    #[test]
    fn guest_ids_are_squashed_to_the_caller() {
        let args = request(false);
        assert!(args.contains(&"--translate-uid=squash-guest:0:1000:4294967295".to_string()));
        assert!(args.contains(&"--translate-gid=squash-guest:0:100:4294967295".to_string()));
        assert!(!args.iter().any(|a| a.contains("=host:")), "{args:?}");
        let root_caller = arguments(&Request {
            binary: Path::new("virtiofsd"),
            shared_dir: &dir(),
            read_only: false,
            guard: false,
            cache_always: false,
            socket: Path::new("/run/fs.sock"),
            log: Path::new("/run/fs.log"),
            uid: 0,
            gid: 0,
            guest_uid: 1000,
            guest_gid: 1000,
        });
        assert!(root_caller.contains(&"--translate-uid=host:0:1000:1".to_string()));
        assert!(root_caller.contains(&"--translate-gid=host:0:1000:1".to_string()));
    }
}
