//! The virtio-fs device as its transport sees it (device ID 26): the
//! backend's features, the tag in config space, and at activation the
//! vhost-user setup that hands the queues to the backend.
//!
//! Snapshots: the ring positions of a running device live in virtiofsd,
//! out of reach, so a running device can be saved only while no request
//! has ever crossed it (every avail ring index still 0, every used ring
//! empty). Linux's driver starts the device at probe, long before anything
//! is mounted, so this is the state of every VM template; a restore hands
//! the rings to a new backend at position 0, which is then exactly where
//! they are.

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserVirtioFeatures};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_config::{VIRTIO_F_ACCESS_PLATFORM, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_ids::VIRTIO_ID_FS;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::defs::{CONFIG_SIZE, NUM_REQUEST_QUEUES, QUEUE_COUNT, QUEUE_SIZE, TAG_MAX_LEN};
use super::Error as SetupError;
use crate::state::{RestoreError, SaveError};
use crate::virtio::device::{read_config_bytes, Activation, Error, VirtioDevice};
use crate::virtio::state::VirtioDeviceSnapshot;

/// The ring features the guest may use: the backend implements the rings,
/// so these only need the backend's say-so; nothing else (no DAX window,
/// no notification data) is offered. Not indirect descriptors either: with
/// them a queue could have 256 requests of up to a megabyte each in
/// flight, more than the guest's bounce pool holds (see
/// `mvm_protocol::boot::BOUNCE_PARAM`); without them, at most 256 buffers.
const PASSED_THROUGH: u64 = (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_RING_F_EVENT_IDX);

/// Offered by the device itself, never passed to the backend: the guest
/// then maps every buffer through its DMA API, which the kernel's
/// `swiotlb=force` (given to a machine that becomes a template) turns
/// into a copy through its bounce pool; without it, a no-op. The
/// addresses stay guest-physical (there is no IOMMU), so the backend needs
/// to know nothing of it; what it gains is that every buffer it is given
/// lies in the pool (`BackendMemory`).
const ACCESS_PLATFORM: u64 = 1 << VIRTIO_F_ACCESS_PLATFORM;

/// Guest memory that the backend may map, where it is not all of it: a
/// machine restored from a template maps the template privately and
/// shares only these windows of it with virtiofsd, each a part of `file`
/// mapped `MAP_SHARED` over the same guest-physical range of the VMM's
/// own mapping (docs/snapshots.md).
#[derive(Debug, Clone)]
pub struct BackendMemory {
    pub file: Arc<File>,
    pub windows: Vec<SharedWindow>,
}

/// One window: guest-physical bytes and where they lie in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedWindow {
    pub guest: Range<u64>,
    pub file_offset: u64,
}

impl BackendMemory {
    /// Whether `len` bytes at `gpa` lie inside one window.
    fn covers(&self, gpa: u64, len: u64) -> bool {
        let Some(end) = gpa.checked_add(len) else {
            return false;
        };
        self.windows
            .iter()
            .any(|w| w.guest.start <= gpa && end <= w.guest.end)
    }

    /// The vhost-user memory table: each window at the address the VMM
    /// maps it.
    fn table(&self, mem: &GuestMemoryMmap) -> Result<Vec<VhostUserMemoryRegionInfo>, Error> {
        self.windows
            .iter()
            .map(|w| {
                let len = w.guest.end - w.guest.start;
                let host = mem
                    .get_slice(GuestAddress(w.guest.start), len as usize)
                    .map_err(|_| {
                        Error::Backend(format!(
                            "shared window {:#x}..{:#x} is not guest memory",
                            w.guest.start, w.guest.end
                        ))
                    })?;
                Ok(VhostUserMemoryRegionInfo {
                    guest_phys_addr: w.guest.start,
                    memory_size: len,
                    userspace_addr: host.ptr_guard().as_ptr() as u64,
                    mmap_offset: w.file_offset,
                    mmap_handle: self.file.as_raw_fd(),
                })
            })
            .collect()
    }
}

pub struct VhostUserFs {
    config: [u8; CONFIG_SIZE],
    frontend: Frontend,
    /// Everything the backend offered, PROTOCOL_FEATURES included.
    backend_features: u64,
    /// PROTOCOL_FEATURES was negotiated: rings then start disabled and
    /// need SET_VRING_ENABLE.
    protocol: bool,
    kick_evts: Vec<EventFd>,
    /// The device's irqfd, every queue's call fd.
    call_evt: EventFd,
    /// Some while the backend holds rings of the current activation.
    running: Option<Rings>,
    /// What the backend may map, where not all of guest memory.
    shared: Option<BackendMemory>,
}

/// What a save needs of the rings the backend holds: where the driver
/// publishes the buffers it makes available, and where the backend
/// returns them.
struct Rings {
    mem: GuestMemoryMmap,
    /// Each queue's avail ring (`le16 flags; le16 idx; ...`).
    avail: Vec<GuestAddress>,
    /// Each queue's used ring (`le16 flags; le16 idx; {le32 id; le32 len}
    /// ring[]; ...`).
    used: Vec<GuestAddress>,
}

impl Rings {
    /// Why a request may have crossed the device, if one may have: a
    /// queue whose avail index moved (the driver made a buffer available,
    /// the backend may have consumed it), or whose first used element is
    /// set (the backend completed a request: the avail index, a free
    /// running u16, may have come round to 0 again; the driver's rings
    /// start zeroed, Linux allocates them so), or that cannot be read.
    fn crossed(&self) -> Option<String> {
        let mut rings = self.avail.iter().zip(&self.used).enumerate();
        rings.find_map(|(index, (&avail, &used))| {
            let idx = avail
                .checked_add(2)
                .and_then(|at| self.mem.read_obj::<[u8; 2]>(at).ok());
            let first_used = used
                .checked_add(4)
                .and_then(|at| self.mem.read_obj::<[u8; 8]>(at).ok());
            let (Some(idx), Some(first_used)) = (idx, first_used) else {
                return Some(format!("queue {index}'s rings cannot be read"));
            };
            let idx = u16::from_le_bytes(idx);
            if idx != 0 {
                return Some(format!("queue {index}'s avail index is {idx}"));
            }
            if first_used != [0; 8] {
                return Some(format!("queue {index}'s used ring has an entry"));
            }
            None
        })
    }
}

fn backend(step: &'static str) -> impl FnOnce(vhost::Error) -> SetupError {
    move |source| SetupError::Backend { step, source }
}

fn activation(step: &'static str) -> impl FnOnce(vhost::Error) -> Error {
    move |e| Error::Backend(format!("{step}: {e}"))
}

impl VhostUserFs {
    pub(super) fn connect(
        tag: &str,
        mut frontend: Frontend,
        kick_evts: Vec<EventFd>,
        call_evt: EventFd,
    ) -> Result<Self, SetupError> {
        frontend.set_owner().map_err(backend("SET_OWNER"))?;
        let backend_features = frontend.get_features().map_err(backend("GET_FEATURES"))?;
        if backend_features & (1 << VIRTIO_F_VERSION_1) == 0 {
            return Err(SetupError::NotModern);
        }
        let protocol = backend_features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
        if protocol {
            // Nothing optional is used (no backend channel, no config
            // space from the backend: the tag is ours), so none is enabled.
            frontend
                .get_protocol_features()
                .map_err(backend("GET_PROTOCOL_FEATURES"))?;
            frontend
                .set_protocol_features(VhostUserProtocolFeatures::empty())
                .map_err(backend("SET_PROTOCOL_FEATURES"))?;
        }
        let mut config = [0u8; CONFIG_SIZE];
        config[..tag.len()].copy_from_slice(tag.as_bytes());
        config[TAG_MAX_LEN..].copy_from_slice(&NUM_REQUEST_QUEUES.to_le_bytes());
        Ok(Self {
            config,
            frontend,
            backend_features,
            protocol,
            kick_evts,
            call_evt,
            running: None,
            shared: None,
        })
    }

    /// Has the backend map only `shared` of guest memory: every ring and
    /// every buffer must then lie in it.
    pub fn share_only(&mut self, shared: BackendMemory) {
        self.shared = Some(shared);
    }

    /// The tag, from the config space it was written into.
    fn tag(&self) -> String {
        let raw = &self.config[..TAG_MAX_LEN];
        let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        String::from_utf8_lossy(&raw[..len]).into_owned()
    }

    fn start_backend(
        &mut self,
        mem: &GuestMemoryMmap,
        queues: &[Queue],
        acked: u64,
    ) -> Result<(), Error> {
        let regions = match &self.shared {
            Some(shared) => {
                for (index, q) in queues.iter().enumerate() {
                    let size = u64::from(q.size());
                    let rings = [
                        (q.desc_table(), 16 * size),
                        (q.avail_ring(), 6 + 2 * size),
                        (q.used_ring(), 6 + 8 * size),
                    ];
                    if !rings.iter().all(|&(at, len)| shared.covers(at, len)) {
                        return Err(Error::Backend(format!(
                            "queue {index}'s rings lie outside the memory shared with the backend"
                        )));
                    }
                }
                shared.table(mem)?
            }
            None => {
                // A private mapping's pages (a snapshot's memory, copy on
                // write) are this process's alone: the backend would map
                // the file under it and neither see the guest's writes nor
                // keep its own from the file.
                if mem.iter().any(|r| r.flags() & libc::MAP_PRIVATE != 0) {
                    return Err(Error::Backend(
                        "guest memory is a private mapping, which the backend cannot share".into(),
                    ));
                }
                mem.iter()
                    .map(VhostUserMemoryRegionInfo::from_guest_region)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| {
                        Error::Backend("guest memory is not shareable (not file-backed)".into())
                    })?
            }
        };
        let protocol_bit = if self.protocol {
            VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
        } else {
            0
        };
        // ACCESS_PLATFORM is the guest's business (see ACCESS_PLATFORM).
        let to_backend = acked & self.backend_features & !ACCESS_PLATFORM;
        self.frontend
            .set_features(to_backend | protocol_bit)
            .map_err(activation("SET_FEATURES"))?;
        self.frontend
            .set_mem_table(&regions)
            .map_err(activation("SET_MEM_TABLE"))?;
        // The backend's view of the guest is the memory table; until the
        // rings are handed over (and enabled) it touches none of it.
        self.running = Some(Rings {
            mem: mem.clone(),
            avail: queues
                .iter()
                .map(|q| GuestAddress(q.avail_ring()))
                .collect(),
            used: queues.iter().map(|q| GuestAddress(q.used_ring())).collect(),
        });
        for (index, queue) in queues.iter().enumerate() {
            let hva = |gpa: u64| {
                mem.get_host_address(GuestAddress(gpa))
                    .map(|p| p as u64)
                    .map_err(|_| Error::BadQueue(index))
            };
            let ring = VringConfigData {
                queue_max_size: queue.max_size(),
                queue_size: queue.size(),
                flags: 0,
                desc_table_addr: hva(queue.desc_table())?,
                used_ring_addr: hva(queue.used_ring())?,
                avail_ring_addr: hva(queue.avail_ring())?,
                log_addr: None,
            };
            self.frontend
                .set_vring_num(index, queue.size())
                .map_err(activation("SET_VRING_NUM"))?;
            self.frontend
                .set_vring_addr(index, &ring)
                .map_err(activation("SET_VRING_ADDR"))?;
            // 0 at first activation, and also at a restore: a running
            // device is saved only before any buffer was made available
            // (see `save`), so its rings are still at 0.
            self.frontend
                .set_vring_base(index, 0)
                .map_err(activation("SET_VRING_BASE"))?;
            self.frontend
                .set_vring_call(index, &self.call_evt)
                .map_err(activation("SET_VRING_CALL"))?;
            self.frontend
                .set_vring_kick(index, &self.kick_evts[index])
                .map_err(activation("SET_VRING_KICK"))?;
            if self.protocol {
                self.frontend
                    .set_vring_enable(index, true)
                    .map_err(activation("SET_VRING_ENABLE"))?;
            }
        }
        Ok(())
    }
}

impl VirtioDevice for VhostUserFs {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_FS
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; QUEUE_COUNT]
    }

    fn features(&self) -> u64 {
        (self.backend_features & PASSED_THROUGH) | ACCESS_PLATFORM
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    /// The config space is read-only.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, activation: Activation) -> Result<(), Error> {
        let Activation {
            mem,
            queues,
            interrupt: _,
            acked_features,
        } = activation;
        if queues.len() != QUEUE_COUNT {
            return Err(Error::QueueCount {
                expected: QUEUE_COUNT,
                got: queues.len(),
            });
        }
        if let Some(bad) = queues.iter().position(|q| !q.is_valid(&mem)) {
            return Err(Error::BadQueue(bad));
        }
        self.start_backend(&mem, &queues, acked_features)
    }

    /// A device the driver has not started saves as its tag. A running
    /// one saves only while no request ever crossed it: every queue's
    /// avail index still 0 and its used ring still empty. Once the driver
    /// has made a buffer available, the ring positions (and maybe requests
    /// in flight, and the FUSE session) live in virtiofsd, and a
    /// vhost-user backend's session cannot be carried into another
    /// process (Firecracker refuses snapshots with vhost-user devices for
    /// the same reason). Before that, the transport's own queue states
    /// (positions 0) are the whole state: a restore activates the device
    /// again from them and the new backend starts at 0. The check reads
    /// guest memory, so the vCPUs must be paused, as for any save.
    fn save(&self) -> Result<VirtioDeviceSnapshot, SaveError> {
        if let Some(why) = self.running.as_ref().and_then(Rings::crossed) {
            return Err(SaveError::Unsupported {
                device: "virtio-fs device",
                why: format!("a request has crossed it ({why}): its ring state lives in virtiofsd"),
            });
        }
        Ok(VirtioDeviceSnapshot::Fs { tag: self.tag() })
    }

    fn active_queues(&self) -> Option<Vec<QueueState>> {
        None
    }

    fn check_snapshot(&self, saved: &VirtioDeviceSnapshot) -> Result<(), RestoreError> {
        match saved {
            VirtioDeviceSnapshot::Fs { tag } if *tag == self.tag() => Ok(()),
            VirtioDeviceSnapshot::Fs { tag } => Err(RestoreError::Mismatch {
                device: "virtio-fs device",
                why: format!("tag {tag:?} saved, {:?} here", self.tag()),
            }),
            other => Err(RestoreError::WrongKind {
                device: "virtio-fs device",
                saved: other.kind(),
            }),
        }
    }

    /// Stops the backend's rings (GET_VRING_BASE stops a ring in
    /// vhost-user) so it no longer touches the old queues.
    fn reset(&mut self) {
        if self.running.take().is_none() {
            return;
        }
        for index in 0..QUEUE_COUNT {
            if self.protocol {
                let _ = self.frontend.set_vring_enable(index, false);
            }
            let _ = self.frontend.get_vring_base(index);
        }
    }
}

#[cfg(test)]
mod tests;
