//! The exec channel between the mvm VMM (host) and the agent in the guest's
//! PID 1: one command per connection, its stdin, stdout, stderr, signals,
//! terminal size and exit. Specified in docs/protocol.md ("version 2: the
//! exec channel"); this crate is the only implementation of its wire format
//! and both sides use it. [`boot`] holds the other half of the contract:
//! the kernel command line and the status port.

pub mod boot;
pub mod frame;
pub mod message;
pub mod setup;
pub mod version;

pub use frame::{Decoder, FrameError, FrameReader, LEN_BYTES, MAX_FRAME};
pub use message::{
    ErrorReport, ExecRequest, Exit, GuestPhase, Hello, Kind, Message, MessageError, Resize, Signal,
    StdinCredit,
};
pub use setup::{
    check_hostname, HostnameProblem, Setup, SetupError, CA_BUNDLE_PATH, DEFAULT_HOSTNAME,
    RUN_CA_PATH, SETUP_ENTROPY_BYTES,
};
pub use version::{check_guest_version, check_host_version, VersionError};

/// Protocol version this crate speaks (carried in `Hello`).
pub const VERSION: u32 = 2;
/// vsock port the guest agent listens on.
pub const AGENT_PORT: u32 = 1024;
/// vsock context id of the guest (2 is the host; 0 and 1 are reserved).
pub const GUEST_CID: u64 = 3;
/// The host vsock port guest-initiated egress connections go to: the only
/// port the VMM accepts a guest's connection on, and only when a run's
/// policy allows some egress (docs/network.md).
pub const EGRESS_VSOCK_PORT: u32 = 1080;
/// The HTTP proxy port guest-init's forwarder listens on, on the guest's
/// 127.0.0.1: each connection is carried to the host proxy over its own
/// vsock stream to [`EGRESS_VSOCK_PORT`].
pub const EGRESS_PROXY_PORT: u16 = 3128;
/// Most bytes of data in one `Stdin`, `Stdout` or `Stderr` message; senders
/// split longer data, receivers reject longer messages.
pub const MAX_DATA: usize = 64 * 1024;
/// Bytes of `Stdin` data the host may have sent and the command not yet
/// taken: the agent's first `StdinCredit`. Version 2's answer to a command
/// that does not read its stdin: the host stops sending, and the stream
/// stays free for `Signal` (before it, stdin data could fill the vsock
/// connection and hold a SIGTERM behind it).
pub const STDIN_WINDOW: u64 = 256 * 1024;
