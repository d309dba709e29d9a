//! Thin, errno-checked wrappers over the fd syscalls the agent needs. Every
//! fd is created close-on-exec so that the command inherits only the stdio
//! it is given. Tested on the host with pipes.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Turns a libc return value into an `io::Result`, reading errno on -1.
pub fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out-array of two ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub fn set_nonblocking(fd: BorrowedFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we borrow; F_GETFL/F_SETFL touch only its flags.
    unsafe {
        let flags = check(libc::fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
        check(libc::fcntl(
            fd.as_raw_fd(),
            libc::F_SETFL,
            flags | libc::O_NONBLOCK,
        ))?;
    }
    Ok(())
}

/// A second fd for the same open file (close-on-exec).
pub fn duplicate(fd: BorrowedFd) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

/// One read(2); `Ok(0)` is end of file. EINTR is returned as an error of
/// kind `Interrupted`, EAGAIN as `WouldBlock`: the poll loop retries both.
pub fn read(fd: BorrowedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One write(2). SIGPIPE is ignored by the agent, so a closed reader is an
/// `EPIPE` error here, not a signal.
pub fn write(fd: BorrowedFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for reads of buf.len() bytes.
    let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Makes `target` (0, 1 or 2 in the child) a copy of `src` that survives
/// exec. dup2 alone does nothing when they are equal, which would leave
/// close-on-exec set; this clears it instead. For the child after fork.
pub fn dup_onto(src: RawFd, target: RawFd) -> io::Result<()> {
    if src == target {
        // SAFETY: fcntl on an fd the child owns; clears only FD_CLOEXEC.
        check(unsafe { libc::fcntl(target, libc::F_SETFD, 0) })?;
    } else {
        // SAFETY: dup2 onto a stdio slot; replacing it is the point.
        check(unsafe { libc::dup2(src, target) })?;
    }
    Ok(())
}

/// poll(2) over `fds`, waiting at most `timeout` (forever with `None`).
/// Returns how many entries have events; EINTR is an `Interrupted` error.
pub fn poll(fds: &mut [libc::pollfd], timeout: Option<std::time::Duration>) -> io::Result<usize> {
    let ms = match timeout {
        None => -1,
        // Rounded up: waking a millisecond early would spin until the
        // deadline instead of sleeping.
        Some(t) => {
            libc::c_int::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX)
        }
    };
    // SAFETY: fds is a valid array of fds.len() pollfd structs.
    let n = check(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) })?;
    Ok(n as usize)
}

/// A blocking stream over an fd we own (the vsock connection before the
/// relay makes it non-blocking), for the `FrameReader` and `Message::encode`.
pub struct FdStream(pub OwnedFd);

impl Read for FdStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        read(self.0.as_fd(), buf)
    }
}

impl Write for FdStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        write(self.0.as_fd(), buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cloexec(fd: BorrowedFd) -> bool {
        // SAFETY: F_GETFD on a live fd.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        flags & libc::FD_CLOEXEC != 0
    }

    #[test]
    fn pipe_is_cloexec_and_carries_bytes() {
        let (r, w) = pipe().unwrap();
        assert!(cloexec(r.as_fd()) && cloexec(w.as_fd()));
        assert_eq!(write(w.as_fd(), b"abc").unwrap(), 3);
        let mut buf = [0u8; 8];
        assert_eq!(read(r.as_fd(), &mut buf).unwrap(), 3);
        assert_eq!(&buf[..3], b"abc");
        drop(w);
        assert_eq!(read(r.as_fd(), &mut buf).unwrap(), 0, "EOF");
    }

    #[test]
    fn nonblocking_read_would_block() {
        let (r, _w) = pipe().unwrap();
        set_nonblocking(r.as_fd()).unwrap();
        let err = read(r.as_fd(), &mut [0u8; 4]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn closed_reader_is_epipe() {
        // SAFETY: plain syscall; the test process must not die of SIGPIPE,
        // exactly as the agent ignores it.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let (r, w) = pipe().unwrap();
        drop(r);
        let err = write(w.as_fd(), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPIPE));
    }

    #[test]
    fn poll_sees_readable_and_times_out() {
        let (r, w) = pipe().unwrap();
        let mut fds = [libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let t = std::time::Duration::from_millis(1);
        assert_eq!(poll(&mut fds, Some(t)).unwrap(), 0);
        write(w.as_fd(), b"x").unwrap();
        assert_eq!(poll(&mut fds, None).unwrap(), 1);
        assert_eq!(fds[0].revents, libc::POLLIN);
    }

    #[test]
    fn dup_onto_itself_clears_cloexec() {
        let (r, w) = pipe().unwrap();
        dup_onto(r.as_raw_fd(), r.as_raw_fd()).unwrap();
        assert!(!cloexec(r.as_fd()));
        let copy = duplicate(w.as_fd()).unwrap();
        assert!(cloexec(copy.as_fd()));
    }
}
