//! The one way to stop a machine, from any thread: a vCPU that hit a
//! shutdown or a KVM error, the i8042's reset line, a device backend that
//! went away, the deadline, a signal the user sent, the exec session that
//! saw the guest linger. Each records why (the first reason wins) and
//! wakes the event loop through the same eventfd.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Why the machine was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The guest reset the machine through the i8042 (how guest-init ends
    /// a run, and how `panic=-1` ends a panic).
    GuestReset,
    /// A vCPU stopped: triple fault, or HLT with interrupts off.
    VcpuShutdown,
    /// KVM, the VMM or a device backend could not continue; the text says
    /// why.
    Failed(String),
    /// The deadline (`--timeout`) passed.
    Timeout,
    /// The host stopped it on a signal (SIGTERM and friends).
    Signal(i32),
    /// The host stopped it for another reason: the exec channel ended and
    /// the guest did not reset by itself within the grace period.
    Host,
    /// The command's `Exit` arrived: guest-init syncs before it sends that
    /// (docs/protocol.md), so nothing in the guest is left to wait for.
    CommandExited,
}

struct Inner {
    reason: Mutex<Option<StopReason>>,
    evt: EventFd,
    /// Set by the event loop once it has seen the stop.
    seen: AtomicBool,
}

/// Cheap to clone; every clone stops the same machine.
#[derive(Clone)]
pub struct StopHandle(Arc<Inner>);

impl StopHandle {
    pub fn new() -> std::io::Result<Self> {
        Ok(Self(Arc::new(Inner {
            reason: Mutex::new(None),
            evt: EventFd::new(EFD_NONBLOCK)?,
            seen: AtomicBool::new(false),
        })))
    }

    /// Records `why` unless a reason is already recorded, and wakes the
    /// event loop.
    pub fn stop(&self, why: StopReason) {
        if let Ok(mut reason) = self.0.reason.lock() {
            reason.get_or_insert(why);
        }
        // The counter only fails on overflow, which one write cannot reach;
        // if it did, a wakeup is pending anyway.
        let _ = self.0.evt.write(1);
    }

    /// The first reason recorded.
    pub fn reason(&self) -> Option<StopReason> {
        self.0.reason.lock().ok().and_then(|r| r.clone())
    }

    /// The machine's event loop has seen the stop: vCPUs are on their way
    /// out and devices serve nothing more.
    pub fn is_stopped(&self) -> bool {
        self.0.seen.load(Ordering::SeqCst)
    }

    /// The signal that stopped the machine, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self.reason() {
            Some(StopReason::Signal(sig)) => Some(sig),
            _ => None,
        }
    }

    pub(super) fn event(&self) -> &EventFd {
        &self.0.evt
    }

    pub(super) fn mark_seen(&self) {
        self.0.seen.store(true, Ordering::SeqCst);
    }
}

/// The i8042's reset line.
impl vm_superio::Trigger for StopHandle {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        self.stop(StopReason::GuestReset);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_wins_and_every_stop_wakes_the_loop() {
        let stop = StopHandle::new().unwrap();
        let other = stop.clone();
        assert_eq!(stop.reason(), None);
        other.stop(StopReason::Signal(15));
        stop.stop(StopReason::GuestReset);
        assert_eq!(stop.reason(), Some(StopReason::Signal(15)));
        assert_eq!(stop.signal(), Some(15));
        assert_eq!(stop.event().read().unwrap(), 2);
        assert!(!stop.is_stopped());
        stop.mark_seen();
        assert!(other.is_stopped());
    }
}
