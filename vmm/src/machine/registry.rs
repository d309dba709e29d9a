//! Every device of a machine by id, in the order they were attached, each
//! able to save its state. The buses route guest accesses; the registry
//! is how the VMM finds its devices again (to save them, to check a
//! restore brought back exactly the saved set).

use std::sync::{Arc, Mutex};

use mvm_devices::state::{DeviceState, Persist, SaveError};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("two devices with the id {0}")]
    DuplicateId(String),
    #[error("the saved machine has devices this one lacks: {0}")]
    Missing(String),
    #[error("this machine has devices the saved one lacks: {0}")]
    Extra(String),
}

/// The saved state of every device, by id, in attach order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStates(pub Vec<(String, DeviceState)>);

impl DeviceStates {
    pub fn get(&self, id: &str) -> Option<&DeviceState> {
        self.0.iter().find(|(i, _)| i == id).map(|(_, s)| s)
    }
}

#[derive(Default)]
pub struct DeviceRegistry {
    devices: Vec<(String, Arc<Mutex<dyn Persist>>)>,
}

impl DeviceRegistry {
    pub fn add(&mut self, id: &str, device: Arc<Mutex<dyn Persist>>) -> Result<(), Error> {
        self.check_free(id)?;
        self.devices.push((id.to_string(), device));
        Ok(())
    }

    /// Refuses an id already taken, before anything is wired for it.
    pub fn check_free(&self, id: &str) -> Result<(), Error> {
        if self.devices.iter().any(|(i, _)| i == id) {
            return Err(Error::DuplicateId(id.to_string()));
        }
        Ok(())
    }

    pub fn ids(&self) -> Vec<&str> {
        self.devices.iter().map(|(id, _)| id.as_str()).collect()
    }

    /// Every device's state. Call with the vCPUs paused: a device is
    /// locked only while it saves, so the set is consistent only if
    /// nothing runs the guest meanwhile.
    pub fn save(&self) -> Result<DeviceStates, SaveError> {
        self.devices
            .iter()
            .map(|(id, dev)| {
                // A poisoned lock still holds the device's last state.
                let dev = dev.lock().unwrap_or_else(|p| p.into_inner());
                Ok((id.clone(), dev.save()?))
            })
            .collect::<Result<_, _>>()
            .map(DeviceStates)
    }

    /// After a restore from `saved`: the same devices, no more, no fewer.
    pub fn check_same_set(&self, saved: &DeviceStates) -> Result<(), Error> {
        let ours = self.ids();
        let missing: Vec<&str> = saved
            .0
            .iter()
            .map(|(id, _)| id.as_str())
            .filter(|id| !ours.contains(id))
            .collect();
        if !missing.is_empty() {
            return Err(Error::Missing(missing.join(", ")));
        }
        let extra: Vec<&str> = ours
            .into_iter()
            .filter(|id| saved.get(id).is_none())
            .collect();
        if !extra.is_empty() {
            return Err(Error::Extra(extra.join(", ")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mvm_devices::legacy::{GuestReport, StatusPort};

    fn port() -> Arc<Mutex<dyn Persist>> {
        Arc::new(Mutex::new(StatusPort::new(GuestReport::default())))
    }

    #[test]
    fn ids_are_unique_and_a_restore_must_bring_back_the_same_set() {
        let mut reg = DeviceRegistry::default();
        reg.add("status", port()).unwrap();
        assert_eq!(
            reg.add("status", port()),
            Err(Error::DuplicateId("status".into()))
        );
        reg.add("other", port()).unwrap();
        let saved = reg.save().unwrap();
        assert_eq!(saved.0.len(), 2);
        assert_eq!(saved.0[0].0, "status");
        reg.check_same_set(&saved).unwrap();

        let mut fewer = DeviceRegistry::default();
        fewer.add("status", port()).unwrap();
        assert_eq!(
            fewer.check_same_set(&saved),
            Err(Error::Missing("other".into()))
        );
        fewer.add("third", port()).unwrap();
        fewer.add("other", port()).unwrap();
        assert_eq!(
            fewer.check_same_set(&saved),
            Err(Error::Extra("third".into()))
        );
    }
}
