//! Boot-vCPU register state for the Linux 64-bit boot protocol: long mode,
//! paging on with an identity map of the first GiB, flat segments from the
//! boot GDT, `rsi` pointing at `boot_params`.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::gdt::{self, BOOT_GDT};
use super::layout::{
    BOOT_STACK_POINTER, GDT_START, IDT_START, PDE_START, PDPTE_START, PML4_START, ZERO_PAGE_START,
};

const X86_CR0_PE: u64 = 1 << 0;
const X86_CR0_ET: u64 = 1 << 4;
const X86_CR0_PG: u64 = 1 << 31;
const X86_CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// Present + writable; with PAGE_SIZE set on a PD entry it maps 2 MiB.
const PTE_PRESENT_RW: u64 = 0x3;
const PDE_2M_PAGE: u64 = 0x80;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot write the boot GDT/IDT into guest memory")]
    WriteGdt,
    #[error("cannot write the boot page tables into guest memory")]
    WritePageTables,
}

/// General-purpose registers at the kernel's 64-bit entry point.
pub fn boot_regs(entry: GuestAddress) -> kvm_regs {
    kvm_regs {
        rflags: 0x2, // bit 1 is reserved and must be set
        rip: entry.0,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_START,
        ..Default::default()
    }
}

/// x87/SSE state as after FNINIT, with all SSE exceptions masked.
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

/// Writes the boot GDT, an empty IDT and the identity page tables into
/// guest memory, and sets `sregs` (taken from the vCPU) to use them.
pub fn setup_sregs(mem: &GuestMemoryMmap, sregs: &mut kvm_sregs) -> Result<(), Error> {
    write_gdt(mem)?;
    write_page_tables(mem)?;

    let code = gdt::segment(BOOT_GDT[gdt::CODE_SELECTOR_INDEX], gdt::CODE_SELECTOR_INDEX);
    let data = gdt::segment(BOOT_GDT[gdt::DATA_SELECTOR_INDEX], gdt::DATA_SELECTOR_INDEX);
    let tss = gdt::segment(BOOT_GDT[gdt::TSS_SELECTOR_INDEX], gdt::TSS_SELECTOR_INDEX);

    sregs.gdt.base = GDT_START;
    sregs.gdt.limit = (std::mem::size_of_val(&BOOT_GDT) - 1) as u16;
    sregs.idt.base = IDT_START;
    sregs.idt.limit = (std::mem::size_of::<u64>() - 1) as u16;
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;

    sregs.cr3 = PML4_START;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.cr0 |= X86_CR0_PE | X86_CR0_ET | X86_CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
    Ok(())
}

fn write_gdt(mem: &GuestMemoryMmap) -> Result<(), Error> {
    for (i, entry) in BOOT_GDT.iter().enumerate() {
        let addr = GuestAddress(GDT_START + (i * 8) as u64);
        mem.write_obj(*entry, addr).map_err(|_| Error::WriteGdt)?;
    }
    mem.write_obj(0u64, GuestAddress(IDT_START))
        .map_err(|_| Error::WriteGdt)
}

/// PML4[0] -> PDPT[0] -> PD with 512 2 MiB pages: virtual = physical for
/// the first GiB, enough for the kernel's startup code to build its own.
fn write_page_tables(mem: &GuestMemoryMmap) -> Result<(), Error> {
    let w = |val: u64, addr: u64| {
        mem.write_obj(val, GuestAddress(addr))
            .map_err(|_| Error::WritePageTables)
    };
    w(PDPTE_START | PTE_PRESENT_RW, PML4_START)?;
    w(PDE_START | PTE_PRESENT_RW, PDPTE_START)?;
    for i in 0..512u64 {
        w((i << 21) | PDE_2M_PAGE | PTE_PRESENT_RW, PDE_START + i * 8)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    fn read(mem: &GuestMemoryMmap, addr: u64) -> u64 {
        mem.read_obj(GuestAddress(addr)).unwrap()
    }

    #[test]
    fn page_tables_identity_map_first_gib() {
        let m = mem();
        let mut sregs = kvm_sregs::default();
        setup_sregs(&m, &mut sregs).unwrap();
        assert_eq!(read(&m, PML4_START), 0xa003);
        assert_eq!(read(&m, PDPTE_START), 0xb003);
        assert_eq!(read(&m, PDE_START), 0x83);
        assert_eq!(read(&m, PDE_START + 8), 0x20_0083);
        assert_eq!(read(&m, PDE_START + 511 * 8), (511 << 21) | 0x83);
    }

    #[test]
    fn sregs_enter_long_mode_with_boot_selectors() {
        let m = mem();
        let mut sregs = kvm_sregs::default();
        setup_sregs(&m, &mut sregs).unwrap();
        assert_eq!(sregs.cr3, PML4_START);
        assert_eq!(
            sregs.cr0 & (X86_CR0_PE | X86_CR0_PG),
            X86_CR0_PE | X86_CR0_PG
        );
        assert_ne!(sregs.cr4 & X86_CR4_PAE, 0);
        assert_eq!(sregs.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(sregs.cs.selector, 0x10);
        assert_eq!(sregs.ds.selector, 0x18);
        assert_eq!(sregs.ss.selector, 0x18);
        assert_eq!(sregs.gdt.base, GDT_START);
        assert_eq!(sregs.gdt.limit, 39);
        for (i, e) in BOOT_GDT.iter().enumerate() {
            assert_eq!(read(&m, GDT_START + 8 * i as u64), *e);
        }
        assert_eq!(read(&m, IDT_START), 0);
    }

    #[test]
    fn regs_point_at_entry_and_zero_page() {
        let r = boot_regs(GuestAddress(0x100_0000));
        assert_eq!(
            (r.rip, r.rsi, r.rsp, r.rflags),
            (0x100_0000, 0x7000, 0x8ff0, 2)
        );
        let f = boot_fpu();
        assert_eq!((f.fcw, f.mxcsr), (0x37f, 0x1f80));
    }

    #[test]
    fn too_small_memory_is_an_error() {
        let tiny = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        assert!(setup_sregs(&tiny, &mut kvm_sregs::default()).is_err());
    }
}
