//! The VM-wide state KVM emulates in the kernel: the PIT, the kvmclock
//! and the three interrupt controllers (both 8259 PICs and the IOAPIC).

use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_pit_state2, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
#[error("KVM cannot {action} the VM's {what}: {source}")]
pub struct Error {
    action: &'static str,
    what: &'static str,
    source: kvm_ioctls::Error,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct VmState {
    pub pit: kvm_pit_state2,
    pub clock: kvm_clock_data,
    pub pic_master: kvm_irqchip,
    pub pic_slave: kvm_irqchip,
    pub ioapic: kvm_irqchip,
}

fn kvm(action: &'static str, what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error {
        action,
        what,
        source,
    }
}

fn irqchip(vm: &VmFd, chip_id: u32, what: &'static str) -> Result<kvm_irqchip, Error> {
    let mut chip = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    vm.get_irqchip(&mut chip).map_err(kvm("read", what))?;
    Ok(chip)
}

impl VmState {
    pub fn save(vm: &VmFd) -> Result<Self, Error> {
        Ok(Self {
            pit: vm.get_pit2().map_err(kvm("read", "PIT"))?,
            clock: vm.get_clock().map_err(kvm("read", "clock"))?,
            pic_master: irqchip(vm, KVM_IRQCHIP_PIC_MASTER, "master PIC")?,
            pic_slave: irqchip(vm, KVM_IRQCHIP_PIC_SLAVE, "slave PIC")?,
            ioapic: irqchip(vm, KVM_IRQCHIP_IOAPIC, "IOAPIC")?,
        })
    }

    /// On a VM whose irqchip and PIT exist (`kvm::create_vm`) and whose
    /// vCPUs have not run.
    pub fn restore(&self, vm: &VmFd) -> Result<(), Error> {
        vm.set_pit2(&self.pit).map_err(kvm("set", "PIT"))?;
        // KVM_SET_CLOCK takes the time only: the flags it reported on the
        // way out (TSC_STABLE and the like) describe the old host's clock.
        let clock = kvm_clock_data {
            flags: 0,
            ..self.clock
        };
        vm.set_clock(&clock).map_err(kvm("set", "clock"))?;
        vm.set_irqchip(&self.pic_master)
            .map_err(kvm("set", "master PIC"))?;
        vm.set_irqchip(&self.pic_slave)
            .map_err(kvm("set", "slave PIC"))?;
        vm.set_irqchip(&self.ioapic).map_err(kvm("set", "IOAPIC"))?;
        Ok(())
    }
}
