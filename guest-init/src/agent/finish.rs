//! The end of a connection: half-close, then give the host a moment to read
//! everything and close its end, so that the reboot right after does not
//! cut off the last bytes in flight. Guest-only, no unit tests.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use mvm_protocol::{ErrorReport, Exit, Message};

use super::fd::{self, FdStream};
use super::vsock;

/// Longest wait for the host to close after our `Exit`.
pub const LINGER: Duration = Duration::from_secs(1);

/// Half-closes `conn`, then reads (and drops) until the host closes, an
/// error, or `LINGER` has passed.
pub fn close(conn: BorrowedFd) {
    if vsock::shutdown_write(conn).is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER;
    let mut scratch = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let mut fds = [libc::pollfd {
            fd: conn.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        match fd::poll(&mut fds, Some(left)) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        // Only read after POLLIN, so that a blocking socket cannot block.
        match fd::read(conn, &mut scratch) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// Ends a run that never got its command going: `Error` with `message`,
/// `Exit` with `status`, then `close`. Returns `status` for the status port.
/// Errors are ignored: the host may be gone, and the status port still
/// tells the VMM.
pub fn fail(conn: OwnedFd, message: String, status: u8) -> u32 {
    let mut stream = FdStream(conn);
    let mut frames = Vec::new();
    for m in [
        Message::Error(ErrorReport { message }),
        Message::Exit(Exit::exited(status.into())),
    ] {
        let _ = m.encode(&mut frames);
    }
    let _ = stream.write_all(&frames);
    close(stream.0.as_fd());
    status.into()
}
