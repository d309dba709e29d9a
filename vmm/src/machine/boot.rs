//! The one place a machine is booted, in a fixed order (Firecracker's
//! `builder.rs`, vmm-reference's `Vmm::try_from`): what every machine gets
//! (`create`: KVM, the VM with irqchip and PIT, guest memory, devices,
//! vCPU fds), then what only a boot does: kernel, initramfs, command line
//! and boot_params, MP table, and each vCPU's CPUID (KVM's supported set,
//! plus what it emulates without listing it), MSRs, registers and LAPIC;
//! last, the pages the guest will run through first mapped ahead (and
//! the bounce pool, which the guest of a machine that makes a template
//! zeroes). The result is ready to start.

use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::Cap;
use linux_loader::cmdline::Cmdline;
use linux_loader::loader::load_cmdline;
use vm_memory::GuestAddress;

use super::create::create;
use super::working_set::WorkingSet;
use super::{fs, kernel, memory, Error, Machine};
use crate::arch::x86_64::layout::{CMDLINE_MAX_SIZE, CMDLINE_START};
use crate::arch::x86_64::{boot_params, cpuid, mptable};
use crate::config::VmConfig;
use crate::console::ConsoleOutput;
use crate::timeline::Timeline;

pub fn boot(config: &VmConfig, console: ConsoleOutput) -> Result<Machine, Error> {
    boot_mapping_ahead(config, console, None)
}

/// [`boot`], with the pages earlier boots of the machine touched
/// (`ahead`: working_set.rs) mapped before its vCPUs run.
pub fn boot_mapping_ahead(
    config: &VmConfig,
    console: ConsoleOutput,
    ahead: Option<&WorkingSet>,
) -> Result<Machine, Error> {
    let (mut machine, kvm) = create(config, console, None, None, Timeline::default())?;
    let mem = &machine.mem;

    let kernel = kernel::load_kernel(mem, &config.kernel)?;
    let initrd = match &config.initrd {
        Some(path) => Some(kernel::load_initrd(mem, config.mem_size, kernel.end, path)?),
        None => None,
    };
    machine.timeline.mark("kernel and initramfs loaded");
    let cmdline = build_cmdline(&machine.device_params, &config.cmdline)?;
    load_cmdline(mem, GuestAddress(CMDLINE_START), &cmdline).map_err(Error::CmdlineWrite)?;
    let cmdline_text = cmdline
        .as_cstring()
        .map_err(Error::Cmdline)?
        .into_string()
        .unwrap_or_default();
    let params = boot_params::build(&boot_params::BootInputs {
        mem_size: config.mem_size,
        cmdline_len: cmdline_text.len(),
        initrd,
        setup_header: kernel.setup_header,
    });
    boot_params::write(mem, &params)?;
    mptable::setup(mem, config.vcpus)?;

    let mut supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(Error::SupportedCpuid)?;
    cpuid::advertise_emulated(
        &mut supported,
        cpuid::Emulated {
            tsc_deadline_timer: kvm.check_extension(Cap::TscDeadlineTimer),
        },
    );
    machine.timeline.mark("boot_params and MP table written");
    for (id, vcpu) in machine.vcpus.iter().enumerate() {
        let entry = (id == 0).then_some(kernel.entry);
        vcpu.configure(&supported, config.vcpus, mem, entry)?;
    }
    machine.timeline.mark("vcpus configured");
    // The kernel's first steps run through these pages (prefault.rs),
    // and then through much the same ones at every boot of one machine.
    let initrd_range = initrd.map(|(addr, size)| addr.0..addr.0 + size as u64);
    let ahead_ranges = match ahead {
        Some(set) => {
            let (ranges, allocated) = set.map_ahead(mem);
            let bytes = ranges.iter().map(|r| r.end - r.start).sum();
            machine
                .timeline
                .mark("the pages boots touch: the private ones allocated");
            machine.mapped_ahead = Some((bytes, allocated));
            ranges
        }
        None => Vec::new(),
    };
    // The pool the guest of a machine that makes a template zeroes.
    machine.pool_ahead = initrd
        .filter(|_| fs::bounces(config))
        .and_then(|(addr, _)| fs::expected_bounce_pool(config.mem_size, addr.0));
    let loaded = std::iter::once(kernel.start..kernel.end)
        .chain(initrd_range)
        .chain(ahead_ranges)
        .chain(machine.pool_ahead.clone())
        .collect();
    machine.prefault(&memory::union(loaded));
    machine.cmdline = cmdline_text;
    Ok(machine)
}

/// Device entries first, then the caller's parameters: for a repeated
/// parameter the kernel takes the last, so the caller can override ours.
fn build_cmdline(device_args: &[String], user: &str) -> Result<Cmdline, Error> {
    let len = device_args.iter().map(|a| a.len() + 1).sum::<usize>() + user.len();
    if len >= CMDLINE_MAX_SIZE {
        return Err(Error::CmdlineTooLong { len });
    }
    let mut cmdline = Cmdline::new(CMDLINE_MAX_SIZE).map_err(Error::Cmdline)?;
    for arg in device_args {
        cmdline.insert_str(arg).map_err(Error::Cmdline)?;
    }
    if !user.trim().is_empty() {
        cmdline.insert_str(user.trim()).map_err(Error::Cmdline)?;
    }
    Ok(cmdline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_puts_user_args_last() {
        let c = build_cmdline(
            &["console=ttyS0".into(), "reboot=k".into()],
            "quiet panic=-1",
        )
        .unwrap();
        assert_eq!(
            c.as_cstring().unwrap().to_str().unwrap(),
            "console=ttyS0 reboot=k quiet panic=-1"
        );
    }

    #[test]
    fn cmdline_too_long_is_refused() {
        let long = "x".repeat(CMDLINE_MAX_SIZE);
        assert!(matches!(
            build_cmdline(&[], &long),
            Err(Error::CmdlineTooLong { .. })
        ));
    }
}
