//! vm-superio devices signal interrupts and resets through a `Trigger`; ours
//! is an `EventFd`, which the VMM registers as a KVM irqfd (interrupts) or
//! watches in its event loop (reset).

use std::io;
use std::ops::Deref;

use vm_superio::Trigger;
use vmm_sys_util::eventfd::EventFd;

pub struct EventFdTrigger(EventFd);

impl EventFdTrigger {
    pub fn new(evt: EventFd) -> Self {
        Self(evt)
    }
}

impl Trigger for EventFdTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

impl Deref for EventFdTrigger {
    type Target = EventFd;

    fn deref(&self) -> &EventFd {
        &self.0
    }
}
