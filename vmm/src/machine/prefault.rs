//! Guest memory that already holds data, mapped into the VM's stage-2
//! page tables before the vCPUs run (`KVM_PRE_FAULT_MEMORY`, Linux 6.10):
//! the loaded kernel and initramfs of a boot, the saved pages of a
//! restore. Without it the guest's first touch of each such page is an
//! exit to KVM of its own (an EPT or NPT violation), one per 4 KiB page
//! where the host has no huge pages under guest RAM.

use std::io;
use std::ops::Range;

use kvm_bindings::{kvm_pre_fault_memory, KVMIO};
use kvm_ioctls::VcpuFd;
use vmm_sys_util::errno;
use vmm_sys_util::ioctl::ioctl_with_mut_ref;
use vmm_sys_util::ioctl_iowr_nr;

ioctl_iowr_nr!(KVM_PRE_FAULT_MEMORY, KVMIO, 0xd5, kvm_pre_fault_memory);

/// Maps each guest-physical range in `ranges` (page-aligned, inside guest
/// RAM) through `vcpu`; returns the bytes mapped. A KVM without the call
/// (before 6.10, or without two-dimensional paging) maps nothing, and
/// that is no error: the guest then faults the pages in as it goes.
pub fn prefault(vcpu: &VcpuFd, ranges: &[Range<u64>]) -> io::Result<u64> {
    let mut mapped = 0;
    for range in ranges {
        let mut arg = kvm_pre_fault_memory {
            gpa: range.start,
            size: range.end.saturating_sub(range.start),
            ..Default::default()
        };
        while arg.size > 0 {
            let before = arg.size;
            // SAFETY: the ioctl reads and updates `arg` (gpa and size
            // advance past what was mapped), a live struct of the size the
            // request number encodes; it writes nothing else of ours.
            let rc = unsafe { ioctl_with_mut_ref(vcpu, KVM_PRE_FAULT_MEMORY(), &mut arg) };
            mapped += before - arg.size;
            if rc >= 0 {
                continue;
            }
            match errno::Error::last().errno() {
                libc::EINTR | libc::EAGAIN => continue,
                libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL => return Ok(mapped),
                e => return Err(io::Error::from_raw_os_error(e)),
            }
        }
    }
    Ok(mapped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_userspace_memory_region;
    use kvm_ioctls::Kvm;

    const MIB: u64 = 1 << 20;

    /// Maps a whole 2 MiB slot where the KVM has the call, nothing where
    /// it does not; a range with no memory behind it maps nothing.
    #[test]
    fn maps_a_slot_or_reports_none_mapped() {
        let Ok(kvm) = Kvm::new() else {
            eprintln!("skipped: /dev/kvm cannot be opened here");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        let mem = vm_memory::GuestMemoryMmap::<()>::from_ranges(&[(
            vm_memory::GuestAddress(0),
            (2 * MIB) as usize,
        )])
        .unwrap();
        let host =
            vm_memory::GuestMemoryBackend::get_host_address(&mem, vm_memory::GuestAddress(0))
                .unwrap();
        let region = kvm_userspace_memory_region {
            slot: 0,
            guest_phys_addr: 0,
            memory_size: 2 * MIB,
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the region is `mem`'s own mapping, which outlives `vm`
        // (declared before it is dropped at the end of the test).
        unsafe { vm.set_user_memory_region(region).unwrap() };
        let vcpu = vm.create_vcpu(0).unwrap();
        let supported = kvm.check_extension_raw(kvm_bindings::KVM_CAP_PRE_FAULT_MEMORY.into()) > 0;
        let mapped = prefault(&vcpu, std::slice::from_ref(&(0..2 * MIB))).unwrap();
        if supported {
            assert_eq!(mapped, 2 * MIB);
        } else {
            eprintln!("this KVM cannot pre-fault: nothing mapped");
            assert_eq!(mapped, 0);
        }
        let beyond = prefault(&vcpu, std::slice::from_ref(&(4 * MIB..6 * MIB)));
        assert!(!matches!(beyond, Ok(n) if n > 0), "{beyond:?}");
    }
}
