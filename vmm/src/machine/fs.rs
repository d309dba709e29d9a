//! A virtio-fs device whose backend (virtiofsd, started by the caller)
//! listens on `share.socket`. The queue eventfds and the irqfd go to the
//! backend as its kick and call fds, so guest requests and their
//! completions never stop in the VMM; the `mvm.mount=` parameter tells
//! guest-init where to mount it (the boot contract, docs/protocol.md).

use std::os::unix::net::UnixStream;

use mvm_devices::virtio::fs;
use mvm_protocol::boot::MountParam;

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
        Ok((device, Box::new(handler)))
    })?;
    env.cmdline_extra.push(
        MountParam {
            tag: share.tag.clone(),
            read_only: share.read_only,
            path: share.guest_path.as_bytes().to_vec(),
        }
        .to_param(),
    );
    Ok(())
}
