//! The flat GDT the boot vCPU enters 64-bit mode with, and the conversion
//! of its entries into KVM segment registers.

use kvm_bindings::kvm_segment;

/// The selectors the x86 boot protocol (Documentation/arch/x86/boot.rst)
/// names for the 64-bit entry: flat `__BOOT_CS` = 0x10 and `__BOOT_DS` =
/// 0x18, so entries 0 and 1 are null; a TSS follows for KVM's sake.
pub const BOOT_GDT: [u64; 5] = [
    gdt_entry(0, 0, 0),            // null
    gdt_entry(0, 0, 0),            // unused
    gdt_entry(0xa09b, 0, 0xfffff), // code: present, exec/read, long mode, 4K gran
    gdt_entry(0xc093, 0, 0xfffff), // data: present, read/write, 32-bit, 4K gran
    gdt_entry(0x808b, 0, 0xfffff), // TSS: present, busy 64-bit TSS
];
pub const CODE_SELECTOR_INDEX: usize = 2;
pub const DATA_SELECTOR_INDEX: usize = 3;
pub const TSS_SELECTOR_INDEX: usize = 4;

/// Packs a segment descriptor from its flags (access byte in bits 0-7,
/// granularity/size/long in bits 12-15), base and 20-bit limit.
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << (56 - 24))
        | ((flags as u64 & 0x0000_f0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << (48 - 16))
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

fn base(entry: u64) -> u64 {
    ((entry & 0xff00_0000_0000_0000) >> 32)
        | ((entry & 0x0000_00ff_0000_0000) >> 16)
        | ((entry & 0x0000_0000_ffff_0000) >> 16)
}

fn limit(entry: u64) -> u32 {
    let raw = ((entry & 0x000f_0000_0000_0000) >> 32) | (entry & 0xffff);
    // With 4 KiB granularity the limit counts pages.
    if entry & (1 << 55) != 0 {
        ((raw << 12) | 0xfff) as u32
    } else {
        raw as u32
    }
}

/// The KVM view of descriptor `index` of [`BOOT_GDT`].
pub fn segment(entry: u64, index: usize) -> kvm_segment {
    let bit = |n: u32| ((entry >> n) & 1) as u8;
    kvm_segment {
        base: base(entry),
        limit: limit(entry),
        selector: (index * 8) as u16,
        type_: ((entry >> 40) & 0xf) as u8,
        present: bit(47),
        dpl: ((entry >> 45) & 0x3) as u8,
        db: bit(54),
        s: bit(44),
        l: bit(53),
        g: bit(55),
        avl: bit(52),
        unusable: if bit(47) == 1 { 0 } else { 1 },
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_match_known_encodings() {
        // The encodings every x86 VMM (and the kernel's own boot GDT) uses.
        assert_eq!(BOOT_GDT[0], 0);
        assert_eq!(BOOT_GDT[1], 0);
        assert_eq!(BOOT_GDT[2], 0x00af_9b00_0000_ffff);
        assert_eq!(BOOT_GDT[3], 0x00cf_9300_0000_ffff);
        assert_eq!(BOOT_GDT[4], 0x008f_8b00_0000_ffff);
    }

    #[test]
    fn code_segment_is_long_mode_ring0() {
        let cs = segment(BOOT_GDT[CODE_SELECTOR_INDEX], CODE_SELECTOR_INDEX);
        assert_eq!(cs.selector, 0x10);
        assert_eq!((cs.l, cs.db, cs.dpl, cs.present, cs.s), (1, 0, 0, 1, 1));
        assert_eq!(cs.type_, 0xb);
        assert_eq!(cs.limit, 0xffff_ffff);
        assert_eq!(cs.base, 0);
    }

    #[test]
    fn data_and_tss_segments() {
        let ds = segment(BOOT_GDT[DATA_SELECTOR_INDEX], DATA_SELECTOR_INDEX);
        assert_eq!((ds.selector, ds.type_, ds.db, ds.l), (0x18, 3, 1, 0));
        let tss = segment(BOOT_GDT[TSS_SELECTOR_INDEX], TSS_SELECTOR_INDEX);
        assert_eq!((tss.selector, tss.type_, tss.s), (0x20, 0xb, 0));
    }

    #[test]
    fn base_and_byte_granular_limit_round_trip() {
        let e = gdt_entry(0x0093, 0x1234_5678, 0xabcde);
        let s = segment(e, 5);
        assert_eq!(s.base, 0x1234_5678);
        assert_eq!(s.limit, 0xabcde);
        assert_eq!(s.g, 0);
        assert_eq!(s.unusable, 0);
        assert_eq!(segment(0, 0).unusable, 1);
    }
}
