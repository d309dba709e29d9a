//! The event-loop half of the virtio-fs device: it watches the vhost-user
//! socket for a hang-up. A backend that died would leave every file
//! operation in the guest waiting forever, so the VM is stopped instead.
//! (Interrupts need no help: the backend signals the irqfd itself.)

use std::os::fd::RawFd;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

pub struct FsHandler {
    /// The vhost-user socket; only its hang-up is watched (replies are
    /// read synchronously by the device half).
    socket_fd: RawFd,
    on_hangup: Option<Box<dyn FnMut(String) + Send>>,
}

impl FsHandler {
    pub(super) fn new(socket_fd: RawFd, on_hangup: Box<dyn FnMut(String) + Send>) -> Self {
        Self {
            socket_fd,
            on_hangup: Some(on_hangup),
        }
    }
}

impl MutEventSubscriber for FsHandler {
    fn init(&mut self, ops: &mut EventOps) {
        let hangup = EventSet::READ_HANG_UP | EventSet::HANG_UP;
        if let Err(e) = ops.add(Events::new_raw(self.socket_fd, hangup)) {
            eprintln!("mvm: virtio-fs: cannot watch the backend socket: {e}");
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if events.fd() != self.socket_fd {
            return;
        }
        let _ = ops.remove(Events::new_raw(self.socket_fd, EventSet::empty()));
        if let Some(mut report) = self.on_hangup.take() {
            report("the virtio-fs backend (virtiofsd) closed its connection".into());
        }
    }
}
