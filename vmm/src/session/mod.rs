//! One `mvm run`: the session directory, the exec client on its own
//! thread, signal forwarding and the user's terminal. The machine itself
//! runs on the caller's thread (`Machine::wait`); this module only talks to the
//! guest agent through the vsock device's Unix socket, and stops the machine
//! only through its stop handle.

pub mod client;
pub mod dir;
pub mod signals;
pub mod terminal;

use crate::confine::{seccomp, ThreadKind};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::machine::{StopHandle, StopReason};
use mvm_devices::virtio::vsock::Dialer;
use mvm_protocol::{ExecRequest, Exit, Message, AGENT_PORT};

pub use dir::SessionDir;
pub use signals::Target;

/// After the exec channel failed, guest-init may still report on the
/// status port and reboot; if it has not within this long, the VMM stops
/// it.
const GUEST_STOP_GRACE: Duration = Duration::from_secs(3);
/// Once the VM has stopped, output still in the socket gets this long to
/// be relayed before the channel is cut.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// The command's exit status, and when it arrived (teardown is measured
/// from there).
pub type Ended = (Exit, Instant);

pub struct Session {
    done: Receiver<Result<Ended, client::Error>>,
    stream: Arc<Mutex<Option<UnixStream>>>,
    /// When the agent took the command (Hello both ways, Exec sent).
    started: Arc<Mutex<Option<Started>>>,
}

/// The command's start, as the session saw it.
#[derive(Clone, Copy)]
struct Started {
    at: Instant,
    /// The guest kernel's clock at guest-init's boot marker, from the
    /// agent's hello.
    guest_init_clock: Option<Duration>,
    /// How many attempts the connection took (1: the agent listened).
    connect_tries: u32,
}

/// Starts the exec client: it waits for the guest agent, sends `request`
/// and relays the command's stdio until it exits. With a `gate`, it first
/// waits for that (the machine is being saved as a template: no
/// connection may exist in it); a gate dropped unopened ends the session.
pub fn start(
    dialer: Dialer,
    request: ExecRequest,
    forward_stdin: bool,
    vm: StopHandle,
    target: Target,
    gate: Option<Receiver<()>>,
) -> std::io::Result<Session> {
    let (tx, done) = mpsc::channel();
    let stream = Arc::new(Mutex::new(None));
    let slot = stream.clone();
    let started = Arc::new(Mutex::new(None));
    let started_slot = started.clone();
    thread::Builder::new()
        .name("mvm-session".into())
        .spawn(move || {
            seccomp::install_or_exit(ThreadKind::Session);
            let opened = gate.is_none_or(|g| g.recv().is_ok());
            let result = if !opened {
                Err(client::Error::VmGone)
            } else {
                exec(
                    &dialer,
                    request,
                    forward_stdin,
                    &vm,
                    &target,
                    &slot,
                    &started_slot,
                )
            };
            match result {
                // guest-init synced before its `Exit` and has nothing more
                // to say: waiting for its reboot would only add the guest
                // kernel's shutdown to the teardown.
                Ok(_) => vm.stop(StopReason::CommandExited),
                // A channel that broke or carried garbage (a guest that
                // misbehaves must not keep the run alive until --timeout):
                // guest-init gets the grace period to report on the status
                // port, then the VM is stopped.
                Err(_) => stop_guest_if_lingering(&vm),
            }
            let _ = tx.send(result);
        })?;
    Ok(Session {
        done,
        stream,
        started,
    })
}

fn exec(
    dialer: &Dialer,
    mut request: ExecRequest,
    forward_stdin: bool,
    vm: &StopHandle,
    target: &Target,
    slot: &Mutex<Option<UnixStream>>,
    started: &Mutex<Option<Started>>,
) -> Result<Ended, client::Error> {
    let (stream, connect_tries) =
        client::connect_dialing_counted(dialer, AGENT_PORT, &|| vm.is_stopped())?;
    // The clock as it is now that the guest listens: a restored guest's
    // stands where its template's stood.
    if let Some(setup) = request.setup.as_mut() {
        setup.wall_clock_ns = wall_clock_ns();
    }
    if let Ok(mut s) = slot.lock() {
        *s = stream.try_clone().ok();
    }
    let writer = Arc::new(Mutex::new(
        stream.try_clone().map_err(client::Error::Write)?,
    ));
    let (mut reader, hello) = client::start(&stream, &writer, request)?;
    if let Ok(mut at) = started.lock() {
        *at = Some(Started {
            at: Instant::now(),
            guest_init_clock: hello.init_started_ns.map(Duration::from_nanos),
            connect_tries,
        });
    }
    if let Ok(mut t) = target.lock() {
        *t = Some(writer.clone());
    }
    let window = Arc::new(client::StdinWindow::default());
    if forward_stdin {
        client::pump_stdin(writer, window.clone());
    } else {
        client::send(&writer, &Message::StdinEof)?;
    }
    let exit = client::relay_output(&mut reader, &window).map(|e| (e, Instant::now()));
    // Closing tells the agent the host has everything (the machine is
    // stopped right after an `Exit`; this matters when none came).
    let _ = stream.shutdown(Shutdown::Both);
    exit
}

/// The host's clock for a setup sent now (a restored guest's clock
/// stands where its template's stood).
pub fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn stop_guest_if_lingering(vm: &StopHandle) {
    let deadline = Instant::now() + GUEST_STOP_GRACE;
    while Instant::now() < deadline {
        if vm.is_stopped() {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
    vm.stop(StopReason::Host);
}

impl Session {
    /// When the guest agent took the command, if it did.
    pub fn command_started(&self) -> Option<Instant> {
        self.started.lock().ok().and_then(|s| *s).map(|s| s.at)
    }

    /// The guest kernel's `CLOCK_BOOTTIME` when guest-init wrote its boot
    /// marker, as the agent said in its hello (a restored guest's is its
    /// template's).
    pub fn guest_init_clock(&self) -> Option<Duration> {
        self.started
            .lock()
            .ok()
            .and_then(|s| *s)
            .and_then(|s| s.guest_init_clock)
    }

    /// How many attempts the connection to the agent took, if it was made.
    pub fn connect_tries(&self) -> Option<u32> {
        self.started
            .lock()
            .ok()
            .and_then(|s| *s)
            .map(|s| s.connect_tries)
    }

    /// Called once the VM has stopped: the command's exit, or why there is
    /// none.
    pub fn finish(self) -> Result<Ended, client::Error> {
        match self.done.recv_timeout(DRAIN_GRACE) {
            Ok(result) => return result,
            Err(RecvTimeoutError::Disconnected) => return Err(client::Error::Lost),
            Err(RecvTimeoutError::Timeout) => {}
        }
        // The guest is gone without a word: unblock the client and collect
        // its (failed) result.
        if let Ok(Some(stream)) = self.stream.lock().as_deref() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        self.done
            .recv_timeout(DRAIN_GRACE)
            .unwrap_or(Err(client::Error::VmGone))
    }
}
