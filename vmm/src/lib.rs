//! mvm: run a command in a throwaway KVM microVM with its own kernel.
//!
//! `cli` parses and hands each subcommand to its front end in `front`
//! (`run`, `boot`), which maps every way a run ends to an exit code. The
//! front ends drive a `machine`: created and booted in one linear function
//! each (`machine::create`, `machine::boot`), then started, paused,
//! resumed and waited for. `session` is `mvm run`'s exec client,
//! `shares`/`virtiofsd` its shared directories, `confine` the VMM's own
//! sandbox.

pub mod arch;
pub mod cli;
pub mod config;
pub mod confine;
pub mod console;
pub mod egress;
pub mod exit_code;
pub mod front;
pub mod helper_log;
pub mod helper_process;
pub mod machine;
pub mod sandboxes;
pub mod session;
pub mod shares;
pub mod timeline;
pub mod virtiofsd;
pub mod virtiofsd_filter;
