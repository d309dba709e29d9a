//! The wire format through the public API: every message round-trips through
//! both readers, and damaged streams give typed errors, not panics.

use std::io::{self, Read};

use mvm_protocol::{
    Decoder, ErrorReport, ExecRequest, Exit, FrameError, FrameReader, Hello, Kind, Message,
    MessageError, Resize, Signal, LEN_BYTES, MAX_DATA, MAX_FRAME,
};

fn every_message() -> Vec<Message> {
    vec![
        Message::Hello(Hello::current()),
        Message::Exec(ExecRequest {
            argv: vec!["sh".into(), "-c".into(), "echo 'ü' \"$X\"".into()],
            env: vec![("X".into(), "a=b".into()), ("EMPTY".into(), String::new())],
            cwd: "/".into(),
            uid: 1000,
            gid: 1000,
            tty: true,
            rows: 50,
            cols: 132,
            max_procs: 4096,
            user_name: None,
            user: None,
            egress: false,
            setup: None,
            keep_serving: true,
        }),
        Message::Stdin(b"line\n\0\xff".to_vec()),
        Message::Stdin(Vec::new()),
        Message::StdinEof,
        Message::Shutdown,
        Message::Signal(Signal { signal: 2 }),
        Message::Resize(Resize {
            rows: u16::MAX,
            cols: 1,
        }),
        Message::Stdout(vec![0xab; MAX_DATA]),
        Message::Stderr(b"oops\n".to_vec()),
        Message::Exit(Exit::exited(3)),
        Message::Exit(Exit::signaled(9)),
        Message::Error(ErrorReport {
            message: "cannot run 'x': No such file or directory".into(),
        }),
    ]
}

fn stream(messages: &[Message]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        m.encode(&mut out).unwrap();
    }
    out
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = ((payload.len() + 1) as u32).to_le_bytes().to_vec();
    f.push(kind);
    f.extend_from_slice(payload);
    f
}

#[test]
fn frame_layout() {
    let bytes = Message::Stdin(b"hi".to_vec()).to_frame().unwrap();
    assert_eq!(bytes, [3, 0, 0, 0, Kind::Stdin.byte(), b'h', b'i']);
    let bytes = Message::StdinEof.to_frame().unwrap();
    assert_eq!(bytes, [1, 0, 0, 0, 4]);
    let hello = Message::Hello(Hello::current()).to_frame().unwrap();
    assert_eq!(hello, frame(1, br#"{"version":2}"#));
}

#[test]
fn every_message_round_trips_through_the_frame_reader() {
    let messages = every_message();
    let bytes = stream(&messages);
    let mut reader = FrameReader::new(&bytes[..]);
    for expected in &messages {
        assert_eq!(reader.read_message().unwrap().as_ref(), Some(expected));
    }
    assert!(reader.read_message().unwrap().is_none(), "clean EOF");
}

#[test]
fn every_message_round_trips_through_the_decoder_in_one_push() {
    let messages = every_message();
    let mut decoder = Decoder::new();
    decoder.push(&stream(&messages));
    let decoded: Vec<Message> = decoder.by_ref().map(Result::unwrap).collect();
    assert_eq!(decoded, messages);
    assert_eq!(decoder.buffered(), 0);
    decoder.finish().unwrap();
}

#[test]
fn decoder_fed_one_byte_at_a_time() {
    let messages = every_message();
    let mut decoder = Decoder::new();
    let mut decoded = Vec::new();
    for byte in stream(&messages) {
        decoder.push(&[byte]);
        for m in decoder.by_ref() {
            decoded.push(m.unwrap());
        }
    }
    assert_eq!(decoded, messages);
    decoder.finish().unwrap();
}

/// A reader that must never be asked for more than `limit` bytes in total:
/// proves the reader does not allocate (or read) what the length claims.
struct Strict<'a> {
    data: &'a [u8],
    limit: usize,
}

impl Read for Strict<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        assert!(buf.len() <= self.limit, "asked for {} bytes", buf.len());
        let n = buf.len().min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        self.limit -= n;
        Ok(n)
    }
}

#[test]
fn too_large_frame_is_rejected_before_reading_its_body() {
    let len = (MAX_FRAME + 1) as u32;
    let mut bytes = len.to_le_bytes().to_vec();
    bytes.push(Kind::Stdout.byte());
    let mut reader = FrameReader::new(Strict {
        data: &bytes,
        limit: LEN_BYTES,
    });
    assert!(matches!(
        reader.read_message(),
        Err(FrameError::FrameTooLarge { len }) if len == MAX_FRAME + 1
    ));

    let huge = u32::MAX.to_le_bytes();
    let mut reader = FrameReader::new(&huge[..]);
    assert!(matches!(
        reader.read_message(),
        Err(FrameError::FrameTooLarge { .. })
    ));
}

#[test]
fn too_large_frame_fails_the_decoder_without_buffering_it() {
    let mut decoder = Decoder::new();
    decoder.push(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decoder.next(),
        Some(Err(FrameError::FrameTooLarge { .. }))
    ));
    assert!(decoder.failed());
    assert_eq!(decoder.buffered(), 0);
    // Nothing after a bad length can be trusted; pushes are dropped.
    decoder.push(&stream(&[Message::StdinEof]));
    assert!(decoder.next().is_none());
    assert_eq!(decoder.buffered(), 0);
}

#[test]
fn frame_of_max_size_is_accepted() {
    // MAX_FRAME counts the kind byte; an Error message fits exactly.
    let overhead = br#"{"message":""}"#.len() + 1;
    let message = Message::Error(ErrorReport {
        message: "x".repeat(MAX_FRAME - overhead),
    });
    let bytes = message.to_frame().unwrap();
    assert_eq!(bytes.len(), LEN_BYTES + MAX_FRAME);
    let mut reader = FrameReader::new(&bytes[..]);
    assert_eq!(reader.read_message().unwrap(), Some(message));

    let too_big = Message::Error(ErrorReport {
        message: "x".repeat(MAX_FRAME),
    });
    assert!(matches!(
        too_big.to_frame(),
        Err(FrameError::FrameTooLarge { .. })
    ));
}

#[test]
fn empty_frame_is_an_error() {
    let mut reader = FrameReader::new(&[0u8, 0, 0, 0][..]);
    assert!(matches!(reader.read_message(), Err(FrameError::EmptyFrame)));
    let mut decoder = Decoder::new();
    decoder.push(&[0, 0, 0, 0]);
    assert!(matches!(decoder.next(), Some(Err(FrameError::EmptyFrame))));
    assert!(decoder.failed());
}

#[test]
fn truncated_streams() {
    let whole = stream(&[Message::Stderr(b"abcdef".to_vec())]);
    for cut in 1..whole.len() {
        let mut reader = FrameReader::new(&whole[..cut]);
        match reader.read_message() {
            Err(FrameError::Truncated { expected, got }) => {
                assert_eq!(got, cut);
                assert!(expected > got);
            }
            other => panic!("cut at {cut}: {other:?}"),
        }
        let mut decoder = Decoder::new();
        decoder.push(&whole[..cut]);
        assert!(decoder.next().is_none(), "incomplete frame waits");
        assert!(matches!(
            decoder.finish(),
            Err(FrameError::Truncated { got, .. }) if got == cut
        ));
    }
}

#[test]
fn bad_messages_are_skipped_by_the_decoder() {
    let mut bytes = frame(99, b"whatever");
    bytes.extend(frame(Kind::Exec.byte(), b"{not json"));
    bytes.extend(frame(Kind::StdinEof.byte(), b"x"));
    bytes.extend(stream(&[Message::StdinEof]));
    let mut decoder = Decoder::new();
    decoder.push(&bytes);
    assert!(matches!(
        decoder.next(),
        Some(Err(FrameError::Message(MessageError::UnknownKind(99))))
    ));
    assert!(matches!(
        decoder.next(),
        Some(Err(FrameError::Message(MessageError::Json {
            kind: Kind::Exec,
            ..
        })))
    ));
    assert!(matches!(
        decoder.next(),
        Some(Err(FrameError::Message(
            MessageError::UnexpectedPayload { .. }
        )))
    ));
    assert_eq!(decoder.next().unwrap().unwrap(), Message::StdinEof);
    assert!(decoder.next().is_none());
    assert!(!decoder.failed());
}

#[test]
fn garbage_never_panics() {
    // A cheap deterministic generator; every prefix of every garbage stream
    // must decode to messages or errors, never a panic or a hang.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut byte = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // Small lengths are more interesting than random 32-bit ones.
        (state % 23) as u8
    };
    for _ in 0..200 {
        let garbage: Vec<u8> = (0..64).map(|_| byte()).collect();
        let mut decoder = Decoder::new();
        for chunk in garbage.chunks(5) {
            decoder.push(chunk);
            for _ in decoder.by_ref() {}
        }
        let _ = decoder.finish();
        let mut reader = FrameReader::new(&garbage[..]);
        while let Ok(Some(_)) = reader.read_message() {}
    }
}

#[test]
fn reader_stops_at_the_frame_end() {
    // The agent reads Hello and Exec with a FrameReader, then hands the
    // socket to a Decoder: the bytes after Exec must still be in the stream.
    let bytes = stream(&[Message::StdinEof, Message::Signal(Signal { signal: 1 })]);
    let mut reader = FrameReader::new(&bytes[..]);
    assert_eq!(reader.read_message().unwrap(), Some(Message::StdinEof));
    let rest = reader.into_inner();
    assert_eq!(rest, &stream(&[Message::Signal(Signal { signal: 1 })])[..]);
}

#[test]
fn io_errors_are_passed_on() {
    struct Broken;
    impl Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::ErrorKind::ConnectionReset.into())
        }
    }
    let mut reader = FrameReader::new(Broken);
    assert!(
        matches!(reader.read_message(), Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset)
    );
}
