//! Turning wait(2) statuses into the exit status reported to the VMM, and
//! into the exec channel's `Exit` message.

use mvm_protocol::Exit;

/// Status reported when init itself fails before running the command.
pub const INIT_FAILURE: u32 = 125;
/// Child exit code when the command exists but cannot be executed.
pub const EXEC_FAILED: i32 = 126;
/// Child exit code when the command is not found.
pub const EXEC_NOT_FOUND: i32 = 127;
/// Status when the host went away before the command ended: the command
/// was killed with SIGKILL.
pub const HOST_GONE: u32 = 128 + libc::SIGKILL as u32;

/// Shell convention: the exit code, or 128 + signal number when the process
/// was killed by a signal. `None` for stop/continue notifications, which are
/// not terminations.
pub fn from_wait_status(wait_status: libc::c_int) -> Option<u32> {
    if libc::WIFEXITED(wait_status) {
        u32::try_from(libc::WEXITSTATUS(wait_status)).ok()
    } else if libc::WIFSIGNALED(wait_status) {
        u32::try_from(libc::WTERMSIG(wait_status))
            .ok()
            .map(|sig| 128 + sig)
    } else {
        None
    }
}

/// The `Exit` message for a terminated child; `None` for stop/continue
/// notifications. Its `status` equals `from_wait_status`.
pub fn exit_message(wait_status: libc::c_int) -> Option<Exit> {
    if libc::WIFEXITED(wait_status) {
        Some(Exit::exited(libc::WEXITSTATUS(wait_status)))
    } else if libc::WIFSIGNALED(wait_status) {
        Some(Exit::signaled(libc::WTERMSIG(wait_status)))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Raw encodings as the Linux kernel builds them.
    fn exited(code: i32) -> i32 {
        (code & 0xff) << 8
    }
    fn killed(sig: i32, core: bool) -> i32 {
        sig | if core { 0x80 } else { 0 }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(from_wait_status(exited(0)), Some(0));
        assert_eq!(from_wait_status(exited(3)), Some(3));
        assert_eq!(from_wait_status(exited(255)), Some(255));
    }

    #[test]
    fn signals_add_128() {
        assert_eq!(from_wait_status(killed(libc::SIGKILL, false)), Some(137));
        assert_eq!(from_wait_status(killed(libc::SIGTERM, false)), Some(143));
        assert_eq!(from_wait_status(killed(libc::SIGSEGV, true)), Some(139));
    }

    #[test]
    fn stop_is_not_termination() {
        assert_eq!(from_wait_status((libc::SIGSTOP << 8) | 0x7f), None);
        assert_eq!(from_wait_status(0xffff), None); // continued
    }

    #[test]
    fn exit_messages_agree_with_the_status() {
        for raw in [
            exited(0),
            exited(3),
            exited(255),
            killed(libc::SIGKILL, false),
            killed(libc::SIGSEGV, true),
        ] {
            let exit = exit_message(raw).unwrap();
            assert_eq!(Some(u32::from(exit.status)), from_wait_status(raw));
        }
        assert_eq!(exit_message(exited(3)), Some(Exit::exited(3)));
        assert_eq!(
            exit_message(killed(libc::SIGTERM, false)),
            Some(Exit::signaled(libc::SIGTERM))
        );
        assert_eq!(exit_message((libc::SIGSTOP << 8) | 0x7f), None);
        assert_eq!(HOST_GONE, 137);
    }
}
