//! Signals sent to `mvm run` while a command runs. Ctrl-C (SIGINT) and
//! SIGQUIT are forwarded to the command, which decides what they mean.
//! SIGTERM and SIGHUP are forwarded too, and if the command has not exited
//! within the grace period the VM is destroyed. SIGWINCH becomes a
//! terminal resize. Before the command has started there is nothing to
//! forward to, so any of them ends the run at once.

use crate::confine::{seccomp, ThreadKind};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use mvm_protocol::{Message, Resize, Signal};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGWINCH};
use signal_hook::iterator::Signals;
use vmm_sys_util::eventfd::EventFd;

use super::client::{self, Writer};
use super::terminal;

/// How long a command gets to exit after a forwarded SIGTERM or SIGHUP.
pub const TERMINATE_GRACE: Duration = Duration::from_secs(5);

/// Ends the VM from outside the event loop, remembering the signal why.
#[derive(Clone)]
pub struct Teardown {
    stop_evt: Arc<EventFd>,
    signal: Arc<AtomicI32>,
}

impl Teardown {
    pub fn new(stop_evt: Arc<EventFd>) -> Self {
        Self {
            stop_evt,
            signal: Arc::new(AtomicI32::new(0)),
        }
    }

    pub fn now(&self, signal: i32) {
        let _ = self
            .signal
            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
        let _ = self.stop_evt.write(1);
    }

    /// The signal that tore the VM down, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }
}

/// Where forwarded signals go once the command runs.
pub type Target = Arc<Mutex<Option<Writer>>>;

pub fn forward(teardown: Teardown, target: Target) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH])?;
    thread::Builder::new()
        .name("mvm-signals".into())
        .spawn(move || {
            seccomp::install_or_exit(ThreadKind::Signals);
            for sig in signals.forever() {
                let writer = target.lock().ok().and_then(|t| t.clone());
                let Some(writer) = writer else {
                    if sig != SIGWINCH {
                        teardown.now(sig);
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
                    teardown.now(sig);
                    continue;
                }
                if sig == SIGTERM || sig == SIGHUP {
                    let teardown = teardown.clone();
                    thread::spawn(move || {
                        seccomp::inherited(ThreadKind::Signals);
                        thread::sleep(TERMINATE_GRACE);
                        teardown.now(sig);
                    });
                }
            }
        })?;
    Ok(())
}
