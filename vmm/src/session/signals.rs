//! Signals sent to `mvm run` while a command runs. Ctrl-C (SIGINT) and
//! SIGQUIT are forwarded to the command, which decides what they mean.
//! SIGTERM and SIGHUP are forwarded too, and if the command has not exited
//! within the grace period the VM is destroyed. SIGWINCH becomes a
//! terminal resize. Before the command has started there is nothing to
//! forward to, so any of them ends the run at once.

use crate::confine::{seccomp, ThreadKind};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use mvm_protocol::{Message, Resize, Signal};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGWINCH};
use signal_hook::iterator::Signals;

use super::client::{self, Writer};
use super::terminal;
use crate::machine::{StopHandle, StopReason};

/// How long a command gets to exit after a forwarded SIGTERM or SIGHUP.
pub const TERMINATE_GRACE: Duration = Duration::from_secs(5);

/// Where forwarded signals go once the command runs.
pub type Target = Arc<Mutex<Option<Writer>>>;

/// Ends the VM through `stop` (with the signal as the reason) where a
/// signal cannot be forwarded.
///
/// The frames go out on a thread of their own, in order: a send can block
/// for as long as the guest withholds vsock credit or the stdin pump holds
/// the channel in a long write, and the signal thread must stay free to
/// take the next signal. For SIGTERM and SIGHUP the teardown timer is
/// armed before the frame is even queued, so no guest can make them do
/// nothing.
pub fn forward(stop: StopHandle, target: Target) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH])?;
    thread::Builder::new()
        .name("mvm-signals".into())
        .spawn(move || {
            seccomp::install_or_exit(ThreadKind::Signals);
            let (queue, frames) = mpsc::channel::<(Writer, i32, Message)>();
            let sender_stop = stop.clone();
            let sender = thread::Builder::new()
                .name("mvm-signal-send".into())
                .spawn(move || {
                    seccomp::inherited(ThreadKind::Signals);
                    for (writer, sig, msg) in frames {
                        if client::send(&writer, &msg).is_err() {
                            sender_stop.stop(StopReason::Signal(sig));
                        }
                    }
                });
            if sender.is_err() {
                eprintln!(
                    "mvm: cannot start the signal sender thread: signals end the run at once"
                );
            }
            for sig in signals.forever() {
                let writer = target.lock().ok().and_then(|t| t.clone());
                let Some(writer) = writer else {
                    if sig != SIGWINCH {
                        stop.stop(StopReason::Signal(sig));
                    }
                    continue;
                };
                if sig == SIGTERM || sig == SIGHUP {
                    let stop = stop.clone();
                    thread::spawn(move || {
                        seccomp::inherited(ThreadKind::Signals);
                        thread::sleep(TERMINATE_GRACE);
                        stop.stop(StopReason::Signal(sig));
                    });
                }
                let msg = if sig == SIGWINCH {
                    let (rows, cols) = terminal::size();
                    Message::Resize(Resize { rows, cols })
                } else {
                    Message::Signal(Signal { signal: sig })
                };
                if sender.is_err() || queue.send((writer, sig, msg)).is_err() {
                    stop.stop(StopReason::Signal(sig));
                }
            }
        })?;
    Ok(())
}
