//! The egress forwarder (docs/network.md): an HTTP proxy port on the
//! guest's 127.0.0.1 whose every connection is carried, byte for byte, to
//! the host's egress proxy over a vsock stream of its own (host CID 2,
//! port `EGRESS_VSOCK_PORT`). It understands nothing of HTTP: the host
//! proxy decides, answers denials and logs. So a guest root that kills or
//! replaces it gains nothing: the same vsock port, the same host proxy.
//!
//! It runs in a process of its own forked from PID 1, as nobody, with no
//! I/O port access and no_new_privs; each connection gets two threads
//! copying one direction each (blocking I/O: simple, and bounded by
//! `MAX_CONNECTIONS`). Guest-only: the e2e suite exercises it.

use std::io::{self, Read, Write};
use std::mem;
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mvm_protocol::{EGRESS_PROXY_PORT, EGRESS_VSOCK_PORT};

/// Connections carried at once; more are closed at once (the host proxy
/// bounds them too, per run).
const MAX_CONNECTIONS: usize = 256;
/// Each direction's copy buffer.
const BUF: usize = 16 << 10;
/// The copy threads' stacks: they hold a buffer and little else.
const STACK: usize = 64 << 10;
const NOBODY: u32 = 65534;
/// The host's vsock address.
const HOST_CID: u32 = 2;

/// Forks the forwarder; PID 1 goes on at once. Its failures are said on
/// the console: the command then sees its proxy refuse connections.
pub fn start() -> io::Result<libc::pid_t> {
    // Bound before the fork, so that the command never races a listener
    // that is not there yet.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, EGRESS_PROXY_PORT))?;
    // SAFETY: guest-init is single-threaded when the agent starts the
    // forwarder; the child only makes system calls and runs its loop.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid > 0 {
        return Ok(pid);
    }
    let code = match drop_privileges().and_then(|()| serve(listener)) {
        Ok(()) => 0,
        Err(e) => {
            crate::say!("egress forwarder: {e}");
            1
        }
    };
    // SAFETY: ends the forked child without running PID 1's exit paths.
    unsafe { libc::_exit(code) }
}

fn drop_privileges() -> io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    // PID 1's status port access must not reach the forwarder.
    check(crate::vmm_port::revoke())?;
    // SAFETY: plain system calls in the forked child.
    unsafe {
        // A peer that went away must be an EPIPE for one copy thread, not
        // a signal that ends every connection (PID 1 leaves SIGPIPE as
        // the kernel set it).
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        check(libc::setsid().min(0))?;
        check(libc::setgroups(0, ptr::null()))?;
        check(libc::setgid(NOBODY))?;
        check(libc::setuid(NOBODY))?;
        check(libc::prctl(
            libc::PR_SET_NO_NEW_PRIVS,
            1 as libc::c_ulong,
            0,
            0,
            0,
        ))?;
    }
    Ok(())
}

fn serve(listener: TcpListener) -> io::Result<()> {
    let live = Arc::new(AtomicUsize::new(0));
    loop {
        let (client, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if live.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            continue; // dropped: the client sees the connection close
        }
        let host = match connect_host() {
            Ok(h) => h,
            // The host proxy is gone or refuses: close, the client sees
            // its proxy connection fail at once.
            Err(_) => continue,
        };
        live.fetch_add(1, Ordering::SeqCst);
        carry(client, host, live.clone());
    }
}

/// Two copy threads for one connection; the second to finish lets go of
/// the slot.
fn carry(client: TcpStream, host: UnixStream, live: Arc<AtomicUsize>) {
    let (Ok(client2), Ok(host2)) = (client.try_clone(), host.try_clone()) else {
        live.fetch_sub(1, Ordering::SeqCst);
        return;
    };
    let done = Arc::new(AtomicUsize::new(0));
    let finish = move |done: &AtomicUsize, live: &AtomicUsize| {
        if done.fetch_add(1, Ordering::SeqCst) == 1 {
            live.fetch_sub(1, Ordering::SeqCst);
        }
    };
    let (d1, l1) = (done.clone(), live.clone());
    let up = std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            copy(client, &host, |h| h.shutdown(Shutdown::Write));
            finish(&d1, &l1);
        });
    let down = std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            copy(host2, &client2, |c| c.shutdown(Shutdown::Write));
            finish(&done, &live);
        });
    if up.is_err() || down.is_err() {
        // Out of threads: what was started ends with its sockets.
        crate::say!("egress forwarder: cannot start a copy thread");
    }
}

/// Copies `from` to `to` until end of file or an error, then half-closes
/// `to` so the other side sees the end.
fn copy<R: Read, W>(mut from: R, mut to: &W, shut: impl Fn(&W) -> io::Result<()>)
where
    for<'a> &'a W: Write,
{
    let mut buf = vec![0u8; BUF];
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = shut(to);
}

/// A vsock stream to the host's egress port. It is a stream socket like a
/// Unix one, so it is held as a `UnixStream` for std's Read/Write and
/// shutdown (both are plain fds to the kernel).
fn connect_host() -> io::Result<UnixStream> {
    // SAFETY: plain syscall; the fd is owned below.
    let raw = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh socket nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_vm is plain old data; all-zero is valid and zeroes
    // the reserved fields.
    let mut addr: libc::sockaddr_vm = unsafe { mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_port = EGRESS_VSOCK_PORT;
    addr.svm_cid = HOST_CID;
    // SAFETY: addr is a valid sockaddr_vm and the length matches it.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            ptr::from_ref(&addr).cast(),
            mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}
