//! Local APIC setup: LINT0 as ExtINT (so the legacy PIC's interrupts, the
//! PIT timer among them, reach the boot CPU before the IOAPIC is set up)
//! and LINT1 as NMI, the wiring a PC's firmware leaves behind.

use kvm_bindings::kvm_lapic_state;

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

fn get_reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let b = &lapic.regs[offset..offset + 4];
    u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

fn set_reg(lapic: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, byte) in value.to_le_bytes().iter().enumerate() {
        lapic.regs[offset + i] = *byte as _;
    }
}

/// Delivery mode lives in bits 8-10 of an LVT entry.
fn with_delivery_mode(reg: u32, mode: u32) -> u32 {
    (reg & !0x700) | (mode << 8)
}

pub fn set_lint(lapic: &mut kvm_lapic_state) {
    let lvt0 = get_reg(lapic, APIC_LVT0);
    set_reg(lapic, APIC_LVT0, with_delivery_mode(lvt0, APIC_MODE_EXTINT));
    let lvt1 = get_reg(lapic, APIC_LVT1);
    set_reg(lapic, APIC_LVT1, with_delivery_mode(lvt1, APIC_MODE_NMI));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lint0_extint_lint1_nmi() {
        let mut lapic = kvm_lapic_state::default();
        // Masked entries with another delivery mode, as after reset.
        set_reg(&mut lapic, APIC_LVT0, 0x0001_0200);
        set_reg(&mut lapic, APIC_LVT1, 0x0001_0000);
        set_lint(&mut lapic);
        assert_eq!(get_reg(&lapic, APIC_LVT0), 0x0001_0700);
        assert_eq!(get_reg(&lapic, APIC_LVT1), 0x0001_0400);
    }
}
