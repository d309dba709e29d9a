//! Architecture support. mvm targets x86-64 hosts with KVM only; other
//! architectures are not stubbed out (see design.md: no cfg forests).

pub mod x86_64;
