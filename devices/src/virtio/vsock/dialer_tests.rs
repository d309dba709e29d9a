//! Host clients handed over in-process (`Dialer`): the same hybrid
//! protocol as a client of the Unix socket, with no `connect`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use super::defs::*;
use super::test_driver::{read_line, Guest, Hdr};

const GUEST_PORT: u32 = 1024;

/// A dialled client asks for GUEST_PORT; the request the guest got.
fn dial(g: &mut Guest) -> (UnixStream, Hdr) {
    let mut c = g.dialed_client();
    c.write_all(b"CONNECT 1024\n").unwrap();
    g.pump();
    g.give_rx(1, 4096);
    let req = g.recv().pop().expect("the guest got no OP_REQUEST").hdr;
    assert_eq!((req.op, req.dst_port), (OP_REQUEST, GUEST_PORT));
    (c, req)
}

#[test]
fn a_dialed_client_reaches_the_guest_and_back() {
    let mut g = Guest::new();
    let (mut c, req) = dial(&mut g);
    let mut resp = Hdr::from_guest(GUEST_PORT, req.src_port, OP_RESPONSE);
    resp.buf_alloc = 4096;
    g.send(resp, &[]);
    assert_eq!(read_line(&mut c), format!("OK {}\n", req.src_port));
    // Both ways: the client's bytes reach the guest, the guest's the client.
    c.write_all(b"ping").unwrap();
    g.pump();
    g.give_rx(1, 4096);
    let data = g.recv().pop().expect("no data for the guest");
    assert_eq!((data.hdr.op, data.data.as_slice()), (OP_RW, &b"ping"[..]));
    g.send(Hdr::from_guest(GUEST_PORT, req.src_port, OP_RW), b"pong");
    let mut back = [0u8; 4];
    c.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"pong");
    assert_eq!(g.handler().connection_count(), 1);
}

#[test]
fn a_dialed_client_the_guest_refuses_reads_eof() {
    let mut g = Guest::new();
    let (mut c, req) = dial(&mut g);
    g.send(Hdr::from_guest(GUEST_PORT, req.src_port, OP_RST), &[]);
    let mut buf = [0u8; 16];
    assert_eq!(c.read(&mut buf).unwrap(), 0, "the refused client is closed");
    assert_eq!(g.handler().connection_count(), 0);
}
