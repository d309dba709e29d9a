//! The event-loop half of the vsock device: a `MutEventSubscriber` the VMM's
//! event loop thread runs. It watches the three queue eventfds, the wakeup
//! the device half writes at activate and reset (and a [`Dialer`] after
//! handing over a client), the listening Unix socket and every client
//! socket, and after each event serves the queues: guest
//! packets from TX first (they carry credit and responses), then as many
//! packets for the guest as it has RX buffers for.

use std::io::{self, ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::{DescriptorChain, QueueOwnedT, QueueT};
use virtio_vsock::packet::{VsockPacket, PKT_HEADER_SIZE};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::defs::{MAX_PKT_DATA, QUEUE_SIZE, RXQ, TXQ};
use super::device::{lock, Active, Shared};
use super::muxer::Muxer;

/// Chains taken from one queue per event, so a guest that refills its
/// queue as fast as it is drained cannot keep the event loop (which also
/// watches the VM's stop event and timeout) from its other work.
const BUDGET: usize = QUEUE_SIZE as usize;

pub struct VsockHandler {
    shared: Arc<Mutex<Shared>>,
    wake: EventFd,
    /// rx, tx, event: signalled by KVM (ioeventfd) or the transport.
    queue_evts: Vec<EventFd>,
    listener: UnixListener,
    /// Host clients handed over in-process ([`Dialer`]), taken at the next
    /// `wake`.
    dialed: Arc<Mutex<Vec<UnixStream>>>,
    muxer: Muxer,
    scratch: TxScratch,
    resets_seen: u64,
    /// The only uid whose clients the listener serves: this process's,
    /// read when the device is made (the confined VMM may not ask).
    owner_uid: u32,
}

/// Connects host clients to the device without a `connect(2)`: each
/// [`Dialer::dial`] makes a socket pair, hands one end to the handler (as
/// if accepted from the listener) and wakes it; the caller speaks the
/// hybrid protocol (`CONNECT <port>`) on the other end. So a thread that
/// talks to the guest needs no `socket` or `connect` once confined, and
/// with them no way to reach any other Unix socket of the user's.
pub struct Dialer {
    dialed: Arc<Mutex<Vec<UnixStream>>>,
    wake: EventFd,
}

impl Dialer {
    pub fn dial(&self) -> io::Result<UnixStream> {
        let (ours, theirs) = UnixStream::pair()?;
        self.dialed
            .lock()
            .map_err(|_| io::Error::other("the vsock handler panicked"))?
            .push(theirs);
        self.wake.write(1)?;
        Ok(ours)
    }
}

impl VsockHandler {
    pub(super) fn new(
        shared: Arc<Mutex<Shared>>,
        wake: EventFd,
        queue_evts: Vec<EventFd>,
        listener: UnixListener,
        muxer: Muxer,
    ) -> Self {
        Self {
            shared,
            wake,
            queue_evts,
            listener,
            dialed: Arc::default(),
            muxer,
            scratch: TxScratch::default(),
            resets_seen: 0,
            // SAFETY: plain syscall without arguments; cannot fail.
            owner_uid: unsafe { libc::geteuid() },
        }
    }

    /// Host clients connected right now (including those still handshaking).
    pub fn connection_count(&self) -> usize {
        self.muxer.connection_count()
    }

    /// A [`Dialer`] for this device (its own handle on the wake eventfd).
    pub fn dialer(&self) -> io::Result<Dialer> {
        Ok(Dialer {
            dialed: Arc::clone(&self.dialed),
            wake: self.wake.try_clone()?,
        })
    }

    /// The clients dialled since the last wake, as if just accepted.
    fn take_dialed(&mut self, ops: &mut EventOps) {
        let dialed = match self.dialed.lock() {
            Ok(mut d) => std::mem::take(&mut *d),
            Err(_) => return,
        };
        for stream in dialed {
            self.muxer.accept(stream, ops);
        }
    }

    fn accept_clients(&mut self, ops: &mut EventOps) {
        loop {
            match self.listener.accept() {
                // Another user's client is closed unheard, whatever the
                // socket's mode lets through (a named sandbox's socket
                // lives on for hours: docs/sandboxes.md).
                Ok((stream, _)) if peer_uid(&stream) != Some(self.owner_uid) => drop(stream),
                Ok((stream, _)) => self.muxer.accept(stream, ops),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // WouldBlock: all taken. Anything else (out of fds): the
                // client stays in the backlog for the next event.
                Err(_) => return,
            }
        }
    }

    fn service(&mut self, ops: &mut EventOps) {
        let shared = Arc::clone(&self.shared);
        let mut shared = lock(&shared);
        if shared.resets != self.resets_seen {
            self.resets_seen = shared.resets;
            self.muxer.on_device_reset();
        }
        let Shared {
            active,
            transport_reset,
            ..
        } = &mut *shared;
        if let Some(active) = active.as_mut() {
            let (tx_used, tx_more) = serve_tx(active, &mut self.muxer, &mut self.scratch);
            *transport_reset = transport_reset.advance(active);
            let (rx_used, rx_more) = match transport_reset.rx_allowed() {
                true => serve_rx(active, &mut self.muxer),
                // Host packets wait for the driver to drop its old
                // connections; its refill of the event queue (a queue
                // notification) brings the handler back.
                false => (false, false),
            };
            notify(active, TXQ, tx_used);
            notify(active, RXQ, rx_used);
            if tx_more || rx_more {
                // Come back after the loop's other events.
                let _ = self.queue_evts[TXQ].write(1);
            }
        }
        drop(shared);
        self.muxer.sync_epoll(ops);
    }
}

/// Room for one guest packet. Linux 6.12 spreads a large payload over
/// several descriptors, which `VsockPacket::from_tx_virtq_chain` refuses (it
/// takes a header plus at most one data descriptor, as its documentation
/// says); so a TX chain is gathered with virtio-queue's `Reader`, which
/// walks any chain within guest memory, and the packet is built over these
/// buffers.
struct TxScratch {
    header: [u8; PKT_HEADER_SIZE],
    data: Vec<u8>,
}

impl Default for TxScratch {
    fn default() -> Self {
        Self {
            header: [0; PKT_HEADER_SIZE],
            data: vec![0; MAX_PKT_DATA as usize],
        }
    }
}

/// A packet over host buffers, its header fields read by the crate.
/// The uid the peer of `stream` had when it connected (`SO_PEERCRED`).
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    // SAFETY: ucred is plain old data; all-zero is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid out-pointers of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut cred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

fn host_packet<'b>(
    header: &'b mut [u8; PKT_HEADER_SIZE],
    data: Option<&'b mut [u8]>,
) -> Option<VsockPacket<'b, ()>> {
    let raw = *header;
    // SAFETY: the packet's slices point into `header` and `data`, which stay
    // mutably borrowed for 'b, the packet's whole life: they remain valid
    // and nothing else reads or writes them meanwhile.
    let mut pkt = unsafe { VsockPacket::new(header, data) }.ok()?;
    // `new` leaves the parsed header zeroed; this parses `raw` into it.
    pkt.set_header_from_raw(&raw).ok()?;
    Some(pkt)
}

/// The packet in a TX chain, copied out of guest memory; None for a chain
/// that is malformed: outside guest memory, shorter than a header, or with
/// fewer device-readable bytes than its header's `len` (or more than the
/// maximum payload).
fn gather_tx<'b>(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    scratch: &'b mut TxScratch,
) -> Option<VsockPacket<'b, ()>> {
    let mut reader = chain.reader(mem).ok()?;
    reader.read_exact(&mut scratch.header).ok()?;
    let len = host_packet(&mut scratch.header, None)?.len();
    if len > MAX_PKT_DATA || reader.available_bytes() < len as usize {
        return None;
    }
    let data = &mut scratch.data[..len as usize];
    reader.read_exact(data).ok()?;
    host_packet(&mut scratch.header, (len > 0).then_some(data))
}

/// Guest packets; returns (any used, budget ran out).
fn serve_tx(active: &mut Active, muxer: &mut Muxer, scratch: &mut TxScratch) -> (bool, bool) {
    let Active { mem, queues, .. } = active;
    let txq = &mut queues[TXQ];
    let mut used = false;
    for _ in 0..BUDGET {
        let Some(chain) = txq.pop_descriptor_chain(&*mem) else {
            return (used, false);
        };
        let head = chain.head_index();
        // A malformed chain is returned to the guest unread.
        if let Some(pkt) = gather_tx(chain, mem, scratch) {
            muxer.on_guest_packet(&pkt);
        }
        if txq.add_used(&*mem, head, 0).is_err() {
            return (used, false);
        }
        used = true;
    }
    (used, true)
}

/// Packets for the guest; returns (any used, budget ran out).
fn serve_rx(active: &mut Active, muxer: &mut Muxer) -> (bool, bool) {
    let Active { mem, queues, .. } = active;
    let rxq = &mut queues[RXQ];
    let mut used = false;
    for _ in 0..BUDGET {
        if !muxer.has_pending_rx() {
            return (used, false);
        }
        let Some(mut chain) = rxq.pop_descriptor_chain(&*mem) else {
            // No buffer: the guest notifies the RX queue when it adds some.
            return (used, false);
        };
        let head = chain.head_index();
        let len = match VsockPacket::from_rx_virtq_chain(&*mem, &mut chain, MAX_PKT_DATA) {
            Ok(mut pkt) => match muxer.fill_rx(&mut pkt) {
                Some(len) => PKT_HEADER_SIZE as u32 + len,
                None => {
                    // Nothing fits after all: the buffer stays the guest's.
                    rxq.go_to_previous_position();
                    return (used, false);
                }
            },
            // A malformed buffer goes back to the guest empty.
            Err(_) => 0,
        };
        if rxq.add_used(&*mem, head, len).is_err() {
            return (used, false);
        }
        used = true;
    }
    (used, true)
}

fn notify(active: &mut Active, queue: usize, used: bool) {
    if !used {
        return;
    }
    let q = &mut active.queues[queue];
    if q.needs_notification(&active.mem).unwrap_or(true) {
        // A full irqfd counter means an interrupt is pending anyway.
        let _ = active.interrupt.signal_used_queue();
    }
}

impl MutEventSubscriber for VsockHandler {
    fn init(&mut self, ops: &mut EventOps) {
        let mut fds = vec![self.wake.as_raw_fd(), self.listener.as_raw_fd()];
        fds.extend(self.queue_evts.iter().map(|e| e.as_raw_fd()));
        for fd in fds {
            // Only an fd already registered can fail here, and every one is
            // fresh; a vsock that cannot hear its queues would hang the guest's
            // sockets silently, so say so.
            if let Err(e) = ops.add(Events::new_raw(fd, EventSet::IN)) {
                eprintln!("mvm: vsock: cannot watch fd {fd}: {e}");
            }
        }
        // Clients may have connected before the event loop started.
        self.accept_clients(ops);
        self.take_dialed(ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.wake.as_raw_fd() {
            let _ = self.wake.read();
            self.take_dialed(ops);
        } else if let Some(evt) = self.queue_evts.iter().find(|e| e.as_raw_fd() == fd) {
            // Reading resets the counter; the queues are served below either
            // way. The event queue (2) only holds buffers for the transport
            // reset a restored device sends (`transport_reset.rs`).
            let _ = evt.read();
        } else if fd == self.listener.as_raw_fd() {
            self.accept_clients(ops);
        } else if self.muxer.owns(fd) {
            self.muxer.on_client_event(fd, events.event_set());
        }
        self.service(ops);
    }
}
