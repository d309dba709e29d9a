//! The front ends: one module per subcommand (`run`, `boot`) over a
//! [`Machine`](crate::machine::Machine), and what they share: the VM
//! options every subcommand takes, the failure type and how each way a
//! machine ends becomes one line on stderr and a documented exit code.
//! `cli` parses and calls in here; nothing here reaches back up.

pub mod boot;
pub mod command_args;
mod console_tail;
pub mod egress;
mod failure;
mod first_pages;
pub mod image;
mod join;
mod launch;
pub mod oci;
mod pull;
mod request;
mod root_file;
pub mod run;
pub mod sandbox;
mod secrets;
pub mod snapshot_cmd;
mod stats;
pub mod template;
mod template_save;
mod vm_args;

pub use failure::Failure;
pub use vm_args::VmArgs;

pub(crate) use failure::{outcome_failure, setup_failure, vmm_failure};
pub(crate) use stats::{print_stats, SessionMoments};
pub(crate) use vm_args::{
    beside_binary, confine_vmm, libexec_helper, refuse_software_kvm, InitramfsNeeds,
};

/// Kernel parameters every mvm guest gets (devices add their own): a
/// panic or oops resets the VM at once instead of hanging it.
pub const BASE_CMDLINE: &str = "panic=-1 oops=panic nomodules";
