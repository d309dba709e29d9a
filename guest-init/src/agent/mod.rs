//! The exec agent (`mvm.agent=1`): instead of running `mvm.cmd`, PID 1
//! serves the exec channel (docs/protocol.md, version 2) on vsock port
//! `AGENT_PORT`. For `mvm run`, one connection: hello, one `Exec`, the
//! relay until the command's `Exit`, and the status to report on the
//! status port. For a named sandbox (an `Exec` with `keep_serving`), one
//! connection per command for as long as the host wants (`sandbox.rs`).
//!
//! The sequence here is guest-only (PID 1, AF_VSOCK); the pieces with logic
//! of their own are unit-tested in their modules, and `tests/relay.rs` runs
//! the spawn and relay against real processes on the host.

mod account;
pub mod child;
pub mod drain;
pub mod fd;
pub mod finish;
pub mod handshake;
pub mod inbound;
pub mod kernel_log;
pub mod phases;
pub mod pty;
pub mod queue;
pub mod relay;
pub mod request;
mod sandbox;
pub mod setup;
pub mod signals;
pub mod vsock;

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use mvm_protocol::{ErrorReport, ExecRequest, Exit, Message, AGENT_PORT};

use self::fd::FdStream;
use self::handshake::Asked;
use self::kernel_log::KernelLog;
use self::relay::{Relay, RelayError};
use crate::status::{HOST_GONE, INIT_FAILURE};
use crate::vmm_port::Ports;
use crate::{say, shutdown};

/// Failures before there is a connection to report them on; init reports
/// them on the console and as status 125.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("exec agent: listen on vsock port {AGENT_PORT}: {0}")]
    Listen(#[source] io::Error),
    #[error("exec agent: accept on vsock port {AGENT_PORT}: {0}")]
    Accept(#[source] io::Error),
}

/// The agent's listening socket. init makes it before it says it is
/// ready, so that a guest restored from a template (taken at that point,
/// docs/snapshots.md) is listening already and the host's first
/// connection is taken, not refused while the socket is being made.
pub fn listen() -> Result<OwnedFd, AgentError> {
    vsock::listen(AGENT_PORT).map_err(AgentError::Listen)
}

/// Serves the first connection on `listener` ([`listen`]), and with
/// `keep_serving` every later one; returns the status for the status port.
/// `ports` (where init has them) carry the marker that the machine is set
/// up for its one command.
pub fn run(listener: OwnedFd, ports: Option<&Ports>) -> Result<u32, AgentError> {
    let (conn, asked) = loop {
        let conn = vsock::accept(listener.as_fd()).map_err(AgentError::Accept)?;
        match greet(conn) {
            // The machine's own request carries its setup and comes first:
            // a command that joins the machine (`mvm oci exec` on a
            // `--serve-exec` run) and reached the agent before it would
            // otherwise become the machine's one command.
            Ok((conn, Asked::Exec(request))) if request.setup.is_none() => {
                fail(conn, NOT_SET_UP.into());
            }
            Ok(greeted) => break greeted,
            // A connection that was waiting when the template was taken,
            // reset by the restore: the host's own is next.
            Err(Greeting::NoHost) => continue,
            Err(Greeting::Failed(status)) => return Ok(status),
        }
    };
    match asked {
        Asked::Exec(request) if request.keep_serving => Ok(sandbox::serve(listener, conn, request)),
        Asked::Exec(request) => {
            // One command per boot: closing the listener refuses any other.
            drop(listener);
            if let Err(message) = prepare_machine(&request) {
                return Ok(fail(conn, message));
            }
            if let Some(ports) = ports {
                ports.machine_set_up_marker();
            }
            Ok(run_command(conn, &request, Last::Yes))
        }
        Asked::Shutdown => {
            finish::close(conn.as_fd());
            Ok(0)
        }
    }
}

/// The answer to a command that joins the machine before its own run.
const NOT_SET_UP: &str =
    "this machine is not set up yet (its own run has not started): try again in a moment";

/// Why a connection brought no request.
enum Greeting {
    /// Nobody was there ([`handshake::HandshakeError::NoHost`]).
    NoHost,
    /// Told to the host when it is still there; the status for the
    /// status port.
    Failed(u32),
}

/// The hello and the request. Never fails: a problem is told to the host
/// (when it is still there) and becomes the status in `Err`.
fn greet(conn: OwnedFd) -> Result<(OwnedFd, Asked), Greeting> {
    let mut stream = FdStream(conn);
    if let Err(err) = handshake::hello(&mut stream) {
        if let handshake::HandshakeError::NoHost(_) = err {
            say!("exec agent: {err}; waiting for the next connection");
            return Err(Greeting::NoHost);
        }
        say!("exec agent: {err}");
        if err.tell_host() {
            let message = Message::Error(ErrorReport {
                message: err.to_string(),
            });
            let _ = message.encode(&mut stream);
        }
        finish::close(stream.0.as_fd());
        return Err(Greeting::Failed(INIT_FAILURE));
    }
    match handshake::read_exec(&mut stream) {
        Ok(asked) => {
            phases::begin();
            Ok((stream.0, asked))
        }
        Err(err) => Err(Greeting::Failed(fail(stream.0, err.to_string()))),
    }
}

/// Says `message` on the console and to the host; status 125.
fn fail(conn: OwnedFd, message: String) -> u32 {
    say!("exec agent: {message}");
    finish::fail(conn, message, INIT_FAILURE as u8)
}

/// What the machine needs once, before its first command: the root and
/// shares (the rest of a request lives in them), and the egress forwarder
/// (before the command, so that its proxy is there from its first step).
fn prepare_machine(request: &ExecRequest) -> Result<(), String> {
    if let Some(setup) = &request.setup {
        setup::apply(setup).map_err(|err| format!("cannot set up the machine: {err}"))?;
    }
    if request.egress {
        crate::forwarder::start()
            .map_err(|err| format!("cannot start the egress forwarder: {err}"))?;
        phases::mark("egress forwarder started");
    }
    Ok(())
}

/// Whether a command is the machine's last: `mvm run`'s one command (or
/// with `--serve-exec` its main one, served by a sandbox's agent), on
/// whose `Exit` the VMM stops the machine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Last {
    Yes,
    No,
}

/// Runs the request's command to its end; returns the status for the
/// status port.
fn run_command(conn: OwnedFd, request: &ExecRequest, last: Last) -> u32 {
    let mut prepared = match request::prepare(request) {
        Ok(prepared) => prepared,
        Err(err) => return fail(conn, format!("bad exec request: {err}")),
    };
    // The root's users: --user looked up, the caller given an entry.
    if let Err(err) = account::apply(request, &mut prepared) {
        return fail(conn, err);
    }
    phases::mark("command prepared (its user and files looked up)");
    if prepared.tty {
        // A failure shows up as the pty failing to open, with its reason.
        let _ = pty::ensure_ptmx();
    }
    let signals = match signals::setup() {
        Ok(signals) => signals,
        Err(err) => return fail(conn, format!("cannot watch for the command's exit: {err}")),
    };
    // Before the command can fill the memory: its OOM kill is logged
    // after this mark.
    let mut kernel_log = KernelLog::mark();
    let child = match child::spawn(&prepared) {
        Ok(child) => child,
        Err(err) => return fail(conn, err.to_string()),
    };
    phases::mark("command started");
    let pid = child.pid;
    let first = child.failure_reports(&prepared);
    let mut before_exit = move |exit: &mut Exit| {
        phases::mark("command exited");
        exit.oom_kill = kernel_log.oom_kill_since()
            || (exit.signal == Some(libc::SIGKILL) && {
                // The killer logs right after it sends SIGKILL; on another
                // vCPU that can trail the victim's end by a moment.
                std::thread::sleep(std::time::Duration::from_millis(50));
                kernel_log.oom_kill_since()
            });
        // The VMM stops the machine when the last command's `Exit`
        // arrives: the status line and every write of the command's must
        // be out before it.
        if last == Last::Yes {
            shutdown::announce(exit.status.into());
            phases::mark("status announced, file systems synced");
        }
        exit.guest_phases = phases::take();
    };
    let outcome = fd::set_nonblocking(conn.as_fd())
        .and_then(|()| Relay::new(conn.as_fd(), &signals, child, &first))
        .map(|relay| relay.before_exit(&mut before_exit))
        .map_err(RelayError::Setup)
        .and_then(|mut relay| relay.run());
    match outcome {
        Ok(exit) => {
            finish::close(conn.as_fd());
            exit.status.into()
        }
        Err(err) => {
            // The command must not outlive its host: nobody would see its
            // output or its end.
            say!("exec agent: {err}; killing the command");
            kill_group(pid);
            match err {
                RelayError::HostClosed | RelayError::HostGone(_) => HOST_GONE,
                RelayError::Setup(_) | RelayError::Poll(_) => fail(conn, err.to_string()),
            }
        }
    }
}

fn kill_group(pid: libc::pid_t) {
    // SAFETY: plain syscalls; the group (or the process) may be gone.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}
