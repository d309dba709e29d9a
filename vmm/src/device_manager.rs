//! Attaching devices to a VM. Each device is registered in one call that
//! claims its bus range, wires its interrupt to KVM and adds whatever the
//! guest kernel must be told on its command line (the vmm-reference "Env"
//! idea), so adding a device touches one place.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use event_manager::MutEventSubscriber;
use kvm_ioctls::{IoEventAddress, VmFd};
use mvm_devices::bus::{self, Bus};
use mvm_devices::legacy::{
    EventFdTrigger, GuestReport, Serial, StatusPort, I8042, STATUS_PORT_LEN,
};
use mvm_devices::virtio::{fs, mmio, vsock, Interrupt, MmioTransport, NOTIFY_REG_OFFSET};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::arch::x86_64::layout::{
    I8042_PORT, I8042_PORT_LEN, MVM_STATUS_PORT, SERIAL_IRQ, SERIAL_PORT, SERIAL_PORT_LEN,
    VIRTIO_IRQ_BASE, VIRTIO_IRQ_LAST, VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE,
};
use crate::config::FsShare;
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
    Vsock(#[from] vsock::Error),
    #[error("cannot connect to the virtio-fs backend at {0}: {1}")]
    FsSocket(String, io::Error),
    #[error("shared directory {tag}: {source}")]
    Fs { tag: String, source: fs::Error },
    #[error(transparent)]
    VirtioMmio(#[from] mmio::Error),
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

/// The vsock device (guest CID `cid`) on the next virtio-mmio slot: its
/// irqfd, one ioeventfd per queue on QueueNotify (datamatch: the queue
/// index), and the Unix socket at `uds_path` host clients connect to. The
/// event-loop half goes to `env.subscribers`.
pub fn attach_vsock(env: &mut DeviceEnv, cid: u64, uds_path: &Path) -> Result<(), Error> {
    let shown = uds_path.display().to_string();
    let listener = UnixListener::bind(uds_path).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse => Error::VsockSocketExists(shown.clone()),
        _ => Error::VsockSocket(shown.clone(), e),
    })?;
    // The socket file is ours from here; a VM that is not built leaves none.
    wire_vsock(env, cid, listener).inspect_err(|_| {
        let _ = std::fs::remove_file(uds_path);
    })
}

fn wire_vsock(env: &mut DeviceEnv, cid: u64, listener: UnixListener) -> Result<(), Error> {
    let slot = env.next_virtio_slot()?;
    let irq = eventfd("the vsock interrupt")?;
    env.vm
        .register_irqfd(&irq, slot.irq)
        .map_err(|e| Error::Irqfd("vsock", io::Error::from_raw_os_error(e.errno())))?;
    let (queue_evts, notify_evts) =
        queue_ioeventfds(env, &slot, vsock::defs::QUEUE_COUNT, "vsock")?;
    let (device, handler) = vsock::new(cid, listener, queue_evts)?;
    let interrupt = Arc::new(Interrupt::new(irq));
    let transport = MmioTransport::new(device, env.mem.clone(), interrupt, notify_evts)?;
    env.mmio
        .insert(Arc::new(Mutex::new(transport)), slot.base, VIRTIO_MMIO_SIZE)?;
    env.subscribers.push(Box::new(handler));
    Ok(())
}

/// A virtio-fs device on the next virtio-mmio slot, its backend listening
/// on `share.socket`: the irqfd and one ioeventfd per queue, which the
/// backend gets as its call and kick fds (guest requests and their
/// completions never stop in the VMM), and the
/// `mvm.mount=` entry that tells guest-init where to mount it
/// (docs/protocol.md). `on_hangup` runs if the backend goes away.
pub fn attach_fs(
    env: &mut DeviceEnv,
    share: &FsShare,
    on_hangup: Box<dyn FnMut(String) + Send>,
) -> Result<(), Error> {
    let stream = UnixStream::connect(&share.socket)
        .map_err(|e| Error::FsSocket(share.socket.display().to_string(), e))?;
    let slot = env.next_virtio_slot()?;
    let irq = eventfd("the virtio-fs interrupt")?;
    env.vm
        .register_irqfd(&irq, slot.irq)
        .map_err(|e| Error::Irqfd("virtio-fs", io::Error::from_raw_os_error(e.errno())))?;
    let (kick_evts, notify_evts) =
        queue_ioeventfds(env, &slot, fs::defs::QUEUE_COUNT, "virtio-fs")?;
    let interrupt = Arc::new(Interrupt::with_vring_always_set(irq));
    let (device, handler) =
        fs::new(&share.tag, stream, kick_evts, &interrupt, on_hangup).map_err(|source| {
            Error::Fs {
                tag: share.tag.clone(),
                source,
            }
        })?;
    let transport = MmioTransport::new(device, env.mem.clone(), interrupt, notify_evts)?;
    env.mmio
        .insert(Arc::new(Mutex::new(transport)), slot.base, VIRTIO_MMIO_SIZE)?;
    env.subscribers.push(Box::new(handler));
    env.cmdline_extra.push(format!(
        "mvm.mount={},{},{}",
        share.tag,
        if share.read_only { "ro" } else { "rw" },
        hex(share.guest_path.as_bytes())
    ));
    Ok(())
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
