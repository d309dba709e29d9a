//! Every guest physical address and port mvm uses, in one place.
//!
//! Low memory, as the 64-bit Linux boot protocol and the MP spec need it:
//!
//! ```text
//! 0x0000_0500  GDT (5 entries)            0x0000_0530  IDT (empty)
//! 0x0000_7000  boot_params (zero page)    0x0000_8ff0  boot stack top
//! 0x0000_9000  PML4  0x0000_a000  PDPT    0x0000_b000  PD (1 GiB identity map)
//! 0x0002_0000  kernel command line (2 KiB)
//! 0x0009_fc00  MP floating pointer + table (last KiB of base memory: the
//!              guest scans there; reserved in e820)
//! 0x0010_0000  high memory: the kernel loads here or at its ELF p_paddr
//! ...          initramfs, page aligned at the top of RAM below the gap
//! 0xd000_0000  MMIO gap (virtio-mmio devices) up to 4 GiB; RAM beyond
//!              MMIO_GAP_START continues at 4 GiB
//! 0xfec0_0000  IOAPIC   0xfee0_0000  LAPIC (in-kernel irqchip)
//! ```

/// Global descriptor table used for the 64-bit entry.
pub const GDT_START: u64 = 0x500;
/// Interrupt descriptor table (empty: the kernel installs its own).
pub const IDT_START: u64 = 0x530;
/// The Linux `boot_params` structure ("zero page"); `rsi` points here.
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack pointer for the boot vCPU.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Identity-mapping page tables: one PML4, one PDPT, one PD of 2 MiB pages.
pub const PML4_START: u64 = 0x9000;
pub const PDPTE_START: u64 = 0xa000;
pub const PDE_START: u64 = 0xb000;
/// The kernel command line and its maximum size (x86 COMMAND_LINE_SIZE).
pub const CMDLINE_START: u64 = 0x20000;
pub const CMDLINE_MAX_SIZE: usize = 2048;
/// Start of the extended BIOS data area; the MP table lives here.
pub const EBDA_START: u64 = 0x9fc00;
/// End of conventional memory.
pub const BASE_MEMORY_END: u64 = 0xa0000;
/// First address above the legacy hole: where high RAM starts.
pub const HIMEM_START: u64 = 0x10_0000;
/// Device MMIO window between low RAM and 4 GiB.
pub const MMIO_GAP_START: u64 = 0xd000_0000;
pub const MMIO_GAP_END: u64 = 1 << 32;
/// Where KVM keeps its real-mode TSS and identity map (Intel VMX needs them
/// below 4 GiB and outside RAM): the three pages below the BIOS ROM.
pub const KVM_TSS_ADDRESS: u64 = 0xfffb_d000;
/// Default IOAPIC and local APIC addresses, as written in the MP table.
pub const IOAPIC_START: u64 = 0xfec0_0000;
pub const APIC_START: u64 = 0xfee0_0000;

/// virtio-mmio devices: one 4 KiB window each from the start of the MMIO
/// gap, and one IOAPIC pin each from VIRTIO_IRQ_BASE (5-23 are free: 4 is
/// the UART, 0-3 and the rest of the ISA range are legacy).
pub const VIRTIO_MMIO_BASE: u64 = MMIO_GAP_START;
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
pub const VIRTIO_IRQ_BASE: u32 = 5;
pub const VIRTIO_IRQ_LAST: u32 = 23;

/// The 8250 console: COM1 and its legacy IRQ.
pub const SERIAL_PORT: u64 = 0x3f8;
pub const SERIAL_PORT_LEN: u64 = 8;
pub const SERIAL_IRQ: u32 = 4;
/// i8042 data (0x60) through command (0x64) ports.
pub const I8042_PORT: u64 = 0x60;
pub const I8042_PORT_LEN: u64 = 5;
/// mvm's status port (boot markers, the command's exit status): its
/// address is part of the boot contract guest-init shares
/// (`mvm_protocol::boot`).
pub const MVM_STATUS_PORT: u64 = mvm_protocol::boot::STATUS_PORT as u64;
pub const MVM_STATUS_PORT_LEN: u64 = mvm_protocol::boot::STATUS_PORT_LEN as u64;

/// Page size used for initramfs alignment.
pub const PAGE_SIZE: u64 = 0x1000;
