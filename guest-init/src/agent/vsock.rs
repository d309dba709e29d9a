//! The agent's AF_VSOCK listening socket and its one connection.
//! Guest-only (needs the guest kernel's virtio-vsock transport), so no unit
//! tests.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr;

use super::fd::check;

/// Listens on `port` for a connection from any CID (in practice the host).
/// Backlog 1: the agent serves one connection per boot.
pub fn listen(port: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let raw =
        check(unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: socket succeeded; the fd is ours alone.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_vm is plain old data; all-zero is a valid value and
    // zeroes the reserved fields as the kernel requires.
    let mut addr: libc::sockaddr_vm = unsafe { mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_port = port;
    addr.svm_cid = libc::VMADDR_CID_ANY;
    // SAFETY: addr is a valid sockaddr_vm and the length matches it.
    check(unsafe {
        libc::bind(
            socket.as_raw_fd(),
            ptr::from_ref(&addr).cast(),
            mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
        )
    })?;
    // SAFETY: plain syscall on our socket.
    check(unsafe { libc::listen(socket.as_raw_fd(), 1) })?;
    Ok(socket)
}

/// Waits for the connection (the host keeps retrying until we listen).
pub fn accept(listener: BorrowedFd) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: null address pointers are allowed when the peer address
        // is not wanted.
        let rc = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                ptr::null_mut(),
                ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        match check(rc) {
            // SAFETY: accept4 succeeded; the fd is ours alone.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        }
    }
}

/// Half-closes the connection: the host reads end of stream after `Exit`.
pub fn shutdown_write(conn: BorrowedFd) -> io::Result<()> {
    // SAFETY: plain syscall on a socket we borrow.
    check(unsafe { libc::shutdown(conn.as_raw_fd(), libc::SHUT_WR) })?;
    Ok(())
}
