//! The serial console: init's only channel to the user, and the command's
//! stdin/stdout/stderr. Guest-only (needs devtmpfs), so no unit tests.

use std::io::{self, Write};

use crate::error::Error;

/// Prints `mvm-init: <message>` on the console. Errors are ignored: there is
/// nowhere else to report them, and PID 1 must not panic as `eprintln!` would.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::console::say_args(format_args!($($arg)*))
    };
}

#[doc(hidden)]
pub fn say_args(args: std::fmt::Arguments) {
    // stderr is unbuffered, so the line is on the wire before we go on.
    let _ = writeln!(io::stderr(), "mvm-init: {args}");
}

/// Makes /dev/console fds 0, 1 and 2. The kernel starts us with no fds
/// because the initramfs has no /dev/console node; devtmpfs provides it.
pub fn open() -> Result<(), Error> {
    // No O_CLOEXEC: if all fds were closed this open returns 0 itself, which
    // the command must inherit. O_NOCTTY: the console becomes the command's
    // controlling tty (see spawn.rs), not init's.
    // SAFETY: the path is a valid NUL-terminated string.
    let fd = unsafe { libc::open(c"/dev/console".as_ptr(), libc::O_RDWR | libc::O_NOCTTY) };
    if fd < 0 {
        return Err(Error::Console(io::Error::last_os_error()));
    }
    for target in 0..=2 {
        // SAFETY: dup2 on fds we own; replacing 0-2 is the point.
        if fd != target && unsafe { libc::dup2(fd, target) } < 0 {
            return Err(Error::Console(io::Error::last_os_error()));
        }
    }
    if fd > 2 {
        // SAFETY: fd is our own spare copy, no longer needed.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// Waits until everything written so far has left the UART, so a reboot
/// right after does not cut off the last lines.
pub fn drain() {
    let _ = io::stdout().flush();
    // SAFETY: plain syscall on fd 2; a failure (not a tty) is harmless.
    unsafe { libc::tcdrain(2) };
}
