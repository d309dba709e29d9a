//! A virtio-fs device whose backend (virtiofsd, started by the caller)
//! listens on `share.socket`. The queue eventfds and the irqfd go to the
//! backend as its kick and call fds, so guest requests and their
//! completions never stop in the VMM. Where the guest mounts it is the
//! run's business, told in the exec channel's setup (docs/protocol.md),
//! not the machine's: a template's device serves any directory.

use std::os::unix::net::UnixStream;

use mvm_devices::virtio::fs;
use mvm_protocol::boot;

use super::attach::{attach_virtio, DeviceEnv, Error, Signaller, VirtioSpec};
use crate::config::FsShare;

/// Registry id of the virtio-fs device with `tag`.
pub fn fs_id(tag: &str) -> String {
    format!("fs-{tag}")
}

/// `on_hangup` runs if the backend goes away.
pub fn attach_fs(
    env: &mut DeviceEnv,
    share: &FsShare,
    on_hangup: Box<dyn FnMut(String) + Send>,
) -> Result<(), Error> {
    let stream = UnixStream::connect(&share.socket)
        .map_err(|e| Error::FsSocket(share.socket.display().to_string(), e))?;
    let id = fs_id(&share.tag);
    // Every buffer the guest gives a virtio-fs device then lies in one
    // pool (the device offers VIRTIO_F_ACCESS_PLATFORM), the one part of
    // guest memory besides the rings that a restored machine must share
    // with virtiofsd (fs_windows.rs).
    for param in [boot::BOUNCE_PARAM, boot::BOUNCE_LOG_PARAM] {
        if !env.cmdline_extra.iter().any(|p| p == param) {
            env.cmdline_extra.push(param.to_string());
        }
    }
    let shared = env.fs_backend.clone();
    let spec = VirtioSpec {
        id: &id,
        what: "virtio-fs",
        queues: fs::defs::QUEUE_COUNT,
        signaller: Signaller::Backend,
    };
    attach_virtio(env, spec, |wiring| {
        let (device, handler) = fs::new(
            &share.tag,
            stream,
            wiring.queue_evts,
            &wiring.interrupt,
            on_hangup,
        )
        .map_err(|source| Error::Fs {
            tag: share.tag.clone(),
            source,
        })?;
        let mut device = device;
        if let Some(shared) = shared {
            device.share_only(shared);
        }
        Ok((device, Box::new(handler)))
    })?;
    Ok(())
}
