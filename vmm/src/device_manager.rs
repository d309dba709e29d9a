//! Attaching devices to a VM. Each device is registered in one call that
//! claims its bus range, wires its interrupt to KVM and adds whatever the
//! guest kernel must be told on its command line (the vmm-reference "Env"
//! idea), so adding a device touches one place.

use std::io;
use std::sync::{Arc, Mutex};

use event_manager::MutEventSubscriber;
use kvm_ioctls::VmFd;
use mvm_devices::bus::{self, Bus};
use mvm_devices::legacy::{
    EventFdTrigger, GuestReport, Serial, StatusPort, I8042, STATUS_PORT_LEN,
};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::x86_64::layout::{
    I8042_PORT, I8042_PORT_LEN, MVM_STATUS_PORT, SERIAL_IRQ, SERIAL_PORT, SERIAL_PORT_LEN,
    VIRTIO_IRQ_BASE, VIRTIO_IRQ_LAST, VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE,
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
}

pub type SerialConsole = Arc<Mutex<Serial<ConsoleOutput>>>;

/// An event-loop subscriber a device hands over (its queue-notify
/// ioeventfds, its backend sockets); the runner registers it.
pub type Subscriber = Box<dyn MutEventSubscriber + Send>;

/// What attaching devices needs from the VM being built.
pub struct DeviceEnv<'a> {
    pub vm: &'a VmFd,
    pub mem: &'a GuestMemoryMmap,
    pub pio: &'a mut Bus,
    pub mmio: &'a mut Bus,
    pub cmdline_extra: &'a mut Vec<String>,
    pub subscribers: &'a mut Vec<Subscriber>,
    /// virtio-mmio slots handed out so far.
    pub virtio_slots: u32,
}

/// The MMIO window, IRQ and kernel parameter of one virtio-mmio device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtioSlot {
    pub base: u64,
    pub irq: u32,
}

impl DeviceEnv<'_> {
    /// The next free virtio-mmio window and IRQ; also declares the device to
    /// the guest kernel (`virtio_mmio.device=4K@<base>:<irq>`).
    pub fn next_virtio_slot(&mut self) -> Result<VirtioSlot, Error> {
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

/// COM1 with its IRQ through an irqfd, and the kernel told to use it.
pub fn attach_serial(env: &mut DeviceEnv, out: ConsoleOutput) -> Result<SerialConsole, Error> {
    let irq = eventfd("the serial interrupt")?;
    env.vm
        .register_irqfd(&irq, SERIAL_IRQ)
        .map_err(|e| Error::Irqfd("serial", io::Error::from_raw_os_error(e.errno())))?;
    let serial = Arc::new(Mutex::new(Serial::new(EventFdTrigger::new(irq), out)));
    env.pio
        .insert(serial.clone(), SERIAL_PORT, SERIAL_PORT_LEN)?;
    env.cmdline_extra.push("console=ttyS0".into());
    // Only COM1 exists; probing the other three legacy ports costs exits.
    env.cmdline_extra.push("8250.nr_uarts=1".into());
    Ok(serial)
}

/// The i8042, whose reset command fires `reset` (the VM's stop eventfd).
pub fn attach_i8042(env: &mut DeviceEnv, reset: &EventFd) -> Result<(), Error> {
    let reset = reset
        .try_clone()
        .map_err(|e| Error::EventFd("the reset line", e))?;
    let dev = Arc::new(Mutex::new(I8042::new(EventFdTrigger::new(reset))));
    env.pio.insert(dev, I8042_PORT, I8042_PORT_LEN)?;
    env.cmdline_extra.push("reboot=k".into());
    Ok(())
}

pub fn attach_status_port(env: &mut DeviceEnv, report: GuestReport) -> Result<(), Error> {
    let dev = Arc::new(Mutex::new(StatusPort::new(report)));
    env.pio.insert(dev, MVM_STATUS_PORT, STATUS_PORT_LEN)?;
    Ok(())
}
