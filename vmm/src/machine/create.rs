//! What boot and restore share, in a fixed order: KVM and its
//! capabilities, the VM with irqchip and PIT, guest memory, every device,
//! and the vCPUs' fds (not yet configured: boot gives them their boot
//! state, a restore its saved one).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use mvm_devices::legacy::GuestReport;
use mvm_devices::virtio::fs::BackendMemory;
use vm_memory::GuestMemoryMmap;

use super::attach::{self, DeviceEnv};
use super::event_loop::EventLoop;
use super::registry::DeviceStates;
use super::stop::{StopHandle, StopReason};
use super::vcpu::{self, Vcpu};
use super::{balloon, block, fs, kvm, memory, vsock, Error, Machine};
use crate::config::VmConfig;
use crate::console::ConsoleOutput;
use crate::timeline::Timeline;

/// A snapshot's guest RAM, and where only part of it is shared with
/// virtiofsd, that part (memory::share_windows).
pub struct Restored {
    pub mem: GuestMemoryMmap,
    pub fs_backend: Option<BackendMemory>,
}

/// A machine with all its devices (rebuilt from `saved` when given) and
/// its vCPUs created but neither configured nor started. Guest RAM is
/// `restored` (a snapshot's) or new. `timeline` holds what came before
/// (a restore's memory copy), so that its moments precede this
/// function's also where the clock cannot tell them apart (a coarse one
/// sorts ties in the order taken).
pub fn create(
    config: &VmConfig,
    console: ConsoleOutput,
    saved: Option<&DeviceStates>,
    restored: Option<Restored>,
    mut timeline: Timeline,
) -> Result<(Machine, kvm_ioctls::Kvm), Error> {
    vcpu::install_kick_handler()?;
    let kvm = kvm::open_kvm()?;
    timeline.mark("kvm opened");
    let vm = kvm::create_vm(&kvm)?;
    let msr_index = Arc::new(kvm::msr_index(&kvm)?);
    timeline.mark("vm created");

    let (mem, fs_backend) = match restored {
        Some(Restored { mem, fs_backend }) => (mem, fs_backend),
        // A vhost-user backend maps guest memory itself, so it must be a
        // file.
        None if config.shares.is_empty() => (
            memory::create(config.mem_size, memory::Backing::Private)?,
            None,
        ),
        None => (
            memory::create(config.mem_size, memory::Backing::Shared)?,
            None,
        ),
    };
    kvm::register_memory(&vm, &mem)?;
    timeline.mark("guest memory");

    let stop = StopHandle::new().map_err(Error::StopEvent)?;
    let report = GuestReport::default();
    let panic_seen: Arc<AtomicBool> = console.panic_flag();
    let mut env = DeviceEnv::new(&vm, &mem, saved);
    env.fs_backend = fs_backend;
    let serial = attach::attach_serial(&mut env, console)?;
    attach::attach_i8042(&mut env, &stop)?;
    attach::attach_status_port(&mut env, report.clone())?;
    // The root disk first: it is the guest's vda whatever else is there.
    if let Some(disk) = &config.root_disk {
        block::attach_root_disk(&mut env, disk)?;
    }
    if let Some(path) = &config.sandbox_disk {
        block::attach_sandbox_disk(&mut env, path)?;
    }
    let vsock_dialer = match &config.vsock {
        Some(vsock) => Some(vsock::attach_vsock(
            &mut env,
            vsock.cid,
            &vsock.uds_path,
            &vsock.guest_ports,
        )?),
        None => None,
    };
    for share in &config.shares {
        let stop = stop.clone();
        let on_hangup = Box::new(move |why: String| stop.stop(StopReason::Failed(why)));
        fs::attach_fs(&mut env, share, on_hangup)?;
    }
    // The user's own parameters (config.cmdline) come after these
    // (boot::build_cmdline), so they may override them.
    env.cmdline_extra.extend(fs::bounce_params(config));
    // Last, so that every other device keeps its slot with or without it.
    if config.free_page_reporting {
        balloon::attach_balloon(&mut env)?;
    }
    let DeviceEnv {
        pio,
        mmio,
        cmdline_extra,
        subscribers,
        registry,
        ..
    } = env;
    if let Some(saved) = saved {
        registry
            .check_same_set(saved)
            .map_err(attach::Error::from)?;
    }
    timeline.mark("devices attached");

    let mut event_loop = EventLoop::new(stop.clone())?;
    event_loop.watch_markers(&report)?;
    for subscriber in subscribers {
        event_loop.add_subscriber(subscriber);
    }
    let vcpus = (0..config.vcpus)
        .map(|id| Vcpu::new(&vm, id, msr_index.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let counters = vcpus
        .iter()
        .filter_map(|v| Some((v.id(), v.counters()?)))
        .collect();
    timeline.mark("vcpus created");

    let machine = Machine {
        vm,
        mem,
        pio: Arc::new(pio),
        mmio: Arc::new(mmio),
        registry,
        event_loop,
        stop,
        serial,
        report,
        panic_seen,
        device_params: cmdline_extra,
        cmdline: String::new(),
        vcpus,
        counters,
        handles: Vec::new(),
        timeline,
        restored: false,
        mapped_ahead: None,
        pool_ahead: None,
        vsock_dialer,
    };
    Ok((machine, kvm))
}
