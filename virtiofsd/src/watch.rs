//! A watch on the guest driver's queues, in front of virtiofsd's
//! vhost-user backend: a queue the guest kernel has broken ends the
//! daemon with one log line, so the VMM stops the VM (its backend hung
//! up) instead of virtiofsd spinning on it.
//!
//! Why: with EVENT_IDX virtiofsd 1.14 processes a queue until it finds no
//! more requests, and a queue it cannot read (an avail index more than a
//! ring ahead of what it has taken, or a ring outside guest memory) is an
//! error that leaves the requests "there": it logs the error and tries
//! again, for ever, one host core at 100 % and a log line each time (issue
//! 16 point 1; mvm caps the log, vmm/src/helper_log.rs, but not the core).
//! A driver that follows the virtio spec never does either. So the watch
//! runs EVENT_IDX's loop itself, with virtiofsd serving one round per
//! call (it is told EVENT_IDX is off; the rings' own EVENT_IDX state,
//! which the vhost-user library keeps, is untouched), and before each
//! round reads the queue's avail index: a queue that cannot be served, or
//! a round virtiofsd fails, ends the daemon with one line. The loop then
//! goes round again only when the guest has made new requests available,
//! so a guest can keep it busy only by keeping a vCPU of its own busy.
//! Everything else is the backend's own.

use std::fs::File;
use std::io;
use std::process;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

use log::error;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
};
use vhost::vhost_user::Backend;
use vhost_user_backend::bitmap::BitmapMmapRegion;
use vhost_user_backend::{VhostUserBackend, VringMutex, VringT};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};

type Memory = GuestMemoryAtomic<GuestMemoryMmap<BitmapMmapRegion>>;
type Vring = VringMutex<Memory>;

/// virtiofsd's backend (`B`) behind the watch.
pub struct Watched<B> {
    inner: B,
    /// The guest's memory as the VMM last described it.
    memory: RwLock<Option<Memory>>,
    /// The driver acked EVENT_IDX.
    event_idx: AtomicBool,
}

impl<B> Watched<B> {
    pub fn new(inner: B) -> Self {
        Watched {
            inner,
            memory: RwLock::new(None),
            event_idx: AtomicBool::new(false),
        }
    }

    /// Why the queue cannot be served, if it cannot.
    fn broken(&self, vring: &Vring) -> Option<String> {
        let memory = self
            .memory
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        let state = vring.get_ref();
        let queue = state.get_queue();
        if !queue.ready() {
            return None;
        }
        let guard = memory.memory();
        match queue.avail_idx(&*guard, Ordering::Acquire) {
            Err(e) => Some(format!("its avail ring cannot be read: {e}")),
            Ok(avail) => {
                let pending = avail.0.wrapping_sub(queue.next_avail());
                (pending > queue.size()).then(|| {
                    format!(
                        "its avail index says {pending} new requests in a ring of {}",
                        queue.size()
                    )
                })
            }
        }
    }
}

impl<B> VhostUserBackend for Watched<B>
where
    B: VhostUserBackend<Bitmap = BitmapMmapRegion, Vring = Vring>,
{
    type Bitmap = BitmapMmapRegion;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        self.inner.num_queues()
    }

    fn max_queue_size(&self) -> usize {
        self.inner.max_queue_size()
    }

    fn features(&self) -> u64 {
        self.inner.features()
    }

    fn acked_features(&self, features: u64) {
        self.inner.acked_features(features)
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        self.inner.protocol_features()
    }

    fn reset_device(&self) {
        self.inner.reset_device()
    }

    fn set_event_idx(&self, enabled: bool) {
        // The loop is the watch's (handle_event); virtiofsd serves rounds.
        self.event_idx.store(enabled, Ordering::Release);
        self.inner.set_event_idx(false)
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        self.inner.get_config(offset, size)
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        self.inner.set_config(offset, buf)
    }

    fn update_memory(&self, memory: Memory) -> io::Result<()> {
        *self.memory.write().unwrap_or_else(|e| e.into_inner()) = Some(memory.clone());
        self.inner.update_memory(memory)
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        self.inner.set_backend_req_fd(backend)
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        self.inner.queues_per_thread()
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        self.inner.exit_event(thread_index)
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            return self
                .inner
                .handle_event(device_event, evset, vrings, thread_id);
        };
        let stop = |why: String| -> ! {
            error!("the guest broke virtio-fs queue {device_event}: {why}; stopping");
            process::exit(1)
        };
        let event_idx = self.event_idx.load(Ordering::Acquire);
        loop {
            if event_idx {
                vring
                    .disable_notification()
                    .unwrap_or_else(|e| stop(format!("{e:?}")));
            }
            if let Some(why) = self.broken(vring) {
                stop(why);
            }
            if let Err(e) = self
                .inner
                .handle_event(device_event, evset, vrings, thread_id)
            {
                stop(e.to_string());
            }
            // With EVENT_IDX: again only if requests came meanwhile.
            let more = event_idx
                && vring
                    .enable_notification()
                    .unwrap_or_else(|e| stop(format!("{e:?}")));
            if !more {
                return Ok(());
            }
        }
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        self.inner.set_device_state_fd(direction, phase, file)
    }

    fn check_device_state(&self) -> io::Result<()> {
        self.inner.check_device_state()
    }
}
