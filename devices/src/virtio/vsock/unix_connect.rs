//! A connect to a Unix socket that never blocks the event loop: a
//! listener whose backlog is full answers EAGAIN instead of making the
//! VMM wait (std's `UnixStream::connect` would block until it has room).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

pub(super) fn connect_nonblocking(path: &Path) -> io::Result<UnixStream> {
    // SAFETY: sockaddr_un is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // One byte stays 0: the path's terminator.
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: plain socket(2); the fd is owned at once below.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_un of at least `len` bytes; fd is ours.
    let rc = unsafe {
        libc::connect(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    #[test]
    fn connects_refuses_and_never_blocks() {
        let dir = std::env::temp_dir().join(format!("mvm-unix-connect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let _ = std::fs::remove_file(&path);
        assert!(connect_nonblocking(&path).is_err(), "no listener yet");
        let listener = UnixListener::bind(&path).unwrap();
        // A backlog of one, so that it fills after a connection or two.
        // SAFETY: listen(2) on the listener's own fd.
        assert_eq!(
            unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), 1) },
            0
        );
        let mut c = connect_nonblocking(&path).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        server.write_all(b"hi").unwrap();
        c.set_nonblocking(false).unwrap();
        let mut buf = [0u8; 2];
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        // Nobody accepts any more: the backlog fills and a connect gets an
        // error instead of waiting.
        let mut refused = false;
        let mut held = Vec::new();
        for _ in 0..64 {
            match connect_nonblocking(&path) {
                Ok(s) => held.push(s),
                Err(_) => {
                    refused = true;
                    break;
                }
            }
        }
        assert!(refused, "a full backlog never refused");
        drop(listener);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
