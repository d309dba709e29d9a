//! Everything that can make init give up before the command's status is
//! known. Each one is reported on the console and as status 125.

use std::ffi::CStr;
use std::io;

use crate::agent::AgentError;
use crate::cmdline::ParseError;
use crate::errno;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ENOSYS here means a guest kernel built without CONFIG_X86_IOPL_IOPERM.
    #[error("ioperm for the VMM ports (needs CONFIG_X86_IOPL_IOPERM): {0}")]
    Ports(#[source] io::Error),
    #[error("mkdir {}: {source}", path.to_string_lossy())]
    Mkdir {
        path: &'static CStr,
        source: io::Error,
    },
    #[error("mount {} on {}: {source}", fstype.to_string_lossy(), target.to_string_lossy())]
    Mount {
        fstype: &'static CStr,
        target: &'static CStr,
        source: io::Error,
    },
    /// The whole console line, documented in docs/protocol.md; init prints
    /// it without the "error: " prefix.
    #[error(
        "cannot mount shared directory {tag} at {path}: {}",
        errno::message(source)
    )]
    Share {
        tag: String,
        path: String,
        source: io::Error,
    },
    #[error("the sandbox's disk: {0}")]
    SandboxDisk(String),
    #[error("switch to the image root: {what}: {source}")]
    SwitchRoot {
        what: &'static str,
        source: io::Error,
    },
    #[error("bring up the loopback interface: {0}")]
    Loopback(#[source] io::Error),
    #[error("open /dev/console: {0}")]
    Console(#[source] io::Error),
    #[error("read /proc/cmdline: {0}")]
    Cmdline(#[source] io::Error),
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error("chdir {path}: {source}")]
    Chdir { path: String, source: io::Error },
    #[error("fork: {0}")]
    Fork(#[source] io::Error),
    #[error("waitpid: {0}")]
    Wait(#[source] io::Error),
    #[error(transparent)]
    Agent(#[from] AgentError),
}
