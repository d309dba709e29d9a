//! A virtio-fs device whose backend (virtiofsd, started by the caller)
//! listens on `share.socket`. The queue eventfds and the irqfd go to the
//! backend as its kick and call fds, so guest requests and their
//! completions never stop in the VMM. Where the guest mounts it is the
//! run's business, told in the exec channel's setup (docs/protocol.md),
//! not the machine's: a template's device serves any directory.

use std::ops::Range;
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
    match bounces(config) {
        true => vec![boot::BOUNCE_PARAM.into(), boot::BOUNCE_LOG_PARAM.into()],
        false => vec![boot::NO_BOUNCE_PARAM.into()],
    }
}

/// Whether the guest of `config` makes the bounce pool.
pub fn bounces(config: &VmConfig) -> bool {
    config.fs_bounce_pool && !config.shares.is_empty()
}

/// The largest machine whose pool [`expected_bounce_pool`] foresees: up
/// to 1 GiB its guess was the kernel's at every size tried; at 2 GiB the
/// kernel put the pool 2 MiB lower, at 3 GiB 6 MiB lower.
pub const POOL_FORESEEN_UP_TO: u64 = 1 << 30;

/// Where mvm's guest kernel (guest-kernel/guest.config) puts the bounce
/// pool of a machine of `mem_size` bytes whose initramfs starts at
/// `initrd_start`, so that a machine that makes a template can map the
/// pool ahead (prefault.rs): its guest zeroes all 8 MiB of it during
/// boot, otherwise one exit to KVM per 4 KiB page, 2048 of them
/// (docs/snapshots.md, "The first run"). The kernel takes the pool from
/// the top of low memory down, right below what it took there before:
/// the pages of its memory map (2 MiB blocks, one per 128 MiB of RAM),
/// below a 2 MiB block of smaller allocations, below the 2 MiB block the
/// initramfs (put at the top of RAM: kernel.rs) begins in. Found by
/// booting machines of 256 MiB to 5 GiB and reading the kernel's record
/// of it; a test boots the default machine and checks the guess
/// (tests/e2e/template.rs). None above [`POOL_FORESEEN_UP_TO`]. A guess
/// that misses costs the pages mapped for nothing, 8 MiB at most, and
/// the boot then pays for the pool as it did before.
pub fn expected_bounce_pool(mem_size: u64, initrd_start: u64) -> Option<Range<u64>> {
    const BLOCK: u64 = 2 << 20;
    const SECTION: u64 = 128 << 20;
    if mem_size > POOL_FORESEEN_UP_TO {
        return None;
    }
    let memory_map = mem_size.div_ceil(SECTION) * BLOCK;
    let end = (initrd_start / BLOCK * BLOCK).checked_sub(BLOCK + memory_map)?;
    Some(end.checked_sub(boot::BOUNCE_POOL_BYTES)?..end)
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

    /// What the kernel logged (`RAMDISK:` and `software IO TLB: mapped`)
    /// when booted with the pool at these sizes, mvm's two initramfs.
    #[test]
    fn the_pool_is_expected_where_the_kernel_put_it() {
        const MIB: u64 = 1 << 20;
        for (mem, initrd, pool) in [
            (256 * MIB, 0x0fec_7000, 0x0f00_0000..0x0f80_0000),
            (512 * MIB, 0x1fec_7000, 0x1ec0_0000..0x1f40_0000),
            (512 * MIB, 0x1fcd_a000, 0x1ea0_0000..0x1f20_0000),
            (1024 * MIB, 0x3fec_7000, 0x3e40_0000..0x3ec0_0000),
        ] {
            assert_eq!(expected_bounce_pool(mem, initrd), Some(pool), "{mem:#x}");
        }
        assert_eq!(expected_bounce_pool(2048 * MIB, 0x7fec_7000), None);
        // Too little room below the initramfs: no guess, no overflow.
        assert_eq!(expected_bounce_pool(64 * MIB, 0x0030_0000), None);
    }
}
