//! What saving a snapshot adds to the filters, only for a run that takes
//! one (`mvm boot --snapshot-at-ready`, a template's first `mvm run`):
//! each vCPU thread reads its own vCPU's state, the vmm thread the VM's
//! in-kernel devices and writes the snapshot's files (a template's are
//! written by the writer thread instead, whose list has `FILE_CALLS`
//! too; Landlock confines them to the snapshot's parent directory).
//! Reading state changes nothing in the VM.

use kvm_bindings::{
    kvm_clock_data, kvm_cpuid2, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state,
    kvm_msrs, kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use vmm_sys_util::{ioctl_ior_nr, ioctl_iowr_nr};

const KVMIO: u32 = 0xAE;

ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);
ioctl_ior_nr!(KVM_GET_LAPIC, KVMIO, 0x8e, kvm_lapic_state);
ioctl_iowr_nr!(KVM_GET_CPUID2, KVMIO, 0x91, kvm_cpuid2);
ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_mp_state);
ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, KVMIO, 0x9f, kvm_vcpu_events);
ioctl_ior_nr!(KVM_GET_DEBUGREGS, KVMIO, 0xa1, kvm_debugregs);
ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_xsave);
ioctl_ior_nr!(KVM_GET_XCRS, KVMIO, 0xa6, kvm_xcrs);
ioctl_iowr_nr!(KVM_GET_IRQCHIP, KVMIO, 0x62, kvm_irqchip);
ioctl_ior_nr!(KVM_GET_CLOCK, KVMIO, 0x7c, kvm_clock_data);
ioctl_ior_nr!(KVM_GET_PIT2, KVMIO, 0x9f, kvm_pit_state2);

/// A vCPU's state (machine/snapshot/vcpu_state.rs).
pub fn vcpu_ioctls() -> Vec<u64> {
    [
        KVM_GET_REGS(),
        KVM_GET_SREGS(),
        KVM_GET_MSRS(),
        KVM_GET_LAPIC(),
        KVM_GET_CPUID2(),
        KVM_GET_MP_STATE(),
        KVM_GET_VCPU_EVENTS(),
        KVM_GET_DEBUGREGS(),
        KVM_GET_XSAVE(),
        KVM_GET_XCRS(),
    ]
    .to_vec()
}

/// The VM's PIT, clock and interrupt controllers (vm_state.rs).
pub fn vm_ioctls() -> Vec<u64> {
    [KVM_GET_IRQCHIP(), KVM_GET_CLOCK(), KVM_GET_PIT2()].to_vec()
}

/// Writing the snapshot directory: making it, its files, their data
/// (sparse: positioned writes and a final length), syncing, renaming the
/// finished directory into place; and `sysinfo`, whether the host has
/// swap, which decides whether guest RAM that is not resident can be
/// skipped (`memory::data_ranges`; `mincore` and `lseek`, which find what
/// to read, are the vmm thread's already).
pub const FILE_CALLS: &[i64] = &[
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_pwrite64,
    libc::SYS_ftruncate,
    libc::SYS_fsync,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_sysinfo,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_numbers_are_the_kernels() {
        // From <linux/kvm.h> as built for x86-64.
        assert_eq!(KVM_GET_REGS(), 0x8090_ae81);
        assert_eq!(KVM_GET_SREGS(), 0x8138_ae83);
        assert_eq!(KVM_GET_MSRS(), 0xc008_ae88);
        assert_eq!(KVM_GET_XSAVE(), 0x9000_aea4);
        assert_eq!(KVM_GET_IRQCHIP(), 0xc208_ae62);
        assert_eq!(KVM_GET_PIT2(), 0x8070_ae9f);
        assert_eq!(KVM_GET_VCPU_EVENTS(), 0x8040_ae9f);
    }
}
