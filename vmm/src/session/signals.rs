//! Signals sent to `mvm run` while a command runs. Ctrl-C (SIGINT) and
//! SIGQUIT are forwarded to the command, which decides what they mean.
//! SIGTERM and SIGHUP are forwarded too, and if the command has not exited
//! within the grace period the VM is destroyed. SIGWINCH becomes a
//! terminal resize. Before the command has started there is nothing to
//! forward to, so any of them ends the run at once.

use crate::confine::{seccomp, ThreadKind};
use std::sync::{Arc, Mutex};
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
pub fn forward(stop: StopHandle, target: Target) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH])?;
    thread::Builder::new()
        .name("mvm-signals".into())
        .spawn(move || {
            seccomp::install_or_exit(ThreadKind::Signals);
            for sig in signals.forever() {
                let writer = target.lock().ok().and_then(|t| t.clone());
                let Some(writer) = writer else {
                    if sig != SIGWINCH {
                        stop.stop(StopReason::Signal(sig));
                    }
                    continue;
                };
                let msg = if sig == SIGWINCH {
                    let (rows, cols) = terminal::size();
                    Message::Resize(Resize { rows, cols })
                } else {
                    Message::Signal(Signal { signal: sig })
                };
                if client::send(&writer, &msg).is_err() {
                    stop.stop(StopReason::Signal(sig));
                    continue;
                }
                if sig == SIGTERM || sig == SIGHUP {
                    let stop = stop.clone();
                    thread::spawn(move || {
                        seccomp::inherited(ThreadKind::Signals);
                        thread::sleep(TERMINATE_GRACE);
                        stop.stop(StopReason::Signal(sig));
                    });
                }
            }
        })?;
    Ok(())
}
