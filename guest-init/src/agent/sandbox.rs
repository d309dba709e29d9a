//! The agent of a named sandbox (`mvm create`): the machine outlives each
//! command, so PID 1 keeps the listener and serves one connection per
//! command, each in a process of its own forked for it. The first request
//! sets the machine up; its argv may be empty (the supervisor's: nothing
//! to run, the `Exit` only says the guest serves). A first request with a
//! command (`mvm run --serve-exec`, an OCI container's process) makes that
//! command the machine's main one: its end is announced as `mvm run`'s
//! one command's is, and the VMM stops the machine on its `Exit`, while
//! later connections (`mvm oci exec`) run beside it. A command that
//! crashes, hangs or floods its channel takes only its own handler with
//! it; PID 1 only accepts, forks and reaps.
//!
//! The machine ends when the host sends `Shutdown` on a connection of its
//! own, or when root in the guest asks init to power off (busybox
//! `poweroff`, `reboot`): every process gets SIGTERM, then SIGKILL after a
//! grace period, the filesystems are synced, and init reports status 0.
//!
//! Guest-only (PID 1, fork, AF_VSOCK); the e2e suite's sandbox tests run
//! every path here.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use mvm_protocol::{ExecRequest, Exit, Message};

use super::fd::FdStream;
use super::handshake::Asked;
use super::signals::{self, ChildSignals};
use super::{fd, finish, greet, prepare_machine, run_command, vsock, Last};
use crate::{power, say};

/// How often PID 1 looks for a power request while nothing else happens
/// (a signal that lands between the check and `poll` waits this long).
const POWER_CHECK: Duration = Duration::from_millis(500);
/// How long the commands get between SIGTERM and SIGKILL at shutdown.
const TERM_GRACE: Duration = Duration::from_secs(3);

/// Sets the machine up for `first`, runs it like any later command, then
/// serves connections until the machine is asked to end. Returns the
/// status for the status port: 0 after a clean shutdown.
pub fn serve(listener: OwnedFd, first: OwnedFd, request: ExecRequest) -> u32 {
    if let Err(message) = prepare_machine(&request) {
        return super::fail(first, message);
    }
    if let Err(e) = power::install() {
        say!("warning: poweroff/reboot requests will be ignored: {e}");
    }
    let children = match signals::setup() {
        Ok(children) => children,
        Err(err) => {
            let message = format!("cannot watch for the commands' exits: {err}");
            return super::fail(first, message);
        }
    };
    say!("sandbox ready: serving commands");
    if request.argv.is_empty() {
        // Set up and nothing to run: the host's sign that it may go on.
        let mut stream = FdStream(first);
        let _ = Message::Exit(Exit::exited(0)).encode(&mut stream);
        finish::close(stream.0.as_fd());
    } else {
        fork_handler(first, Some(&request), &listener, &children);
    }
    drop(request);
    while power::requested().is_none() {
        let mut fds = [pollin(listener.as_fd()), pollin(children.fd().as_fd())];
        match fd::poll(&mut fds, Some(POWER_CHECK)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                say!("exec agent: poll: {e}; ending the sandbox");
                break;
            }
        }
        if fds[1].revents != 0 {
            children.drain();
            signals::reap(0);
        }
        if fds[0].revents != 0 {
            match vsock::accept(listener.as_fd()) {
                Ok(conn) => fork_handler(conn, None, &listener, &children),
                Err(e) => say!("exec agent: accept: {e}"),
            }
        }
    }
    drop(listener);
    end_every_process();
    0
}

fn pollin(fd: BorrowedFd) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Serves `conn` in a child process; PID 1 goes on at once. With
/// `request`, the first command (already read, the machine set up), the
/// machine's main one; without, the child reads the connection's own
/// request.
fn fork_handler(
    conn: OwnedFd,
    request: Option<&ExecRequest>,
    listener: &OwnedFd,
    children: &ChildSignals,
) {
    // SAFETY: PID 1 is single-threaded (the egress forwarder is a process
    // of its own); the child only runs the agent's own code and exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        say!("exec agent: fork: {}", io::Error::last_os_error());
        return; // `conn` closes: the host sees the channel drop.
    }
    if pid > 0 {
        return; // PID 1's copy of `conn` closes here.
    }
    // The child accepts nothing and reaps only its own command.
    // SAFETY: closing fds this process owns a copy of; never used again.
    unsafe {
        libc::close(listener.as_raw_fd());
        libc::close(children.fd().as_raw_fd());
    }
    match request {
        Some(request) => {
            run_command(conn, request, Last::Yes);
        }
        None => serve_connection(conn),
    }
    // SAFETY: ends the forked child without running PID 1's exit paths.
    unsafe { libc::_exit(0) }
}

/// A later connection: a command, or the host's request to end.
fn serve_connection(conn: OwnedFd) {
    let (conn, asked) = match greet(conn) {
        Ok(greeted) => greeted,
        Err(_) => return,
    };
    match asked {
        Asked::Exec(request) if request.setup.is_some() || request.keep_serving => {
            super::fail(
                conn,
                "this sandbox is already set up: a command's request must not carry a setup".into(),
            );
        }
        Asked::Exec(request) => {
            run_command(conn, &request, Last::No);
        }
        Asked::Shutdown => {
            // PID 1 takes it as any power request.
            // SAFETY: plain syscall; PID 1 handles SIGUSR2 (power::install).
            unsafe { libc::kill(1, libc::SIGUSR2) };
            finish::close(conn.as_fd());
        }
    }
}

/// SIGTERM to every process but init, SIGKILL to whatever is left after
/// the grace period, every child reaped, the filesystems synced.
fn end_every_process() {
    say!("sandbox ending: stopping every process");
    // SAFETY: plain syscall; -1 is every process PID 1 may signal but itself.
    unsafe { libc::kill(-1, libc::SIGTERM) };
    let deadline = Instant::now() + TERM_GRACE;
    while Instant::now() < deadline && reap_any() {
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    while reap_any() {
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: plain syscall.
    unsafe { libc::sync() };
}

/// Reaps what has exited; whether any child is left.
fn reap_any() -> bool {
    loop {
        let mut raw = 0;
        // SAFETY: raw is a valid out-pointer for the call's duration.
        match unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) } {
            0 => return true,
            -1 => return io::Error::last_os_error().raw_os_error() == Some(libc::EINTR),
            _ => {}
        }
    }
}
