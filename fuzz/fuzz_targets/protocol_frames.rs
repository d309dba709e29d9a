//! The exec channel's frame decoder on both sides: the host's `Decoder`
//! (bytes pushed in pieces of any size, as they arrive from the vsock
//! socket) and the guest's `FrameReader` and handshake (hello, then the
//! Exec request, then its preparation into a command). Besides panics,
//! hangs and runaway allocations: every message either side decodes
//! encodes again and decodes to the same message, and both sides agree on
//! what the bytes say.

#![no_main]

use std::io::{self, Read, Write};

use libfuzzer_sys::fuzz_target;
use mvm_guest_init::agent::{handshake, request};
use mvm_protocol::{Decoder, FrameReader, Message};

fuzz_target!(|data: &[u8]| {
    let Some((&piece, bytes)) = data.split_first() else {
        return;
    };
    let host = host_side(bytes, usize::from(piece % 64) + 1);
    let guest = guest_side(bytes);
    // The host stops at the first bad frame; the guest's reader at the
    // first error too: up to there they read the same messages.
    let n = host.len().min(guest.len());
    assert_eq!(host[..n], guest[..n], "host and guest decoded differently");
    for message in host.iter().chain(&guest) {
        round_trip(message);
    }
    guest_handshake(bytes);
});

/// What the host's decoder makes of `bytes` pushed `piece` bytes at a time.
fn host_side(bytes: &[u8], piece: usize) -> Vec<Message> {
    let mut decoder = Decoder::new();
    let mut out = Vec::new();
    for chunk in bytes.chunks(piece) {
        decoder.push(chunk);
        for message in decoder.by_ref() {
            match message {
                Ok(m) => out.push(m),
                Err(_) => return out,
            }
        }
    }
    let _ = decoder.finish();
    out
}

fn guest_side(bytes: &[u8]) -> Vec<Message> {
    let mut reader = FrameReader::new(bytes);
    let mut out = Vec::new();
    while let Ok(Some(message)) = reader.read_message() {
        out.push(message);
    }
    out
}

fn round_trip(message: &Message) {
    let frame = message.to_frame().expect("a decoded message encodes again");
    let mut again = Decoder::new();
    again.push(&frame);
    let decoded = again.next().expect("a whole frame").expect("it decodes");
    assert_eq!(&decoded, message, "the round trip changed the message");
}

/// The guest agent's side of a connection whose host sends `bytes`.
fn guest_handshake(bytes: &[u8]) {
    let mut stream = Peer {
        input: bytes,
        output: Vec::new(),
    };
    if handshake::hello(&mut stream).is_err() {
        return;
    }
    if let Ok(handshake::Asked::Exec(exec)) = handshake::read_exec(&mut stream) {
        let _ = request::prepare(&exec);
    }
}

/// The host end as the agent sees it: what the host sent, and a sink.
struct Peer<'a> {
    input: &'a [u8],
    output: Vec<u8>,
}

impl Read for Peer<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Peer<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
