//! The vsock device end to end, minus KVM: a pretend guest driver on mock
//! split queues (test_driver.rs), real Unix sockets for the host clients,
//! the handler in a real event-manager loop.

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

use virtio_bindings::virtio_mmio as reg;
use vm_memory::Bytes;

use super::defs::*;
use super::test_driver::{read_line, Desc, Guest, Hdr, EVENT_TRANSPORT_RESET, GUEST_CID, HDR_LEN};
use crate::virtio::VirtioDevice;

const GUEST_PORT: u32 = 1024;

/// Client connects to GUEST_PORT; the guest accepts, advertising
/// `buf_alloc` of receive space.
fn connect_with(g: &mut Guest, buf_alloc: u32) -> (UnixStream, u32) {
    let mut c = g.client();
    c.write_all(b"CONNECT 1024\n").unwrap();
    g.pump();
    g.give_rx(1, 4096);
    let req = g.recv().pop().expect("no REQUEST").hdr;
    let mut resp = Hdr::from_guest(GUEST_PORT, req.src_port, OP_RESPONSE);
    resp.buf_alloc = buf_alloc;
    g.send(resp, &[]);
    assert_eq!(read_line(&mut c), format!("OK {}\n", req.src_port));
    (c, req.src_port)
}

/// Everything the client can read right now.
fn drain(c: &mut UnixStream) -> Vec<u8> {
    c.set_nonblocking(true).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("client read: {e}"),
        }
    }
    c.set_nonblocking(false).unwrap();
    out
}

/// Reads from a client that fell behind until it has `len` bytes, letting
/// the device flush; returns the data and the guest packets sent meanwhile
/// (RX buffers are replenished as they are used).
fn catch_up(g: &mut Guest, c: &mut UnixStream, len: usize) -> (Vec<u8>, Vec<Hdr>) {
    let (mut got, mut pkts) = (Vec::new(), Vec::new());
    for _ in 0..10_000 {
        got.extend(drain(c));
        g.pump();
        for p in g.recv() {
            pkts.push(p.hdr);
            g.give_rx(1, 4096);
        }
        if got.len() >= len {
            return (got, pkts);
        }
    }
    panic!("the client got only {} of {len} bytes", got.len());
}

fn assert_eof(c: &mut UnixStream) {
    let mut b = [0u8; 16];
    assert_eq!(c.read(&mut b).unwrap(), 0, "expected EOF");
}

/// Bytes waiting in the client's receive queue.
fn queued(c: &UnixStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD on a socket fd we own writes one c_int through the
    // pointer, which points at a live local.
    let rc = unsafe { libc::ioctl(c.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(rc, 0);
    n as usize
}

fn pattern(from: usize, len: usize) -> Vec<u8> {
    (from..from + len).map(|i| (i % 251) as u8).collect()
}

#[test]
fn transport_shows_a_vsock_device_with_its_cid() {
    let mut g = Guest::new_unstarted();
    assert_eq!(g.read_reg(reg::VIRTIO_MMIO_DEVICE_ID), 19);
    assert_eq!(g.read_reg(reg::VIRTIO_MMIO_DEVICE_FEATURES), 0);
    g.write_reg(reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    assert_eq!(g.read_reg(reg::VIRTIO_MMIO_DEVICE_FEATURES), 1, "VERSION_1");
    g.write_reg(reg::VIRTIO_MMIO_QUEUE_SEL, 2);
    assert_eq!(g.read_reg(reg::VIRTIO_MMIO_QUEUE_NUM_MAX), 256);
    g.write_reg(reg::VIRTIO_MMIO_QUEUE_SEL, 3);
    assert_eq!(g.read_reg(reg::VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
    assert_eq!(g.read_reg(reg::VIRTIO_MMIO_CONFIG), GUEST_CID as u32);
    assert_eq!(g.read_reg(reg::VIRTIO_MMIO_CONFIG + 4), 0);
}

#[test]
fn reserved_cids_are_refused() {
    for cid in [0, 1, 2, u64::from(u32::MAX)] {
        let name = format!("mvm-vsock-cid-{}-{cid}", std::process::id());
        let l = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name).unwrap()).unwrap();
        assert!(matches!(
            super::new(cid, l, vec![], vec![]),
            Err(super::Error::InvalidCid(c)) if c == cid
        ));
    }
}

#[test]
fn activation_refuses_queues_outside_guest_memory() {
    use crate::virtio::{Activation, Interrupt};
    use std::sync::Arc;
    use virtio_queue::{Queue, QueueT};
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    let g = Guest::new_unstarted();
    let mut device = super::Vsock::new(
        GUEST_CID,
        Default::default(),
        EventFd::new(EFD_NONBLOCK).unwrap(),
    );
    let mut queues: Vec<Queue> = (0..3).map(|_| Queue::new(16).unwrap()).collect();
    for q in &mut queues {
        q.set_ready(true);
    }
    queues[1].set_desc_table_address(Some(0), Some(0x10));
    let err = device.activate(Activation {
        mem: g.mem.clone(),
        queues,
        interrupt: Arc::new(Interrupt::new(EventFd::new(EFD_NONBLOCK).unwrap())),
        acked_features: 1 << 32,
    });
    assert_eq!(err, Err(crate::virtio::device::Error::BadQueue(1)));
}

#[test]
fn connect_then_data_both_ways() {
    let mut g = Guest::new();
    let mut c = g.client();
    c.write_all(b"CONNECT 1024\n").unwrap();
    g.pump();
    g.give_rx(4, 4096);
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1);
    let req = pkts[0].hdr;
    assert_eq!(
        (req.op, req.type_, req.src_cid, req.dst_cid, req.dst_port),
        (OP_REQUEST, TYPE_STREAM, HOST_CID, GUEST_CID, GUEST_PORT)
    );
    assert!(req.src_port >= FIRST_HOST_PORT);
    assert_eq!(req.buf_alloc, CONN_BUF_SIZE);
    assert_eq!(pkts[0].used_len, HDR_LEN as u32);
    // The used buffer was signalled.
    assert_eq!(g.interrupt.status() & 1, 1);
    assert!(g.interrupt.irqfd().read().unwrap() >= 1);

    // Nothing reaches the client before the guest answers.
    c.set_nonblocking(true).unwrap();
    assert_eq!(
        c.read(&mut [0u8; 8]).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    c.set_nonblocking(false).unwrap();

    g.send(Hdr::from_guest(GUEST_PORT, req.src_port, OP_RESPONSE), &[]);
    assert_eq!(read_line(&mut c), format!("OK {}\n", req.src_port));
    assert_eq!(g.tx_used().len(), 1);

    c.write_all(b"hello guest").unwrap();
    g.pump();
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1);
    let p = &pkts[0];
    assert_eq!(p.hdr.op, OP_RW);
    assert_eq!(p.data, b"hello guest");
    assert_eq!(p.used_len, (HDR_LEN + 11) as u32);
    assert_eq!((p.hdr.src_port, p.hdr.dst_port), (req.src_port, GUEST_PORT));

    g.send(
        Hdr::from_guest(GUEST_PORT, req.src_port, OP_RW),
        b"hello host",
    );
    let mut buf = [0u8; 10];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello host");
    assert_eq!(g.tx_used(), vec![(0, 0)]);
}

#[test]
fn client_data_waits_for_guest_credit() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, 10);
    let data = pattern(0, 25);
    c.write_all(&data).unwrap();
    g.pump();
    g.give_rx(4, 4096);
    let pkts = g.recv();
    // 10 bytes of data, then a credit request; no more data without credit.
    assert_eq!(pkts.len(), 2, "{pkts:?}");
    assert_eq!((pkts[0].hdr.op, &pkts[0].data[..]), (OP_RW, &data[..10]));
    assert_eq!(pkts[1].hdr.op, OP_CREDIT_REQUEST);
    g.pump();
    assert!(g.recv().is_empty());

    // The guest's reader consumed 4 bytes: 4 more may come.
    let mut update = Hdr::from_guest(GUEST_PORT, port, OP_CREDIT_UPDATE);
    update.buf_alloc = 10;
    update.fwd_cnt = 4;
    g.send(update, &[]);
    let pkts = g.recv();
    assert_eq!(pkts.len(), 2, "{pkts:?}");
    assert_eq!((pkts[0].hdr.op, &pkts[0].data[..]), (OP_RW, &data[10..14]));
    assert_eq!(pkts[1].hdr.op, OP_CREDIT_REQUEST);

    // A bigger buffer: the rest flows.
    update.buf_alloc = 1000;
    g.send(update, &[]);
    g.give_rx(2, 4096);
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!((pkts[0].hdr.op, &pkts[0].data[..]), (OP_RW, &data[14..]));
}

/// The guest sends as fast as its credit allows to a client that never
/// reads, until it has no credit left; returns (bytes sent, last fwd_cnt
/// the device told it).
fn send_until_stalled(g: &mut Guest, port: u32) -> (u32, u32) {
    let (mut sent, mut fwd_seen) = (0u32, 0u32);
    g.give_rx(8, 4096);
    for _ in 0..10_000 {
        for p in g.recv() {
            assert_eq!(p.hdr.op, OP_CREDIT_UPDATE, "{:?}", p.hdr);
            assert_eq!(p.hdr.buf_alloc, CONN_BUF_SIZE);
            fwd_seen = p.hdr.fwd_cnt;
            g.give_rx(1, 4096);
        }
        let free = CONN_BUF_SIZE - (sent - fwd_seen);
        if free == 0 {
            return (sent, fwd_seen);
        }
        let n = free.min(4096);
        g.send(
            Hdr::from_guest(GUEST_PORT, port, OP_RW),
            &pattern(sent as usize, n as usize),
        );
        sent += n;
    }
    panic!("the guest never ran out of credit");
}

#[test]
fn slow_client_bounds_buffering_and_credit() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    let (sent, fwd_seen) = send_until_stalled(&mut g, port);

    // Credit was given back exactly for what the client socket took, and
    // the device holds no more than its buffer.
    assert_eq!(fwd_seen as usize, queued(&c));
    assert_eq!(sent - fwd_seen, CONN_BUF_SIZE);
    g.pump();
    assert!(
        g.recv().is_empty(),
        "no credit while the client reads nothing"
    );

    // The client catches up: everything arrives, in order, and the guest
    // hears all of it was forwarded.
    let (got, pkts) = catch_up(&mut g, &mut c, sent as usize);
    assert!(
        got == pattern(0, sent as usize),
        "data corrupted or reordered"
    );
    assert!(pkts.iter().all(|h| h.op == OP_CREDIT_UPDATE), "{pkts:?}");
    assert_eq!(pkts.last().map(|h| h.fwd_cnt), Some(sent));
}

#[test]
fn guest_overrunning_its_credit_is_reset() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    let (sent, _) = send_until_stalled(&mut g, port);
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RW), b"!");
    let pkts = g.recv();
    assert_eq!(pkts.last().map(|p| p.hdr.op), Some(OP_RST), "{pkts:?}");
    assert_eq!(g.handler().connection_count(), 0);
    // The client gets what was in its socket, then EOF; the buffer is lost.
    let got = drain(&mut c);
    assert!(got.len() < sent as usize);
    assert_eof(&mut c);
}

#[test]
fn client_half_close_becomes_shutdown_send() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    c.write_all(b"last words").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    g.pump();
    g.give_rx(4, 4096);
    let pkts = g.recv();
    assert_eq!(pkts.len(), 2, "{pkts:?}");
    assert_eq!(pkts[0].data, b"last words");
    assert_eq!(
        (pkts[1].hdr.op, pkts[1].hdr.flags),
        (OP_SHUTDOWN, SHUTDOWN_SEND)
    );

    // The other direction still works.
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RW), b"reply");
    let mut buf = [0u8; 5];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"reply");

    // The guest closes: RST, the client reads EOF, the connection is gone.
    let mut shut = Hdr::from_guest(GUEST_PORT, port, OP_SHUTDOWN);
    shut.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
    g.send(shut, &[]);
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!(pkts[0].hdr.op, OP_RST);
    assert_eof(&mut c);
    assert_eq!(g.handler().connection_count(), 0);
}

#[test]
fn guest_shutdown_send_half_closes_the_client() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RW), b"bye");
    let mut shut = Hdr::from_guest(GUEST_PORT, port, OP_SHUTDOWN);
    shut.flags = SHUTDOWN_SEND;
    g.send(shut, &[]);
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"bye");

    // The client can still talk.
    c.write_all(b"ok").unwrap();
    g.pump();
    g.give_rx(4, 4096);
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!(pkts[0].data, b"ok");

    // The client hangs up: the guest is told neither side sends nor
    // receives, and the connection is dropped.
    drop(c);
    g.pump();
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    assert_eq!(
        (pkts[0].hdr.op, pkts[0].hdr.flags),
        (OP_SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND)
    );
    assert_eq!(g.handler().connection_count(), 0);
    // Linux answers with an RST, which is not answered.
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RST), &[]);
    assert!(g.recv().is_empty());
}

#[test]
fn guest_shutdown_waits_for_buffered_data() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    let (sent, _) = send_until_stalled(&mut g, port);
    let mut shut = Hdr::from_guest(GUEST_PORT, port, OP_SHUTDOWN);
    shut.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
    g.send(shut, &[]);
    assert!(g.recv().is_empty(), "no RST while data is still buffered");
    let (got, pkts) = catch_up(&mut g, &mut c, sent as usize);
    assert!(got == pattern(0, sent as usize));
    assert_eof(&mut c);
    assert_eq!(pkts.last().map(|h| h.op), Some(OP_RST), "{pkts:?}");
    assert_eq!(g.handler().connection_count(), 0);
}

#[test]
fn guest_rst_closes_the_client() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RST), &[]);
    assert_eof(&mut c);
    assert_eq!(g.handler().connection_count(), 0);
    assert!(g.recv().is_empty(), "an RST is never answered");
}

#[test]
fn guest_refusing_the_request_closes_the_client() {
    let mut g = Guest::new();
    let mut c = g.client();
    c.write_all(b"CONNECT 7\n").unwrap();
    g.pump();
    g.give_rx(1, 4096);
    let req = g.recv().pop().unwrap().hdr;
    g.send(Hdr::from_guest(7, req.src_port, OP_RST), &[]);
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert!(got.is_empty(), "no OK line: {got:?}");
    assert_eq!(g.handler().connection_count(), 0);
}

#[test]
fn bad_connect_lines_close_the_client() {
    let mut g = Guest::new();
    for line in [
        &b"HELLO\n"[..],
        b"CONNECT x\n",
        b"CONNECT 12345678901234567\n",
    ] {
        let mut c = g.client();
        c.write_all(line).unwrap();
        g.pump();
        // Closed with part of the line unread, the socket reads as reset.
        match c.read(&mut [0u8; 8]) {
            Ok(0) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            other => panic!("{line:?}: client not closed: {other:?}"),
        }
    }
    g.give_rx(1, 4096);
    assert!(g.recv().is_empty(), "the guest heard nothing");
    assert_eq!(g.handler().connection_count(), 0);
}

#[test]
fn client_leaving_before_the_guest_answers() {
    let mut g = Guest::new();
    // Before the REQUEST went out (no RX buffer): nothing for the guest.
    let mut c = g.client();
    c.write_all(b"CONNECT 1024\n").unwrap();
    g.pump();
    drop(c);
    g.pump();
    g.give_rx(2, 4096);
    assert!(g.recv().is_empty());
    assert_eq!(g.handler().connection_count(), 0);

    // After it: the guest gets an RST.
    let mut c = g.client();
    c.write_all(b"CONNECT 1024\n").unwrap();
    g.pump();
    let req = g.recv().pop().unwrap().hdr;
    drop(c);
    g.pump();
    let rst = g.recv().pop().expect("no RST").hdr;
    assert_eq!((rst.op, rst.src_port), (OP_RST, req.src_port));
    assert_eq!(g.handler().connection_count(), 0);
}

#[test]
fn guest_initiated_connections_are_refused() {
    let mut g = Guest::new();
    g.give_rx(4, 4096);
    g.send(Hdr::from_guest(5000, 1234, OP_REQUEST), &[]);
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1);
    let h = pkts[0].hdr;
    assert_eq!(
        (h.op, h.src_cid, h.dst_cid, h.src_port, h.dst_port),
        (OP_RST, HOST_CID, GUEST_CID, 1234, 5000)
    );
    // Other packets for no connection get an RST too; an RST gets nothing.
    g.send(Hdr::from_guest(5000, 1234, OP_RW), b"data");
    assert_eq!(g.recv().pop().unwrap().hdr.op, OP_RST);
    g.send(Hdr::from_guest(5000, 1234, OP_RST), &[]);
    assert!(g.recv().is_empty());
    // A packet claiming another source CID, or for another CID: dropped.
    let mut spoof = Hdr::from_guest(5000, 1234, OP_REQUEST);
    spoof.src_cid = 7;
    g.send(spoof, &[]);
    let mut elsewhere = Hdr::from_guest(5000, 1234, OP_REQUEST);
    elsewhere.dst_cid = 9;
    g.send(elsewhere, &[]);
    assert!(g.recv().is_empty());
}

#[test]
fn malformed_tx_chains_are_dropped() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    g.give_rx(8, 4096);
    let rw = |len: u32| {
        let mut h = Hdr::from_guest(GUEST_PORT, port, OP_RW);
        h.len = len;
        h.to_bytes()
    };
    let hdr = HDR_LEN as u32;
    let far = 0xff_0000_0000u64;
    let cases: Vec<(&str, Vec<Desc>, u32)> = vec![
        ("header too short", vec![(None, 20, false)], 0),
        ("write-only header", vec![(None, hdr, true)], 0),
        ("header outside memory", vec![(Some(far), hdr, false)], 0),
        (
            "header across the end of memory",
            vec![(Some(super::test_driver::MEM_SIZE as u64 - 8), hdr, false)],
            0,
        ),
        ("data missing", vec![(None, hdr, false)], 5),
        (
            "data shorter than len",
            vec![(None, hdr, false), (None, 2, false)],
            5,
        ),
        (
            "write-only data",
            vec![(None, hdr, false), (None, 5, true)],
            5,
        ),
        (
            "data outside memory",
            vec![(None, hdr, false), (Some(far), 5, false)],
            5,
        ),
        (
            "len beyond the maximum",
            vec![(None, hdr, false), (None, 5, false)],
            MAX_PKT_DATA + 1,
        ),
    ];
    g.tx_used();
    for (what, descs, len) in cases {
        g.send_chain_with(&descs, &rw(len), b"XXXXX");
        assert_eq!(g.tx_used().len(), 1, "{what}: chain not returned");
        assert!(g.recv().is_empty(), "{what}: answered");
    }
    c.set_nonblocking(true).unwrap();
    assert_eq!(
        c.read(&mut [0u8; 8]).unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "malformed data reached the client"
    );
    c.set_nonblocking(false).unwrap();

    // Still working.
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RW), b"fine");
    let mut buf = [0u8; 4];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"fine");
}

#[test]
fn bad_op_or_type_on_a_connection_resets_it() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    g.give_rx(4, 4096);
    g.send(Hdr::from_guest(GUEST_PORT, port, 99), &[]);
    assert_eq!(g.recv().pop().unwrap().hdr.op, OP_RST);
    assert_eof(&mut c);
    assert_eq!(g.handler().connection_count(), 0);

    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    g.give_rx(4, 4096);
    let mut seqpacket = Hdr::from_guest(GUEST_PORT, port, OP_RW);
    seqpacket.type_ = 2;
    g.send(seqpacket, b"x");
    let rst = g.recv().pop().unwrap().hdr;
    assert_eq!((rst.op, rst.type_), (OP_RST, 2));
    // The stream connection itself is untouched.
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RW), b"y");
    let mut b = [0u8; 1];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"y");
}

#[test]
fn malformed_rx_buffers_are_returned_empty() {
    let mut g = Guest::new();
    g.send(Hdr::from_guest(5000, 1234, OP_REQUEST), &[]);
    let hdr = HDR_LEN as u32;
    let cases: Vec<Vec<Desc>> = vec![
        vec![(None, 20, true)],
        vec![(None, hdr, false), (None, 4096, true)],
        vec![(Some(0xff_0000_0000), hdr, true), (None, 4096, true)],
        vec![(None, hdr, true), (Some(0xff_0000_0000), 4096, true)],
        vec![(None, hdr, true), (None, 4096, false)],
    ];
    for descs in cases {
        let head = g.give_rx_chain(&descs);
        assert_eq!(g.rx_used_raw(), vec![(head, 0)], "{descs:?}");
    }
    // The RST still waits for a good buffer.
    g.give_rx(1, 4096);
    assert_eq!(g.recv().pop().unwrap().hdr.op, OP_RST);
}

#[test]
fn device_reset_ends_known_connections_only() {
    // A client that connects before the driver is up waits for it.
    let mut g = Guest::new_unstarted();
    let mut early = g.client();
    early.write_all(b"CONNECT 1024\n").unwrap();
    g.pump();
    g.start_driver();
    g.give_rx(1, 4096);
    let req = g
        .recv()
        .pop()
        .expect("REQUEST after the driver started")
        .hdr;
    g.send(Hdr::from_guest(GUEST_PORT, req.src_port, OP_RESPONSE), &[]);
    assert_eq!(read_line(&mut early), format!("OK {}\n", req.src_port));

    // A reset makes the guest forget it: the client reads EOF.
    g.write_reg(reg::VIRTIO_MMIO_STATUS, 0);
    g.pump();
    assert_eof(&mut early);
    assert_eq!(g.handler().connection_count(), 0);

    // After the driver comes back, new connections work.
    g.start_driver();
    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RW), b"again");
    let mut buf = [0u8; 5];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"again");
}

#[test]
fn connections_beyond_the_limit_are_closed() {
    let mut g = Guest::new();
    let mut clients: Vec<UnixStream> = (0..MAX_CONNECTIONS).map(|_| g.client()).collect();
    assert_eq!(g.handler().connection_count(), MAX_CONNECTIONS);
    let mut extra = g.client();
    assert_eof(&mut extra);
    clients.clear();
    g.pump();
    assert_eq!(g.handler().connection_count(), 0);
}

#[test]
fn single_descriptor_buffers_as_linux_uses_them() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, 256 * 1024);
    c.write_all(b"one buffer").unwrap();
    g.pump();
    let head = g.give_rx_chain(&[(None, (HDR_LEN + 4096) as u32, true)]);
    let used = g.rx_used_raw();
    assert_eq!(used, vec![(head, (HDR_LEN + 10) as u32)]);
    let mut raw = [0u8; HDR_LEN + 10];
    g.mem
        .read_slice(&mut raw, vm_memory::GuestAddress(g.rx_area(head)))
        .unwrap();
    let hdr = Hdr::parse(raw[..HDR_LEN].try_into().unwrap());
    assert_eq!((hdr.op, hdr.len), (OP_RW, 10));
    assert_eq!(&raw[HDR_LEN..], b"one buffer");

    // Header and data in one TX descriptor too.
    let mut h = Hdr::from_guest(GUEST_PORT, port, OP_RW);
    h.len = 4;
    let mut bytes = h.to_bytes().to_vec();
    bytes.extend_from_slice(b"back");
    g.send_chain_with(&[(None, bytes.len() as u32, false)], &bytes, &[]);
    let mut buf = [0u8; 4];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"back");
}

#[test]
fn payload_spread_over_descriptors_as_linux_sends_it() {
    let mut g = Guest::new();
    let (mut c, port) = connect_with(&mut g, CONN_BUF_SIZE);
    let mut h = Hdr::from_guest(GUEST_PORT, port, OP_RW);
    h.len = 12;
    let bytes = h.to_bytes();
    // The header split over two descriptors, the second also holding the
    // start of the payload; the rest of the payload in two more.
    g.poke(0xf0_0000, &bytes[20..]);
    g.poke(0xf0_0000 + 24, b"spread");
    g.poke(0xf2_0000, b" over");
    g.poke(0xf3_0000, b"!");
    g.send_chain_with(
        &[
            (None, 20, false),
            (Some(0xf0_0000), 24 + 6, false),
            (Some(0xf2_0000), 5, false),
            (Some(0xf3_0000), 1, false),
        ],
        &bytes[..20],
        &[],
    );
    let mut buf = [0u8; 12];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"spread over!");

    // One byte short of `len`: dropped.
    h.len = 13;
    let bytes = h.to_bytes();
    g.poke(0xf0_0000, &bytes[20..]);
    g.send_chain_with(
        &[
            (None, 20, false),
            (Some(0xf0_0000), 24 + 6, false),
            (Some(0xf2_0000), 5, false),
            (Some(0xf3_0000), 1, false),
        ],
        &bytes[..20],
        &[],
    );
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RW), b"next");
    let mut buf = [0u8; 4];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"next");
}

#[test]
fn a_restored_device_carries_on_at_the_saved_ring_positions() {
    let mut g = Guest::new();
    // Traffic before the save moves every ring past its start.
    let (mut before, port) = connect_with(&mut g, 65536);
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RW), b"before");
    g.pump();
    assert_eq!(drain(&mut before), b"before");
    let saved = g.transport.save().unwrap();
    assert!(
        saved.queues.iter().take(2).all(|q| q.next_avail > 0),
        "{saved:?}"
    );

    g.save_and_restore();
    // Connections are host resources, not state: the new device has none,
    // and the guest's next packets are read from where the old device
    // stopped (a device restarted at 0 would replay the old chains).
    assert_eq!(g.handler().connection_count(), 0);
    let (mut after, port) = connect_with(&mut g, 65536);
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RW), b"after");
    g.pump();
    assert_eq!(drain(&mut after), b"after");
    after.write_all(b"to guest").unwrap();
    g.pump();
    g.give_rx(1, 4096);
    let pkt = g.recv().pop().expect("data for the guest");
    assert_eq!((pkt.hdr.op, &pkt.data[..]), (OP_RW, &b"to guest"[..]));
}

/// A client connecting as another uid: the second user of a sandbox
/// whose socket someone made reachable. Needs root (to become that uid in
/// a child); skipped otherwise. The child uses raw system calls only
/// (this test process has other threads).
#[test]
fn a_client_of_another_user_is_closed_unheard() {
    // SAFETY: plain syscall without arguments.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: becoming another uid to connect needs root");
        return;
    }
    let mut g = Guest::new();
    let name = g.addr().as_abstract_name().unwrap().to_vec();
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in name.iter().enumerate() {
        sa.sun_path[i + 1] = *b as libc::c_char; // sun_path[0] = 0: abstract
    }
    let sa_len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
    // SAFETY: the child makes only system calls on memory prepared above
    // and ends with _exit; the parent waits for it.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: system calls on valid memory; _exit never returns.
        unsafe {
            let timeout = libc::timeval {
                tv_sec: 5,
                tv_usec: 0,
            };
            let code = if libc::setresuid(65534, 65534, 65534) != 0 {
                3
            } else {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    std::ptr::from_ref(&timeout).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                );
                let line = b"CONNECT 1024\n";
                let mut byte = 0u8;
                if libc::connect(fd, std::ptr::from_ref(&sa).cast(), sa_len) != 0 {
                    4
                } else if libc::write(fd, line.as_ptr().cast(), line.len()) < 0 {
                    5
                } else {
                    // End of stream or a reset: closed unheard. A byte:
                    // served; a timeout: left waiting.
                    match libc::read(fd, std::ptr::from_mut(&mut byte).cast(), 1) {
                        0 => 0,
                        1 => 6,
                        _ if *libc::__errno_location() == libc::ECONNRESET => 0,
                        _ => 7,
                    }
                }
            };
            libc::_exit(code);
        }
    }
    let mut status = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        g.pump();
        // SAFETY: status is a valid out-pointer.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the child hangs");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the other user's client was served"
    );
    g.give_rx(1, 4096);
    assert!(g.recv().is_empty(), "its CONNECT reached the guest");
    // The positive control: this user's client is heard.
    let (_c, _port) = connect_with(&mut g, 4096);
}

/// A restored device tells the driver its connections are gone
/// (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET, once), and no host packet reaches
/// the guest before the driver has handled it: a host connection taken
/// first would be reset with the old ones.
#[test]
fn a_restored_device_resets_the_transport_before_any_host_packet() {
    let mut g = Guest::new();
    // A booted device owes nothing: the control for the event below.
    assert_eq!(g.handle_events(), []);
    g.scribble_on_event_buffers();

    g.save_and_restore_unhandled();
    let mut c = g.client();
    c.write_all(b"CONNECT 1024\n").unwrap();
    g.pump();
    g.give_rx(1, 4096);
    let early: Vec<Hdr> = g.recv().into_iter().map(|p| p.hdr).collect();
    assert_eq!(early, [], "a host packet before the reset was handled");
    // The event is on the queue with its interrupt; handling it (the
    // buffer given back) lets the waiting request through.
    assert_ne!(g.interrupt.status(), 0);
    assert_eq!(g.handle_events(), [EVENT_TRANSPORT_RESET]);
    let req = g
        .recv()
        .pop()
        .expect("the REQUEST, once the reset was handled");
    assert_eq!((req.hdr.op, req.hdr.dst_port), (OP_REQUEST, 1024));
    g.send(
        Hdr::from_guest(GUEST_PORT, req.hdr.src_port, OP_RESPONSE),
        &[],
    );
    assert_eq!(read_line(&mut c), format!("OK {}\n", req.hdr.src_port));
    // Once only.
    g.pump();
    assert_eq!(g.handle_events(), []);
}

/// A driver that starts the device over after a restore has dropped its
/// connections itself: nothing is owed, and nothing waits for it.
#[test]
fn a_driver_reset_after_a_restore_owes_no_transport_reset() {
    let mut g = Guest::new();
    g.save_and_restore_unhandled();
    g.start_driver();
    let (mut c, port) = connect_with(&mut g, 65536);
    g.send(Hdr::from_guest(GUEST_PORT, port, OP_RW), b"fresh");
    g.pump();
    assert_eq!(drain(&mut c), b"fresh");
}

/// The reset waits for a buffer that can hold it: a driver that offered
/// none yet gets it in the first it offers, and one too short goes back
/// empty first. Host packets wait until every buffer given back is back.
#[test]
fn the_transport_reset_waits_for_a_buffer_that_holds_it() {
    let held = |g: &mut Guest| -> Vec<Hdr> { g.recv().into_iter().map(|p| p.hdr).collect() };

    let mut g = Guest::new_unstarted();
    g.start_driver_with_event_buffers(&[]);
    g.save_and_restore_unhandled();
    let mut c = g.client();
    c.write_all(b"CONNECT 1024\n").unwrap();
    g.pump();
    g.give_rx(1, 4096);
    assert_eq!(g.handle_events(), []);
    assert_eq!(held(&mut g), [], "a host packet before any reset");
    g.give_event_buffer(4);
    assert_eq!(
        held(&mut g),
        [],
        "a host packet before the reset was handled"
    );
    assert_eq!(g.handle_events(), [EVENT_TRANSPORT_RESET]);
    assert_eq!(held(&mut g).len(), 1, "the REQUEST after the reset");

    let mut g = Guest::new_unstarted();
    g.start_driver_with_event_buffers(&[2, 4]);
    g.save_and_restore_unhandled();
    let mut c = g.client();
    c.write_all(b"CONNECT 1024\n").unwrap();
    g.pump();
    g.give_rx(1, 4096);
    assert_eq!(held(&mut g), []);
    assert_eq!(g.handle_events(), [None, EVENT_TRANSPORT_RESET]);
    assert_eq!(held(&mut g).len(), 1, "the REQUEST after the reset");
}
