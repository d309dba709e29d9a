//! Guest-initiated connections to a served port (e.g. the egress proxy's):
//! accepted when the port's Unix socket has a listener, one stream per
//! guest connection, data and shutdowns both ways; refused with an RST
//! everywhere else, as before.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use vmm_sys_util::tempdir::TempDir;

use super::defs::*;
use super::test_driver::{Guest, Hdr, GUEST_CID};
use super::GuestPort;

const SERVED: u32 = 1080;

/// A served port's socket path in a directory of its own, removed with the
/// returned guard when the test ends (pass or fail).
fn socket_path() -> (TempDir, PathBuf) {
    let dir = TempDir::new_with_prefix(std::env::temp_dir().join("mvm-vsock-gp-")).unwrap();
    let path = dir.as_path().join("egress.sock");
    (dir, path)
}

fn serving(path: &Path) -> Guest {
    Guest::serving(vec![GuestPort {
        port: SERVED,
        socket: path.to_path_buf(),
    }])
}

/// The guest connects from `guest_port`; returns the accepted host stream.
fn guest_connects(g: &mut Guest, listener: &UnixListener, guest_port: u32) -> UnixStream {
    g.send(Hdr::from_guest(guest_port, SERVED, OP_REQUEST), &[]);
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    let h = pkts[0].hdr;
    assert_eq!(
        (h.op, h.src_cid, h.dst_cid, h.src_port, h.dst_port),
        (OP_RESPONSE, HOST_CID, GUEST_CID, SERVED, guest_port)
    );
    assert_eq!(h.buf_alloc, CONN_BUF_SIZE);
    let (stream, _) = listener
        .accept()
        .expect("the device connected to the socket");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
}

#[test]
fn a_guest_connection_to_a_served_port_reaches_its_socket() {
    let (_dir, path) = socket_path();
    let listener = UnixListener::bind(&path).unwrap();
    let mut g = serving(&path);
    g.give_rx(8, 4096);
    let mut host = guest_connects(&mut g, &listener, 40000);
    assert_eq!(g.handler().connection_count(), 1);

    g.send(
        Hdr::from_guest(40000, SERVED, OP_RW),
        b"CONNECT example.org:443 HTTP/1.1\r\n\r\n",
    );
    let mut buf = vec![0u8; 36];
    host.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"CONNECT example.org:443 HTTP/1.1\r\n\r\n");

    host.write_all(b"HTTP/1.1 403 Forbidden\r\n").unwrap();
    g.pump();
    g.give_rx(4, 4096);
    let pkts = g.recv();
    let data: Vec<u8> = pkts
        .iter()
        .filter(|p| p.hdr.op == OP_RW)
        .flat_map(|p| p.data.clone())
        .collect();
    assert_eq!(data, b"HTTP/1.1 403 Forbidden\r\n");
    assert!(pkts
        .iter()
        .all(|p| p.hdr.dst_port == 40000 && p.hdr.src_port == SERVED));

    // The host closes: the guest hears SHUTDOWN (send, then both).
    drop(host);
    g.pump();
    g.give_rx(4, 4096);
    let shut: Vec<u32> = g
        .recv()
        .iter()
        .filter(|p| p.hdr.op == OP_SHUTDOWN)
        .map(|p| p.hdr.flags)
        .collect();
    assert!(!shut.is_empty(), "no shutdown after the host closed");
    assert_eq!(
        shut.iter().fold(0, |a, f| a | f),
        SHUTDOWN_RCV | SHUTDOWN_SEND
    );
}

#[test]
fn two_guest_connections_to_one_port_stay_apart() {
    let (_dir, path) = socket_path();
    let listener = UnixListener::bind(&path).unwrap();
    let mut g = serving(&path);
    g.give_rx(8, 4096);
    let mut a = guest_connects(&mut g, &listener, 40001);
    let mut b = guest_connects(&mut g, &listener, 40002);
    assert_eq!(g.handler().connection_count(), 2);
    g.send(Hdr::from_guest(40002, SERVED, OP_RW), b"to-b");
    g.send(Hdr::from_guest(40001, SERVED, OP_RW), b"to-a");
    let mut buf = [0u8; 4];
    a.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"to-a");
    b.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"to-b");
    // The guest closes one: that stream reads EOF, the other goes on.
    g.send(
        Hdr::from_guest(40001, SERVED, OP_SHUTDOWN).with_flags(SHUTDOWN_RCV | SHUTDOWN_SEND),
        &[],
    );
    assert_eq!(a.read(&mut buf).unwrap(), 0);
    g.send(Hdr::from_guest(40002, SERVED, OP_RW), b"more");
    b.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"more");
}

#[test]
fn without_a_listener_or_on_another_port_the_guest_gets_a_reset() {
    let (_dir, path) = socket_path();
    let mut g = serving(&path);
    g.give_rx(8, 4096);
    // Served port, but nothing listens on its socket.
    g.send(Hdr::from_guest(40003, SERVED, OP_REQUEST), &[]);
    assert_eq!(g.recv().pop().unwrap().hdr.op, OP_RST);
    // A listener now, but the guest asks for another port.
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    g.send(Hdr::from_guest(40004, SERVED + 1, OP_REQUEST), &[]);
    assert_eq!(g.recv().pop().unwrap().hdr.op, OP_RST);
    assert!(
        listener.accept().is_err(),
        "a refused port reached the socket"
    );
    // Control: the served port with its listener is accepted.
    g.send(Hdr::from_guest(40005, SERVED, OP_REQUEST), &[]);
    assert_eq!(g.recv().pop().unwrap().hdr.op, OP_RESPONSE);
    assert!(listener.accept().is_ok());
    assert_eq!(g.handler().connection_count(), 1);
}

#[test]
fn guest_connections_beyond_the_limit_are_reset() {
    let (_dir, path) = socket_path();
    let listener = UnixListener::bind(&path).unwrap();
    let mut g = serving(&path);
    let mut held = Vec::new();
    for i in 0..MAX_CONNECTIONS as u32 {
        g.give_rx(1, 4096);
        g.send(Hdr::from_guest(41000 + i, SERVED, OP_REQUEST), &[]);
        assert_eq!(
            g.recv().pop().unwrap().hdr.op,
            OP_RESPONSE,
            "connection {i}"
        );
        held.push(listener.accept().unwrap().0);
    }
    g.give_rx(1, 4096);
    g.send(Hdr::from_guest(42000, SERVED, OP_REQUEST), &[]);
    assert_eq!(g.recv().pop().unwrap().hdr.op, OP_RST);
    assert_eq!(g.handler().connection_count(), MAX_CONNECTIONS);
}
