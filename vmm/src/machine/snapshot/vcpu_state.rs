//! One vCPU's architectural state as KVM holds it, saved while the vCPU is
//! out of the guest and set on a fresh vCPU before it first runs
//! (Firecracker's `VcpuState`, in its save and restore order).

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs,
    kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs, KVM_MAX_CPUID_ENTRIES,
    KVM_MAX_MSR_ENTRIES,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("KVM cannot {action} the {what} of vCPU {id}: {source}")]
    Kvm {
        action: &'static str,
        what: &'static str,
        id: u8,
        source: kvm_ioctls::Error,
    },
    #[error("vCPU {id}: KVM took only {set} of {total} saved MSRs")]
    Msrs { id: u8, set: usize, total: usize },
    #[error("vCPU {id}: the saved {what} is too large for KVM")]
    TooLarge { id: u8, what: &'static str },
}

#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    pub id: u8,
    pub cpuid: Vec<kvm_cpuid_entry2>,
    pub msrs: Vec<kvm_msr_entry>,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub xsave: kvm_xsave,
    pub xcrs: kvm_xcrs,
    pub debug_regs: kvm_debugregs,
    pub lapic: kvm_lapic_state,
    pub mp_state: kvm_mp_state,
    pub vcpu_events: kvm_vcpu_events,
}

fn kvm(
    action: &'static str,
    what: &'static str,
    id: u8,
) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm {
        action,
        what,
        id,
        source,
    }
}

impl VcpuState {
    /// Reads every piece of state from `fd`; `msr_index` is what
    /// `KVM_GET_MSR_INDEX_LIST` says KVM saves. An MSR KVM lists but will
    /// not read on this host is left out rather than failing the save.
    pub fn save(id: u8, fd: &VcpuFd, msr_index: &[u32]) -> Result<Self, Error> {
        let get = |what| kvm("read", what, id);
        Ok(Self {
            id,
            cpuid: fd
                .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
                .map_err(get("CPUID"))?
                .as_slice()
                .to_vec(),
            msrs: save_msrs(id, fd, msr_index)?,
            regs: fd.get_regs().map_err(get("registers"))?,
            sregs: fd.get_sregs().map_err(get("special registers"))?,
            xsave: fd.get_xsave().map_err(get("XSAVE area"))?,
            xcrs: fd.get_xcrs().map_err(get("XCRs"))?,
            debug_regs: fd.get_debug_regs().map_err(get("debug registers"))?,
            lapic: fd.get_lapic().map_err(get("LAPIC"))?,
            mp_state: fd.get_mp_state().map_err(get("MP state"))?,
            vcpu_events: fd.get_vcpu_events().map_err(get("pending events"))?,
        })
    }

    /// Sets everything on a vCPU that has not run yet. CPUID first (KVM
    /// checks the rest against it), the events last (they may refer to
    /// the registers).
    pub fn restore(&self, fd: &VcpuFd) -> Result<(), Error> {
        let id = self.id;
        let set = |what| kvm("set", what, id);
        let cpuid =
            CpuId::from_entries(&self.cpuid).map_err(|_| Error::TooLarge { id, what: "CPUID" })?;
        fd.set_cpuid2(&cpuid).map_err(set("CPUID"))?;
        fd.set_mp_state(self.mp_state).map_err(set("MP state"))?;
        fd.set_regs(&self.regs).map_err(set("registers"))?;
        fd.set_sregs(&self.sregs_to_set())
            .map_err(set("special registers"))?;
        // SAFETY: the area comes from KVM_GET_XSAVE on a vCPU of the same
        // CPUID (the snapshot's, set just above), which is the size and
        // layout KVM_SET_XSAVE expects; KVM validates its contents.
        unsafe { fd.set_xsave(&self.xsave) }.map_err(set("XSAVE area"))?;
        fd.set_xcrs(&self.xcrs).map_err(set("XCRs"))?;
        fd.set_debug_regs(&self.debug_regs)
            .map_err(set("debug registers"))?;
        fd.set_lapic(&self.lapic).map_err(set("LAPIC"))?;
        for chunk in self.msrs.chunks(KVM_MAX_MSR_ENTRIES) {
            let msrs =
                Msrs::from_entries(chunk).map_err(|_| Error::TooLarge { id, what: "MSRs" })?;
            let done = fd.set_msrs(&msrs).map_err(set("MSRs"))?;
            if done != chunk.len() {
                return Err(Error::Msrs {
                    id,
                    set: done,
                    total: chunk.len(),
                });
            }
        }
        fd.set_vcpu_events(&self.vcpu_events)
            .map_err(set("pending events"))?;
        Ok(())
    }
}

impl VcpuState {
    /// The special registers as they are set back. On AMD, KVM reports the
    /// task register's type as busy (11) whatever the CPU holds (SVM keeps
    /// no busy bit); set back as is, QEMU's emulated SVM (the test host)
    /// then refuses every I/O permission check against that TSS, which
    /// only accepts an available one (9), and the guest's first `out` from
    /// user mode faults. A guest's TR as AMD hardware runs it carries no
    /// busy bit, so on AMD it is restored as available; Intel's VM entry
    /// requires the busy type and keeps it.
    fn sregs_to_set(&self) -> kvm_sregs {
        let mut sregs = self.sregs;
        let amd = self.cpuid.iter().any(|e| {
            e.function == 0 && (e.ebx, e.edx, e.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163)
        });
        if amd && sregs.tr.type_ == TSS_BUSY {
            sregs.tr.type_ = TSS_AVAILABLE;
        }
        sregs
    }
}

/// 64-bit TSS descriptor types.
const TSS_AVAILABLE: u8 = 9;
const TSS_BUSY: u8 = 11;

/// `KVM_GET_MSRS` stops at the first MSR it cannot read and says how many
/// it did: those are kept, the failing one skipped, and the rest tried
/// again.
fn save_msrs(id: u8, fd: &VcpuFd, index: &[u32]) -> Result<Vec<kvm_msr_entry>, Error> {
    let mut saved = Vec::with_capacity(index.len());
    let mut rest = index;
    while !rest.is_empty() {
        let take = rest.len().min(KVM_MAX_MSR_ENTRIES);
        let entries: Vec<kvm_msr_entry> = rest[..take]
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs =
            Msrs::from_entries(&entries).map_err(|_| Error::TooLarge { id, what: "MSRs" })?;
        let read = fd.get_msrs(&mut msrs).map_err(kvm("read", "MSRs", id))?;
        saved.extend_from_slice(&msrs.as_slice()[..read]);
        // Skip the one that failed (if any) and go on after it.
        let next = if read < take { read + 1 } else { take };
        rest = &rest[next..];
    }
    Ok(saved)
}
