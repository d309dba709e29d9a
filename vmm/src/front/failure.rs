//! A front end's failure: the one line for stderr and the exit code
//! (vmm/src/exit_code.rs, `mvm --help`).

use crate::exit_code;
use crate::machine::{self, kvm, Outcome};

/// A failure before or while running the VM: message and exit code.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: i32,
}

/// A machine that could not be built: nothing ran yet.
impl From<machine::Error> for Failure {
    fn from(e: machine::Error) -> Self {
        let code = match &e {
            machine::Error::Kvm(
                kvm::Error::NoKvm(_) | kvm::Error::KvmPermission(_) | kvm::Error::OpenKvm(..),
            ) => exit_code::KVM_UNAVAILABLE,
            _ => exit_code::SETUP_FAILED,
        };
        Failure {
            message: e.to_string(),
            code,
        }
    }
}

/// A machine that failed while starting or running.
pub(crate) fn vmm_failure(e: machine::Error) -> Failure {
    Failure {
        message: e.to_string(),
        code: exit_code::VMM_FAILED,
    }
}

pub(crate) fn setup_failure(message: impl ToString) -> Failure {
    Failure {
        message: message.to_string(),
        code: exit_code::SETUP_FAILED,
    }
}

/// The failure for a machine that ended without the command's exit status
/// (`timeout`: the `--timeout` given, for the message).
pub(crate) fn outcome_failure(outcome: Outcome, timeout: Option<f64>) -> Failure {
    match outcome {
        Outcome::Panicked => Failure {
            message: "the guest kernel panicked (see the guest console)".into(),
            code: exit_code::GUEST_CRASHED,
        },
        Outcome::TimedOut => Failure {
            message: format!(
                "the guest did not finish within --timeout {}s; the VM was destroyed",
                timeout.unwrap_or_default()
            ),
            code: exit_code::TIMEOUT,
        },
        Outcome::Signalled(sig) => Failure {
            message: format!("stopped by signal {sig}; the VM was destroyed"),
            code: 128 + sig,
        },
        Outcome::Failed(why) => Failure {
            message: why,
            code: exit_code::VMM_FAILED,
        },
        Outcome::Exited(_) | Outcome::Stopped => Failure {
            message: "the guest stopped without reporting the command's exit status (an unexpected reboot or crash; see the guest console)".into(),
            code: exit_code::GUEST_CRASHED,
        },
    }
}
