//! Which guest memory a restored machine shares with virtiofsd: the guest
//! kernel's DMA bounce pool, through which every virtio-fs buffer passes
//! (`swiotlb=force` and `VIRTIO_F_ACCESS_PLATFORM`: devices/src/virtio/fs),
//! and each virtio-fs queue's rings. Both are known from the template: the
//! pool from what guest-init reported on the status port before its ready
//! marker, the rings from the saved transports. Everything else stays a
//! private mapping of the template (docs/snapshots.md, "Restoring").

use std::ops::Range;

use mvm_devices::state::DeviceState;
use mvm_devices::virtio::state::VirtioDeviceSnapshot;

use super::memory::union;
use super::registry::DeviceStates;
use super::snapshot::RegionLayout;

const PAGE: u64 = 4096;
/// A pool larger than this is not one mvm's boot parameter makes
/// (`mvm_protocol::boot::BOUNCE_PARAM`: 8 MiB) and is not believed.
const MAX_POOL: u64 = 256 << 20;

/// The page-aligned, sorted, disjoint guest-physical ranges to share, or
/// why a restore cannot share only part of guest memory (no pool was
/// reported, or a range lies outside guest RAM): it then copies it all.
pub fn shared_windows(
    devices: &DeviceStates,
    regions: &[RegionLayout],
) -> Result<Vec<Range<u64>>, String> {
    let mut windows = Vec::new();
    let mut has_fs = false;
    let mut has_port = false;
    for (_, state) in &devices.0 {
        match state {
            DeviceState::StatusPort(port) => {
                has_port = true;
                let pool = port
                    .bounce_pool
                    .range()
                    .ok_or("the template's guest reported no DMA bounce pool")?;
                if pool.end - pool.start > MAX_POOL {
                    return Err(format!(
                        "the reported bounce pool ({} MiB) is larger than {} MiB",
                        (pool.end - pool.start) >> 20,
                        MAX_POOL >> 20
                    ));
                }
                windows.push(pool);
            }
            DeviceState::Virtio(t) if matches!(t.device, VirtioDeviceSnapshot::Fs { .. }) => {
                has_fs = true;
                for q in t.queues.iter().filter(|q| q.ready) {
                    let size = u64::from(q.size);
                    for (at, len) in [
                        (q.desc_table, 16 * size),
                        (q.avail_ring, 6 + 2 * size),
                        (q.used_ring, 6 + 8 * size),
                    ] {
                        let end = at.checked_add(len).ok_or("a ring's address overflows")?;
                        windows.push(at / PAGE * PAGE..end.div_ceil(PAGE) * PAGE);
                    }
                }
            }
            _ => {}
        }
    }
    if !has_fs {
        return Err("the template has no virtio-fs device".into());
    }
    if !has_port {
        return Err("the template has no status port".into());
    }
    let windows = union(windows);
    let inside = |w: &Range<u64>| {
        regions
            .iter()
            .any(|r| r.guest_addr <= w.start && w.end <= r.guest_addr + r.len)
    };
    if let Some(out) = windows.iter().find(|w| !inside(w)) {
        return Err(format!(
            "{:#x}..{:#x} is not inside one region of guest RAM",
            out.start, out.end
        ));
    }
    Ok(windows)
}

#[cfg(test)]
mod tests {
    use mvm_devices::legacy::{BouncePool, StatusPortSnapshot};
    use mvm_devices::virtio::state::{QueueSnapshot, TransportSnapshot};

    use super::*;

    const MIB: u64 = 1 << 20;

    fn layout() -> Vec<RegionLayout> {
        vec![RegionLayout {
            guest_addr: 0,
            len: 512 * MIB,
            file_offset: 0,
        }]
    }

    fn port(pfn: Option<u32>, pages: Option<u32>) -> (String, DeviceState) {
        let saved = StatusPortSnapshot {
            markers: vec![1, 2],
            exit_status: None,
            bounce_pool: BouncePool { pfn, pages },
        };
        ("status".into(), DeviceState::StatusPort(saved))
    }

    fn queue(desc: u64, ready: bool) -> QueueSnapshot {
        QueueSnapshot {
            max_size: 1024,
            size: 1024,
            ready,
            desc_table: desc,
            avail_ring: desc + 0x4000,
            used_ring: desc + 0x5000,
            next_avail: 0,
            next_used: 0,
            event_idx_enabled: true,
        }
    }

    fn transport(device: VirtioDeviceSnapshot, queues: Vec<QueueSnapshot>) -> DeviceState {
        DeviceState::Virtio(TransportSnapshot {
            device_type: 26,
            status: 15,
            acked_features: 0,
            queue_select: 0,
            device_features_select: 0,
            driver_features_select: 0,
            config_generation: 0,
            interrupt_status: 0,
            queues,
            device,
        })
    }

    fn fs(queues: Vec<QueueSnapshot>) -> (String, DeviceState) {
        let device = VirtioDeviceSnapshot::Fs { tag: "w".into() };
        ("fs-w".into(), transport(device, queues))
    }

    #[test]
    fn the_pool_and_every_ready_rings_pages_are_shared() {
        // A pool of 16 MiB at 480 MiB; rings 0x7000 apart from 1 MiB on,
        // the second queue's right after the first's, a third not ready.
        let devices = DeviceStates(vec![
            port(Some((480 * MIB / PAGE) as u32), Some(4096)),
            fs(vec![
                queue(MIB, true),
                queue(MIB + 0x7000, true),
                queue(0, false),
            ]),
        ]);
        let windows = shared_windows(&devices, &layout()).unwrap();
        assert_eq!(
            windows,
            [
                // desc 16 KiB, avail 2 KiB + 6, used 8 KiB + 6: pages up to
                // used + 0x3000, twice, touching.
                MIB..MIB + 0x7000 + 0x8000,
                480 * MIB..496 * MIB,
            ]
        );
    }

    #[test]
    fn vsock_rings_are_not_shared() {
        let vsock = transport(
            VirtioDeviceSnapshot::Vsock { cid: 3 },
            vec![queue(MIB, true)],
        );
        let devices = DeviceStates(vec![
            port(Some(0x1000), Some(1)),
            ("vsock".into(), vsock),
            fs(vec![]),
        ]);
        let windows = shared_windows(&devices, &layout()).unwrap();
        assert_eq!(windows, std::slice::from_ref(&(0x100_0000..0x100_1000)));
    }

    #[test]
    fn without_a_pool_or_inside_ram_there_are_no_windows() {
        let rings = || fs(vec![queue(MIB, true)]);
        let no_pool = DeviceStates(vec![port(None, Some(4)), rings()]);
        let why = shared_windows(&no_pool, &layout()).unwrap_err();
        assert!(why.contains("no DMA bounce pool"), "{why}");
        let beyond = DeviceStates(vec![
            port(Some((510 * MIB / PAGE) as u32), Some(4096)),
            rings(),
        ]);
        let why = shared_windows(&beyond, &layout()).unwrap_err();
        assert!(why.contains("not inside"), "{why}");
        let huge = DeviceStates(vec![port(Some(0), Some(1 << 20)), rings()]);
        assert!(shared_windows(&huge, &layout()).is_err());
        let no_fs = DeviceStates(vec![port(Some(1), Some(1))]);
        assert!(shared_windows(&no_fs, &layout()).is_err());
        let no_port = DeviceStates(vec![rings()]);
        let why = shared_windows(&no_port, &layout()).unwrap_err();
        assert!(why.contains("no status port"), "{why}");
    }
}
