//! A helper process's stderr (virtiofsd's), kept in a capped file in the
//! session directory. The helper writes into a pipe, and the VMM's event
//! loop copies what arrives into the file up to [`HELPER_LOG_LIMIT`],
//! dropping the rest but always draining the pipe: a guest that makes the
//! helper log in a loop (a malformed ring, say) can neither fill the
//! runtime directory, often RAM-backed, nor stall the helper on a full
//! pipe.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

use crate::console::Capped;

/// Most bytes of a helper's log kept on disk (its first lines: the ones
/// that say why it failed to start).
pub const HELPER_LOG_LIMIT: u64 = 1 << 20;

pub struct LogPump {
    pipe: File,
    log: Capped<File>,
    open: bool,
}

/// A pipe for the helper's stderr: the end to hand it, and the pump that
/// copies from the other into `log`.
pub fn pipe(log: File) -> io::Result<(OwnedFd, LogPump)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-element array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just created both fds; each is owned once from here.
    let (read, write) = unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // The helper's end must block: a helper writing its log expects that.
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = libc::fcntl(write.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(write.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    Ok((
        write,
        LogPump {
            pipe: read,
            log: Capped::new(log, HELPER_LOG_LIMIT),
            open: true,
        },
    ))
}

impl LogPump {
    /// Copies what the pipe holds now; false once the helper's end closed.
    pub fn drain(&mut self) -> bool {
        let mut buf = [0u8; 16 << 10];
        while self.open {
            match self.pipe.read(&mut buf) {
                Ok(0) => self.open = false,
                // Capped drops the excess, it never fails for it; a failing
                // disk loses log lines, never the run.
                Ok(n) => {
                    let _ = self.log.write_all(&buf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.open
    }
}

impl MutEventSubscriber for LogPump {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if !self.drain() || events.event_set().contains(EventSet::HANG_UP) {
            self.drain();
            let _ = ops.remove(events);
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        // Without it the log stays short of lines; the run goes on.
        let _ = ops.add(Events::new(&self.pipe, EventSet::IN));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_that_logs_without_end_fills_neither_the_disk_nor_its_pipe() {
        let dir = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let path = dir.as_path().join("fs0.log");
        let (write, mut pump) = pipe(File::create(&path).unwrap()).unwrap();
        let mut helper = File::from(write);
        let line = b"[ERROR virtiofsd] avail index 65535 is past the ring\n";
        // Eight times the limit, in pieces smaller than the pipe.
        let mut sent = 0u64;
        while sent < 8 * HELPER_LOG_LIMIT {
            for _ in 0..256 {
                helper.write_all(line).unwrap();
                sent += line.len() as u64;
            }
            assert!(pump.drain(), "still open");
        }
        drop(helper);
        assert!(!pump.drain(), "the helper's end closed");
        let kept = std::fs::metadata(&path).unwrap().len();
        assert_eq!(kept, HELPER_LOG_LIMIT);
        assert!(
            std::fs::read(&path).unwrap().starts_with(line),
            "the first lines are kept"
        );
    }
}
