//! Model-specific registers set on every vCPU before it first runs: the
//! syscall MSRs zeroed (the kernel programs them), a zero TSC, fast string
//! operations on, and MTRRs enabled with write-back as the default type so
//! that guest RAM is cacheable from the first instruction.

use kvm_bindings::{kvm_msr_entry, Msrs};

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

const MISC_ENABLE_FAST_STRING: u64 = 1;
const MTRR_ENABLE: u64 = 1 << 11;
const MTRR_TYPE_WRBACK: u64 = 6;

pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    let msr = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    vec![
        msr(MSR_IA32_SYSENTER_CS, 0),
        msr(MSR_IA32_SYSENTER_ESP, 0),
        msr(MSR_IA32_SYSENTER_EIP, 0),
        msr(MSR_STAR, 0),
        msr(MSR_CSTAR, 0),
        msr(MSR_KERNEL_GS_BASE, 0),
        msr(MSR_SYSCALL_MASK, 0),
        msr(MSR_LSTAR, 0),
        msr(MSR_IA32_TSC, 0),
        msr(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        msr(MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_TYPE_WRBACK),
    ]
}

/// The same entries in the FAM wrapper `KVM_SET_MSRS` takes.
pub fn boot_msrs() -> Msrs {
    // The list is a fixed dozen entries, far below the wrapper's capacity.
    Msrs::from_entries(&boot_msr_entries()).expect("boot MSR list fits a kvm_msrs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msr_list_is_complete_and_unique() {
        let entries = boot_msr_entries();
        let mut idx: Vec<u32> = entries.iter().map(|e| e.index).collect();
        idx.sort();
        idx.dedup();
        assert_eq!(idx.len(), entries.len());
        let def = entries.iter().find(|e| e.index == 0x2ff).unwrap();
        assert_eq!(def.data, 0x806);
        assert_eq!(boot_msrs().as_slice().len(), entries.len());
    }
}
