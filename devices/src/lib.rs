//! mvm's emulated devices.
//!
//! Devices here know nothing about KVM: they implement [`bus::BusDevice`] and
//! raise interrupts through an `EventFd` the VMM wires to an irqfd. That keeps
//! them unit-testable without `/dev/kvm`.

pub mod bus;
pub mod legacy;
pub mod state;
pub mod virtio;
