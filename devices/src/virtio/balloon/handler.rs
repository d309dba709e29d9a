//! The event-loop half of the balloon: it watches the three queues'
//! eventfds and the wakeup the device half writes at activation. A
//! reporting chain's blocks are freed ([`super::discard`]) and the chain
//! given back; inflate and deflate chains (never asked for) go back
//! untouched.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::QueueT;
use vmm_sys_util::eventfd::EventFd;

use super::device::{lock, Shared};
use super::discard::discard;
use super::{QUEUE_COUNT, QUEUE_SIZE, REPORTING_QUEUE};

/// Chains served per queue per event, so a guest that refills a queue as
/// fast as it is drained cannot keep the event loop from its other work.
const BUDGET: usize = QUEUE_SIZE as usize;

/// Ranges read of one report: Linux sends at most PAGE_REPORTING_CAPACITY
/// (32). The rest of a longer chain (an indirect table can hold 65535
/// descriptors, a loop repeats one) is given back unread, so one event
/// costs at most BUDGET * MAX_RANGES madvise calls.
const MAX_RANGES: usize = 32;

pub struct BalloonHandler {
    shared: Arc<Mutex<Shared>>,
    wake: EventFd,
    queue_evts: [EventFd; QUEUE_COUNT],
}

impl BalloonHandler {
    pub(super) fn new(
        shared: Arc<Mutex<Shared>>,
        wake: EventFd,
        queue_evts: [EventFd; QUEUE_COUNT],
    ) -> Self {
        Self {
            shared,
            wake,
            queue_evts,
        }
    }

    fn service(&mut self) {
        let shared = Arc::clone(&self.shared);
        let mut shared = lock(&shared);
        let Some(active) = shared.as_mut() else {
            return;
        };
        let mut notify = false;
        for (index, queue) in active.queues.iter_mut().enumerate() {
            let mut used = false;
            let mut taken = 0;
            while taken < BUDGET {
                let Some(chain) = queue.pop_descriptor_chain(&active.mem) else {
                    break;
                };
                taken += 1;
                let head = chain.head_index();
                if index == REPORTING_QUEUE {
                    for desc in chain.take(MAX_RANGES) {
                        // discard frees nothing of a range that is not
                        // whole pages of guest memory; the chain goes back
                        // used either way.
                        let _ = discard(&active.mem, desc.addr().0, u64::from(desc.len()));
                    }
                }
                // Nothing is written into a balloon buffer: used length 0.
                if queue.add_used(&active.mem, head, 0).is_err() {
                    break;
                }
                used = true;
            }
            if taken == BUDGET {
                // Budget spent: come back after the loop's other events.
                let _ = self.queue_evts[index].write(1);
            }
            notify |= used && queue.needs_notification(&active.mem).unwrap_or(true);
        }
        if notify {
            // A full irqfd counter means an interrupt is pending anyway.
            let _ = active.interrupt.signal_used_queue();
        }
    }
}

impl MutEventSubscriber for BalloonHandler {
    fn init(&mut self, ops: &mut EventOps) {
        let fds = std::iter::once(self.wake.as_raw_fd())
            .chain(self.queue_evts.iter().map(|e| e.as_raw_fd()));
        for fd in fds {
            // Unheard reports would leave the guest's reporting worker
            // waiting forever, so say so.
            if let Err(e) = ops.add(Events::new_raw(fd, EventSet::IN)) {
                eprintln!("mvm: virtio-balloon: cannot watch fd {fd}: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.wake.as_raw_fd() {
            let _ = self.wake.read();
        }
        for evt in &self.queue_evts {
            if fd == evt.as_raw_fd() {
                let _ = evt.read();
            }
        }
        self.service();
    }
}
