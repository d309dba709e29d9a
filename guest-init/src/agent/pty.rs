//! Pseudo-terminals for `tty` requests. The slave is opened from the master
//! with TIOCGPTPEER, so it is the peer of that very master whatever is
//! mounted where. Guest-only by contract (the guest's devpts has
//! ptmxmode=0666); the calls themselves are ordinary and work on any Linux.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::fd::check;

/// /dev/ptmx from devtmpfs opens the devpts instance mounted at /dev/pts;
/// the link is the fallback should the node be missing.
const PTMX: &CStr = c"/dev/ptmx";
const PTMX_LINK_TARGET: &CStr = c"pts/ptmx";
/// The usual VEOF, in case the terminal settings cannot be read.
const DEFAULT_EOF: u8 = 0x04;

pub struct Pty {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// Makes sure /dev/ptmx exists (programs in the guest open it too).
pub fn ensure_ptmx() -> io::Result<()> {
    // SAFETY: valid NUL-terminated paths; access only checks existence.
    unsafe {
        if libc::access(PTMX.as_ptr(), libc::F_OK) == 0 {
            return Ok(());
        }
        check(libc::symlink(PTMX_LINK_TARGET.as_ptr(), PTMX.as_ptr()))?;
    }
    Ok(())
}

/// A new terminal pair of the given size. Both fds are close-on-exec; the
/// child dups the slave onto its stdio.
pub fn open(rows: u16, cols: u16) -> io::Result<Pty> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: valid NUL-terminated path.
    let raw = check(unsafe { libc::open(PTMX.as_ptr(), flags) })?;
    // SAFETY: open succeeded; the fd is ours alone.
    let master = unsafe { OwnedFd::from_raw_fd(raw) };
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from the pointer, which is valid.
    check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) })?;
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new fd.
    let raw = check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) })?;
    // SAFETY: the ioctl succeeded; the fd is ours alone.
    let slave = unsafe { OwnedFd::from_raw_fd(raw) };
    set_size(master.as_fd(), rows, cols)?;
    Ok(Pty { master, slave })
}

/// Sets the terminal size; the kernel sends SIGWINCH to the foreground
/// process group when it changes.
pub fn set_size(master: BorrowedFd, rows: u16, cols: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize from the pointer, which is valid.
    check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) })?;
    Ok(())
}

/// The character that means end of input on this terminal right now (the
/// program may have changed it).
pub fn eof_char(master: BorrowedFd) -> u8 {
    // SAFETY: termios is plain old data; all-zero is a valid value.
    let mut termios: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: termios is a valid out-pointer. On a master, the kernel
    // reports the settings of the pair (the slave's).
    if unsafe { libc::tcgetattr(master.as_raw_fd(), &mut termios) } == 0 {
        termios.c_cc[libc::VEOF]
    } else {
        DEFAULT_EOF
    }
}

/// Makes the slave the calling process's controlling terminal. For the child,
/// after setsid().
pub fn make_controlling(slave: BorrowedFd) -> io::Result<()> {
    // SAFETY: plain ioctl on our own fd; 0 = do not steal from another session.
    check(unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCSCTTY, 0) })?;
    Ok(())
}
