//! `mvm boot`: the console is the interface (stdout, and stdin once
//! guest-init is ready); the run ends when the guest powers off. It can
//! also save the machine as soon as guest-init is ready
//! (`--snapshot-at-ready`), and start from such a snapshot instead of
//! booting (`--restore`): docs/snapshots.md.
//!
//! A cold boot maps ahead the pages earlier boots of the same machine
//! touched up to guest-init's ready marker, and the first such boot
//! records them (front/first_pages.rs; docs/snapshots.md, "The pages a
//! boot touches first").

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use mvm_devices::legacy::BOOT_MARKER_INIT_READY;

use super::first_pages::{self, Recorder};
use super::template;
use super::{
    confine_vmm, outcome_failure, print_stats, refuse_software_kvm, setup_failure, vmm_failure,
    Failure, SessionMoments, VmArgs, BASE_CMDLINE,
};
use crate::config::VmConfig;
use crate::console::ConsoleOutput;
use crate::machine::working_set::WorkingSet;
use crate::machine::{self, boot, Machine, Outcome, StopReason};
use crate::timeline::Timeline;

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    /// Save the machine to DIR (which must not exist; its parent must) as
    /// soon as guest-init reports ready, then end it (exit 0)
    #[arg(long, value_name = "DIR", conflicts_with = "restore")]
    pub snapshot_at_ready: Option<PathBuf>,
    /// Start from the snapshot in DIR instead of booting (same --memory and
    /// --cpus as when it was taken; --kernel, --initrd and --cmdline are
    /// not used)
    #[arg(long, value_name = "DIR")]
    pub restore: Option<PathBuf>,
}

pub fn boot(args: &VmArgs, snap: &SnapshotArgs, started: Instant) -> Result<i32, Failure> {
    let config = args.vm_config(format!("{BASE_CMDLINE} {}", args.cmdline))?;
    let timeout = args.timeout()?;
    // Where a snapshot goes: its parent must exist (Landlock lets the VMM
    // write below it and nowhere else), the snapshot itself must not.
    let snapshot_parent = match &snap.snapshot_at_ready {
        None => None,
        Some(dir) => Some(snapshot_parent(dir)?),
    };
    crate::machine::kvm::check_kvm().map_err(|e| Failure::from(machine::Error::Kvm(e)))?;
    refuse_software_kvm()?;
    let console = ConsoleOutput::new(Box::new(std::io::stdout()));
    let mut front = Timeline::default();
    front.mark("arguments parsed");
    let mut recorder = None;
    let mut machine = match &snap.restore {
        Some(dir) => machine::restore(&config, console, dir)?,
        // A machine booted to be saved maps nothing ahead: each page it
        // maps is one more its snapshot holds.
        None if snap.snapshot_at_ready.is_some() => boot::boot(&config, console)?,
        None => {
            let ahead;
            (ahead, recorder) = boot_set(&config);
            boot::boot_mapping_ahead(&config, console, ahead.as_ref())?
        }
    };
    if snapshot_parent.is_some() {
        crate::confine::seccomp::allow_snapshots();
    }
    confine_vmm(
        args.confinement(),
        Some(crate::confine::landlock::Writable {
            session: None,
            snapshot_parent: snapshot_parent.as_deref(),
        }),
    )?;
    front.mark("vmm confined");
    machine.forward_console_input();
    let deadline = timeout.map(|t| Instant::now() + t);
    machine.start().map_err(vmm_failure)?;
    if let Some(dir) = &snap.snapshot_at_ready {
        return snapshot_at_ready(machine, dir, deadline, args.timeout, &front, started);
    }
    if let Some(recorder) = recorder {
        first_pages::record_at_marker(
            &mut machine,
            recorder,
            BOOT_MARKER_INIT_READY,
            deadline,
            &mut front,
        )?;
    }
    let ended = machine.wait(deadline).map_err(vmm_failure)?;
    print_stats(
        args.print_stats,
        started,
        &front,
        &machine,
        &ended,
        SessionMoments::default(),
    );
    match ended.outcome {
        Outcome::Exited(_) | Outcome::Stopped => Ok(0),
        other => Err(outcome_failure(other, args.timeout)),
    }
}

/// The pages earlier boots of `config`'s machine touched, or the
/// recorder of this boot's, kept in the template store as `mvm run`'s
/// cold boots keep theirs (the machine's command line, and so its key,
/// differs from any `mvm run` machine's). Neither without a store.
fn boot_set(config: &VmConfig) -> (Option<WorkingSet>, Option<Recorder>) {
    match template::store_dir() {
        Some(store) => first_pages::for_boot(&store, config, true).split(),
        None => (None, None),
    }
}

/// The directory a snapshot at `dir` is written in, checked before the VM
/// is built.
fn snapshot_parent(dir: &Path) -> Result<PathBuf, Failure> {
    if dir.exists() {
        return Err(setup_failure(format!(
            "--snapshot-at-ready {}: it exists already; remove it or choose another path",
            dir.display()
        )));
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    parent.canonicalize().map_err(|e| {
        setup_failure(format!(
            "--snapshot-at-ready {}: cannot use its directory {}: {e}",
            dir.display(),
            parent.display()
        ))
    })
}

/// Runs until guest-init is ready, pauses, saves, ends the machine.
fn snapshot_at_ready(
    mut machine: Machine,
    dir: &Path,
    deadline: Option<Instant>,
    timeout: Option<f64>,
    front: &Timeline,
    started: Instant,
) -> Result<i32, Failure> {
    let stopped = match machine
        .run_until_marker(BOOT_MARKER_INIT_READY, deadline)
        .map_err(vmm_failure)?
    {
        machine::event_loop::Wait::Done => false,
        machine::event_loop::Wait::Stopped => true,
        machine::event_loop::Wait::Deadline => {
            machine.stop_handle().stop(StopReason::Timeout);
            true
        }
    };
    if stopped {
        let ended = machine.wait(None).map_err(vmm_failure)?;
        return Err(match ended.outcome {
            Outcome::TimedOut => outcome_failure(Outcome::TimedOut, timeout),
            _ => setup_failure("the guest stopped before guest-init was ready: no snapshot taken"),
        });
    }
    machine.pause().map_err(vmm_failure)?;
    let at = Instant::now();
    machine
        .snapshot(dir)
        .map_err(|e| setup_failure(format!("cannot take the snapshot: {e}")))?;
    let took = at.elapsed();
    machine.stop_handle().stop(StopReason::Host);
    machine.resume();
    let _ = machine.wait(None);
    let _ = (front, started);
    eprintln!(
        "mvm: snapshot of the ready guest written to {} in {:.1} ms",
        dir.display(),
        took.as_secs_f64() * 1e3
    );
    Ok(0)
}
