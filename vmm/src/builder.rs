//! The one place a VM is put together, in a fixed order (Firecracker's
//! `builder.rs`, vmm-reference's `Vmm::try_from`): KVM and its
//! capabilities, the VM with irqchip and PIT, guest memory, devices, kernel,
//! initramfs, command line and boot_params, MP table, then the vCPUs with
//! their CPUID, MSRs, registers and LAPIC. The result is ready to run, its
//! vCPUs not yet started.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::VmFd;
use linux_loader::cmdline::Cmdline;
use linux_loader::loader::load_cmdline;
use mvm_devices::bus::Bus;
use mvm_devices::legacy::GuestReport;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::x86_64::layout::{CMDLINE_MAX_SIZE, CMDLINE_START};
use crate::arch::x86_64::{boot_params, mptable};
use crate::config::VmConfig;
use crate::console::ConsoleOutput;
use crate::device_manager::{self, DeviceEnv, SerialConsole, Subscriber};
use crate::vcpu::{self, StopSignal, Vcpu};
use crate::{kernel, memory, vm};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kvm(#[from] vm::Error),
    #[error(transparent)]
    Memory(#[from] memory::Error),
    #[error(transparent)]
    Devices(#[from] device_manager::Error),
    #[error(transparent)]
    Kernel(#[from] kernel::Error),
    #[error("the kernel command line is too long ({len} bytes; the guest accepts {CMDLINE_MAX_SIZE}): shorten the command or its arguments")]
    CmdlineTooLong { len: usize },
    #[error("invalid kernel command line: {0}")]
    Cmdline(linux_loader::cmdline::Error),
    #[error("cannot write the kernel command line into guest memory: {0}")]
    CmdlineWrite(linux_loader::loader::Error),
    #[error(transparent)]
    BootParams(#[from] boot_params::Error),
    #[error(transparent)]
    MpTable(#[from] mptable::Error),
    #[error("KVM cannot report its supported CPUID: {0}")]
    SupportedCpuid(kvm_ioctls::Error),
    #[error(transparent)]
    Vcpu(#[from] vcpu::Error),
    #[error("cannot create the stop eventfd: {0}")]
    StopEvent(std::io::Error),
}

/// A built VM, vCPUs configured but not running.
pub struct Vmm {
    /// Kept for the VM's lifetime: the memory regions and irqfds belong to it.
    pub vm: VmFd,
    pub mem: GuestMemoryMmap,
    pub vcpus: Vec<Vcpu>,
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    /// Device work for the event loop thread.
    pub subscribers: Vec<Subscriber>,
    pub stop: StopSignal,
    pub serial: SerialConsole,
    pub report: GuestReport,
    pub panic_seen: Arc<AtomicBool>,
    pub cmdline: String,
}

pub fn build(config: &VmConfig, console: ConsoleOutput) -> Result<Vmm, Error> {
    let kvm = vm::open_kvm()?;
    let vm = vm::create_vm(&kvm)?;

    // A vhost-user backend maps guest memory itself, so it must be a file.
    let backing = if config.shares.is_empty() {
        memory::Backing::Private
    } else {
        memory::Backing::Shared
    };
    let mem = memory::create(config.mem_size, backing)?;
    vm::register_memory(&vm, &mem)?;

    let stop = StopSignal {
        reason: Arc::new(Mutex::new(None)),
        evt: Arc::new(EventFd::new(EFD_NONBLOCK).map_err(Error::StopEvent)?),
        stopped: Arc::new(AtomicBool::new(false)),
    };
    let report = GuestReport::default();
    let panic_seen = console.panic_flag();
    let mut pio = Bus::new();
    let mut mmio = Bus::new();
    let mut cmdline_extra = Vec::new();
    let mut subscribers = Vec::new();
    let mut env = DeviceEnv {
        vm: &vm,
        mem: &mem,
        pio: &mut pio,
        mmio: &mut mmio,
        cmdline_extra: &mut cmdline_extra,
        subscribers: &mut subscribers,
        virtio_slots: 0,
    };
    let serial = device_manager::attach_serial(&mut env, console)?;
    device_manager::attach_i8042(&mut env, &stop.evt)?;
    device_manager::attach_status_port(&mut env, report.clone())?;
    if let Some(vsock) = &config.vsock {
        device_manager::attach_vsock(&mut env, vsock.cid, &vsock.uds_path)?;
    }
    for share in &config.shares {
        let stop = stop.clone();
        let on_hangup = Box::new(move |why: String| stop.stop(vcpu::VcpuStop::Failed(why)));
        device_manager::attach_fs(&mut env, share, on_hangup)?;
    }

    let kernel = kernel::load_kernel(&mem, &config.kernel)?;
    let initrd = match &config.initrd {
        Some(path) => Some(kernel::load_initrd(
            &mem,
            config.mem_size,
            kernel.end,
            path,
        )?),
        None => None,
    };
    let cmdline = build_cmdline(&cmdline_extra, &config.cmdline)?;
    load_cmdline(&mem, GuestAddress(CMDLINE_START), &cmdline).map_err(Error::CmdlineWrite)?;
    let cmdline_text = cmdline
        .as_cstring()
        .map_err(Error::Cmdline)?
        .into_string()
        .unwrap_or_default();
    let params = boot_params::build(&boot_params::BootInputs {
        mem_size: config.mem_size,
        cmdline_len: cmdline_text.len(),
        initrd,
        setup_header: kernel.setup_header,
    });
    boot_params::write(&mem, &params)?;
    mptable::setup(&mem, config.vcpus)?;

    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(Error::SupportedCpuid)?;
    let mut vcpus = Vec::with_capacity(config.vcpus.into());
    for id in 0..config.vcpus {
        let vcpu = Vcpu::new(&vm, id)?;
        let entry = (id == 0).then_some(kernel.entry);
        vcpu.configure(&supported, config.vcpus, &mem, entry)?;
        vcpus.push(vcpu);
    }

    Ok(Vmm {
        vm,
        mem,
        vcpus,
        pio: Arc::new(pio),
        mmio: Arc::new(mmio),
        subscribers,
        stop,
        serial,
        report,
        panic_seen,
        cmdline: cmdline_text,
    })
}

/// Device entries first, then the caller's parameters: for a repeated
/// parameter the kernel takes the last, so the caller can override ours.
fn build_cmdline(device_args: &[String], user: &str) -> Result<Cmdline, Error> {
    let len = device_args.iter().map(|a| a.len() + 1).sum::<usize>() + user.len();
    if len >= CMDLINE_MAX_SIZE {
        return Err(Error::CmdlineTooLong { len });
    }
    let mut cmdline = Cmdline::new(CMDLINE_MAX_SIZE).map_err(Error::Cmdline)?;
    for arg in device_args {
        cmdline.insert_str(arg).map_err(Error::Cmdline)?;
    }
    if !user.trim().is_empty() {
        cmdline.insert_str(user.trim()).map_err(Error::Cmdline)?;
    }
    Ok(cmdline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_puts_user_args_last() {
        let c = build_cmdline(
            &["console=ttyS0".into(), "reboot=k".into()],
            "quiet panic=-1",
        )
        .unwrap();
        assert_eq!(
            c.as_cstring().unwrap().to_str().unwrap(),
            "console=ttyS0 reboot=k quiet panic=-1"
        );
    }

    #[test]
    fn cmdline_too_long_is_refused() {
        let long = "x".repeat(CMDLINE_MAX_SIZE);
        assert!(matches!(
            build_cmdline(&[], &long),
            Err(Error::CmdlineTooLong { .. })
        ));
    }
}
