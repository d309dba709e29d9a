//! The connection table: routes guest packets to connections by port,
//! picks which connection fills the next guest RX buffer, answers packets
//! that match no connection, and keeps each client socket's epoll
//! registration in line with what its connection wants.
//!
//! Connections are host-initiated, except on the ports the VMM was told
//! to serve for the guest ([`GuestPort`]: e.g. the egress proxy's): a
//! guest OP_REQUEST to one of those is accepted if the device can connect
//! to that port's Unix socket. Every other guest OP_REQUEST is answered
//! with OP_RST: the guest gets no channel to the host but those.
//!
//! Keys: a host-initiated connection's host port is unique (allocated
//! here), so it is the key; the connections of one served port share it,
//! and are told apart by the guest's port: [`key`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use event_manager::{EventOps, EventSet, Events};
use virtio_vsock::packet::VsockPacket;
use vm_memory::bitmap::BitmapSlice;

use super::connection::{Connection, GuestHeader};
use super::defs::{
    FIRST_HOST_PORT, HOST_CID, MAX_CONNECTIONS, MAX_STRAY_REPLIES, OP_REQUEST, OP_RST, TYPE_STREAM,
};
use super::header::{self, Reply};
use super::unix_connect::connect_nonblocking;

/// A host port the guest may connect to, and the Unix socket whose
/// listener serves it (one stream per guest connection, like
/// Firecracker's `uds_path_PORT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestPort {
    pub port: u32,
    pub socket: PathBuf,
}

/// The connection table's key: the host port above, the guest port below
/// (0 for host-initiated connections, whose host port alone is unique).
fn key(host_port: u32, guest_port: u32) -> u64 {
    (u64::from(host_port) << 32) | u64::from(guest_port)
}

/// An RST owed for a packet that matched no connection.
#[derive(Debug, Clone, Copy)]
struct Stray {
    host_port: u32,
    guest_port: u32,
    type_: u16,
}

#[derive(Debug)]
pub(super) struct Muxer {
    guest_cid: u64,
    /// By [`key`].
    conns: BTreeMap<u64, Connection>,
    /// Client socket to key.
    by_fd: HashMap<RawFd, u64>,
    stray: VecDeque<Stray>,
    next_port: u32,
    /// Key from which the next RX buffer is offered: round robin, so one
    /// busy connection cannot starve the others.
    rr_next: u64,
    /// The ports guest-initiated connections may reach.
    guest_ports: Vec<GuestPort>,
}

impl Muxer {
    pub(super) fn new(guest_cid: u64, guest_ports: Vec<GuestPort>) -> Self {
        Self {
            guest_cid,
            conns: BTreeMap::new(),
            by_fd: HashMap::new(),
            stray: VecDeque::new(),
            next_port: FIRST_HOST_PORT,
            rr_next: 0,
            guest_ports,
        }
    }

    fn served(&self, host_port: u32) -> Option<&GuestPort> {
        self.guest_ports.iter().find(|g| g.port == host_port)
    }

    pub(super) fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// A host port no live connection uses, counting up from
    /// FIRST_HOST_PORT and wrapping back to it.
    fn alloc_port(&mut self) -> u32 {
        loop {
            let port = self.next_port;
            self.next_port = port.checked_add(1).unwrap_or(FIRST_HOST_PORT);
            if !self.conns.contains_key(&key(port, 0)) && self.served(port).is_none() {
                return port;
            }
        }
    }

    /// A client connected to the Unix socket.
    pub(super) fn accept(&mut self, stream: UnixStream, ops: &mut EventOps) {
        if self.conns.len() >= MAX_CONNECTIONS || stream.set_nonblocking(true).is_err() {
            // Dropping the stream closes it: the client reads EOF at once.
            return;
        }
        let port = self.alloc_port();
        let mut conn = Connection::new(stream, self.guest_cid, port);
        let Some(interest) = conn.interest() else {
            return;
        };
        if ops.add(Events::new(conn.stream(), interest)).is_err() {
            return;
        }
        conn.epoll = Some(interest);
        self.by_fd.insert(conn.fd(), key(port, 0));
        self.conns.insert(key(port, 0), conn);
    }

    /// A guest OP_REQUEST to a served port: connected to its socket and
    /// accepted, or refused (no listener, its backlog full, too many
    /// connections) with an RST like any other. The new stream is put in
    /// epoll by the next `sync_epoll`.
    fn accept_guest(&mut self, host_port: u32, guest_port: u32, hdr: GuestHeader) -> bool {
        let Some(served) = self.served(host_port) else {
            return false;
        };
        if self.conns.len() >= MAX_CONNECTIONS
            || self.conns.contains_key(&key(host_port, guest_port))
        {
            return false;
        }
        let Ok(stream) = connect_nonblocking(&served.socket) else {
            return false;
        };
        let conn = Connection::accepted(stream, self.guest_cid, host_port, guest_port, hdr);
        self.by_fd.insert(conn.fd(), key(host_port, guest_port));
        self.conns.insert(key(host_port, guest_port), conn);
        true
    }

    /// Whether `fd` is a client socket of ours.
    pub(super) fn owns(&self, fd: RawFd) -> bool {
        self.by_fd.contains_key(&fd)
    }

    pub(super) fn on_client_event(&mut self, fd: RawFd, set: EventSet) {
        if let Some(conn) = self.by_fd.get(&fd).and_then(|p| self.conns.get_mut(p)) {
            conn.on_client_event(set);
        }
    }

    /// A packet the guest put on the TX queue.
    pub(super) fn on_guest_packet<B: BitmapSlice>(&mut self, pkt: &VsockPacket<'_, B>) {
        if pkt.src_cid() != self.guest_cid || pkt.dst_cid() != HOST_CID {
            // Not from our guest or not for us: nobody to answer.
            return;
        }
        let hdr = GuestHeader {
            op: pkt.op(),
            flags: pkt.flags(),
            buf_alloc: pkt.buf_alloc(),
            fwd_cnt: pkt.fwd_cnt(),
        };
        let served = self.served(pkt.dst_port()).is_some();
        let k = key(pkt.dst_port(), if served { pkt.src_port() } else { 0 });
        let known = self
            .conns
            .get(&k)
            .is_some_and(|c| c.guest_port() == Some(pkt.src_port()));
        if known && pkt.type_() == TYPE_STREAM {
            if let Some(conn) = self.conns.get_mut(&k) {
                conn.on_guest_packet(hdr, pkt.data_slice());
            }
            return;
        }
        // Never answer an RST, or two peers could bounce them for ever.
        if hdr.op == OP_RST {
            return;
        }
        let accepted = !known
            && served
            && hdr.op == OP_REQUEST
            && pkt.type_() == TYPE_STREAM
            && self.accept_guest(pkt.dst_port(), pkt.src_port(), hdr);
        // A REQUEST to a port nobody serves (or that could not be
        // connected), a packet for a connection that is gone or never was,
        // a socket type we do not do: refused.
        if !accepted && self.stray.len() < MAX_STRAY_REPLIES {
            self.stray.push_back(Stray {
                host_port: pkt.dst_port(),
                guest_port: pkt.src_port(),
                type_: pkt.type_(),
            });
        }
    }

    pub(super) fn has_pending_rx(&self) -> bool {
        !self.stray.is_empty() || self.conns.values().any(Connection::has_pending_rx)
    }

    /// Fills one guest RX buffer; the data length, or None if no packet is
    /// waiting (or none fits this buffer).
    pub(super) fn fill_rx<B: BitmapSlice>(&mut self, pkt: &mut VsockPacket<'_, B>) -> Option<u32> {
        if let Some(s) = self.stray.pop_front() {
            header::write(
                pkt,
                &Reply {
                    guest_cid: self.guest_cid,
                    host_port: s.host_port,
                    guest_port: s.guest_port,
                    type_: s.type_,
                    op: OP_RST,
                    flags: 0,
                    len: 0,
                    fwd_cnt: 0,
                },
            );
            return Some(0);
        }
        let order: Vec<u64> = self
            .conns
            .range(self.rr_next..)
            .chain(self.conns.range(..self.rr_next))
            .filter(|(_, c)| c.has_pending_rx())
            .map(|(p, _)| *p)
            .collect();
        for port in order {
            let Some(conn) = self.conns.get_mut(&port) else {
                continue;
            };
            if let Some(len) = conn.fill_rx(pkt) {
                self.rr_next = port.wrapping_add(1);
                return Some(len);
            }
        }
        None
    }

    /// The driver reset the device: the guest forgot every connection it
    /// had heard of, so those end (their clients see EOF); clients still
    /// waiting for their REQUEST to go out keep waiting for the new driver.
    pub(super) fn on_device_reset(&mut self) {
        self.stray.clear();
        for conn in self.conns.values_mut() {
            if conn.guest_knows() {
                conn.close_silently();
            }
        }
    }

    /// Brings each client socket's epoll registration in line with what its
    /// connection wants, and drops finished connections (closing their
    /// sockets, after taking them out of epoll: event-manager must never see
    /// an fd number it no longer knows).
    pub(super) fn sync_epoll(&mut self, ops: &mut EventOps) {
        let mut finished = Vec::new();
        for (port, conn) in self.conns.iter_mut() {
            let want = conn.interest();
            match (conn.epoll, want) {
                // On failure the old interest stays recorded and the next
                // sync tries again.
                (Some(cur), Some(want))
                    if cur != want && ops.modify(Events::new(conn.stream(), want)).is_ok() =>
                {
                    conn.epoll = Some(want);
                }
                // A guest-initiated connection, not watched yet.
                (None, Some(want)) if ops.add(Events::new(conn.stream(), want)).is_ok() => {
                    conn.epoll = Some(want);
                }
                (Some(_), None) => {
                    // Removal only fails for an fd epoll does not have; either
                    // way it is out of the watch list now.
                    let _ = ops.remove(Events::empty(conn.stream()));
                    conn.epoll = None;
                }
                _ => {}
            }
            if conn.is_finished() {
                finished.push(*port);
            }
        }
        for port in finished {
            if let Some(conn) = self.conns.remove(&port) {
                self.by_fd.remove(&conn.fd());
            }
        }
    }
}
