//! The vsock device: guest CID `cid`, its host side the Unix socket at
//! `uds_path` that host clients connect to (Firecracker's hybrid vsock,
//! devices/src/virtio/vsock/mod.rs).

use std::io;
use std::os::unix::net::UnixListener;
use std::path::Path;

use mvm_devices::virtio::vsock;

use super::attach::{attach_virtio, DeviceEnv, Error, Signaller, VirtioSpec};

/// Registry id of the vsock device for guest CID `cid`.
pub fn vsock_id(cid: u64) -> String {
    format!("vsock-{cid}")
}

/// `guest_ports`: the host ports the guest may connect to (each served by
/// a Unix socket); empty for none. Returns the device's [`vsock::Dialer`],
/// through which the VMM's own exec client reaches the guest without a
/// `connect` (docs/security.md).
pub fn attach_vsock(
    env: &mut DeviceEnv,
    cid: u64,
    uds_path: &Path,
    guest_ports: &[vsock::GuestPort],
) -> Result<vsock::Dialer, Error> {
    let shown = uds_path.display().to_string();
    let listener = UnixListener::bind(uds_path).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse => Error::VsockSocketExists(shown.clone()),
        _ => Error::VsockSocket(shown.clone(), e),
    })?;
    // The socket file is ours from here; a VM that is not built leaves none.
    let id = vsock_id(cid);
    let spec = VirtioSpec {
        id: &id,
        what: "vsock",
        queues: vsock::defs::QUEUE_COUNT,
        signaller: Signaller::Device,
    };
    let mut dialer = None;
    attach_virtio(env, spec, |wiring| {
        let (device, handler) = vsock::new(cid, listener, wiring.queue_evts, guest_ports.to_vec())?;
        dialer = Some(
            handler
                .dialer()
                .map_err(|e| Error::EventFd("the vsock dialer", e))?,
        );
        Ok((device, Box::new(handler)))
    })
    // A slot attached means the builder above ran and made the dialer.
    .and_then(|_| {
        dialer.ok_or(Error::EventFd(
            "the vsock dialer",
            io::ErrorKind::NotFound.into(),
        ))
    })
    .inspect_err(|_| {
        let _ = std::fs::remove_file(uds_path);
    })
}
