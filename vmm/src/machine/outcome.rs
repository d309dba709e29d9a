//! How a machine ended, decided in one place from what was recorded: the
//! stop reason, the status guest-init reported, and whether the console
//! showed a panic.

use super::stop::StopReason;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Guest-init reported the command's exit status.
    Exited(u32),
    /// The guest reset or shut down without reporting a status (or the
    /// host ended a guest that lingered after its command).
    Stopped,
    /// The guest kernel panicked.
    Panicked,
    /// The deadline passed first.
    TimedOut,
    /// The host tore the machine down on this signal.
    Signalled(i32),
    /// KVM, the VMM or a device backend failed.
    Failed(String),
}

impl Outcome {
    /// The order matters: what the host decided (deadline, signal, a
    /// failure) comes before what the guest said, and a reported status
    /// before a panic banner a command may have printed itself.
    pub fn decide(reason: Option<StopReason>, exit_status: Option<u32>, panic_seen: bool) -> Self {
        match (reason, exit_status) {
            (Some(StopReason::Timeout), _) => Self::TimedOut,
            (Some(StopReason::Signal(sig)), _) => Self::Signalled(sig),
            (Some(StopReason::Failed(why)), _) => Self::Failed(why),
            (_, Some(status)) => Self::Exited(status),
            _ if panic_seen => Self::Panicked,
            _ => Self::Stopped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_decisions_come_first_then_the_status_then_a_panic() {
        use StopReason::*;
        assert_eq!(
            Outcome::decide(Some(Timeout), Some(0), true),
            Outcome::TimedOut
        );
        assert_eq!(
            Outcome::decide(Some(Signal(15)), Some(0), false),
            Outcome::Signalled(15)
        );
        assert_eq!(
            Outcome::decide(Some(Failed("x".into())), Some(3), false),
            Outcome::Failed("x".into())
        );
        assert_eq!(
            Outcome::decide(Some(GuestReset), Some(3), true),
            Outcome::Exited(3)
        );
        assert_eq!(
            Outcome::decide(Some(Host), Some(3), false),
            Outcome::Exited(3)
        );
        assert_eq!(
            Outcome::decide(Some(GuestReset), None, true),
            Outcome::Panicked
        );
        assert_eq!(
            Outcome::decide(Some(VcpuShutdown), None, false),
            Outcome::Stopped
        );
        assert_eq!(Outcome::decide(None, None, false), Outcome::Stopped);
    }
}
