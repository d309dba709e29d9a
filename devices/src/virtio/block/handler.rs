//! The event-loop half of the block device: it watches the request
//! queue's eventfd and the wakeup the device half writes at activation,
//! and serves every request chain the driver has made available.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::QueueT;
use vmm_sys_util::eventfd::EventFd;

use super::defs::QUEUE_SIZE;
use super::device::{lock, Shared};
use super::request::Disk;

/// Chains served per event, so a guest that refills its queue as fast as
/// it is drained cannot keep the event loop from its other work.
const BUDGET: usize = QUEUE_SIZE as usize;

pub struct BlockHandler {
    shared: Arc<Mutex<Shared>>,
    wake: EventFd,
    queue_evt: EventFd,
    disk: Disk,
    served: u64,
}

impl BlockHandler {
    pub(super) fn new(
        shared: Arc<Mutex<Shared>>,
        wake: EventFd,
        queue_evt: EventFd,
        disk: Disk,
    ) -> Self {
        Self {
            shared,
            wake,
            queue_evt,
            disk,
            served: 0,
        }
    }

    /// Requests served so far (for tests).
    pub fn served(&self) -> u64 {
        self.served
    }

    fn service(&mut self) {
        let shared = Arc::clone(&self.shared);
        let mut shared = lock(&shared);
        let Some(active) = shared.as_mut() else {
            return;
        };
        let mut used = false;
        let mut taken = 0;
        while taken < BUDGET {
            let Some(chain) = active.queues.pop_descriptor_chain(&active.mem) else {
                break;
            };
            taken += 1;
            let head = chain.head_index();
            let len = self.disk.serve(chain, &active.mem);
            self.served += 1;
            if active.queues.add_used(&active.mem, head, len).is_err() {
                break;
            }
            used = true;
        }
        if taken == BUDGET {
            // Budget spent: come back after the loop's other events.
            let _ = self.queue_evt.write(1);
        }
        if used
            && active
                .queues
                .needs_notification(&active.mem)
                .unwrap_or(true)
        {
            // A full irqfd counter means an interrupt is pending anyway.
            let _ = active.interrupt.signal_used_queue();
        }
    }
}

impl MutEventSubscriber for BlockHandler {
    fn init(&mut self, ops: &mut EventOps) {
        for fd in [self.wake.as_raw_fd(), self.queue_evt.as_raw_fd()] {
            // A disk that cannot hear its queue would hang the guest's
            // root filesystem silently, so say so.
            if let Err(e) = ops.add(Events::new_raw(fd, EventSet::IN)) {
                eprintln!("mvm: virtio-blk: cannot watch fd {fd}: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.wake.as_raw_fd() {
            let _ = self.wake.read();
        } else if fd == self.queue_evt.as_raw_fd() {
            let _ = self.queue_evt.read();
        }
        self.service();
    }
}
