//! Attaching devices to a machine. Each device is one call that claims its
//! bus range, wires its interrupt to KVM, adds whatever the guest kernel
//! must be told on its command line (the vmm-reference "Env" idea) and
//! enters the device in the registry; every virtio device goes through
//! [`attach_virtio`], so a new one is that call plus its own file
//! (`vsock.rs`, `fs.rs`).
//!
//! When the environment carries saved device states (a restore), each
//! device is rebuilt from the state saved under its id instead of fresh.

use std::io;
use std::sync::{Arc, Mutex};

use event_manager::MutEventSubscriber;
use kvm_ioctls::{IoEventAddress, VmFd};
use mvm_devices::bus::{self, Bus};
use mvm_devices::legacy::{EventFdTrigger, GuestReport, Serial, StatusPort, I8042};
use mvm_devices::state::{DeviceState, RestoreError};
use mvm_devices::virtio::fs::BackendMemory;
use mvm_devices::virtio::{mmio, Interrupt, MmioTransport, VirtioDevice, NOTIFY_REG_OFFSET};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::registry::{self, DeviceRegistry, DeviceStates};
use super::stop::StopHandle;
use crate::arch::x86_64::layout::{
    I8042_PORT, I8042_PORT_LEN, MVM_STATUS_PORT, MVM_STATUS_PORT_LEN, SERIAL_IRQ, SERIAL_PORT,
    SERIAL_PORT_LEN, VIRTIO_IRQ_BASE, VIRTIO_IRQ_LAST, VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE,
};
use crate::console::ConsoleOutput;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create an eventfd for {0}: {1}")]
    EventFd(&'static str, io::Error),
    #[error("cannot wire the {0} interrupt to KVM: {1}")]
    Irqfd(&'static str, io::Error),
    #[error("device address conflict: {0}")]
    Bus(#[from] bus::Error),
    #[error("no free virtio-mmio slot (IRQs {VIRTIO_IRQ_BASE}-{VIRTIO_IRQ_LAST} are taken)")]
    NoVirtioSlot,
    #[error("cannot register the {0} queue notifications with KVM: {1}")]
    Ioeventfd(&'static str, io::Error),
    #[error("cannot listen on the vsock socket {0}: it already exists (remove it or choose another path)")]
    VsockSocketExists(String),
    #[error("cannot listen on the vsock socket {0}: {1}")]
    VsockSocket(String, io::Error),
    #[error(transparent)]
    Vsock(#[from] mvm_devices::virtio::vsock::Error),
    #[error("cannot connect to the virtio-fs backend at {0}: {1}")]
    FsSocket(String, io::Error),
    #[error("shared directory {tag}: {source}")]
    Fs {
        tag: String,
        source: mvm_devices::virtio::fs::Error,
    },
    #[error("the root image {0}: {1}")]
    RootDisk(String, String),
    #[error("the sandbox's disk {0}: {1}")]
    SandboxDisk(String, String),
    #[error(transparent)]
    Balloon(#[from] mvm_devices::virtio::balloon::Error),
    #[error(transparent)]
    VirtioMmio(#[from] mmio::Error),
    #[error(transparent)]
    Registry(#[from] registry::Error),
    #[error("device {id}: {source}")]
    Restore { id: String, source: RestoreError },
}

pub type SerialConsole = Arc<Mutex<Serial<ConsoleOutput>>>;

/// An event-loop subscriber a device hands over (its queue-notify
/// ioeventfds, its backend sockets); the machine's event loop runs it.
pub type Subscriber = Box<dyn MutEventSubscriber + Send>;

/// What attaching devices needs from the VM being built, and what it
/// collects: the buses, the kernel parameters, the event-loop work and the
/// registry.
pub struct DeviceEnv<'a> {
    pub vm: &'a VmFd,
    pub mem: &'a GuestMemoryMmap,
    pub pio: Bus,
    pub mmio: Bus,
    pub cmdline_extra: Vec<String>,
    pub subscribers: Vec<Subscriber>,
    pub registry: DeviceRegistry,
    /// The states to rebuild the devices from (a restore), by id.
    saved: Option<&'a DeviceStates>,
    /// virtio-mmio slots handed out so far.
    virtio_slots: u32,
    /// Where virtiofsd may map only part of guest memory (a restore), that
    /// part; else it maps all of it.
    pub fs_backend: Option<BackendMemory>,
}

/// The MMIO window and IRQ of one virtio-mmio device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtioSlot {
    pub base: u64,
    pub irq: u32,
}

impl<'a> DeviceEnv<'a> {
    pub fn new(vm: &'a VmFd, mem: &'a GuestMemoryMmap, saved: Option<&'a DeviceStates>) -> Self {
        Self {
            vm,
            mem,
            pio: Bus::new(),
            mmio: Bus::new(),
            cmdline_extra: Vec::new(),
            subscribers: Vec::new(),
            registry: DeviceRegistry::default(),
            saved,
            virtio_slots: 0,
            fs_backend: None,
        }
    }

    /// The state saved under `id`, when restoring.
    fn saved(&self, id: &str) -> Option<&'a DeviceState> {
        self.saved.and_then(|s| s.get(id))
    }

    /// The next free virtio-mmio window and IRQ; also declares the device to
    /// the guest kernel (`virtio_mmio.device=4K@<base>:<irq>`).
    fn next_virtio_slot(&mut self) -> Result<VirtioSlot, Error> {
        let irq = VIRTIO_IRQ_BASE + self.virtio_slots;
        if irq > VIRTIO_IRQ_LAST {
            return Err(Error::NoVirtioSlot);
        }
        let base = VIRTIO_MMIO_BASE + u64::from(self.virtio_slots) * VIRTIO_MMIO_SIZE;
        self.virtio_slots += 1;
        self.cmdline_extra.push(format!(
            "virtio_mmio.device={}K@{base:#x}:{irq}",
            VIRTIO_MMIO_SIZE >> 10
        ));
        Ok(VirtioSlot { base, irq })
    }
}

fn eventfd(what: &'static str) -> Result<EventFd, Error> {
    EventFd::new(EFD_NONBLOCK).map_err(|e| Error::EventFd(what, e))
}

fn wrong_kind(id: &str, device: &'static str, saved: &DeviceState) -> Error {
    Error::Restore {
        id: id.to_string(),
        source: RestoreError::WrongKind {
            device,
            saved: saved.kind(),
        },
    }
}

/// Registry id of the console.
pub const SERIAL_ID: &str = "serial0";
/// Registry id of the i8042.
pub const I8042_ID: &str = "i8042";
/// Registry id of the status port.
pub const STATUS_PORT_ID: &str = "status";

/// COM1 with its IRQ through an irqfd, and the kernel told to use it.
pub fn attach_serial(env: &mut DeviceEnv, out: ConsoleOutput) -> Result<SerialConsole, Error> {
    let irq = eventfd("the serial interrupt")?;
    env.vm
        .register_irqfd(&irq, SERIAL_IRQ)
        .map_err(|e| Error::Irqfd("serial", io::Error::from_raw_os_error(e.errno())))?;
    let serial = match env.saved(SERIAL_ID) {
        None => Serial::new(EventFdTrigger::new(irq), out),
        Some(DeviceState::Serial(saved)) => {
            Serial::from_snapshot(saved, EventFdTrigger::new(irq), out).map_err(|source| {
                Error::Restore {
                    id: SERIAL_ID.into(),
                    source,
                }
            })?
        }
        Some(other) => return Err(wrong_kind(SERIAL_ID, "serial", other)),
    };
    let serial = Arc::new(Mutex::new(serial));
    env.pio
        .insert(serial.clone(), SERIAL_PORT, SERIAL_PORT_LEN)?;
    env.registry.add(SERIAL_ID, serial.clone())?;
    env.cmdline_extra.push("console=ttyS0".into());
    // Only COM1 exists; probing the other three legacy ports costs exits.
    env.cmdline_extra.push("8250.nr_uarts=1".into());
    Ok(serial)
}

/// The i8042, whose reset command stops the machine (`StopReason::GuestReset`).
pub fn attach_i8042(env: &mut DeviceEnv, stop: &StopHandle) -> Result<(), Error> {
    if let Some(saved) = env.saved(I8042_ID) {
        if *saved != DeviceState::I8042 {
            return Err(wrong_kind(I8042_ID, "i8042", saved));
        }
    }
    let dev = Arc::new(Mutex::new(I8042::new(stop.clone())));
    env.pio.insert(dev.clone(), I8042_PORT, I8042_PORT_LEN)?;
    env.registry.add(I8042_ID, dev)?;
    env.cmdline_extra.push("reboot=k".into());
    Ok(())
}

pub fn attach_status_port(env: &mut DeviceEnv, report: GuestReport) -> Result<(), Error> {
    let port = match env.saved(STATUS_PORT_ID) {
        None => StatusPort::new(report),
        Some(DeviceState::StatusPort(saved)) => StatusPort::from_snapshot(report, saved),
        Some(other) => return Err(wrong_kind(STATUS_PORT_ID, "status port", other)),
    };
    let dev = Arc::new(Mutex::new(port));
    env.pio
        .insert(dev.clone(), MVM_STATUS_PORT, MVM_STATUS_PORT_LEN)?;
    env.registry.add(STATUS_PORT_ID, dev)?;
    Ok(())
}

/// Who raises a virtio device's interrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signaller {
    /// The device's own event handler, through [`Interrupt`].
    Device,
    /// A vhost-user backend writes the irqfd itself, so InterruptStatus
    /// must always show "used buffers" ([`Interrupt::with_vring_always_set`]).
    Backend,
}

/// What a virtio device gets to build itself with.
pub struct VirtioWiring {
    /// One per queue, signalled by KVM when the guest writes QueueNotify.
    pub queue_evts: Vec<EventFd>,
    /// The device's interrupt line (its irqfd inside).
    pub interrupt: Arc<Interrupt>,
}

/// What a virtio device is, for [`attach_virtio`].
pub struct VirtioSpec<'s> {
    /// Registry id.
    pub id: &'s str,
    /// For messages: "vsock", "virtio-fs".
    pub what: &'static str,
    pub queues: usize,
    pub signaller: Signaller,
}

/// A virtio device on the next virtio-mmio slot: its irqfd, one ioeventfd
/// per queue on QueueNotify (datamatch: the queue index), the device that
/// `build` makes from them behind an MMIO transport (restored from the
/// state saved under `spec.id`, if any), its event-loop subscriber, and its
/// registry entry.
pub fn attach_virtio<D: VirtioDevice + 'static>(
    env: &mut DeviceEnv,
    spec: VirtioSpec,
    build: impl FnOnce(VirtioWiring) -> Result<(D, Subscriber), Error>,
) -> Result<VirtioSlot, Error> {
    env.registry.check_free(spec.id)?;
    let saved = match env.saved(spec.id) {
        None => None,
        Some(DeviceState::Virtio(t)) => Some(t),
        Some(other) => return Err(wrong_kind(spec.id, spec.what, other)),
    };
    let slot = env.next_virtio_slot()?;
    let irq = eventfd("a virtio interrupt")?;
    env.vm
        .register_irqfd(&irq, slot.irq)
        .map_err(|e| Error::Irqfd(spec.what, io::Error::from_raw_os_error(e.errno())))?;
    let (device_evts, transport_evts) = queue_ioeventfds(env, &slot, spec.queues, spec.what)?;
    let interrupt = Arc::new(match spec.signaller {
        Signaller::Device => Interrupt::new(irq),
        Signaller::Backend => Interrupt::with_vring_always_set(irq),
    });
    let (device, subscriber) = build(VirtioWiring {
        queue_evts: device_evts,
        interrupt: interrupt.clone(),
    })?;
    let transport = match saved {
        None => MmioTransport::new(device, env.mem.clone(), interrupt, transport_evts)?,
        Some(saved) => {
            MmioTransport::restore(device, env.mem.clone(), interrupt, transport_evts, saved)
                .map_err(|source| Error::Restore {
                    id: spec.id.to_string(),
                    source,
                })?
        }
    };
    let transport = Arc::new(Mutex::new(transport));
    env.mmio
        .insert(transport.clone(), slot.base, VIRTIO_MMIO_SIZE)?;
    env.registry.add(spec.id, transport)?;
    env.subscribers.push(subscriber);
    Ok(slot)
}

/// One eventfd per queue, registered with KVM on QueueNotify (datamatch:
/// the queue index), twice over: the device's copy and the transport's.
fn queue_ioeventfds(
    env: &mut DeviceEnv,
    slot: &VirtioSlot,
    count: usize,
    what: &'static str,
) -> Result<(Vec<EventFd>, Vec<EventFd>), Error> {
    let mut device_evts = Vec::with_capacity(count);
    let mut transport_evts = Vec::with_capacity(count);
    for queue in 0..count {
        let evt = eventfd("a queue notification")?;
        // The guest's QueueNotify write then never leaves KVM: it signals
        // the eventfd the device (or its backend) waits on.
        env.vm
            .register_ioevent(
                &evt,
                &IoEventAddress::Mmio(slot.base + NOTIFY_REG_OFFSET),
                queue as u32,
            )
            .map_err(|e| Error::Ioeventfd(what, io::Error::from_raw_os_error(e.errno())))?;
        transport_evts.push(
            evt.try_clone()
                .map_err(|e| Error::EventFd("a queue notification", e))?,
        );
        device_evts.push(evt);
    }
    Ok((device_evts, transport_evts))
}
