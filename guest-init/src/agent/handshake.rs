//! The start of a connection: the `Hello` exchange, then the one `Exec`
//! (or a named sandbox's `Shutdown`).
//! Generic over the stream, so it is unit-tested on the host with an
//! in-memory one; the agent runs it on the blocking vsock connection.

use std::io::{self, Read, Write};

use mvm_protocol::{
    check_host_version, ExecRequest, FrameError, FrameReader, Hello, Kind, Message, VersionError,
};

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("reading from the host: {0}")]
    Read(#[source] FrameError),
    #[error("writing to the host: {0}")]
    Write(#[source] FrameError),
    #[error("the host closed the connection before its {0:?} message")]
    Closed(Kind),
    /// The connection ended or failed before the host's hello was whole:
    /// nobody is at the other end to answer (a connection that was
    /// waiting in the guest when a template was taken, reset after its
    /// restore: docs/snapshots.md, "vsock after a restore").
    #[error("the connection ended before the host's hello")]
    NoHost(#[source] Option<io::Error>),
    #[error("expected a {expected:?} message from the host, got {got:?}")]
    Unexpected { expected: Kind, got: Kind },
    #[error(transparent)]
    Version(#[from] VersionError),
}

impl HandshakeError {
    /// Whether the host can still be told about it with an `Error` message.
    pub fn tell_host(&self) -> bool {
        !matches!(
            self,
            HandshakeError::Write(_) | HandshakeError::Closed(_) | HandshakeError::NoHost(_)
        )
    }
}

/// Reads the host's `Hello`, answers with ours whatever came (so the host
/// learns our version even if it sent something else), then checks its
/// version. A connection that ends or fails before a whole first frame
/// is answered with nothing ([`HandshakeError::NoHost`]).
pub fn hello<S: Read + Write>(stream: &mut S) -> Result<(), HandshakeError> {
    let first = match FrameReader::new(&mut *stream).read_message() {
        Ok(None) => return Err(HandshakeError::NoHost(None)),
        Err(FrameError::Io(err)) => return Err(HandshakeError::NoHost(Some(err))),
        Err(FrameError::Truncated { .. }) => return Err(HandshakeError::NoHost(None)),
        first => first,
    };
    let ours = Hello {
        init_started_ns: crate::vmm_port::init_started_ns(),
        ..Hello::current()
    };
    Message::Hello(ours)
        .encode(stream)
        .map_err(HandshakeError::Write)?;
    match expect(first, Kind::Hello)? {
        Message::Hello(hello) => Ok(check_host_version(hello.version)?),
        other => Err(unexpected(Kind::Hello, &other)),
    }
}

/// What the host asks for after the hello.
#[derive(Debug, PartialEq)]
pub enum Asked {
    Exec(ExecRequest),
    Shutdown,
}

/// Reads the `Exec` request (or `Shutdown`) that follows the hello. Reads
/// exactly its frame, so stdin the host sent right after it stays in the
/// stream.
pub fn read_exec<S: Read>(stream: &mut S) -> Result<Asked, HandshakeError> {
    match expect(FrameReader::new(stream).read_message(), Kind::Exec)? {
        Message::Exec(request) => Ok(Asked::Exec(request)),
        Message::Shutdown => Ok(Asked::Shutdown),
        other => Err(unexpected(Kind::Exec, &other)),
    }
}

fn expect(
    read: Result<Option<Message>, FrameError>,
    kind: Kind,
) -> Result<Message, HandshakeError> {
    read.map_err(HandshakeError::Read)?
        .ok_or(HandshakeError::Closed(kind))
}

fn unexpected(expected: Kind, got: &Message) -> HandshakeError {
    HandshakeError::Unexpected {
        expected,
        got: got.kind(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mvm_protocol::{Signal, VERSION};
    use std::io::{self, Cursor};

    /// What the host sent, and what we answered.
    struct Duplex {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Duplex {
        fn new(messages: &[Message]) -> Self {
            let mut input = Vec::new();
            for m in messages {
                m.encode(&mut input).unwrap();
            }
            Duplex {
                input: Cursor::new(input),
                output: Vec::new(),
            }
        }

        fn answers(&self) -> Vec<Message> {
            let mut reader = FrameReader::new(&self.output[..]);
            std::iter::from_fn(|| reader.read_message().unwrap()).collect()
        }
    }

    impl Read for Duplex {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Duplex {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn exec() -> ExecRequest {
        ExecRequest::new(vec!["true".into()])
    }

    #[test]
    fn hello_then_exec_leaves_the_rest_in_the_stream() {
        let mut s = Duplex::new(&[
            Message::Hello(Hello::current()),
            Message::Exec(exec()),
            Message::StdinEof,
        ]);
        hello(&mut s).unwrap();
        assert_eq!(read_exec(&mut s).unwrap(), Asked::Exec(exec()));
        assert_eq!(s.answers(), [Message::Hello(Hello::current())]);
        let mut rest = FrameReader::new(&mut s);
        assert_eq!(rest.read_message().unwrap(), Some(Message::StdinEof));
    }

    #[test]
    fn shutdown_takes_the_place_of_exec() {
        let mut s = Duplex::new(&[Message::Hello(Hello::current()), Message::Shutdown]);
        hello(&mut s).unwrap();
        assert_eq!(read_exec(&mut s).unwrap(), Asked::Shutdown);
    }

    #[test]
    fn version_mismatch_is_answered_with_our_version() {
        let mut s = Duplex::new(&[Message::Hello(Hello {
            version: VERSION + 1,
            ..Hello::current()
        })]);
        let err = hello(&mut s).unwrap_err();
        assert!(matches!(err, HandshakeError::Version(_)));
        assert!(err.tell_host());
        assert_eq!(
            err.to_string(),
            format!(
                "host protocol version {}, guest speaks {VERSION}: rebuild the initramfs with this mvm",
                VERSION + 1
            )
        );
        assert_eq!(s.answers(), [Message::Hello(Hello::current())]);
    }

    #[test]
    fn wrong_first_message() {
        let mut s = Duplex::new(&[Message::Exec(exec())]);
        let err = hello(&mut s).unwrap_err();
        assert!(matches!(
            err,
            HandshakeError::Unexpected {
                expected: Kind::Hello,
                got: Kind::Exec
            }
        ));
        assert_eq!(s.answers(), [Message::Hello(Hello::current())]);

        let mut s = Duplex::new(&[Message::Signal(Signal { signal: 9 })]);
        assert!(matches!(
            read_exec(&mut s),
            Err(HandshakeError::Unexpected {
                expected: Kind::Exec,
                ..
            })
        ));
    }

    #[test]
    fn closed_and_garbage() {
        // Nothing at all: nobody to answer.
        let mut s = Duplex::new(&[]);
        let err = hello(&mut s).unwrap_err();
        assert!(matches!(err, HandshakeError::NoHost(None)), "{err:?}");
        assert!(!err.tell_host());
        assert!(s.output.is_empty());

        // A connection reset under us (Linux's answer to a transport
        // reset): nobody to answer either.
        struct Reset(Vec<u8>);
        impl Read for Reset {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::from_raw_os_error(libc::ENOTCONN))
            }
        }
        impl Write for Reset {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut reset = Reset(Vec::new());
        let err = hello(&mut reset).unwrap_err();
        assert!(matches!(err, HandshakeError::NoHost(Some(_))), "{err:?}");
        assert!(reset.0.is_empty());

        // Half a length prefix, then the end.
        let mut s = Duplex::new(&[]);
        s.input = Cursor::new(vec![5, 0]);
        assert!(matches!(hello(&mut s), Err(HandshakeError::NoHost(None))));
        assert!(s.output.is_empty());

        let mut s = Duplex::new(&[]);
        s.input = Cursor::new(vec![5, 0, 0, 0, 99, 1, 2, 3, 4]);
        assert!(matches!(hello(&mut s), Err(HandshakeError::Read(_))));

        let mut s = Duplex::new(&[]);
        assert!(matches!(
            read_exec(&mut s),
            Err(HandshakeError::Closed(Kind::Exec))
        ));
    }
}
