//! The balloon minus KVM: real guest memory (anonymous, and a shared
//! memfd as a vhost-user backend would map it), reports built on mock
//! split queues, the handler run by a real event manager.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::discard::{discard, Refused, PAGE};
use super::*;
use crate::virtio::device::{Activation, Interrupt, VirtioDevice};
use crate::virtio::state::VirtioDeviceSnapshot;

const MEM_SIZE: usize = 16 << 20;
/// Where the reported blocks lie: clear of the mock queues at the start.
const BLOCK: u64 = 8 << 20;
const BLOCK_LEN: u64 = 2 << 20;
const FILL: u8 = 0xa5;

fn private_mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

/// Guest memory over a memfd (as with a virtio-fs share), and the memfd.
fn shared_mem() -> (GuestMemoryMmap, File) {
    // SAFETY: the name is NUL-terminated and the flags valid.
    let fd = unsafe { libc::memfd_create(c"mvm-balloon-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: memfd_create just returned this fd and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(MEM_SIZE as u64).unwrap();
    let mem = GuestMemoryMmap::from_ranges_with_files([(
        GuestAddress(0),
        MEM_SIZE,
        Some(FileOffset::new(file.try_clone().unwrap(), 0)),
    )])
    .unwrap();
    (mem, file)
}

fn fill(mem: &GuestMemoryMmap, addr: u64, len: u64) {
    mem.write_slice(&vec![FILL; len as usize], GuestAddress(addr))
        .unwrap();
}

fn bytes(mem: &GuestMemoryMmap, addr: u64, len: u64) -> Vec<u8> {
    let mut got = vec![0u8; len as usize];
    mem.read_slice(&mut got, GuestAddress(addr)).unwrap();
    got
}

fn all(v: &[u8], b: u8) -> bool {
    v.iter().all(|&x| x == b)
}

#[test]
fn a_discarded_private_block_reads_zeros_and_its_neighbours_keep_their_bytes() {
    let mem = private_mem();
    fill(&mem, BLOCK - PAGE, BLOCK_LEN + 2 * PAGE);
    // The positive control: the block holds what was written.
    assert!(all(&bytes(&mem, BLOCK, BLOCK_LEN), FILL));
    discard(&mem, BLOCK, BLOCK_LEN).unwrap();
    assert!(all(&bytes(&mem, BLOCK, BLOCK_LEN), 0));
    assert!(all(&bytes(&mem, BLOCK - PAGE, PAGE), FILL));
    assert!(all(&bytes(&mem, BLOCK + BLOCK_LEN, PAGE), FILL));
}

#[test]
fn a_discarded_shared_block_is_a_hole_in_the_memfd_too() {
    let (mem, file) = shared_mem();
    fill(&mem, BLOCK, BLOCK_LEN);
    let mut seen = vec![0u8; BLOCK_LEN as usize];
    // What a backend mapping the memfd sees, before and after.
    file.read_exact_at(&mut seen, BLOCK).unwrap();
    assert!(all(&seen, FILL));
    discard(&mem, BLOCK, BLOCK_LEN).unwrap();
    file.read_exact_at(&mut seen, BLOCK).unwrap();
    assert!(all(&seen, 0));
    assert!(all(&bytes(&mem, BLOCK, BLOCK_LEN), 0));
    // The file's blocks went (a punched hole), not just this mapping.
    let blocks = |f: &File| {
        use std::os::unix::fs::MetadataExt;
        f.metadata().unwrap().blocks()
    };
    fill(&mem, 0, MEM_SIZE as u64);
    let before = blocks(&file);
    discard(&mem, BLOCK, BLOCK_LEN).unwrap();
    assert_eq!(before - blocks(&file), BLOCK_LEN / 512);
}

#[test]
fn ranges_that_are_not_whole_pages_inside_memory_are_refused_untouched() {
    let mem = private_mem();
    fill(&mem, 0, MEM_SIZE as u64);
    let end = MEM_SIZE as u64;
    for (addr, len) in [
        (BLOCK + 1, PAGE),
        (BLOCK, PAGE + 1),
        (BLOCK, 0),
        (end - PAGE, 2 * PAGE),
        (end, PAGE),
        (u64::MAX - PAGE + 1, PAGE),
    ] {
        let refused = discard(&mem, addr, len).unwrap_err();
        assert!(
            matches!(
                refused,
                Refused::NotPages { .. } | Refused::OutsideMemory { .. }
            ),
            "{addr:#x}+{len:#x}: {refused}"
        );
    }
    assert!(all(&bytes(&mem, 0, MEM_SIZE as u64), FILL));
}

/// A device activated on three mock queues (inflate, deflate, reporting
/// at distinct places), its handler in an event manager.
struct Rig {
    mem: GuestMemoryMmap,
    dev: Balloon,
    em: EventManager<Box<dyn MutEventSubscriber + Send>>,
    queues: Vec<MockSplitQueue<'static, GuestMemoryMmap>>,
    evts: Vec<EventFd>,
    irq: EventFd,
}

fn rig(mem: GuestMemoryMmap) -> Rig {
    // The mock queues borrow the memory for their lifetime; leak a clone
    // (a test process's few MiB of mappings).
    let leaked: &'static GuestMemoryMmap = Box::leak(Box::new(mem.clone()));
    let queues: Vec<_> = (0..QUEUE_COUNT as u64)
        .map(|i| MockSplitQueue::create(leaked, GuestAddress(i * 0x10_0000), QUEUE_SIZE))
        .collect();
    let evts: Vec<EventFd> = (0..QUEUE_COUNT)
        .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
        .collect();
    let (dev, handler) = new(evts.iter().map(|e| e.try_clone().unwrap()).collect()).unwrap();
    let mut em = EventManager::<Box<dyn MutEventSubscriber + Send>>::new().unwrap();
    em.add_subscriber(Box::new(handler));
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    Rig {
        mem,
        dev,
        em,
        queues,
        evts,
        irq,
    }
}

impl Rig {
    fn activate(&mut self) {
        let queues: Vec<Queue> = self
            .queues
            .iter()
            .map(|q| q.create_queue().unwrap())
            .collect();
        let interrupt = Arc::new(Interrupt::new(self.irq.try_clone().unwrap()));
        self.dev
            .activate(Activation {
                mem: self.mem.clone(),
                queues,
                interrupt,
                acked_features: self.dev.features(),
            })
            .unwrap();
    }

    /// Puts one chain of device-writable buffers (as Linux's reports are)
    /// on queue `index` and kicks it.
    fn offer(&mut self, index: usize, ranges: &[(u64, u32)]) {
        let last = ranges.len() - 1;
        let descs: Vec<RawDescriptor> = ranges
            .iter()
            .enumerate()
            .map(|(i, &(addr, len))| {
                let next = if i == last { 0 } else { VRING_DESC_F_NEXT };
                RawDescriptor::from(SplitDescriptor::new(
                    addr,
                    len,
                    VRING_DESC_F_WRITE as u16 | next,
                    (i + 1) as u16,
                ))
            })
            .collect();
        self.queues[index].add_desc_chains(&descs, 0).unwrap();
        self.evts[index].write(1).unwrap();
    }

    fn run(&mut self) {
        self.em.run_with_timeout(1000).unwrap();
    }

    fn used(&self, index: usize) -> u16 {
        self.dev.active_queues().unwrap()[index].next_used
    }
}

const VRING_DESC_F_NEXT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;

#[test]
fn a_report_frees_its_blocks_and_comes_back_used_with_an_interrupt() {
    let mut r = rig(private_mem());
    fill(&r.mem, BLOCK, 2 * BLOCK_LEN + PAGE);
    r.activate();
    r.run(); // the activation wakeup: nothing queued yet
    assert!(r.irq.read().is_err(), "an interrupt with nothing used");
    r.offer(
        REPORTING_QUEUE,
        &[
            (BLOCK, BLOCK_LEN as u32),
            (BLOCK + BLOCK_LEN, BLOCK_LEN as u32),
        ],
    );
    r.run();
    assert_eq!(r.used(REPORTING_QUEUE), 1);
    assert_eq!(r.irq.read().unwrap(), 1, "no interrupt after the report");
    assert!(all(&bytes(&r.mem, BLOCK, 2 * BLOCK_LEN), 0));
    // Past the report: kept.
    assert!(all(&bytes(&r.mem, BLOCK + 2 * BLOCK_LEN, PAGE), FILL));
}

#[test]
fn inflate_buffers_and_bad_reports_come_back_without_freeing_anything() {
    let mut r = rig(private_mem());
    let last = MEM_SIZE as u64 - PAGE;
    fill(&r.mem, BLOCK, BLOCK_LEN);
    fill(&r.mem, last, PAGE);
    r.activate();
    // Never asked to inflate: the pages stay the guest's.
    r.offer(0, &[(BLOCK, PAGE as u32)]);
    // A report whose range runs past the end of memory, and an unaligned one.
    r.offer(
        REPORTING_QUEUE,
        &[
            (MEM_SIZE as u64 - PAGE, 2 * PAGE as u32),
            (BLOCK + 8, PAGE as u32),
        ],
    );
    r.run();
    assert_eq!(r.used(0), 1);
    assert_eq!(r.used(REPORTING_QUEUE), 1);
    assert!(all(&bytes(&r.mem, BLOCK, BLOCK_LEN), FILL));
    assert!(
        all(&bytes(&r.mem, last, PAGE), FILL),
        "the last page was freed"
    );
}

#[test]
fn a_report_longer_than_linux_sends_is_read_only_so_far() {
    let mut r = rig(private_mem());
    let pages = 40u64;
    fill(&r.mem, BLOCK, pages * PAGE);
    r.activate();
    let ranges: Vec<(u64, u32)> = (0..pages)
        .map(|i| (BLOCK + i * PAGE, PAGE as u32))
        .collect();
    r.offer(REPORTING_QUEUE, &ranges);
    r.run();
    assert_eq!(r.used(REPORTING_QUEUE), 1);
    // The first 32 ranges (Linux's most) are freed, the rest kept.
    assert!(all(&bytes(&r.mem, BLOCK, 32 * PAGE), 0));
    assert!(all(&bytes(&r.mem, BLOCK + 32 * PAGE, 8 * PAGE), FILL));
}

#[test]
fn a_driver_that_declines_reporting_starts_without_the_reporting_queue() {
    let mut r = rig(private_mem());
    fill(&r.mem, BLOCK, PAGE);
    // Only inflate and deflate set up, as Linux does when it declines.
    let queues: Vec<Queue> = r
        .queues
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let mut queue: Queue = q.create_queue().unwrap();
            if i == REPORTING_QUEUE {
                QueueT::set_ready(&mut queue, false);
            }
            queue
        })
        .collect();
    let interrupt = Arc::new(Interrupt::new(r.irq.try_clone().unwrap()));
    r.dev
        .activate(Activation {
            mem: r.mem.clone(),
            queues,
            interrupt,
            acked_features: 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1,
        })
        .unwrap();
    r.offer(0, &[(BLOCK, PAGE as u32)]);
    r.run();
    assert_eq!(r.used(0), 1, "the inflate queue is still served");
    assert!(all(&bytes(&r.mem, BLOCK, PAGE), FILL));
}

#[test]
fn a_discarded_page_of_a_privately_mapped_file_reads_the_files_bytes_again() {
    use std::io::Write;
    use vm_memory::mmap::MmapRegionBuilder;
    use vm_memory::GuestRegionMmap;
    let mut file = vmm_sys_util::tempfile::TempFile::new().unwrap().into_file();
    file.write_all(&vec![0x5a; MEM_SIZE]).unwrap();
    // As machine/memory.rs maps a snapshot's memory file.
    let mapping = MmapRegionBuilder::new(MEM_SIZE)
        .with_file_offset(FileOffset::new(file.try_clone().unwrap(), 0))
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
        .build()
        .unwrap();
    let region = GuestRegionMmap::new(mapping, GuestAddress(0)).unwrap();
    let mem = GuestMemoryMmap::from_regions(vec![region]).unwrap();
    fill(&mem, BLOCK, BLOCK_LEN);
    discard(&mem, BLOCK, BLOCK_LEN).unwrap();
    assert!(all(&bytes(&mem, BLOCK, BLOCK_LEN), 0x5a));
    let mut on_disk = vec![0u8; BLOCK_LEN as usize];
    file.read_exact_at(&mut on_disk, BLOCK).unwrap();
    assert!(all(&on_disk, 0x5a), "the snapshot file was written");
}

#[test]
fn the_device_offers_reporting_only_and_keeps_the_balloon_empty() {
    let (mut dev, _h) = new((0..QUEUE_COUNT)
        .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
        .collect())
    .unwrap();
    assert_eq!(dev.device_type(), 5);
    assert_eq!(
        dev.features(),
        (1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_BALLOON_F_FREE_PAGE_REPORTING)
    );
    let mut config = [0xffu8; CONFIG_LEN];
    dev.read_config(0, &mut config);
    assert_eq!(config, [0; CONFIG_LEN]);
    dev.write_config(4, &7u32.to_le_bytes());
    // num_pages is not the driver's to write.
    dev.write_config(0, &9u32.to_le_bytes());
    dev.read_config(0, &mut config);
    assert_eq!(config, [0, 0, 0, 0, 7, 0, 0, 0]);
    assert_eq!(dev.save().unwrap(), VirtioDeviceSnapshot::Balloon);
    assert!(dev
        .check_snapshot(&VirtioDeviceSnapshot::Vsock { cid: 3 })
        .is_err());
    assert!(new(vec![EventFd::new(EFD_NONBLOCK).unwrap()]).is_err());
}
