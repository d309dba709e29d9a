//! Saved device state. Every device can `save()` what the guest has made of
//! it into one of these plain, serde-serialisable values and be rebuilt
//! from it (`from_snapshot` / `restore` next to each device), with fresh
//! host resources (eventfds, sockets) that are never part of a snapshot.
//!
//! A snapshot is untrusted input when it is read back: every restore
//! checks it against the device it is applied to and refuses what does
//! not fit, rather than trusting sizes and addresses.

use serde::{Deserialize, Serialize};

pub use crate::legacy::{SerialSnapshot, StatusPortSnapshot};
pub use crate::virtio::state::{QueueSnapshot, TransportSnapshot, VirtioDeviceSnapshot};

/// One device's saved state, by kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceState {
    Serial(SerialSnapshot),
    /// The i8042 keeps nothing but its reset line (vm-superio's device has
    /// no registers), so there is nothing to save.
    I8042,
    StatusPort(StatusPortSnapshot),
    Virtio(TransportSnapshot),
}

impl DeviceState {
    /// The kind, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Serial(_) => "serial",
            Self::I8042 => "i8042",
            Self::StatusPort(_) => "status port",
            Self::Virtio(t) => t.device.kind(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaveError {
    #[error("cannot save the {device}: {why}")]
    Unsupported { device: &'static str, why: String },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    #[error("the saved state is of a {saved}, not of a {device}")]
    WrongKind {
        device: &'static str,
        saved: &'static str,
    },
    #[error("the saved {device} state does not match this device: {why}")]
    Mismatch { device: &'static str, why: String },
    #[error("the saved {device} state is invalid: {why}")]
    Invalid { device: &'static str, why: String },
    #[error("the restored {device} could not start again: {why}")]
    Activate { device: &'static str, why: String },
}

/// A device that can save its state (the registry holds them this way).
pub trait Persist: Send {
    fn save(&self) -> Result<DeviceState, SaveError>;
}
