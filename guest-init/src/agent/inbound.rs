//! What the agent does with each frame the host sends during a run. Pure,
//! unit-tested; the relay carries the actions out.

use mvm_protocol::{FrameError, Message};

/// Highest signal number on Linux (SIGRTMAX with glibc's reserved ones).
const MAX_SIGNAL: i32 = 64;

#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Bytes for the command's stdin.
    Stdin(Vec<u8>),
    /// Close the command's stdin (VEOF on a terminal).
    StdinEof,
    /// Send this signal to the command's process group.
    Signal(i32),
    Resize {
        rows: u16,
        cols: u16,
    },
    /// Ignored; the text goes back to the host as an `Error` message.
    Reject(String),
    /// The stream cannot be decoded any further: stop reading it.
    Fatal(String),
}

pub fn action(frame: Result<Message, FrameError>) -> Action {
    let message = match frame {
        Ok(message) => message,
        Err(err @ (FrameError::FrameTooLarge { .. } | FrameError::EmptyFrame)) => {
            return Action::Fatal(format!("broken stream from the host: {err}"))
        }
        Err(err) => return Action::Reject(format!("bad message from the host: {err}")),
    };
    match message {
        Message::Stdin(data) => Action::Stdin(data),
        Message::StdinEof => Action::StdinEof,
        Message::Signal(s) if (1..=MAX_SIGNAL).contains(&s.signal) => Action::Signal(s.signal),
        Message::Signal(s) => Action::Reject(format!("invalid signal number {}", s.signal)),
        Message::Resize(r) => Action::Resize {
            rows: r.rows,
            cols: r.cols,
        },
        other => Action::Reject(format!(
            "unexpected {:?} message from the host during a run",
            other.kind()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mvm_protocol::{Exit, Hello, MessageError, Resize, Signal};

    #[test]
    fn run_time_messages() {
        assert_eq!(
            action(Ok(Message::Stdin(b"x".to_vec()))),
            Action::Stdin(b"x".to_vec())
        );
        assert_eq!(action(Ok(Message::StdinEof)), Action::StdinEof);
        assert_eq!(
            action(Ok(Message::Signal(Signal { signal: 2 }))),
            Action::Signal(2)
        );
        assert_eq!(
            action(Ok(Message::Signal(Signal { signal: 64 }))),
            Action::Signal(64)
        );
        assert_eq!(
            action(Ok(Message::Resize(Resize { rows: 3, cols: 4 }))),
            Action::Resize { rows: 3, cols: 4 }
        );
    }

    #[test]
    fn bad_signals_are_rejected() {
        for signal in [0, -9, 65, i32::MAX] {
            assert_eq!(
                action(Ok(Message::Signal(Signal { signal }))),
                Action::Reject(format!("invalid signal number {signal}"))
            );
        }
    }

    #[test]
    fn out_of_place_messages_are_rejected() {
        assert_eq!(
            action(Ok(Message::Hello(Hello::current()))),
            Action::Reject("unexpected Hello message from the host during a run".into())
        );
        assert!(matches!(
            action(Ok(Message::Exit(Exit::exited(0)))),
            Action::Reject(_)
        ));
        assert!(matches!(
            action(Ok(Message::Stdout(vec![]))),
            Action::Reject(_)
        ));
    }

    #[test]
    fn decode_errors() {
        assert_eq!(
            action(Err(MessageError::UnknownKind(42).into())),
            Action::Reject("bad message from the host: unknown message kind 42".into())
        );
        assert!(matches!(
            action(Err(FrameError::FrameTooLarge { len: 1 << 30 })),
            Action::Fatal(_)
        ));
        assert!(matches!(
            action(Err(FrameError::EmptyFrame)),
            Action::Fatal(_)
        ));
    }
}
