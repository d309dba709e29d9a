//! Turning wait(2) statuses into the exit status reported to the VMM.

/// Status reported when init itself fails before running the command.
pub const INIT_FAILURE: u32 = 125;
/// Child exit code when the command exists but cannot be executed.
pub const EXEC_FAILED: i32 = 126;
/// Child exit code when the command is not found.
pub const EXEC_NOT_FOUND: i32 = 127;

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
}
