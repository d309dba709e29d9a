//! The boot contract between the VMM and guest-init: what the VMM puts on
//! the kernel command line and what guest-init reports back on mvm's
//! status port. Both sides use these definitions and nothing else, so the
//! contract cannot drift apart (docs/protocol.md, "Boot contract").
//!
//! Everything here is fixed at boot. What a run needs after a snapshot
//! restore must not come this way (the command line is in the template);
//! it travels over the exec channel instead.

/// First I/O port of mvm's status port range.
pub const STATUS_PORT: u16 = 0x440;
/// Ports in the range (guest-init asks `ioperm` for all of them).
pub const STATUS_PORT_LEN: u16 = 16;
/// Offset of the byte-wide boot-progress marker register.
pub const MARKER_OFFSET: u16 = 0;
/// Offset of the 32-bit exit-status register: the guest command's status
/// (0-255, or 128 + signal), written just before guest-init ends the VM.
pub const EXIT_STATUS_OFFSET: u16 = 4;
/// Offsets of two 32-bit registers where guest-init reports, before its
/// ready marker, where the kernel put its DMA bounce pool (swiotlb): the
/// pool's first page frame number and its length in pages. Every buffer a
/// virtio-fs device sees lies in that pool (the VMM boots a guest that
/// becomes a template with [`BOUNCE_PARAM`] and offers the device
/// `VIRTIO_F_ACCESS_PLATFORM`), so a machine restored from a template
/// need share only the pool and the device's rings with virtiofsd
/// (docs/snapshots.md). Each register keeps its first value.
pub const BOUNCE_POOL_PFN_OFFSET: u16 = 8;
pub const BOUNCE_POOL_PAGES_OFFSET: u16 = 12;
/// The kernel parameter, given only to a machine with virtio-fs devices
/// that may be saved as a template, that makes every device that uses the
/// DMA API (here only virtio-fs: it alone is offered
/// `VIRTIO_F_ACCESS_PLATFORM`) bounce its buffers through a pool of this
/// many 2 KiB slabs (8 MiB). What it must hold: without indirect
/// descriptors a virtio-fs queue of 256 has at most 256 buffers in flight,
/// each a page for file data, 1 MiB. A request's arguments outside pages
/// are one buffer of up to about 66 KiB (an extended attribute's value): a
/// queue full of those (at least two buffers a request, so at most 128)
/// could ask for more than the pool's 8 MiB, and a request that finds the
/// pool full fails (ENOMEM). The kernel must not grow the pool elsewhere
/// (`CONFIG_SWIOTLB_DYNAMIC`, off in mvm's kernel): virtiofsd could not
/// map a buffer outside it. The kernel zeroes the pool at boot, which
/// costs the boot of the run that makes a template (docs/snapshots.md).
///
/// The pool is cut into 4 areas of 2 MiB (the `4`), each with its own
/// lock and its own next-fit cursor, and a vCPU takes its buffers from
/// area `cpu % 4`, going on to the others only when no free run of slabs
/// there fits the buffer. The kernel's default is one area per possible
/// CPU: one area for mvm's one-vCPU machine, whose cursor then walks the
/// whole 8 MiB, so a workspace read of more than 8 MiB touches every
/// page of the pool (and a restored machine pays for each as a fresh
/// page of the shared window). With 4 areas that machine walks 2 MiB,
/// twice what the request queue can have in flight (256 page buffers,
/// 1 MiB), and the pool's size is the same. A machine of more than 4
/// vCPUs shares areas between them (more contention on an area's lock,
/// not less room).
pub const BOUNCE_PARAM: &str = "swiotlb=4096,4,force";
/// The size of the pool [`BOUNCE_PARAM`] asks for: 4096 slabs of 2 KiB.
pub const BOUNCE_POOL_BYTES: u64 = 8 << 20;
/// Also passed with [`BOUNCE_PARAM`]: x86 Linux logs where the pool lies
/// ([`BOUNCE_POOL_LOG`]) only when software bounce buffering is its
/// IOMMU choice (`pci_iommu_init`); a guest without an IOMMU loses
/// nothing by it.
pub const BOUNCE_LOG_PARAM: &str = "iommu=soft";
/// Passed instead of [`BOUNCE_PARAM`] to every other machine: no pool at
/// all. Without it a guest whose RAM reaches above 4 GiB (mvm puts RAM
/// above 3.25 GiB there) gets the kernel's default pool of 64 MiB,
/// zeroed at boot, which nothing of mvm's needs: no device but virtio-fs
/// uses the DMA API, and without an IOMMU that maps a buffer where it
/// lies.
pub const NO_BOUNCE_PARAM: &str = "swiotlb=noforce";
/// What the kernel logs when it has made the pool (`software IO TLB:
/// mapped [mem 0x...-0x...] (16MB)`), the one place that says where it
/// lies.
pub const BOUNCE_POOL_LOG: &str = "software IO TLB: mapped [mem ";

/// Marker written by guest-init as its first act in userspace; the VMM
/// timestamps it ("boot to init").
pub const MARKER_INIT_STARTED: u8 = 1;
/// Marker written once guest-init is set up (its readiness line is on the
/// console) and the command starts next; the VMM holds console input
/// until it comes.
pub const MARKER_INIT_READY: u8 = 2;
/// Marker written by the exec agent once it has set up the machine for
/// its run (clock, entropy, the image root, the shares), just before it
/// prepares and starts the command. A machine restored from a template
/// records there which of its pages the run touched so far, for later
/// restores to map ahead (docs/snapshots.md, "The pages a run touches
/// first"): what comes after is the command's own.
pub const MARKER_MACHINE_SET_UP: u8 = 3;

// Both registers lie inside the range, and the markers differ.
const _: () = assert!(MARKER_OFFSET < STATUS_PORT_LEN);
const _: () = assert!(EXIT_STATUS_OFFSET + 4 <= BOUNCE_POOL_PFN_OFFSET);
const _: () = assert!(BOUNCE_POOL_PFN_OFFSET + 4 <= BOUNCE_POOL_PAGES_OFFSET);
const _: () = assert!(BOUNCE_POOL_PAGES_OFFSET + 4 <= STATUS_PORT_LEN);
const _: () = assert!(MARKER_INIT_STARTED != MARKER_INIT_READY);
const _: () = assert!(MARKER_MACHINE_SET_UP != MARKER_INIT_STARTED);
const _: () = assert!(MARKER_MACHINE_SET_UP != MARKER_INIT_READY);

/// `mvm.cmd=<hex>`: argv joined with NUL bytes, hex-encoded.
pub const CMD_PARAM: &str = "mvm.cmd";
/// `mvm.workdir=<hex>`: the command's working directory, hex-encoded.
pub const WORKDIR_PARAM: &str = "mvm.workdir";
/// `mvm.agent=1`: serve the exec channel over vsock instead of `mvm.cmd`.
pub const AGENT_PARAM: &str = "mvm.agent";
/// `mvm.ready_delay_ms=<ms>`: guest-init waits this long (at most
/// [`MAX_READY_DELAY_MS`]) before its ready marker, where a template is
/// taken (after making the agent's listening socket, where there is
/// one). For tests: a host connection made in that window is in the
/// template (docs/snapshots.md, "vsock after a restore").
pub const READY_DELAY_PARAM: &str = "mvm.ready_delay_ms";
pub const MAX_READY_DELAY_MS: u64 = 10_000;
/// `mvm.mount=<tag>,<ro|rw>,<hex path>`: one per virtio-fs share, in mount
/// order.
pub const MOUNT_PARAM: &str = "mvm.mount";
/// Longest virtio-fs tag: the device's config field is 36 bytes.
pub const MAX_TAG_LEN: usize = 36;
/// `mvm.root=<device>,erofs,<scratch bytes>`: the guest's root is the
/// read-only EROFS filesystem on block device `/dev/<device>`, under an
/// overlayfs whose upper layer is a tmpfs of at most `<scratch bytes>`
/// (docs/images.md); `mvm.root=<tag>,virtiofs,<scratch bytes>`: the same
/// over the virtio-fs share `<tag>` (a host directory) instead. Absent:
/// the initramfs is the root.
pub const ROOT_PARAM: &str = "mvm.root";
/// The block device the VMM attaches the image root as: the first (and
/// only) virtio-blk device.
pub const ROOT_DEVICE: &str = "vda";
/// The block device's id (GET_ID: /sys/block/vda/serial in the guest).
pub const ROOT_DISK_ID: &str = "mvm-root";
/// A named sandbox's disk's id (GET_ID: `/sys/block/vdX/serial`): the
/// writable disk its root's upper layer lives on (docs/sandboxes.md).
pub const SANDBOX_DISK_ID: &str = "mvm-disk";
/// The root disk's advertised capacity in 512-byte sectors: 64 GiB,
/// whatever the image's size, so that the guest sees the same disk under
/// every image and one VM template fits them all. The image lies at the
/// disk's start and EROFS reads only its own blocks; the guest sees the
/// rest as zeros. An image larger than this cannot be attached.
pub const ROOT_DISK_SECTORS: u64 = (64 << 30) / 512;

/// `mvm.agent=1`, as the VMM passes it.
pub fn agent_param() -> String {
    format!("{AGENT_PARAM}=1")
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    #[error("odd number of hex digits ({0})")]
    OddLength(usize),
    #[error("bad hex digit {digit:?} at offset {offset}")]
    BadDigit { offset: usize, digit: char },
}

/// Lowercase hex: keeps arbitrary bytes (spaces, quotes, `=`) away from
/// the kernel's own command-line parser.
pub fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes hex (either case accepted) into bytes.
pub fn decode_hex(hex: &str) -> Result<Vec<u8>, HexError> {
    let digits = hex.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return Err(HexError::OddLength(digits.len()));
    }
    let nibble = |offset: usize| {
        let digit = char::from(digits[offset]);
        digit
            .to_digit(16)
            .map(|v| v as u8)
            .ok_or(HexError::BadDigit { offset, digit })
    };
    (0..digits.len())
        .step_by(2)
        .map(|i| Ok((nibble(i)? << 4) | nibble(i + 1)?))
        .collect()
}

/// What is wrong with one `mvm.mount` value.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MountProblem {
    #[error("expected <tag>,<ro|rw>,<hex of the guest path>")]
    Fields,
    #[error("the tag must be 1 to {MAX_TAG_LEN} of A-Z a-z 0-9 _ -")]
    Tag,
    #[error("the mode must be ro or rw")]
    Mode,
    #[error("path: {0}")]
    Hex(HexError),
    #[error("the path must be absolute")]
    NotAbsolute,
    #[error("the path contains a NUL byte")]
    Nul,
    #[error("the path must not contain a .. component")]
    DotDot,
    #[error("the path must not be /")]
    Root,
}

/// One virtio-fs share as `mvm.mount` carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountParam {
    /// The virtio-fs device's tag: the mount source.
    pub tag: String,
    pub read_only: bool,
    /// Absolute guest path, neither `/` nor with `..` components.
    pub path: Vec<u8>,
}

impl MountParam {
    /// The whole `mvm.mount=...` kernel parameter.
    pub fn to_param(&self) -> String {
        format!(
            "{MOUNT_PARAM}={},{},{}",
            self.tag,
            if self.read_only { "ro" } else { "rw" },
            encode_hex(&self.path)
        )
    }

    /// Decodes one `mvm.mount` value (after the `=`), refusing anything
    /// guest-init must not mount.
    pub fn decode(value: &str) -> Result<Self, MountProblem> {
        let fields: Vec<&str> = value.split(',').collect();
        let [tag, mode, path] = fields[..] else {
            return Err(MountProblem::Fields);
        };
        if !tag_is_valid(tag) {
            return Err(MountProblem::Tag);
        }
        let read_only = match mode {
            "ro" => true,
            "rw" => false,
            _ => return Err(MountProblem::Mode),
        };
        let path = decode_hex(path).map_err(MountProblem::Hex)?;
        if path.first() != Some(&b'/') {
            return Err(MountProblem::NotAbsolute);
        }
        if path.contains(&0) {
            return Err(MountProblem::Nul);
        }
        let components: Vec<&[u8]> = path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        if components.iter().any(|c| *c == b"..") {
            return Err(MountProblem::DotDot);
        }
        if components.is_empty() {
            // `/`, and spellings of it such as `//` or `/.`.
            return Err(MountProblem::Root);
        }
        Ok(Self {
            tag: tag.to_string(),
            read_only,
            path,
        })
    }
}

/// The image root as `mvm.root` carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootParam {
    /// What lies under the overlay.
    pub lower: RootLower,
    /// Most bytes the command may write anywhere in the root (the
    /// overlay's tmpfs upper layer; it counts against guest memory).
    pub scratch_bytes: u64,
}

/// The root's read-only lower layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootLower {
    /// The EROFS image on block device [`ROOT_DEVICE`]: `vda,erofs,N`.
    Disk,
    /// A host directory the VMM serves over virtio-fs, mounted by its tag
    /// (`mvm run --rootfs DIR`): `TAG,virtiofs,N`.
    Share(String),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RootProblem {
    #[error("expected <device>,erofs,<scratch bytes> or <tag>,virtiofs,<scratch bytes>")]
    Fields,
    #[error("the device must be {ROOT_DEVICE}")]
    Device,
    #[error("the tag must be 1 to {MAX_TAG_LEN} of A-Z a-z 0-9 _ -")]
    Tag,
    #[error("the filesystem must be erofs or virtiofs")]
    Fstype,
    #[error("the scratch size must be a number of bytes above 0")]
    Scratch,
}

impl RootParam {
    /// The whole `mvm.root=...` kernel parameter.
    pub fn to_param(&self) -> String {
        match &self.lower {
            RootLower::Disk => format!("{ROOT_PARAM}={ROOT_DEVICE},erofs,{}", self.scratch_bytes),
            RootLower::Share(tag) => format!("{ROOT_PARAM}={tag},virtiofs,{}", self.scratch_bytes),
        }
    }

    /// Decodes one `mvm.root` value (after the `=`).
    pub fn decode(value: &str) -> Result<Self, RootProblem> {
        let fields: Vec<&str> = value.split(',').collect();
        let [source, fstype, scratch] = fields[..] else {
            return Err(RootProblem::Fields);
        };
        let lower = match fstype {
            "erofs" if source == ROOT_DEVICE => RootLower::Disk,
            "erofs" => return Err(RootProblem::Device),
            "virtiofs" if tag_is_valid(source) => RootLower::Share(source.to_string()),
            "virtiofs" => return Err(RootProblem::Tag),
            _ => return Err(RootProblem::Fstype),
        };
        match scratch.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Self {
                lower,
                scratch_bytes: n,
            }),
            _ => Err(RootProblem::Scratch),
        }
    }
}

/// 1 to [`MAX_TAG_LEN`] of A-Z a-z 0-9 _ -.
pub fn tag_is_valid(tag: &str) -> bool {
    (1..=MAX_TAG_LEN).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The bounce pool's guest-physical pages, from one kernel log record
/// that says where it lies ([`BOUNCE_POOL_LOG`]): its start rounded down
/// and its end (exclusive, or the last byte) rounded up to pages.
pub fn bounce_pool_from_log(record: &str) -> Option<std::ops::Range<u64>> {
    const PAGE: u64 = 4096;
    let rest = &record[record.find(BOUNCE_POOL_LOG)? + BOUNCE_POOL_LOG.len()..];
    let (span, _) = rest.split_once(']')?;
    let (start, end) = span.split_once('-')?;
    let hex = |s: &str| u64::from_str_radix(s.trim().strip_prefix("0x")?, 16).ok();
    let (start, end) = (hex(start)?, hex(end)?);
    let start = start / PAGE * PAGE;
    let end = end.checked_add(PAGE - 1)? / PAGE * PAGE;
    (start < end).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode_hex(&encode_hex(&all)).unwrap(), all);
        assert_eq!(decode_hex("6A6b").unwrap(), b"jk");
        assert_eq!(decode_hex("6").unwrap_err(), HexError::OddLength(1));
        assert_eq!(
            decode_hex("6g").unwrap_err(),
            HexError::BadDigit {
                offset: 1,
                digit: 'g'
            }
        );
    }

    #[test]
    fn the_bounce_pool_is_8_mib_in_areas_that_each_hold_twice_a_full_queue() {
        // Read as the kernel reads it (`setup_io_tlb_npages`): slabs,
        // areas, then `force`.
        let value = BOUNCE_PARAM.strip_prefix("swiotlb=").unwrap();
        let fields: Vec<&str> = value.split(',').collect();
        let [slabs, areas, "force"] = fields[..] else {
            panic!("{BOUNCE_PARAM}");
        };
        let (slabs, areas): (u64, u64) = (slabs.parse().unwrap(), areas.parse().unwrap());
        const SLAB: u64 = 2048;
        assert_eq!(slabs * SLAB, BOUNCE_POOL_BYTES);
        assert_eq!(BOUNCE_POOL_BYTES, 8 << 20);
        // The kernel rounds an area count up to a power of two, and where
        // an area would hold fewer slabs than one largest mapping
        // (IO_TLB_SEGSIZE, 128) it grows the pool to fit: then neither the
        // count nor the size written here is the one in use.
        assert!(areas.is_power_of_two(), "{areas}");
        assert!(slabs / areas >= 128, "{areas}");
        // A vCPU's own area holds twice what the virtio-fs request queue
        // can have in flight: 256 page buffers.
        assert!(slabs / areas * SLAB >= 2 * 256 * 4096, "{areas}");
    }

    #[test]
    fn a_mount_param_the_vmm_writes_is_what_guest_init_reads() {
        let share = MountParam {
            tag: "mvm0".into(),
            read_only: true,
            path: b"/workspace dir/=x".to_vec(),
        };
        let param = share.to_param();
        let value = param.strip_prefix("mvm.mount=").unwrap();
        assert!(!value.contains(' '), "{value}");
        assert_eq!(MountParam::decode(value).unwrap(), share);
        let rw = MountParam {
            read_only: false,
            ..share
        };
        assert_eq!(
            MountParam::decode(rw.to_param().strip_prefix("mvm.mount=").unwrap()).unwrap(),
            rw
        );
    }

    #[test]
    fn a_root_param_the_vmm_writes_is_what_guest_init_reads() {
        let root = RootParam {
            lower: RootLower::Disk,
            scratch_bytes: 256 << 20,
        };
        let param = root.to_param();
        assert_eq!(param, "mvm.root=vda,erofs,268435456");
        let value = param.strip_prefix("mvm.root=").unwrap();
        assert_eq!(RootParam::decode(value), Ok(root));
        let dir = RootParam {
            lower: RootLower::Share("mvm0".into()),
            scratch_bytes: 1 << 20,
        };
        assert_eq!(dir.to_param(), "mvm.root=mvm0,virtiofs,1048576");
        assert_eq!(RootParam::decode("mvm0,virtiofs,1048576"), Ok(dir));
        assert_eq!(RootParam::decode("vdb,erofs,1"), Err(RootProblem::Device));
        assert_eq!(RootParam::decode(",virtiofs,1"), Err(RootProblem::Tag));
        assert_eq!(RootParam::decode("a b,virtiofs,1"), Err(RootProblem::Tag));
        assert_eq!(RootParam::decode("vda,ext4,1"), Err(RootProblem::Fstype));
        assert_eq!(RootParam::decode("vda,erofs,0"), Err(RootProblem::Scratch));
        assert_eq!(RootParam::decode("vda,erofs,-1"), Err(RootProblem::Scratch));
        assert_eq!(RootParam::decode("vda,erofs"), Err(RootProblem::Fields));
    }

    #[test]
    fn the_agent_param_is_what_guest_init_looks_for() {
        assert_eq!(agent_param(), "mvm.agent=1");
    }

    #[test]
    fn the_bounce_pool_is_read_from_the_kernels_record() {
        let record = "6,41,123456,-;software IO TLB: mapped \
                      [mem 0x000000001e000000-0x000000001f000000] (16MB)\n";
        assert_eq!(bounce_pool_from_log(record), Some(0x1e00_0000..0x1f00_0000));
        // An inclusive end is rounded up to the page it ends.
        let inclusive = "software IO TLB: mapped [mem 0x1000-0x2fff] (0MB)";
        assert_eq!(bounce_pool_from_log(inclusive), Some(0x1000..0x3000));
        for other in [
            "6,42,1,-;software IO TLB: No low mem",
            "software IO TLB: mapped [mem 0x2000-0x1000] (0MB)",
            "software IO TLB: mapped [mem 0x2000-] (0MB)",
            "software IO TLB: mapped [mem zz-0x3000] (0MB)",
            "virtio-fs: mapped [mem 0x1000-0x3000]",
        ] {
            assert_eq!(bounce_pool_from_log(other), None, "{other}");
        }
    }
}
