//! virtio devices on the virtio-mmio transport (virtio 1.2, "modern" only).
//!
//! [`mmio::MmioTransport`] is the register file a vCPU thread reaches through
//! the MMIO bus; behind it sits a [`device::VirtioDevice`]. Queue
//! notifications arrive on eventfds (KVM ioeventfds, or the transport writes
//! them itself for a QueueNotify that reaches the bus), interrupts leave
//! through [`device::Interrupt`], an irqfd. The queues themselves are served
//! by each device's event-loop subscriber, never on a vCPU thread.

pub mod balloon;
pub mod block;
pub mod device;
pub mod fs;
pub mod mmio;
pub mod state;
pub mod vsock;

pub use device::{Activation, Interrupt, VirtioDevice};
pub use mmio::{MmioTransport, NOTIFY_REG_OFFSET};
