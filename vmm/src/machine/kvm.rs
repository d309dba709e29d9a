//! The KVM side of a VM: opening /dev/kvm, checking what mvm relies on,
//! creating the VM with its in-kernel interrupt controllers and timer, and
//! handing it the guest memory.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::sync::Mutex;

use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Cap, Kvm, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::arch::x86_64::layout::KVM_TSS_ADDRESS;

/// Capabilities the builder uses; checked up front so a host that lacks one
/// gets a message naming it instead of a failed ioctl later.
const REQUIRED_CAPS: &[(Cap, &str)] = &[
    (Cap::Irqchip, "in-kernel irqchip"),
    (Cap::UserMemory, "user memory regions"),
    (Cap::SetTssAddr, "TSS address"),
    (Cap::Pit2, "in-kernel PIT"),
    (Cap::Irqfd, "irqfd"),
    (Cap::Ioeventfd, "ioeventfd"),
    (Cap::ExtCpuid, "CPUID configuration"),
];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} does not exist: this host has no KVM; load kvm-intel or kvm-amd, or run on a machine with hardware virtualization (tests/testhost/mvm runs mvm inside an emulated one)")]
    NoKvm(String),
    #[error("no permission to open {0}: add your user to the group owning it (usually 'kvm': sudo usermod -aG kvm $USER, then log in again)")]
    KvmPermission(String),
    #[error("cannot open {0}: {1}")]
    OpenKvm(String, io::Error),
    #[error("KVM API version {0} is not the stable version 12")]
    KvmApiVersion(i32),
    #[error("this host's KVM lacks {0}, which mvm needs")]
    MissingCap(&'static str),
    #[error("KVM refused to create a VM: {0}")]
    CreateVm(io::Error),
    #[error("KVM could not set up the {what}: {source}")]
    Setup {
        what: &'static str,
        source: io::Error,
    },
    #[error("KVM refused guest memory region {slot}: {source}")]
    MemoryRegion { slot: u32, source: io::Error },
    #[error("KVM cannot list the MSRs it saves: {0}")]
    MsrIndex(io::Error),
}

fn setup(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |e| Error::Setup {
        what,
        source: io::Error::from_raw_os_error(e.errno()),
    }
}

/// The KVM device node: /dev/kvm, unless `MVM_KVM_DEVICE` names another
/// (tests use it to check the errors for a missing or forbidden device).
pub fn kvm_device_path() -> CString {
    std::env::var_os("MVM_KVM_DEVICE")
        .and_then(|p| CString::new(p.into_vec()).ok())
        .unwrap_or_else(|| c"/dev/kvm".to_owned())
}

/// The handle a front end's early check opened ([`check_kvm`]), kept for
/// the machine it then builds: /dev/kvm is opened once per run.
static CHECKED: Mutex<Option<Kvm>> = Mutex::new(None);

/// Opens and checks KVM now, before any helper process or session
/// directory exists, so that a host without it fails first; the handle
/// is kept for [`open_kvm`].
pub fn check_kvm() -> Result<(), Error> {
    let kvm = open_new()?;
    if let Ok(mut checked) = CHECKED.lock() {
        *checked = Some(kvm);
    }
    Ok(())
}

/// KVM, opened and checked: the handle [`check_kvm`] kept, else a new one.
pub fn open_kvm() -> Result<Kvm, Error> {
    match CHECKED.lock().ok().and_then(|mut c| c.take()) {
        Some(kvm) => Ok(kvm),
        None => open_new(),
    }
}

fn open_new() -> Result<Kvm, Error> {
    let path = kvm_device_path();
    let shown = path.to_string_lossy().into_owned();
    let kvm = Kvm::new_with_path(&path).map_err(|e| match e.errno() {
        libc::ENOENT => Error::NoKvm(shown.clone()),
        libc::EACCES | libc::EPERM => Error::KvmPermission(shown.clone()),
        errno => Error::OpenKvm(shown.clone(), io::Error::from_raw_os_error(errno)),
    })?;
    let version = kvm.get_api_version();
    if version != 12 {
        return Err(Error::KvmApiVersion(version));
    }
    for (cap, name) in REQUIRED_CAPS {
        if !kvm.check_extension(*cap) {
            return Err(Error::MissingCap(name));
        }
    }
    Ok(kvm)
}

/// A VM with the legacy PIC + IOAPIC + LAPICs and the PIT emulated by KVM:
/// the guest's timer and interrupt routing never leave the kernel.
pub fn create_vm(kvm: &Kvm) -> Result<VmFd, Error> {
    let vm = kvm
        .create_vm()
        .map_err(|e| Error::CreateVm(io::Error::from_raw_os_error(e.errno())))?;
    vm.set_tss_address(KVM_TSS_ADDRESS as usize)
        .map_err(setup("TSS address"))?;
    vm.create_irq_chip()
        .map_err(setup("interrupt controller"))?;
    let pit = kvm_pit_config {
        // No speaker port emulation: nothing in the guest beeps.
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit).map_err(setup("PIT timer"))?;
    Ok(vm)
}

pub fn register_memory(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), Error> {
    for (slot, region) in mem.iter().enumerate() {
        let slot = slot as u32;
        let region_desc = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
        };
        // SAFETY: the region is a live mapping owned by `mem`, which the VMM
        // keeps alive for as long as the VM exists (both live in `Vmm`), and
        // the slot numbers are distinct.
        unsafe { vm.set_user_memory_region(region_desc) }.map_err(|e| Error::MemoryRegion {
            slot,
            source: io::Error::from_raw_os_error(e.errno()),
        })?;
    }
    Ok(())
}

/// The MSRs KVM saves and restores for a vCPU (`KVM_GET_MSR_INDEX_LIST`),
/// read once while /dev/kvm is open.
pub fn msr_index(kvm: &Kvm) -> Result<Vec<u32>, Error> {
    kvm.get_msr_index_list()
        .map(|list| list.as_slice().to_vec())
        .map_err(|e| Error::MsrIndex(io::Error::from_raw_os_error(e.errno())))
}
