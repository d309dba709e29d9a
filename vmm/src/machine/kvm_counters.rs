//! A vCPU's counters as KVM keeps them (`KVM_GET_STATS_FD`, Linux 5.14):
//! its exits by kind, the nested page faults it took, the guest TLB
//! flushes KVM did for it. `--print-stats` prints some at the end of a
//! run (docs/benchmarks.md, "KVM's counters"): they tell where a guest's
//! time goes that the timeline cannot see, such as a fault per page it
//! touches.
//!
//! The file is opened with the vCPU, before the VMM confines itself, and
//! read with `pread` afterwards. Its layout (the kernel's
//! Documentation/virt/kvm/api.rst, "KVM_GET_STATS_FD"): a header, the
//! descriptors (each a fixed part and a name of `name_size` bytes), and
//! the data, each counter at its descriptor's offset.

use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use kvm_bindings::KVMIO;
use kvm_ioctls::VcpuFd;
use vmm_sys_util::ioctl::ioctl;
use vmm_sys_util::ioctl_io_nr;

ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);

/// The header's size: six u32 fields.
const HEADER: usize = 24;
/// A descriptor's fixed part: flags (u32), exponent (i16), size (u16),
/// offset (u32), bucket size (u32); its name follows.
const DESC: usize = 16;
/// Where a descriptor's flags keep the counter's type.
const TYPE_MASK: u32 = 0xf;
/// Types whose one value is a plain number: cumulative, instant, peak.
const PLAIN_TYPES: [u32; 3] = [0, 1, 2];

/// Counters by KVM's name for them, in KVM's order.
pub type Named = Vec<(String, u64)>;

/// One vCPU's statistics file.
#[derive(Debug)]
pub struct Counters {
    file: File,
}

impl Counters {
    /// None where KVM keeps no binary statistics (before Linux 5.14).
    pub fn open(vcpu: &VcpuFd) -> Option<Self> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new
        // file descriptor, which nothing else owns.
        let fd = unsafe { ioctl(vcpu, KVM_GET_STATS_FD()) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd was just returned to us, open, and owned by no one else.
        let file = unsafe { File::from_raw_fd(fd) };
        Some(Self { file })
    }

    /// Every counter that is one plain number, by KVM's name for it
    /// (`exits`, `pf_taken`, `tlb_flush`, ...), in KVM's order.
    pub fn read(&self) -> io::Result<Named> {
        let mut header = [0u8; HEADER];
        self.file.read_exact_at(&mut header, 0)?;
        let field = |i: usize| u32::from_ne_bytes(header[i * 4..i * 4 + 4].try_into().unwrap());
        let (name_size, count, desc_at, data_at) = (field(1), field(2), field(4), field(5));
        let mut descs = vec![0u8; (DESC + name_size as usize) * count as usize];
        self.file.read_exact_at(&mut descs, u64::from(desc_at))?;
        let parsed = parse_descriptors(&descs, name_size as usize)?;
        let data_len = parsed
            .iter()
            .map(|d| d.offset + d.size * 8)
            .max()
            .unwrap_or(0);
        let mut data = vec![0u8; data_len];
        self.file.read_exact_at(&mut data, u64::from(data_at))?;
        Ok(values(&parsed, &data))
    }
}

/// A counter's descriptor: where its values lie in the data block.
#[derive(Debug, PartialEq)]
struct Descriptor {
    name: String,
    plain: bool,
    offset: usize,
    size: usize,
}

fn parse_descriptors(bytes: &[u8], name_size: usize) -> io::Result<Vec<Descriptor>> {
    let each = DESC + name_size;
    if !bytes.len().is_multiple_of(each) {
        return Err(io::Error::other(
            "KVM's statistics descriptors are cut short",
        ));
    }
    Ok(bytes
        .chunks_exact(each)
        .map(|d| {
            let u32_at = |i: usize| u32::from_ne_bytes(d[i..i + 4].try_into().unwrap());
            let size = u16::from_ne_bytes(d[6..8].try_into().unwrap()) as usize;
            let name = &d[DESC..];
            let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            Descriptor {
                name: String::from_utf8_lossy(&name[..end]).into_owned(),
                plain: PLAIN_TYPES.contains(&(u32_at(0) & TYPE_MASK)) && size == 1,
                offset: u32_at(8) as usize,
                size,
            }
        })
        .collect())
}

fn values(descs: &[Descriptor], data: &[u8]) -> Named {
    descs
        .iter()
        .filter(|d| d.plain)
        .map(|d| {
            let v = u64::from_ne_bytes(data[d.offset..d.offset + 8].try_into().unwrap());
            (d.name.clone(), v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(flags: u32, size: u16, offset: u32, name: &str, name_size: usize) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend(flags.to_ne_bytes());
        d.extend(0i16.to_ne_bytes());
        d.extend(size.to_ne_bytes());
        d.extend(offset.to_ne_bytes());
        d.extend(0u32.to_ne_bytes());
        let mut n = name.as_bytes().to_vec();
        n.resize(name_size, 0);
        d.extend(n);
        d
    }

    /// Plain counters come out by name with their values; a histogram
    /// (type 4, a linear one) and a counter of several values are left
    /// out; descriptors cut short are an error.
    #[test]
    fn plain_counters_are_read_by_name_and_the_rest_left_out() {
        let name_size = 48;
        let mut descs = descriptor(0, 1, 0, "exits", name_size);
        descs.extend(descriptor(0x4, 32, 8, "halt_poll_hist_ns", name_size));
        descs.extend(descriptor(2 << 8 | 1, 1, 264, "halt_wait_ns", name_size));
        descs.extend(descriptor(0, 2, 272, "two_values", name_size));
        let parsed = parse_descriptors(&descs, name_size).unwrap();
        assert_eq!(parsed.len(), 4);
        assert!(!parsed[1].plain && !parsed[3].plain);
        let mut data = vec![0u8; 288];
        data[0..8].copy_from_slice(&57_846u64.to_ne_bytes());
        data[264..272].copy_from_slice(&1_000u64.to_ne_bytes());
        assert_eq!(
            values(&parsed, &data),
            [
                ("exits".to_string(), 57_846),
                ("halt_wait_ns".to_string(), 1_000)
            ]
        );
        assert!(parse_descriptors(&descs[..descs.len() - 1], name_size).is_err());
    }

    /// On a real vCPU (where /dev/kvm opens): the counters `--print-stats`
    /// shows are there, and `exits` moves when the vCPU runs.
    #[test]
    fn a_vcpu_has_the_counters_print_stats_shows() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            eprintln!("skipped: /dev/kvm does not open here");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        let mut vcpu = vm.create_vcpu(0).unwrap();
        let Some(counters) = Counters::open(&vcpu) else {
            eprintln!("skipped: this kernel's KVM keeps no binary statistics");
            return;
        };
        let read = |name: &str| {
            counters
                .read()
                .unwrap()
                .into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v)
                .unwrap_or_else(|| panic!("no {name} counter"))
        };
        let before = read("exits");
        for name in [
            "pf_taken",
            "pf_fixed",
            "tlb_flush",
            "io_exits",
            "mmio_exits",
        ] {
            read(name);
        }
        // A vCPU with no memory stops at once (it faults on its first
        // fetch), where this KVM can run it at all.
        match vcpu.run() {
            Ok(_) => assert!(read("exits") > before),
            Err(e) => eprintln!("not run: this KVM cannot run a bare vCPU: {e}"),
        }
    }
}
