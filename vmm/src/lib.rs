//! mvm: run a command in a throwaway KVM microVM with its own kernel.
//!
//! `cli` parses and maps outcomes to exit codes; `builder` assembles a VM in
//! one linear function from `vm`, `memory`, `device_manager`, `kernel` and
//! `arch`; `runner` starts the `vcpu` threads and drives the `event_loop`.

pub mod arch;
pub mod builder;
pub mod cli;
pub mod config;
pub mod confine;
pub mod console;
pub mod device_manager;
pub mod event_loop;
pub mod exit_code;
pub mod kernel;
pub mod memory;
mod run_command;
pub mod runner;
pub mod session;
pub mod shares;
pub mod vcpu;
pub mod virtiofsd;
pub mod virtiofsd_filter;
pub mod vm;
