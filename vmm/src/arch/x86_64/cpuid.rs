//! Per-vCPU CPUID, derived from what KVM supports on this host.
//!
//! Two edits matter for booting Linux: each vCPU must see its own APIC id
//! (leaf 1 EBX, leaf 0xb EDX), and the hypervisor bit (leaf 1 ECX bit 31)
//! must be set, or the guest never looks at the KVM leaves at 0x4000_0000,
//! finds no kvm-clock and hangs calibrating its TSC.
//!
//! One more is a matter of speed: `KVM_GET_SUPPORTED_CPUID` leaves the
//! TSC-deadline timer (leaf 1 ECX bit 24) clear although KVM emulates it
//! (it says so through `KVM_CAP_TSC_DEADLINE_TIMER`), and without it the
//! guest runs the IO-APIC timer check and two polled LAPIC-timer
//! calibrations at boot (about 250 ms in the test host). Firecracker's
//! CPUID normalisation sets it the same way.
//!
//! And one is about XSAVE: see [`boot_xcr0`].

use kvm_bindings::{kvm_cpuid_entry2, CpuId};

const LEAF_FEATURES: u32 = 0x1;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_XSTATE: u32 = 0xd;
/// ECX bit 26: XSAVE/XRSTOR and XCR0 exist.
const ECX_XSAVE_BIT: u32 = 1 << 26;
/// XCR0 bit 0, x87 state: always set.
const XCR0_X87: u64 = 1;
const ECX_HYPERVISOR_BIT: u32 = 1 << 31;
/// ECX bit 24: the LAPIC timer has TSC-deadline mode.
const ECX_TSC_DEADLINE_BIT: u32 = 1 << 24;
/// EBX bits 23-16: logical processors per package (valid with HTT).
const EBX_CPU_COUNT_SHIFT: u32 = 16;
/// EBX bits 31-24: initial APIC id.
const EBX_APIC_ID_SHIFT: u32 = 24;
/// EDX bit 28: HTT, "the CPU count field is valid".
const EDX_HTT_BIT: u32 = 1 << 28;

/// What KVM emulates beyond what `KVM_GET_SUPPORTED_CPUID` reports, from
/// its capabilities.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Emulated {
    /// `KVM_CAP_TSC_DEADLINE_TIMER`.
    pub tsc_deadline_timer: bool,
}

/// Advertises in `cpuid` (from `KVM_GET_SUPPORTED_CPUID`, for every vCPU)
/// what KVM emulates but does not list there.
pub fn advertise_emulated(cpuid: &mut CpuId, emulated: Emulated) {
    for entry in cpuid.as_mut_slice() {
        if entry.function == LEAF_FEATURES && emulated.tsc_deadline_timer {
            entry.ecx |= ECX_TSC_DEADLINE_BIT;
        }
    }
}

/// The XCR0 a vCPU starts with: every state component CPUID leaf 0xD
/// sub-leaf 0 lists (EDX:EAX), or None if the vCPU has no XSAVE.
///
/// Why not the reset value (x87 only): KVM keeps leaf 0xD's size fields
/// (EBX: bytes for the components enabled in XCR0) in step with the XCR0
/// it last saw, and the guest kernel checks that size against its own sum
/// right after writing XCR0; on a mismatch it prints a kernel WARNING and
/// turns XSAVE off altogether (no AVX in the guest). Where KVM sees the
/// guest's XSETBV (hardware) the start value is overwritten at once and
/// changes nothing; where it does not (nested under QEMU's TCG, the test
/// host, for mvm and Firecracker alike) the size stays that of the value
/// set here, which is what the guest goes on to enable.
pub fn boot_xcr0(cpuid: &CpuId) -> Option<u64> {
    let entries = cpuid.as_slice();
    let features = entries.iter().find(|e| e.function == LEAF_FEATURES)?;
    if features.ecx & ECX_XSAVE_BIT == 0 {
        return None;
    }
    let xstate = entries
        .iter()
        .find(|e| e.function == LEAF_XSTATE && e.index == 0)?;
    Some(u64::from(xstate.eax) | u64::from(xstate.edx) << 32 | XCR0_X87)
}

/// Adjusts `cpuid` (from `KVM_GET_SUPPORTED_CPUID`) for vCPU `cpu_id` of
/// `cpu_count`.
pub fn filter(cpuid: &mut CpuId, cpu_id: u8, cpu_count: u8) {
    for entry in cpuid.as_mut_slice() {
        filter_entry(entry, cpu_id, cpu_count);
    }
}

fn filter_entry(entry: &mut kvm_cpuid_entry2, cpu_id: u8, cpu_count: u8) {
    match entry.function {
        LEAF_FEATURES => {
            entry.ecx |= ECX_HYPERVISOR_BIT;
            entry.ebx &= 0x0000_ffff;
            entry.ebx |= (u32::from(cpu_id) << EBX_APIC_ID_SHIFT)
                | (u32::from(cpu_count) << EBX_CPU_COUNT_SHIFT);
            if cpu_count > 1 {
                entry.edx |= EDX_HTT_BIT;
            }
        }
        LEAF_EXT_TOPOLOGY => {
            // x2APIC id of this logical processor, in every sub-leaf.
            entry.edx = u32::from(cpu_id);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            ebx: 0xdead_0800,
            edx: 0x1,
            ..Default::default()
        }
    }

    #[test]
    fn sets_apic_id_count_and_hypervisor_bit() {
        let mut cpuid =
            CpuId::from_entries(&[entry(0, 0), entry(1, 0), entry(0xb, 0), entry(0xb, 1)]).unwrap();
        filter(&mut cpuid, 3, 4);
        let e = cpuid.as_slice();
        assert_eq!(e[0], entry(0, 0), "other leaves untouched");
        assert_eq!(e[1].ebx, 0x0304_0800);
        assert_ne!(e[1].ecx & (1 << 31), 0);
        assert_ne!(e[1].edx & (1 << 28), 0);
        assert_eq!((e[2].edx, e[3].edx), (3, 3));
    }

    #[test]
    fn the_tsc_deadline_timer_is_advertised_when_kvm_emulates_it() {
        let mut cpuid = CpuId::from_entries(&[entry(0, 0), entry(1, 0)]).unwrap();
        advertise_emulated(&mut cpuid, Emulated::default());
        assert_eq!(
            cpuid.as_slice()[1].ecx & (1 << 24),
            0,
            "not without the capability"
        );
        advertise_emulated(
            &mut cpuid,
            Emulated {
                tsc_deadline_timer: true,
            },
        );
        assert_ne!(cpuid.as_slice()[1].ecx & (1 << 24), 0);
        assert_eq!(cpuid.as_slice()[0], entry(0, 0), "other leaves untouched");
        // The per-vCPU filter keeps it.
        filter(&mut cpuid, 0, 1);
        assert_ne!(cpuid.as_slice()[1].ecx & (1 << 24), 0);
    }

    #[test]
    fn the_boot_xcr0_is_every_component_leaf_0xd_lists() {
        let features = |ecx| kvm_cpuid_entry2 {
            function: 1,
            ecx,
            ..Default::default()
        };
        let xstate = kvm_cpuid_entry2 {
            function: 0xd,
            index: 0,
            eax: 0x7,
            edx: 0x2,
            ..Default::default()
        };
        let other_subleaf = kvm_cpuid_entry2 {
            function: 0xd,
            index: 2,
            eax: 256,
            ..Default::default()
        };
        let with = CpuId::from_entries(&[features(1 << 26), other_subleaf, xstate]).unwrap();
        assert_eq!(boot_xcr0(&with), Some(0x2_0000_0007));
        let without = CpuId::from_entries(&[features(0), xstate]).unwrap();
        assert_eq!(boot_xcr0(&without), None, "no XSAVE, no XCR0");
        let no_leaf = CpuId::from_entries(&[features(1 << 26)]).unwrap();
        assert_eq!(boot_xcr0(&no_leaf), None);
    }

    #[test]
    fn single_cpu_has_no_htt() {
        let mut cpuid = CpuId::from_entries(&[entry(1, 0)]).unwrap();
        filter(&mut cpuid, 0, 1);
        assert_eq!(cpuid.as_slice()[0].ebx, 0x0001_0800);
        assert_eq!(cpuid.as_slice()[0].edx & (1 << 28), 0);
    }
}
