//! One connection: a host client's Unix stream on one side, a guest vsock
//! socket on the other, and the protocol state between them. Most are
//! host-initiated (a client connected to the device's socket and named a
//! guest port); a guest-initiated one, to a port the VMM was told to
//! serve, is accepted with a stream the device connected itself
//! ([`Connection::accepted`]).
//!
//! Data from the client is read straight into guest RX buffers, never
//! buffered here, and only as much as the guest has credit for
//! (`peer_buf_alloc - (rx_cnt - peer_fwd_cnt)`). Data from the guest is
//! written to the client at once; what the client cannot take yet waits in
//! `to_client`, which the guest cannot overfill: we advertise
//! [`CONN_BUF_SIZE`] and count as forwarded (`fwd_cnt`) only what the client
//! socket accepted. A guest that sends beyond its credit is reset.
//!
//! Shutdown: the client's half-close (EOF) becomes OP_SHUTDOWN SEND; its
//! full close (HUP) becomes OP_SHUTDOWN RCV|SEND once its last bytes went to
//! the guest, and the connection is dropped (Linux answers with an RST we
//! ignore). The guest's SEND shutdown becomes `shutdown(SHUT_WR)` toward the
//! client once `to_client` is drained; RCV|SEND (the guest closed) is
//! answered with RST after draining, and the client socket is closed.

use std::io::{ErrorKind, Write};
use std::net::Shutdown;
use std::num::Wrapping;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

use event_manager::EventSet;
use virtio_vsock::packet::VsockPacket;
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{ReadVolatile, VolatileMemoryError, VolatileSlice, WriteVolatile};

use super::defs::{
    CONN_BUF_SIZE, CREDIT_UPDATE_THRESHOLD, OP_CREDIT_REQUEST, OP_CREDIT_UPDATE, OP_REQUEST,
    OP_RESPONSE, OP_RST, OP_RW, OP_SHUTDOWN, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};
use super::handshake::{self, LineReader, Progress};
use super::header::{self, Reply};

#[derive(Debug)]
enum State {
    /// Reading the client's `CONNECT <port>` line.
    Handshake(LineReader),
    /// OP_REQUEST owed to or sent to the guest; waiting for OP_RESPONSE.
    Connecting,
    Established,
    /// Over: dropped once the packets still owed to the guest are sent.
    Closing,
}

/// Packets owed to the guest, sent in the order of [`Connection::fill_rx`].
#[derive(Debug, Default)]
struct Owed {
    rst: bool,
    request: bool,
    /// The OP_RESPONSE that accepts a guest-initiated connection.
    response: bool,
    /// OP_SHUTDOWN flags; 0 for none.
    shutdown: u32,
    credit_request: bool,
    credit_update: bool,
}

impl Owed {
    fn any(&self) -> bool {
        self.rst
            || self.request
            || self.response
            || self.shutdown != 0
            || self.credit_request
            || self.credit_update
    }
}

/// What a guest packet for this connection carried, header fields only.
#[derive(Debug, Clone, Copy)]
pub(super) struct GuestHeader {
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

#[derive(Debug)]
pub(super) struct Connection {
    stream: UnixStream,
    guest_cid: u64,
    host_port: u32,
    /// Known once the client's CONNECT line is read.
    guest_port: Option<u32>,
    state: State,
    owed: Owed,
    /// The epoll interest registered for `stream`; None when not registered.
    pub(super) epoll: Option<EventSet>,

    // Guest to client.
    to_client: Vec<u8>,
    /// Bytes of `to_client` already written.
    to_client_head: usize,
    /// Bytes at the front of `to_client` that are our `OK` line, not guest
    /// data (they do not count against the guest's credit).
    reply_bytes: usize,
    /// Guest bytes received, and written to the client.
    recv_cnt: Wrapping<u32>,
    fwd_cnt: Wrapping<u32>,
    /// `fwd_cnt` as the guest last saw it.
    fwd_cnt_sent: Wrapping<u32>,

    // Client to guest.
    rx_cnt: Wrapping<u32>,
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    /// A credit request went out and no guest packet has come back since.
    credit_requested: bool,
    /// epoll said the client has data (or hung up) and no read has drained
    /// it yet.
    readable: bool,

    /// SHUTDOWN flags the guest sent.
    guest_shut: u32,
    /// The client will send no more (read returned 0).
    client_eof: bool,
    /// The client hung up or its socket failed: nothing more can be written
    /// to it, and epoll would report it for ever, so it is unregistered.
    client_gone: bool,
    /// We shut down our writing side toward the client.
    client_write_shut: bool,
}

impl Connection {
    /// A client that just connected and has yet to send its CONNECT line.
    pub(super) fn new(stream: UnixStream, guest_cid: u64, host_port: u32) -> Self {
        Self {
            stream,
            guest_cid,
            host_port,
            guest_port: None,
            state: State::Handshake(LineReader::default()),
            owed: Owed::default(),
            epoll: None,
            to_client: Vec::new(),
            to_client_head: 0,
            reply_bytes: 0,
            recv_cnt: Wrapping(0),
            fwd_cnt: Wrapping(0),
            fwd_cnt_sent: Wrapping(0),
            rx_cnt: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            credit_requested: false,
            readable: false,
            guest_shut: 0,
            client_eof: false,
            client_gone: false,
            client_write_shut: false,
        }
    }

    /// A guest-initiated connection from `guest_port` to `host_port` whose
    /// host side is `stream` (already connected): established at once, the
    /// guest's REQUEST (`hdr`) carrying its credit, and an OP_RESPONSE owed.
    pub(super) fn accepted(
        stream: UnixStream,
        guest_cid: u64,
        host_port: u32,
        guest_port: u32,
        hdr: GuestHeader,
    ) -> Self {
        let mut conn = Self::new(stream, guest_cid, host_port);
        conn.guest_port = Some(guest_port);
        conn.state = State::Established;
        conn.peer_buf_alloc = hdr.buf_alloc;
        conn.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
        conn.owed.response = true;
        conn
    }

    pub(super) fn stream(&self) -> &UnixStream {
        &self.stream
    }

    pub(super) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    pub(super) fn guest_port(&self) -> Option<u32> {
        self.guest_port
    }

    /// Whether the guest has heard of this connection (its REQUEST was sent):
    /// a device reset makes the guest forget it, so it must end.
    pub(super) fn guest_knows(&self) -> bool {
        match self.state {
            State::Handshake(_) => false,
            State::Connecting => !self.owed.request,
            State::Established | State::Closing => true,
        }
    }

    /// Dropped without a word to the guest.
    pub(super) fn close_silently(&mut self) {
        self.state = State::Closing;
        self.owed = Owed::default();
        self.to_client.clear();
        self.to_client_head = 0;
    }

    /// Dropped with an RST, and whatever the client had not taken is lost.
    fn reset(&mut self) {
        self.close_silently();
        self.owed.rst = true;
    }

    pub(super) fn is_finished(&self) -> bool {
        matches!(self.state, State::Closing) && !self.owed.any()
    }

    fn buffered(&self) -> usize {
        self.to_client.len() - self.to_client_head
    }

    /// How much the guest can take right now.
    fn peer_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// Whether client data may go to the guest (credit aside).
    fn may_forward_to_guest(&self) -> bool {
        matches!(self.state, State::Established)
            && !self.client_eof
            && self.guest_shut & SHUTDOWN_RCV == 0
    }

    /// The epoll events wanted on the client socket; None when it must not
    /// be registered at all.
    pub(super) fn interest(&self) -> Option<EventSet> {
        if self.client_gone || self.is_finished() {
            return None;
        }
        let mut set = EventSet::empty();
        match self.state {
            State::Handshake(_) => set |= EventSet::IN,
            State::Established => {
                // IN only while a read could go somewhere: level-triggered
                // epoll would otherwise wake the loop for ever.
                if self.may_forward_to_guest() && !self.readable && self.peer_credit() > 0 {
                    set |= EventSet::IN;
                }
                if self.buffered() > 0 {
                    set |= EventSet::OUT;
                }
            }
            State::Connecting | State::Closing => {}
        }
        Some(set)
    }

    /// epoll reported `set` on the client socket.
    pub(super) fn on_client_event(&mut self, set: EventSet) {
        if set.contains(EventSet::ERROR) {
            self.client_gone = true;
            self.abort();
            return;
        }
        if set.contains(EventSet::HANG_UP) {
            self.client_gone = true;
            if self.buffered() > 0 {
                // It closed without taking what the guest sent.
                self.abort();
                return;
            }
            // Whatever it wrote before closing is still to be read.
            self.readable = true;
        }
        if set.contains(EventSet::IN) {
            self.readable = true;
        }
        match &mut self.state {
            State::Handshake(reader) => match reader.read_from(&mut self.stream) {
                Progress::Pending if !self.client_gone => {}
                Progress::Pending | Progress::Invalid => self.close_silently(),
                Progress::Port(port) => {
                    self.guest_port = Some(port);
                    self.state = State::Connecting;
                    self.owed.request = true;
                    self.readable = false;
                }
            },
            State::Connecting if self.client_gone => self.abort(),
            State::Established if set.contains(EventSet::OUT) => self.flush(),
            _ => {}
        }
    }

    /// The client is gone or broken: tell the guest if it knows of us.
    fn abort(&mut self) {
        if self.guest_knows() && !matches!(self.state, State::Closing) {
            self.reset();
        } else if !matches!(self.state, State::Closing) {
            self.close_silently();
        }
    }

    /// A guest packet addressed to this connection.
    pub(super) fn on_guest_packet<B: BitmapSlice>(
        &mut self,
        hdr: GuestHeader,
        data: Option<&VolatileSlice<'_, B>>,
    ) {
        self.peer_buf_alloc = hdr.buf_alloc;
        self.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
        self.credit_requested = false;
        match (&self.state, hdr.op) {
            (State::Closing, _) => {}
            (_, OP_RST) => self.close_silently(),
            (State::Connecting, OP_RESPONSE) if !self.owed.request => {
                self.state = State::Established;
                let line = handshake::ok_line(self.host_port);
                self.reply_bytes = line.len();
                self.to_client.extend_from_slice(line.as_bytes());
                self.flush();
            }
            (State::Established, OP_RW) => self.guest_data(data),
            (State::Established, OP_CREDIT_UPDATE) => {}
            (State::Established, OP_CREDIT_REQUEST) => self.owed.credit_update = true,
            (State::Established, OP_SHUTDOWN) => {
                self.guest_shut |= hdr.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
                self.after_flush();
            }
            // A REQUEST or RESPONSE out of place, an unknown op: the guest
            // and we disagree about this connection, so it ends.
            _ => self.reset(),
        }
    }

    /// Guest data for the client.
    fn guest_data<B: BitmapSlice>(&mut self, data: Option<&VolatileSlice<'_, B>>) {
        let Some(data) = data else { return };
        if self.guest_shut & SHUTDOWN_SEND != 0 {
            // Data after the guest said it would send no more.
            self.reset();
            return;
        }
        let held = (self.recv_cnt - self.fwd_cnt).0 as usize;
        if held + data.len() > CONN_BUF_SIZE as usize {
            // Beyond the credit we gave: the guest broke flow control.
            self.reset();
            return;
        }
        self.recv_cnt += Wrapping(data.len() as u32);
        let mut written = 0;
        if self.buffered() == 0 {
            match self.stream.write_volatile(data) {
                Ok(n) => written = n,
                Err(VolatileMemoryError::IOError(e)) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => {
                    self.client_gone = true;
                    self.reset();
                    return;
                }
            }
            self.fwd_cnt += Wrapping(written as u32);
        }
        if written < data.len() {
            self.compact();
            // A Vec takes a volatile copy of the rest; it cannot fail.
            if let Ok(rest) = data.offset(written) {
                let _ = self.to_client.write_all_volatile(&rest);
            }
        }
        self.after_flush();
    }

    /// Drops the already-written front of `to_client` before it grows.
    fn compact(&mut self) {
        if self.to_client_head > 0 {
            self.to_client.drain(..self.to_client_head);
            self.to_client_head = 0;
        }
    }

    /// Writes what `to_client` holds until the client would block.
    fn flush(&mut self) {
        while self.buffered() > 0 {
            match self.stream.write(&self.to_client[self.to_client_head..]) {
                Ok(n) if n > 0 => {
                    self.to_client_head += n;
                    let reply = n.min(self.reply_bytes);
                    self.reply_bytes -= reply;
                    self.fwd_cnt += Wrapping((n - reply) as u32);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                _ => {
                    self.client_gone = true;
                    self.reset();
                    return;
                }
            }
        }
        if self.buffered() == 0 {
            self.to_client.clear();
            self.to_client_head = 0;
        }
        self.after_flush();
    }

    /// What follows a change in what is buffered or what the guest said.
    fn after_flush(&mut self) {
        if !matches!(self.state, State::Established) {
            return;
        }
        if self.guest_shut & SHUTDOWN_RCV != 0 {
            self.readable = false;
        }
        if self.buffered() == 0 {
            if self.guest_shut & SHUTDOWN_SEND != 0 && !self.client_write_shut {
                // The client reads EOF: the guest will send nothing more.
                let _ = self.stream.shutdown(Shutdown::Write);
                self.client_write_shut = true;
            }
            if self.guest_shut == SHUTDOWN_RCV | SHUTDOWN_SEND {
                // The guest closed and all it sent was delivered: the RST
                // ends its wait (Linux waits for one after SHUTDOWN).
                self.reset();
                return;
            }
        }
        // Credit: the guest's idea of our free space is what we last told it
        // minus what it sent since. Once that runs low, any progress is
        // worth telling; it can never block with nothing owed to it.
        let unadvertised = (self.fwd_cnt - self.fwd_cnt_sent).0;
        let seen_free = CONN_BUF_SIZE.saturating_sub((self.recv_cnt - self.fwd_cnt_sent).0);
        if unadvertised > 0 && seen_free < CREDIT_UPDATE_THRESHOLD {
            self.owed.credit_update = true;
        }
    }

    /// Whether [`fill_rx`](Self::fill_rx) has something to send.
    pub(super) fn has_pending_rx(&self) -> bool {
        self.owed.any()
            || (self.may_forward_to_guest()
                && self.readable
                && (self.peer_credit() > 0 || !self.credit_requested))
    }

    fn reply(&mut self, op: u16, flags: u32, len: u32) -> Reply {
        self.fwd_cnt_sent = self.fwd_cnt;
        // Anything we send carries our credit: no separate update owed.
        self.owed.credit_update = false;
        Reply {
            guest_cid: self.guest_cid,
            host_port: self.host_port,
            guest_port: self.guest_port.unwrap_or(0),
            type_: TYPE_STREAM,
            op,
            flags,
            len,
            fwd_cnt: self.fwd_cnt.0,
        }
    }

    /// Fills `pkt` (an RX buffer) with the next packet for the guest and
    /// returns its data length; None when there is nothing to send (or the
    /// buffer has no room for the data that is waiting).
    pub(super) fn fill_rx<B: BitmapSlice>(&mut self, pkt: &mut VsockPacket<'_, B>) -> Option<u32> {
        if self.owed.rst {
            self.owed = Owed::default();
            let r = self.reply(OP_RST, 0, 0);
            header::write(pkt, &r);
            return Some(0);
        }
        if self.owed.request {
            self.owed.request = false;
            let r = self.reply(OP_REQUEST, 0, 0);
            header::write(pkt, &r);
            return Some(0);
        }
        if self.owed.response {
            // First, before any data: the guest's connect() returns on it.
            self.owed.response = false;
            let r = self.reply(OP_RESPONSE, 0, 0);
            header::write(pkt, &r);
            return Some(0);
        }
        if self.may_forward_to_guest() && self.readable {
            if let Some(len) = self.read_client(pkt) {
                return Some(len);
            }
        }
        if self.owed.rst {
            // Reading failed.
            return self.fill_rx(pkt);
        }
        let (op, flags) = if self.owed.shutdown != 0 {
            (OP_SHUTDOWN, std::mem::take(&mut self.owed.shutdown))
        } else if self.owed.credit_request {
            self.owed.credit_request = false;
            (OP_CREDIT_REQUEST, 0)
        } else if self.owed.credit_update {
            (OP_CREDIT_UPDATE, 0)
        } else {
            return None;
        };
        let r = self.reply(op, flags, 0);
        header::write(pkt, &r);
        Some(0)
    }

    /// Reads client data into `pkt`'s data buffer, as much as the guest has
    /// credit for; Some(len) when a data packet was filled.
    fn read_client<B: BitmapSlice>(&mut self, pkt: &mut VsockPacket<'_, B>) -> Option<u32> {
        let credit = self.peer_credit();
        if credit == 0 {
            if !self.credit_requested {
                self.credit_requested = true;
                self.owed.credit_request = true;
            }
            return None;
        }
        let room = pkt.data_slice()?.len().min(credit as usize);
        let mut buf = pkt.data_slice()?.subslice(0, room).ok()?;
        match self.stream.read_volatile(&mut buf) {
            Ok(0) => {
                self.readable = false;
                self.client_eof = true;
                self.owed.shutdown |= SHUTDOWN_SEND;
                if self.client_gone {
                    // Closed, not half-closed: it takes nothing more either,
                    // and once the guest hears so this connection is done.
                    self.owed.shutdown |= SHUTDOWN_RCV;
                    let shutdown = self.owed.shutdown;
                    self.close_silently();
                    self.owed.shutdown = shutdown;
                }
                None
            }
            Ok(n) => {
                self.rx_cnt += Wrapping(n as u32);
                let r = self.reply(OP_RW, 0, n as u32);
                header::write(pkt, &r);
                Some(n as u32)
            }
            Err(VolatileMemoryError::IOError(e))
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) =>
            {
                self.readable = false;
                None
            }
            Err(_) => {
                self.client_gone = true;
                self.reset();
                None
            }
        }
    }
}
