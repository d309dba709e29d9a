//! PID 1 inherits every orphan in the guest; reaping them all keeps zombies
//! from piling up while we wait for the command. Guest-only, no unit tests
//! (the status mapping itself is tested in status.rs).

use std::io;

use crate::error::Error;
use crate::{power, status};

/// Reaps children until `pid` terminates; returns its exit status. A power
/// request (see power.rs) kills the command's process group first.
pub fn wait_for(pid: libc::pid_t) -> Result<u32, Error> {
    let mut killed = false;
    loop {
        if !killed && power::requested().is_some() {
            // SAFETY: plain syscalls; the command leads its own process
            // group (it called setsid), so -pid reaches all of it.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
            killed = true;
        }
        let mut raw = 0;
        // SAFETY: `raw` is a valid out-pointer for the call's duration.
        let reaped = unsafe { libc::waitpid(-1, &mut raw, 0) };
        if reaped == -1 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::Wait(err));
        }
        if reaped == pid {
            if let Some(code) = status::from_wait_status(raw) {
                return Ok(code);
            }
        }
        // Any other pid is an orphan we just reaped: nothing to report.
    }
}
