//! The i8042 keyboard controller, kept for one job: the guest kernel runs
//! with `reboot=k`, so a guest reboot or panic (with `panic=-1`) writes the
//! CPU-reset command to port 0x64, and the VMM stops the VM when the reset
//! `EventFd` fires.

use vm_superio::Trigger;

use crate::bus::BusDevice;
use crate::state::{DeviceState, Persist, SaveError};

/// `T` is the reset line: the VMM's stop handle, or an eventfd in tests.
pub struct I8042<T: Trigger> {
    dev: vm_superio::I8042Device<T>,
}

impl<T: Trigger> I8042<T> {
    pub fn new(reset: T) -> Self {
        Self {
            dev: vm_superio::I8042Device::new(reset),
        }
    }
}

impl<T: Trigger + Send> Persist for I8042<T> {
    /// vm-superio's i8042 has no registers to save.
    fn save(&self) -> Result<DeviceState, SaveError> {
        Ok(DeviceState::I8042)
    }
}

impl<T: Trigger + Send> BusDevice for I8042<T> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if let (Some(first), Ok(offset)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.dev.read(offset);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&value), Ok(offset)) = (data.first(), u8::try_from(offset)) {
            // The only failure is an EventFd write error, which would leave
            // the guest spinning in its reboot path; the vCPU loop also
            // stops on the triple fault that follows, so nothing is lost.
            let _ = self.dev.write(offset, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::EventFdTrigger;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    #[test]
    fn reset_command_fires_the_reset_event() {
        let evt = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut dev = I8042::new(EventFdTrigger::new(evt.try_clone().unwrap()));
        dev.write(4, &[0x00]);
        assert!(evt.read().is_err(), "no reset for other commands");
        dev.write(4, &[0xfe]);
        assert_eq!(evt.read().unwrap(), 1);
    }
}
