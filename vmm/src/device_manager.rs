//! Attaching devices to a VM. Each device is registered in one call that
//! claims its bus range, wires its interrupt to KVM and adds whatever the
//! guest kernel must be told on its command line (the vmm-reference "Env"
//! idea), so adding a device touches one place.

use std::io;
use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use mvm_devices::bus::{self, Bus};
use mvm_devices::legacy::{
    EventFdTrigger, GuestReport, Serial, StatusPort, I8042, STATUS_PORT_LEN,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::x86_64::layout::{
    I8042_PORT, I8042_PORT_LEN, MVM_STATUS_PORT, SERIAL_IRQ, SERIAL_PORT, SERIAL_PORT_LEN,
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
}

pub type SerialConsole = Arc<Mutex<Serial<ConsoleOutput>>>;

/// What attaching devices needs from the VM being built.
pub struct DeviceEnv<'a> {
    pub vm: &'a VmFd,
    pub pio: &'a mut Bus,
    pub cmdline_extra: &'a mut Vec<String>,
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
