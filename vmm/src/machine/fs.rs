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
use crate::config::{FsShare, VmConfig};

/// Registry id of the virtio-fs device with `tag`.
pub fn fs_id(tag: &str) -> String {
    format!("fs-{tag}")
}

/// The kernel parameters that make the guest bounce every buffer it gives
/// a virtio-fs device (offered VIRTIO_F_ACCESS_PLATFORM) through one DMA
/// pool, the one part of guest memory besides the rings that a restored
/// machine must share with virtiofsd (fs_windows.rs): for a machine with
/// shares that may be saved (`VmConfig::fs_bounce_pool`). Any other
/// machine is told to make no pool at all; its DMA API then maps buffers
/// where they lie (there is no IOMMU).
pub fn bounce_params(config: &VmConfig) -> Vec<String> {
    match config.fs_bounce_pool && !config.shares.is_empty() {
        true => vec![boot::BOUNCE_PARAM.into(), boot::BOUNCE_LOG_PARAM.into()],
        false => vec![boot::NO_BOUNCE_PARAM.into()],
    }
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn config(shares: usize, fs_bounce_pool: bool) -> VmConfig {
        let share = |i: usize| FsShare {
            tag: format!("mvm{i}"),
            socket: PathBuf::from(format!("fs{i}.sock")),
            guest_path: format!("/share{i}"),
            read_only: true,
        };
        VmConfig {
            kernel: PathBuf::from("vmlinux"),
            initrd: None,
            cmdline: String::new(),
            vcpus: 1,
            mem_size: 512 << 20,
            vsock: None,
            shares: (0..shares).map(share).collect(),
            root_disk: None,
            root_dir: None,
            sandbox_disk: None,
            free_page_reporting: false,
            fs_bounce_pool,
        }
    }

    #[test]
    fn only_a_machine_with_shares_that_may_be_saved_gets_a_pool() {
        let pool = [boot::BOUNCE_PARAM, boot::BOUNCE_LOG_PARAM];
        assert_eq!(bounce_params(&config(1, true)), pool);
        // Once for the machine, however many shares.
        assert_eq!(bounce_params(&config(3, true)), pool);
        assert_eq!(bounce_params(&config(1, false)), [boot::NO_BOUNCE_PARAM]);
        assert_eq!(bounce_params(&config(0, true)), [boot::NO_BOUNCE_PARAM]);
    }
}
