//! Brings up `lo`, the guest's only network interface (there is no
//! network device: docs/network.md). A server on 127.0.0.1 or ::1 then
//! works inside the VM; every other address stays unreachable.
//! Guest-only, no unit tests: the e2e suite connects over it.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::error::Error;

pub fn up() -> Result<(), Error> {
    let fail = |source: io::Error| Error::Loopback(source);
    // SAFETY: plain socket(2) call; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    // SAFETY: fd is a fresh socket nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: req is a valid ifreq naming "lo"; the kernel fills ifru_flags.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } != 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    // SAFETY: reading the union member SIOCGIFFLAGS just wrote.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: as above; SIOCSIFFLAGS reads the flags.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } != 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    Ok(())
}
