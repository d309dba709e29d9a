//! The balloon, for free page reporting only (devices/src/virtio/balloon):
//! what a long-lived guest frees, the host gets back.

use mvm_devices::virtio::balloon;

use super::attach::{attach_virtio, DeviceEnv, Error, Signaller, VirtioSpec};

/// Registry id of the balloon.
pub const BALLOON_ID: &str = "balloon";

pub fn attach_balloon(env: &mut DeviceEnv) -> Result<(), Error> {
    let spec = VirtioSpec {
        id: BALLOON_ID,
        what: "virtio-balloon",
        queues: balloon::QUEUE_COUNT,
        signaller: Signaller::Device,
    };
    attach_virtio(env, spec, |wiring| {
        let (device, handler) = balloon::new(wiring.queue_evts)?;
        Ok((device, Box::new(handler)))
    })?;
    Ok(())
}
