//! The Linux "zero page" (`struct boot_params`): the e820 memory map, where
//! the command line and initramfs are, and the loader identification the
//! boot protocol asks for. linux-loader provides the structure and writes
//! it; this module decides what goes in it.

use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::layout::{
    BASE_MEMORY_END, CMDLINE_START, EBDA_START, HIMEM_START, MMIO_GAP_END, MMIO_GAP_START,
    ZERO_PAGE_START,
};

pub const E820_RAM: u32 = 1;
pub const E820_RESERVED: u32 = 2;

const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448; // "HdrS"
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x100_0000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot write boot_params into guest memory: {0}")]
    Write(linux_loader::configurator::Error),
}

/// Where the VMM put the pieces the kernel must find.
pub struct BootInputs {
    pub mem_size: u64,
    /// Length of the command line in bytes, without the NUL.
    pub cmdline_len: usize,
    pub initrd: Option<(GuestAddress, usize)>,
    /// The bzImage's own setup header; `None` for an ELF vmlinux.
    pub setup_header: Option<setup_header>,
}

/// The e820 map for `mem_size` bytes of RAM laid out as memory.rs does:
/// base memory with the MP table area reserved, high memory up to the MMIO
/// gap, and the rest above 4 GiB.
pub fn e820_map(mem_size: u64) -> Vec<boot_e820_entry> {
    let entry = |addr, size, r#type| boot_e820_entry { addr, size, r#type };
    let mut map = vec![
        entry(0, EBDA_START, E820_RAM),
        entry(EBDA_START, BASE_MEMORY_END - EBDA_START, E820_RESERVED),
    ];
    let low_end = mem_size.min(MMIO_GAP_START);
    if low_end > HIMEM_START {
        map.push(entry(HIMEM_START, low_end - HIMEM_START, E820_RAM));
    }
    if mem_size > MMIO_GAP_START {
        map.push(entry(MMIO_GAP_END, mem_size - MMIO_GAP_START, E820_RAM));
    }
    map
}

pub fn build(inputs: &BootInputs) -> boot_params {
    let mut params = boot_params::default();
    if let Some(hdr) = inputs.setup_header {
        params.hdr = hdr;
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT_BYTES;
    params.hdr.cmd_line_ptr = CMDLINE_START as u32;
    params.hdr.cmdline_size = inputs.cmdline_len as u32;
    if let Some((addr, size)) = inputs.initrd {
        params.hdr.ramdisk_image = addr.0 as u32;
        params.hdr.ramdisk_size = size as u32;
    }
    let map = e820_map(inputs.mem_size);
    params.e820_entries = map.len() as u8;
    params.e820_table[..map.len()].copy_from_slice(&map);
    params
}

pub fn write(mem: &GuestMemoryMmap, params: &boot_params) -> Result<(), Error> {
    LinuxBootConfigurator::write_bootparams::<GuestMemoryMmap>(
        &BootParams::new::<boot_params>(params, GuestAddress(ZERO_PAGE_START)),
        mem,
    )
    .map_err(Error::Write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{ByteValued, Bytes};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn flat(map: &[boot_e820_entry]) -> Vec<(u64, u64, u32)> {
        map.iter().map(|e| (e.addr, e.size, e.r#type)).collect()
    }

    #[test]
    fn e820_small_guest() {
        assert_eq!(
            flat(&e820_map(128 * MIB)),
            vec![
                (0, 0x9fc00, E820_RAM),
                (0x9fc00, 0x400, E820_RESERVED),
                (0x10_0000, 127 * MIB, E820_RAM),
            ]
        );
    }

    #[test]
    fn e820_guest_larger_than_the_gap_continues_above_4g() {
        let map = flat(&e820_map(4 * GIB));
        assert_eq!(map[2], (0x10_0000, 0xd000_0000 - 0x10_0000, E820_RAM));
        assert_eq!(map[3], (4 * GIB, 4 * GIB - 0xd000_0000, E820_RAM));
        let ram: u64 = map.iter().filter(|e| e.2 == E820_RAM).map(|e| e.1).sum();
        // Only the legacy hole (0x9fc00..1 MiB) is missing from the RAM total.
        assert_eq!(ram, 4 * GIB - (0x10_0000 - 0x9fc00));
    }

    #[test]
    fn header_fields_at_their_boot_protocol_offsets() {
        let params = build(&BootInputs {
            mem_size: 256 * MIB,
            cmdline_len: 42,
            initrd: Some((GuestAddress(0x0f00_0000), 0x1234)),
            setup_header: None,
        });
        let bytes = params.as_slice();
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap());
        // Offsets from Documentation/arch/x86/boot.rst and zero-page.rst.
        assert_eq!(u16_at(0x1fe), 0xaa55);
        assert_eq!(u32_at(0x202), 0x5372_6448);
        assert_eq!(bytes[0x210], 0xff);
        assert_eq!(u32_at(0x218), 0x0f00_0000);
        assert_eq!(u32_at(0x21c), 0x1234);
        assert_eq!(u32_at(0x228), 0x20000);
        assert_eq!(u32_at(0x230), 0x100_0000);
        assert_eq!(u32_at(0x238), 42);
        assert_eq!(bytes[0x1e8], 3);
        // First e820 entry at 0x2d0: addr, size, type (20 bytes each).
        assert_eq!(u32_at(0x2d0 + 8), 0x9fc00);
        assert_eq!(u32_at(0x2d0 + 16), E820_RAM);
        assert_eq!(u32_at(0x2d0 + 2 * 20 + 16), E820_RAM);
    }

    #[test]
    fn bzimage_header_is_kept_and_loader_fields_overridden() {
        let hdr = setup_header {
            version: 0x20f,
            setup_sects: 27,
            ..Default::default()
        };
        let params = build(&BootInputs {
            mem_size: 64 * MIB,
            cmdline_len: 1,
            initrd: None,
            setup_header: Some(hdr),
        });
        assert_eq!({ params.hdr.version }, 0x20f);
        assert_eq!(params.hdr.setup_sects, 27);
        assert_eq!(params.hdr.type_of_loader, 0xff);
        assert_eq!({ params.hdr.ramdisk_image }, 0);
    }

    #[test]
    fn written_into_the_zero_page() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let params = build(&BootInputs {
            mem_size: 64 * MIB,
            cmdline_len: 1,
            initrd: None,
            setup_header: None,
        });
        write(&mem, &params).unwrap();
        let magic: u32 = mem.read_obj(GuestAddress(ZERO_PAGE_START + 0x202)).unwrap();
        assert_eq!(magic, 0x5372_6448);
    }
}
