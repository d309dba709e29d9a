//! Power requests to PID 1. busybox's `reboot`, `poweroff` and `halt`
//! (without -f) do not call reboot(2) themselves: they signal init
//! (SIGTERM, SIGUSR2, SIGUSR1). The kernel only delivers signals to PID 1
//! that it handles, so without these handlers `poweroff` in `mvm boot`'s
//! shell would do nothing. A request ends the command and takes init's
//! normal report-and-reboot path, which the VMM sees as a clean stop.
//! Guest-only (signalling PID 1), so no unit tests beyond the e2e one.

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

static REQUESTED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_request(sig: libc::c_int) {
    REQUESTED.store(sig, Ordering::SeqCst);
}

/// Installs the handlers, without SA_RESTART so that init's waitpid
/// returns EINTR and sees the request.
pub fn install() -> io::Result<()> {
    for sig in [libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2] {
        // SAFETY: sigaction is plain old data; all-zero is a valid value.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_request as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only stores to an atomic (async-signal-safe);
        // `action` is fully initialised and outlives the call.
        if unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal of a pending power request, if any.
pub fn requested() -> Option<i32> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}
