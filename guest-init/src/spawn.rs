//! Starting the guest command: fork, then exec in the child with a fixed
//! environment. Guest-only (it is PID 1's job), so no unit tests.

use std::ffi::{CStr, CString};
use std::io;
use std::ptr;

use crate::errno::strerror;
use crate::error::Error;
use crate::status::{EXEC_FAILED, EXEC_NOT_FOUND};

/// `PATH` of every command init runs (the exec agent's too).
pub const PATH: &CStr = c"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The command's whole environment; nothing from the kernel leaks through.
const ENV: [(&CStr, &CStr); 3] = [(c"PATH", PATH), (c"HOME", c"/root"), (c"TERM", c"linux")];

/// Forks and execs `argv` (searched in PATH) in the current directory with
/// the console as stdio. Returns the child's pid. With `controlling_tty` the
/// console becomes the controlling tty of the command's session.
pub fn spawn(argv: &[CString], controlling_tty: bool) -> Result<libc::pid_t, Error> {
    // Built before fork so the child only makes syscalls and libc calls.
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(ptr::null());

    // SAFETY: init is single-threaded, so the child is a full copy with no
    // locks held by other threads; it only runs `exec_child`, which never
    // returns.
    match unsafe { libc::fork() } {
        -1 => Err(Error::Fork(io::Error::last_os_error())),
        0 => exec_child(&ptrs, controlling_tty),
        pid => Ok(pid),
    }
}

fn exec_child(argv: &[*const libc::c_char], controlling_tty: bool) -> ! {
    // A session of its own with the console as controlling tty gives an
    // interactive shell job control and Ctrl-C. Only then: when a session
    // leader with a (non-pty) controlling tty exits, the kernel hangs the
    // tty up and discards output still queued in the UART, which would
    // cut off the last lines of a command's output. Best effort: without a
    // controlling tty the command still runs.
    // The I/O bitmap survives exec: the command must not reach the status
    // port (best effort like the rest: this path has no error channel, and
    // the exec below is what matters).
    crate::vmm_port::revoke();
    // SAFETY: plain syscalls on our own process and fd 0.
    unsafe {
        libc::setsid();
        if controlling_tty {
            libc::ioctl(0, libc::TIOCSCTTY, 1);
        }
    }
    // SAFETY: the child is single-threaded, so changing the environment
    // races with nothing; all strings are valid C strings. execvp searches
    // the PATH set here.
    unsafe {
        libc::clearenv();
        for (name, value) in ENV {
            libc::setenv(name.as_ptr(), value.as_ptr(), 1);
        }
        libc::execvp(argv[0], argv.as_ptr());
    }
    // Only reached if exec failed.
    let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: argv[0] is the pointer of a live CString from `spawn`.
    let name = unsafe { CStr::from_ptr(argv[0]) };
    crate::say!(
        "cannot run '{}': {}",
        name.to_string_lossy(),
        strerror(errno)
    );
    let code = if errno == libc::ENOENT {
        EXEC_NOT_FOUND
    } else {
        EXEC_FAILED
    };
    // SAFETY: _exit skips atexit handlers and stdio flushing that belong to
    // the parent's copy of the process.
    unsafe { libc::_exit(code) }
}
