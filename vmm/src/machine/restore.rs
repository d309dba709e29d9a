//! A machine rebuilt from a snapshot: the same devices from their saved
//! states, guest RAM from the memory file (mapped privately; for a machine
//! with shares, with the few pages virtiofsd is given shared over it), the VM's
//! in-kernel devices and every vCPU set to what was saved. It starts where
//! the saved one was paused.

use std::path::Path;

use super::create::{create, Restored};
use super::snapshot::{self, Loaded};
use super::working_set::WorkingSet;
use super::{fs_windows, memory, Error, Machine};
use crate::config::VmConfig;
use crate::console::ConsoleOutput;
use crate::timeline::Timeline;

/// `config` must describe the saved machine (memory size, vCPU count,
/// devices: a vsock device of the same CID); only host resources (the
/// vsock socket path, the console) may differ.
pub fn restore(config: &VmConfig, console: ConsoleOutput, dir: &Path) -> Result<Machine, Error> {
    restore_loaded(config, console, snapshot::read(dir)?, None)
}

/// [`restore`] from a snapshot already read and checked (a template
/// `mvm run` checked before starting anything else), with the pages that
/// runs from it touch first (`ahead`, recorded by an earlier one: see
/// working_set.rs) mapped before its vCPUs run.
pub fn restore_loaded(
    config: &VmConfig,
    console: ConsoleOutput,
    loaded: Loaded,
    ahead: Option<&WorkingSet>,
) -> Result<Machine, Error> {
    let Loaded { state, memory } = loaded;
    if state.mem_size != config.mem_size || state.vcpus.len() != usize::from(config.vcpus) {
        return Err(Error::Restore(format!(
            "the snapshot is of a machine with {} MiB and {} vCPUs, not {} MiB and {}",
            state.mem_size >> 20,
            state.vcpus.len(),
            config.mem_size >> 20,
            config.vcpus
        )));
    }
    // The pages to map into the VM ahead of the guest (prefault.rs).
    let (mem, memory_phase, mut prefault, fs_backend) = if config.shares.is_empty() {
        // Untouched pages come from the file through the page cache,
        // shared with every machine restored from it. Not all of them
        // are mapped ahead: KVM would map them read-only, and the guest's
        // first write to each still exits, for its private copy (measured
        // in docs/snapshots.md: no gain). Only the pages runs are known to
        // touch first are (`ahead`, below), the written ones copied.
        let mem = memory::from_snapshot(&memory, &state.regions, config.mem_size)?;
        (
            mem,
            "guest memory mapped from the template",
            Vec::new(),
            None,
        )
    } else {
        // virtiofsd maps guest memory too (MAP_SHARED), which a private
        // mapping of the file cannot be; but all it is ever given lies in
        // the bounce pool and the rings: only those are shared (a copy of
        // their data), the rest mapped as above.
        let windowed =
            fs_windows::shared_windows(&state.devices, &state.regions).and_then(|windows| {
                let mem = memory::from_snapshot(&memory, &state.regions, config.mem_size)
                    .map_err(|e| e.to_string())?;
                let backend = memory::share_windows(&memory, &state.regions, &mem, &windows)
                    .map_err(|e| e.to_string())?;
                Ok((mem, backend))
            });
        match windowed {
            Ok((mem, backend)) => {
                let phase = "guest memory mapped from the template, its virtio-fs windows shared";
                (mem, phase, Vec::new(), Some(backend))
            }
            // A template without them (its guest reported no pool), or
            // windows that could not be made: a memfd with a copy of all
            // its data, which virtiofsd maps whole.
            Err(why) => {
                eprintln!("mvm: warning: guest memory is copied for virtiofsd: {why}");
                let (mem, copied) =
                    memory::from_snapshot_shared(&memory, &state.regions, config.mem_size)?;
                (mem, "guest memory copied from the template", copied, None)
            }
        }
    };
    let mut timeline = Timeline::default();
    timeline.mark(memory_phase);
    let mapped_ahead = ahead.map(|set| {
        let (ranges, copied) = set.map_ahead(&mem);
        let bytes = ranges.iter().map(|r| r.end - r.start).sum();
        prefault.extend(ranges);
        timeline.mark("the pages runs touch first: the written ones copied");
        (bytes, copied)
    });
    let restored = Restored { mem, fs_backend };
    let (mut machine, _kvm) = create(
        config,
        console,
        Some(&state.devices),
        Some(restored),
        timeline,
    )?;
    state.vm.restore(&machine.vm)?;
    machine.timeline.mark("vm state restored");
    for (vcpu, saved) in machine.vcpus.iter().zip(&state.vcpus) {
        if saved.id != vcpu.id() {
            return Err(Error::Restore(format!(
                "the snapshot's vCPU {} is out of order",
                saved.id
            )));
        }
        vcpu.restore_state(saved)?;
    }
    machine.timeline.mark("vcpu state restored");
    machine.prefault(&prefault);
    machine.cmdline = state.cmdline;
    machine.restored = true;
    machine.mapped_ahead = mapped_ahead;
    Ok(machine)
}
