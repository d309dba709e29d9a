//! x86-64 specifics: guest layout, boot structures and vCPU state.

pub mod boot_params;
pub mod cpuid;
pub mod gdt;
pub mod interrupts;
pub mod layout;
pub mod mptable;
pub mod msr;
pub mod regs;
