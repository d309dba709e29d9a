//! Signal handling of the agent: SIGCHLD arrives through a signalfd so the
//! relay's poll loop sees child exits as just another readable fd, and
//! SIGPIPE is ignored so that writing to a closed pipe or socket is an
//! error to handle, not a signal. The child undoes both before exec.
//!
//! Process-wide signal state only behaves as documented in a
//! single-threaded process (PID 1 in the guest), so no unit tests here.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

use super::fd::check;

/// The SIGCHLD signalfd; reading it only says "some child changed state".
pub struct ChildSignals {
    fd: OwnedFd,
}

/// Blocks SIGCHLD (so it queues for the signalfd instead of being dropped
/// by PID 1's default disposition) and ignores SIGPIPE. Must run before
/// the fork so that no exit can be missed.
pub fn setup() -> io::Result<ChildSignals> {
    let mask = sigchld_mask();
    // SAFETY: mask is a valid sigset; the old mask is not wanted.
    check(unsafe { libc::sigprocmask(libc::SIG_BLOCK, &mask, ptr::null_mut()) })?;
    // SAFETY: plain syscall; SIG_IGN for SIGPIPE installs no handler code.
    if unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: mask is a valid sigset; -1 asks for a new fd.
    let raw = check(unsafe { libc::signalfd(-1, &mask, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) })?;
    // SAFETY: signalfd succeeded; the fd is ours alone.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    Ok(ChildSignals { fd })
}

impl ChildSignals {
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Empties the signalfd so poll stops reporting it. Several exits may
    /// have merged into one signal: the caller reaps with `reap` anyway.
    pub fn drain(&self) {
        // SAFETY: signalfd_siginfo is plain old data.
        let mut info: libc::signalfd_siginfo = unsafe { mem::zeroed() };
        loop {
            // SAFETY: info is valid for writes of its full size.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    ptr::from_mut(&mut info).cast(),
                    mem::size_of::<libc::signalfd_siginfo>(),
                )
            };
            // Anything but a full record (EAGAIN when empty) ends the loop.
            if n != mem::size_of::<libc::signalfd_siginfo>() as isize {
                break;
            }
        }
    }
}

/// Reaps every terminated child without blocking (PID 1 inherits every
/// orphan); returns the wait status of `pid` if it was among them.
pub fn reap(pid: libc::pid_t) -> Option<libc::c_int> {
    let mut found = None;
    loop {
        let mut raw = 0;
        // SAFETY: raw is a valid out-pointer for the call's duration.
        let reaped = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
        if reaped <= 0 {
            // 0: children left but none exited; -1: ECHILD (none left) or
            // EINTR, after which the next SIGCHLD brings us back.
            return found;
        }
        if reaped == pid && (libc::WIFEXITED(raw) || libc::WIFSIGNALED(raw)) {
            found = Some(raw);
        }
    }
}

/// For the child after fork: unblocks every signal and restores SIGPIPE's
/// default, since both the mask and ignored dispositions survive exec.
pub fn reset_in_child() {
    // SAFETY: an all-empty sigset is valid; plain syscalls in the child.
    unsafe {
        let mut empty: libc::sigset_t = mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn sigchld_mask() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data, then initialised by sigemptyset.
    unsafe {
        let mut mask: libc::sigset_t = mem::zeroed();
        libc::sigemptyset(&mut mask);
        libc::sigaddset(&mut mask, libc::SIGCHLD);
        mask
    }
}
