//! The Intel MultiProcessor Specification 1.4 table: how a guest without
//! ACPI learns how many CPUs it has, where the IOAPIC is and how the ISA
//! IRQs are wired. Written at the start of the EBDA, which Linux scans.
//!
//! Built byte by byte in little-endian order (the spec's structures are
//! packed), so the tests can check offsets against the spec directly.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{APIC_START, BASE_MEMORY_END, EBDA_START, IOAPIC_START};

/// The most vCPUs whose entries fit, with the fixed entries, in the KiB
/// between EBDA_START and the end of base memory.
pub const MAX_CPUS: u8 = 32;
/// IOAPIC pins wired one to one to ISA IRQs.
const IRQ_COUNT: u8 = 24;
const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const SPEC_REV: u8 = 4;

const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;
const CPU_ENABLED: u8 = 1;
const CPU_BOOT_PROCESSOR: u8 = 2;
/// Family 6, model 1, stepping 3, as in the CPU signature field.
const CPU_SIGNATURE: u32 = (6 << 8) | (1 << 4) | 3;
/// CPUID feature flags claimed for each CPU: FPU and APIC present.
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9);
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;

const FLOATING_POINTER_LEN: usize = 16;
const HEADER_LEN: usize = 44;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{0} vCPUs requested; the MP table (no ACPI) describes at most {MAX_CPUS}")]
    TooManyCpus(u8),
    #[error("cannot write the MP table into guest memory")]
    Write,
}

/// Builds the floating pointer structure followed by the configuration table,
/// for placement at `base`.
pub fn build(cpu_count: u8, base: u64) -> Result<Vec<u8>, Error> {
    if cpu_count == 0 || cpu_count > MAX_CPUS {
        return Err(Error::TooManyCpus(cpu_count));
    }
    let ioapic_id = cpu_count + 1;
    let mut entries = Vec::new();
    let mut entry_count: u16 = 0;

    for cpu in 0..cpu_count {
        let flags = CPU_ENABLED | if cpu == 0 { CPU_BOOT_PROCESSOR } else { 0 };
        entries.extend([ENTRY_PROCESSOR, cpu, APIC_VERSION, flags]);
        entries.extend(CPU_SIGNATURE.to_le_bytes());
        entries.extend(CPU_FEATURES.to_le_bytes());
        entries.extend([0u8; 8]);
        entry_count += 1;
    }
    entries.extend([ENTRY_BUS, 0]);
    entries.extend(*b"ISA   ");
    entry_count += 1;
    entries.extend([ENTRY_IOAPIC, ioapic_id, IOAPIC_VERSION, CPU_ENABLED]);
    entries.extend((IOAPIC_START as u32).to_le_bytes());
    entry_count += 1;
    for irq in 0..IRQ_COUNT {
        // Flags 0: polarity and trigger mode conform to the (ISA) bus.
        entries.extend([
            ENTRY_IO_INTERRUPT,
            INT_TYPE_INT,
            0,
            0,
            0,
            irq,
            ioapic_id,
            irq,
        ]);
        entry_count += 1;
    }
    // LINT0 of every local APIC is ExtINT, LINT1 is NMI (0xff: all APICs).
    entries.extend([ENTRY_LOCAL_INTERRUPT, INT_TYPE_EXTINT, 0, 0, 0, 0, 0, 0]);
    entries.extend([ENTRY_LOCAL_INTERRUPT, INT_TYPE_NMI, 0, 0, 0, 0, 0xff, 1]);
    entry_count += 2;

    let table_len = HEADER_LEN + entries.len();
    let mut table = Vec::with_capacity(table_len);
    table.extend(*b"PCMP");
    table.extend((table_len as u16).to_le_bytes());
    table.push(SPEC_REV);
    table.push(0); // checksum, below
    table.extend(*b"MVM     ");
    table.extend(*b"MICROVM     ");
    table.extend(0u32.to_le_bytes()); // OEM table pointer
    table.extend(0u16.to_le_bytes()); // OEM table size
    table.extend(entry_count.to_le_bytes());
    table.extend((APIC_START as u32).to_le_bytes());
    table.extend(0u32.to_le_bytes()); // extended table length, checksum
    debug_assert_eq!(table.len(), HEADER_LEN);
    table.extend(entries);
    table[7] = checksum(&table);

    let table_addr = base + FLOATING_POINTER_LEN as u64;
    let mut out = Vec::with_capacity(FLOATING_POINTER_LEN + table_len);
    out.extend(*b"_MP_");
    out.extend((table_addr as u32).to_le_bytes());
    out.push(1); // length in 16-byte units
    out.push(SPEC_REV);
    out.push(0); // checksum, below
    out.extend([0u8; 5]); // feature bytes: 0 = a configuration table follows
    out[10] = checksum(&out);
    out.extend(table);
    Ok(out)
}

/// Writes the table for `cpu_count` vCPUs at the start of the EBDA.
pub fn setup(mem: &GuestMemoryMmap, cpu_count: u8) -> Result<(), Error> {
    let bytes = build(cpu_count, EBDA_START)?;
    // MAX_CPUS is chosen so this holds; the check keeps it true if entries
    // are ever added.
    if EBDA_START + bytes.len() as u64 > BASE_MEMORY_END {
        return Err(Error::TooManyCpus(cpu_count));
    }
    mem.write_slice(&bytes, GuestAddress(EBDA_START))
        .map_err(|_| Error::Write)
}

/// The byte that makes the sum of all bytes zero (mod 256).
fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |acc, b| acc.wrapping_add(*b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    #[test]
    fn floating_pointer_per_spec() {
        let t = build(2, EBDA_START).unwrap();
        assert_eq!(&t[0..4], b"_MP_");
        assert_eq!(
            u32::from_le_bytes(t[4..8].try_into().unwrap()),
            EBDA_START as u32 + 16
        );
        assert_eq!((t[8], t[9]), (1, 4));
        assert_eq!(sum(&t[..16]), 0);
        assert_eq!(&t[11..16], &[0; 5]);
    }

    #[test]
    fn config_table_header_per_spec() {
        let cpus = 3;
        let t = build(cpus, EBDA_START).unwrap();
        let table = &t[16..];
        assert_eq!(&table[0..4], b"PCMP");
        let len = u16::from_le_bytes([table[4], table[5]]) as usize;
        assert_eq!(len, table.len());
        // 3 CPUs x 20 + bus 8 + IOAPIC 8 + 24 IRQs x 8 + 2 local x 8.
        assert_eq!(len, 44 + 60 + 8 + 8 + 192 + 16);
        assert_eq!(table[6], 4);
        assert_eq!(sum(table), 0);
        assert_eq!(
            u16::from_le_bytes([table[34], table[35]]),
            3 + 1 + 1 + 24 + 2
        );
        assert_eq!(
            u32::from_le_bytes(table[36..40].try_into().unwrap()),
            0xfee0_0000
        );
    }

    #[test]
    fn processor_entries_mark_only_cpu0_as_boot() {
        let t = build(2, EBDA_START).unwrap();
        let cpu0 = &t[16 + 44..16 + 64];
        let cpu1 = &t[16 + 64..16 + 84];
        assert_eq!(&cpu0[..4], &[0, 0, 0x14, 3]);
        assert_eq!(&cpu1[..4], &[0, 1, 0x14, 1]);
        let bus = &t[16 + 84..16 + 92];
        assert_eq!(bus, b"\x01\x00ISA   ");
        let ioapic = &t[16 + 92..16 + 100];
        assert_eq!(ioapic, &[2, 3, 0x11, 1, 0, 0, 0xc0, 0xfe]);
        let irq4 = &t[16 + 100 + 4 * 8..16 + 100 + 5 * 8];
        assert_eq!(irq4, &[3, 0, 0, 0, 0, 4, 3, 4]);
        let nmi = &t[t.len() - 8..];
        assert_eq!(nmi, &[4, 1, 0, 0, 0, 0, 0xff, 1]);
    }

    #[test]
    fn cpu_limits() {
        assert_eq!(build(0, EBDA_START), Err(Error::TooManyCpus(0)));
        assert_eq!(build(33, EBDA_START), Err(Error::TooManyCpus(33)));
        let max = build(MAX_CPUS, EBDA_START).unwrap();
        assert!(EBDA_START + max.len() as u64 <= BASE_MEMORY_END);
    }

    #[test]
    fn written_where_linux_scans() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        setup(&mem, 1).unwrap();
        let mut sig = [0u8; 4];
        mem.read_slice(&mut sig, GuestAddress(0x9fc00)).unwrap();
        assert_eq!(&sig, b"_MP_");
    }
}
