//! The messages of the exec channel and their payloads. A message is a kind
//! byte plus a payload: JSON (serde_json) for structured messages, raw bytes
//! for data. How they are framed on the stream is `frame.rs`'s job.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::{MAX_DATA, VERSION};

/// The kind byte of a frame. Host -> guest kinds are below 16, guest -> host
/// kinds from 17 up, so a message sent the wrong way is easy to spot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Exec = 2,
    Stdin = 3,
    StdinEof = 4,
    Signal = 5,
    Resize = 6,
    Shutdown = 7,
    Stdout = 17,
    Stderr = 18,
    Exit = 19,
    Error = 20,
    StdinCredit = 21,
}

impl Kind {
    /// Every kind, in wire order.
    pub const ALL: [Kind; 12] = [
        Kind::Hello,
        Kind::Exec,
        Kind::Stdin,
        Kind::StdinEof,
        Kind::Signal,
        Kind::Resize,
        Kind::Shutdown,
        Kind::Stdout,
        Kind::Stderr,
        Kind::Exit,
        Kind::Error,
        Kind::StdinCredit,
    ];

    /// The kind a wire byte stands for, if any.
    pub fn from_byte(byte: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.byte() == byte)
    }

    pub fn byte(self) -> u8 {
        self as u8
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("{kind:?} message: bad JSON payload: {source}")]
    Json {
        kind: Kind,
        source: serde_json::Error,
    },
    #[error("{kind:?} message carries {len} bytes, more than the {MAX_DATA}-byte limit for data")]
    DataTooLarge { kind: Kind, len: usize },
    #[error("{kind:?} message must be empty, has {len} bytes")]
    UnexpectedPayload { kind: Kind, len: usize },
}

/// Payload of `Hello`, sent first by the host and answered by the guest.
/// Its `version` is frozen across versions so that any two versions can
/// tell each other apart; fields added after it are optional, and a
/// reader ignores those it does not know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u32,
    /// The guest's: its kernel's `CLOCK_BOOTTIME` in nanoseconds when
    /// guest-init wrote its boot marker, so that the host can place the
    /// start of the guest kernel's clock on its own timeline (`--print-stats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_started_ns: Option<u64>,
}

impl Hello {
    /// The hello of this crate's protocol version.
    pub fn current() -> Hello {
        Hello {
            version: VERSION,
            init_started_ns: None,
        }
    }
}

/// Payload of `Exec`: the one command a connection runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The command and its arguments; `argv[0]` is searched in `PATH`.
    pub argv: Vec<String>,
    /// Added to the agent's base environment; wins over it.
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    /// Run on a pseudo-terminal (stdout and stderr then both arrive as
    /// `Stdout`) instead of three pipes.
    pub tty: bool,
    /// Initial terminal size; only meaningful with `tty`.
    pub rows: u16,
    pub cols: u16,
    /// `RLIMIT_NPROC` for the command's user; 0 = no limit.
    pub max_procs: u64,
    /// With an image root: the login name `uid` gets in the root's
    /// /etc/passwd (and /etc/group for `gid`) when the image has no entry
    /// for it, with a home directory /home/NAME it owns. Ignored on the
    /// initramfs root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_name: Option<String>,
    /// `USER[:GROUP]` to run as instead of `uid`/`gid`: names looked up in
    /// the root's /etc/passwd and /etc/group, numbers taken as they are
    /// (`mvm run --user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Start the egress forwarder (127.0.0.1:`EGRESS_PROXY_PORT` to the
    /// host's vsock port `EGRESS_VSOCK_PORT`) before the command; the host
    /// sets the proxy variables in `env` itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub egress: bool,
    /// The machine's setup (root, shares, clock, entropy), applied before
    /// anything else of this request: sent with a run's first command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<Box<crate::setup::Setup>>,
    /// A named sandbox's first request: the machine outlives this command
    /// and the agent goes on serving connections, one command each, until
    /// a `Shutdown` (or a power request inside the guest). Only on the
    /// request that carries `setup`. With a command (`mvm run
    /// --serve-exec`), that command is the machine's main one: the VMM
    /// stops the machine on its `Exit`, later connections run beside it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_serving: bool,
}

impl ExecRequest {
    /// `argv` as root in `/`, no extra environment, pipes, no process
    /// limit: the starting point callers adjust.
    pub fn new(argv: Vec<String>) -> ExecRequest {
        ExecRequest {
            argv,
            env: Vec::new(),
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            tty: false,
            rows: 0,
            cols: 0,
            max_procs: 0,
            user_name: None,
            user: None,
            egress: false,
            setup: None,
            keep_serving: false,
        }
    }
}

/// Payload of `Signal`: deliver this signal to the command's process group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signal {
    pub signal: i32,
}

/// Payload of `Resize`: the terminal's new size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resize {
    pub rows: u16,
    pub cols: u16,
}

/// Payload of `StdinCredit`: the host may send this many more bytes of
/// `Stdin` data. The agent grants [`crate::STDIN_WINDOW`] when the command
/// starts and gives back what the command has taken, so stdin never fills
/// the stream and `Signal` or `Resize` behind it always gets through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StdinCredit {
    pub bytes: u64,
}

/// Payload of `Exit`: how the command ended. Exactly one of `code` and
/// `signal` is set; `status` is the shell's `$?` for it. `oom_kill`: the
/// guest kernel's OOM killer killed a process (the command or another)
/// while the command ran, as the kernel's log says; left out when false.
/// It only informs the user: a guest can claim it falsely. `guest_phases`:
/// where the guest's time went between the request's arrival and the
/// `Exit`, for `--print-stats` (left out when empty); likewise only
/// informative.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub status: u8,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_kill: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guest_phases: Vec<GuestPhase>,
}

/// One phase of the guest's work on a request: `name` ended `after_ns`
/// after the request arrived, by the guest's monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestPhase {
    pub name: String,
    pub after_ns: u64,
}

impl Exit {
    /// The command exited with `code` (only its low 8 bits reach a parent).
    pub fn exited(code: i32) -> Exit {
        Exit {
            code: Some(code),
            signal: None,
            status: (code & 0xff) as u8,
            oom_kill: false,
            guest_phases: Vec::new(),
        }
    }

    /// The command was killed by `signal`: status 128 + signal.
    pub fn signaled(signal: i32) -> Exit {
        let status = 128i32.saturating_add(signal).clamp(0, 255) as u8;
        Exit {
            code: None,
            signal: Some(signal),
            status,
            oom_kill: false,
            guest_phases: Vec::new(),
        }
    }
}

/// Payload of `Error`: a message for the user. It does not end the run by
/// itself; an `Exit` still follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReport {
    pub message: String,
}

/// One message of the exec channel, in either direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Both ways: the protocol version the sender speaks.
    Hello(Hello),
    /// Host -> guest: the command to run.
    Exec(ExecRequest),
    /// Host -> guest: bytes for the command's stdin (at most `MAX_DATA`).
    Stdin(Vec<u8>),
    /// Host -> guest: no more stdin.
    StdinEof,
    /// Host -> guest: signal the command.
    Signal(Signal),
    /// Host -> guest: the terminal was resized.
    Resize(Resize),
    /// Host -> guest, instead of `Exec`: end the machine (every command
    /// is stopped, filesystems synced, the guest powers off).
    Shutdown,
    /// Guest -> host: bytes the command wrote to stdout (at most `MAX_DATA`).
    Stdout(Vec<u8>),
    /// Guest -> host: bytes the command wrote to stderr (at most `MAX_DATA`).
    Stderr(Vec<u8>),
    /// Guest -> host: the command ended; the last message of a run.
    Exit(Exit),
    /// Guest -> host: something went wrong (see `ErrorReport`).
    Error(ErrorReport),
    /// Guest -> host: room for more stdin (see `StdinCredit`).
    StdinCredit(StdinCredit),
}

impl Message {
    pub fn kind(&self) -> Kind {
        match self {
            Message::Hello(_) => Kind::Hello,
            Message::Exec(_) => Kind::Exec,
            Message::Stdin(_) => Kind::Stdin,
            Message::StdinEof => Kind::StdinEof,
            Message::Signal(_) => Kind::Signal,
            Message::Resize(_) => Kind::Resize,
            Message::Shutdown => Kind::Shutdown,
            Message::Stdout(_) => Kind::Stdout,
            Message::Stderr(_) => Kind::Stderr,
            Message::Exit(_) => Kind::Exit,
            Message::Error(_) => Kind::Error,
            Message::StdinCredit(_) => Kind::StdinCredit,
        }
    }

    /// The payload bytes as they go on the wire (borrowed for data).
    pub fn payload(&self) -> Result<Cow<'_, [u8]>, MessageError> {
        let kind = self.kind();
        let json = |value: Result<Vec<u8>, serde_json::Error>| {
            value
                .map(Cow::Owned)
                .map_err(|source| MessageError::Json { kind, source })
        };
        match self {
            Message::Hello(p) => json(serde_json::to_vec(p)),
            Message::Exec(p) => json(serde_json::to_vec(p)),
            Message::Signal(p) => json(serde_json::to_vec(p)),
            Message::Resize(p) => json(serde_json::to_vec(p)),
            Message::Exit(p) => json(serde_json::to_vec(p)),
            Message::Error(p) => json(serde_json::to_vec(p)),
            Message::StdinCredit(p) => json(serde_json::to_vec(p)),
            Message::Stdin(data) | Message::Stdout(data) | Message::Stderr(data) => {
                check_data(kind, data.len())?;
                Ok(Cow::Borrowed(data))
            }
            Message::StdinEof | Message::Shutdown => Ok(Cow::Borrowed(&[])),
        }
    }

    /// Builds a message from a frame's kind byte and payload.
    pub fn decode(kind_byte: u8, payload: &[u8]) -> Result<Message, MessageError> {
        let kind = Kind::from_byte(kind_byte).ok_or(MessageError::UnknownKind(kind_byte))?;
        let json = |source| MessageError::Json { kind, source };
        Ok(match kind {
            Kind::Hello => Message::Hello(serde_json::from_slice(payload).map_err(json)?),
            Kind::Exec => Message::Exec(serde_json::from_slice(payload).map_err(json)?),
            Kind::Signal => Message::Signal(serde_json::from_slice(payload).map_err(json)?),
            Kind::Resize => Message::Resize(serde_json::from_slice(payload).map_err(json)?),
            Kind::Exit => Message::Exit(serde_json::from_slice(payload).map_err(json)?),
            Kind::Error => Message::Error(serde_json::from_slice(payload).map_err(json)?),
            Kind::StdinCredit => {
                Message::StdinCredit(serde_json::from_slice(payload).map_err(json)?)
            }
            Kind::Stdin | Kind::Stdout | Kind::Stderr => {
                check_data(kind, payload.len())?;
                let data = payload.to_vec();
                match kind {
                    Kind::Stdin => Message::Stdin(data),
                    Kind::Stdout => Message::Stdout(data),
                    _ => Message::Stderr(data),
                }
            }
            Kind::StdinEof if payload.is_empty() => Message::StdinEof,
            Kind::Shutdown if payload.is_empty() => Message::Shutdown,
            Kind::StdinEof | Kind::Shutdown => {
                return Err(MessageError::UnexpectedPayload {
                    kind,
                    len: payload.len(),
                })
            }
        })
    }
}

fn check_data(kind: Kind, len: usize) -> Result<(), MessageError> {
    if len > MAX_DATA {
        Err(MessageError::DataTooLarge { kind, len })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_bytes_are_the_documented_ones() {
        let bytes: Vec<u8> = Kind::ALL.iter().map(|k| k.byte()).collect();
        assert_eq!(bytes, [1, 2, 3, 4, 5, 6, 7, 17, 18, 19, 20, 21]);
        for kind in Kind::ALL {
            assert_eq!(Kind::from_byte(kind.byte()), Some(kind));
        }
        for byte in [0, 8, 16, 22, 255] {
            assert_eq!(Kind::from_byte(byte), None);
        }
    }

    #[test]
    fn json_payloads_are_the_documented_ones() {
        let text = |m: Message| String::from_utf8(m.payload().unwrap().into_owned()).unwrap();
        assert_eq!(text(Message::Hello(Hello::current())), r#"{"version":2}"#);
        assert_eq!(
            text(Message::StdinCredit(StdinCredit { bytes: 262144 })),
            r#"{"bytes":262144}"#
        );
        assert_eq!(
            text(Message::Signal(Signal { signal: 15 })),
            r#"{"signal":15}"#
        );
        assert_eq!(
            text(Message::Resize(Resize { rows: 24, cols: 80 })),
            r#"{"rows":24,"cols":80}"#
        );
        assert_eq!(
            text(Message::Exit(Exit::signaled(9))),
            r#"{"code":null,"signal":9,"status":137}"#
        );
        let oom = Exit {
            oom_kill: true,
            ..Exit::signaled(9)
        };
        assert_eq!(
            text(Message::Exit(oom.clone())),
            r#"{"code":null,"signal":9,"status":137,"oom_kill":true}"#
        );
        assert_eq!(
            Message::decode(
                Kind::Exit.byte(),
                br#"{"code":null,"signal":9,"status":137,"oom_kill":true}"#
            )
            .unwrap(),
            Message::Exit(oom)
        );
        let timed = Exit {
            guest_phases: vec![GuestPhase {
                name: "command started".into(),
                after_ns: 1_500,
            }],
            ..Exit::exited(0)
        };
        assert_eq!(
            text(Message::Exit(timed.clone())),
            r#"{"code":0,"signal":null,"status":0,"guest_phases":[{"name":"command started","after_ns":1500}]}"#
        );
        assert_eq!(
            Message::decode(
                Kind::Exit.byte(),
                &text(Message::Exit(timed.clone())).into_bytes()
            )
            .unwrap(),
            Message::Exit(timed)
        );
        assert_eq!(
            text(Message::Error(ErrorReport {
                message: "x".into()
            })),
            r#"{"message":"x"}"#
        );
        let exec = ExecRequest {
            argv: vec!["sh".into()],
            env: vec![("A".into(), "b".into())],
            cwd: "/".into(),
            uid: 1000,
            gid: 100,
            tty: false,
            rows: 0,
            cols: 0,
            max_procs: 0,
            user_name: None,
            user: None,
            egress: false,
            setup: None,
            keep_serving: false,
        };
        assert_eq!(
            text(Message::Exec(exec)),
            r#"{"argv":["sh"],"env":[["A","b"]],"cwd":"/","uid":1000,"gid":100,"tty":false,"rows":0,"cols":0,"max_procs":0}"#
        );
    }

    #[test]
    fn exit_status_mapping() {
        assert_eq!(Exit::exited(0).status, 0);
        assert_eq!(Exit::exited(3).status, 3);
        assert_eq!(Exit::exited(256 + 7).status, 7);
        assert_eq!(Exit::signaled(15).status, 143);
        assert_eq!(Exit::signaled(200).status, 255, "saturates, never wraps");
        assert_eq!(Exit::exited(3).signal, None);
        assert_eq!(Exit::signaled(9).code, None);
    }

    #[test]
    fn unknown_kind_and_bad_payloads_are_errors() {
        assert!(matches!(
            Message::decode(99, b""),
            Err(MessageError::UnknownKind(99))
        ));
        assert!(matches!(
            Message::decode(Kind::Hello.byte(), b"{\"version\":"),
            Err(MessageError::Json {
                kind: Kind::Hello,
                ..
            })
        ));
        assert!(matches!(
            Message::decode(Kind::Exec.byte(), br#"{"argv":["sh"]}"#),
            Err(MessageError::Json {
                kind: Kind::Exec,
                ..
            })
        ));
        assert!(matches!(
            Message::decode(Kind::StdinEof.byte(), b"x"),
            Err(MessageError::UnexpectedPayload { len: 1, .. })
        ));
        assert!(matches!(
            Message::decode(Kind::Shutdown.byte(), b"x"),
            Err(MessageError::UnexpectedPayload { len: 1, .. })
        ));
        assert!(matches!(
            Message::decode(Kind::Signal.byte(), br#"{"signal":"TERM"}"#),
            Err(MessageError::Json { .. })
        ));
    }

    #[test]
    fn data_is_limited_both_ways() {
        let big = vec![0u8; MAX_DATA + 1];
        assert!(matches!(
            Message::Stdout(big.clone()).payload(),
            Err(MessageError::DataTooLarge {
                kind: Kind::Stdout,
                ..
            })
        ));
        assert!(matches!(
            Message::decode(Kind::Stdin.byte(), &big),
            Err(MessageError::DataTooLarge {
                kind: Kind::Stdin,
                ..
            })
        ));
        let max = vec![7u8; MAX_DATA];
        let msg = Message::decode(Kind::Stderr.byte(), &max).unwrap();
        assert_eq!(msg, Message::Stderr(max));
    }

    #[test]
    fn unknown_json_fields_are_ignored() {
        // A newer peer may add fields within a version; they must not break us.
        let msg = Message::decode(Kind::Hello.byte(), br#"{"version":1,"x":true}"#).unwrap();
        assert_eq!(
            msg,
            Message::Hello(Hello {
                version: 1,
                init_started_ns: None
            })
        );
        let guest = Message::Hello(Hello {
            init_started_ns: Some(812_000_000),
            ..Hello::current()
        });
        let text = guest.payload().unwrap().into_owned();
        assert_eq!(text, br#"{"version":2,"init_started_ns":812000000}"#);
        assert_eq!(Message::decode(Kind::Hello.byte(), &text).unwrap(), guest);
    }
}
