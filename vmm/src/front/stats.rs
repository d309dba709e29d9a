//! `--print-stats`: what the run cost, on stderr (docs/benchmarks.md).

use std::time::{Duration, Instant};

use mvm_devices::legacy::{BOOT_MARKER_INIT_READY, BOOT_MARKER_INIT_STARTED};
use mvm_protocol::GuestPhase;

use crate::machine::{Ended, Machine};
use crate::timeline::Timeline;

/// What the exec session saw of the guest, for the timeline.
#[derive(Debug, Default)]
pub(crate) struct SessionMoments<'a> {
    /// When the command's exit status arrived (`mvm run`).
    pub exit_received: Option<Instant>,
    /// The guest kernel's clock at guest-init's boot marker (the hello).
    pub guest_init_clock: Option<Duration>,
    /// How many attempts the connection to the agent took.
    pub connect_tries: Option<u32>,
    /// When the command was sent, and the agent's moments after its
    /// arrival (its `Exit`).
    pub guest_phases: Option<(Instant, &'a [GuestPhase])>,
}

/// `started`: when mvm started; `front`: the front end's own moments;
/// `session`: the exec session's.
pub(crate) fn print_stats(
    wanted: bool,
    started: Instant,
    front: &Timeline,
    machine: &Machine,
    ended: &Ended,
    session: SessionMoments,
) {
    let SessionMoments {
        exit_received: teardown_from,
        guest_init_clock,
        connect_tries,
        guest_phases,
    } = session;
    if !wanted {
        return;
    }
    let mut timeline = front.clone();
    timeline.extend(machine.timeline());
    // A restored guest's markers are its template's, from another boot.
    let markers: &[(u8, Instant)] = match machine.is_restored() {
        true => &[],
        false => &ended.markers,
    };
    for (marker, name) in [
        (
            BOOT_MARKER_INIT_STARTED,
            "guest-init started (its first marker)",
        ),
        (
            BOOT_MARKER_INIT_READY,
            "guest-init ready (waiting for its run)",
        ),
    ] {
        if let Some((_, at)) = markers.iter().find(|(m, _)| *m == marker) {
            timeline.mark_at(name, *at);
        }
    }
    // The guest kernel's clock (CLOCK_BOOTTIME) starts in its
    // timekeeping_init: the marker's arrival less the clock's reading at
    // it places that start on mvm's timeline, telling the kernel's early
    // set-up (before it) from its init (after it) by the kernel's own
    // clock.
    let init_started = markers
        .iter()
        .find(|(m, _)| *m == BOOT_MARKER_INIT_STARTED)
        .map(|(_, at)| *at);
    let kernel_clock_start =
        init_started.and_then(|at| guest_init_clock.and_then(|d| at.checked_sub(d)));
    if let Some(at) = kernel_clock_start {
        timeline.mark_at("guest kernel's clock started (by its own clock)", at);
    }
    if let Some(at) = teardown_from {
        timeline.mark_at("command's exit status received", at);
    }
    // Placed from the moment the request was sent (the guest counts from
    // its arrival): each lands early by the request's way to the guest.
    for (sent, phase) in guest_phases
        .into_iter()
        .flat_map(|(at, ps)| ps.iter().map(move |p| (at, p)))
    {
        timeline.mark_at(
            format!("guest: {}", phase.name),
            sent + Duration::from_nanos(phase.after_ns),
        );
    }
    timeline.mark("teardown done");
    for (ms, name) in timeline.since(started) {
        eprintln!("mvm: phase: +{ms:.1} ms {name}");
    }
    let boot_to_init = init_started.map(|at| at.saturating_duration_since(started));
    match boot_to_init {
        Some(d) => eprintln!("mvm: boot to init: {:.1} ms", d.as_secs_f64() * 1e3),
        None if machine.is_restored() => {
            eprintln!("mvm: boot to init: none (restored from a template)")
        }
        None => eprintln!("mvm: boot to init: no boot marker from the guest"),
    }
    if let (Some(d), Some(_)) = (guest_init_clock, kernel_clock_start) {
        eprintln!(
            "mvm: guest kernel to init: {:.1} ms (the guest's own clock)",
            d.as_secs_f64() * 1e3
        );
    }
    if let Some(n) = connect_tries {
        // Refused tries are the agent not listening yet (a boot, and a
        // restored guest before it makes its socket: docs/snapshots.md).
        eprintln!(
            "mvm: agent connection: {n} {}",
            if n == 1 { "try" } else { "tries" }
        );
    }
    print_process_stats(started);
    if let Some((mapped, private)) = machine.mapped_ahead() {
        // docs/snapshots.md, "The pages a run touches first".
        let (whose, made) = match machine.is_restored() {
            true => ("this template's runs", "copied"),
            false => ("this machine's boots and runs", "allocated"),
        };
        eprintln!(
            "mvm: mapped ahead: {} KiB, the pages {whose} touch first ({} KiB of them {made})",
            mapped >> 10,
            private >> 10
        );
    }
    if let Some((ahead, reported)) = machine.bounce_pool_ahead() {
        // docs/snapshots.md, "The first run".
        let hit = match reported {
            Some(pool) if pool == ahead => "where the guest put it".to_string(),
            Some(pool) => format!("but the guest put it at {:#x}-{:#x}", pool.start, pool.end),
            None => "but the guest reported none".to_string(),
        };
        eprintln!(
            "mvm: bounce pool mapped ahead at {:#x}-{:#x}, {hit}",
            ahead.start, ahead.end
        );
    }
    if let Some(kib) = machine.guest_resident_kib() {
        eprintln!("mvm: guest resident: {kib} KiB");
    }
    print_kvm_counters(machine);
    if let Some(at) = teardown_from {
        eprintln!("mvm: teardown: {:.1} ms", at.elapsed().as_secs_f64() * 1e3);
    }
}

/// Each vCPU's exits, nested page faults and guest TLB flushes as KVM
/// counted them, since the vCPU was made (docs/benchmarks.md, "KVM's
/// counters").
fn print_kvm_counters(machine: &Machine) {
    for (id, counters) in machine.kvm_counters() {
        let counters = match counters {
            Ok(c) => c,
            Err(e) => {
                eprintln!("mvm: kvm vcpu{id}: counters unreadable: {e}");
                continue;
            }
        };
        let get = |name: &str| {
            counters
                .iter()
                .find(|(n, _)| n == name)
                .map_or("?".to_string(), |(_, v)| v.to_string())
        };
        eprintln!(
            "mvm: kvm vcpu{id} exits: {} (io {}, mmio {}, halt {}, irq {}, irq window {})",
            get("exits"),
            get("io_exits"),
            get("mmio_exits"),
            get("halt_exits"),
            get("irq_exits"),
            get("irq_window_exits"),
        );
        eprintln!(
            "mvm: kvm vcpu{id} page faults: {} (fixed {}, emulated {})",
            get("pf_taken"),
            get("pf_fixed"),
            get("pf_emulate"),
        );
        eprintln!("mvm: kvm vcpu{id} tlb flushes: {}", get("tlb_flush"));
    }
}

/// `mvm exec --print-stats`: this process's wall and CPU time and peak
/// RSS, and the sandbox's: its supervisor's peak RSS (`VmHWM`, since it
/// started: the VMM and the guest memory it touched), read at the end
/// from `supervisor`, the pid it had when the exec began.
pub(crate) fn print_exec_stats(started: Instant, supervisor: Option<i32>) {
    print_process_stats(started);
    match supervisor.and_then(peak_rss_kib) {
        Some(kib) => eprintln!("mvm: sandbox peak rss: {kib} KiB"),
        None => eprintln!("mvm: sandbox peak rss: none (no running supervisor to read)"),
    }
}

/// This process's wall time since `started`, CPU time and peak RSS.
fn print_process_stats(started: Instant) {
    eprintln!("mvm: wall: {:.3} s", started.elapsed().as_secs_f64());
    if let Some(usage) = self_usage() {
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        eprintln!(
            "mvm: cpu: {:.3} s",
            secs(usage.ru_utime) + secs(usage.ru_stime)
        );
        eprintln!("mvm: peak rss: {} KiB", usage.ru_maxrss);
    }
}

/// `VmHWM` of process `pid`, in KiB.
fn peak_rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn self_usage() -> Option<libc::rusage> {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the valid out-pointer it is given.
    (unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0).then_some(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_has_a_peak_rss_and_a_gone_one_none() {
        let own = peak_rss_kib(std::process::id() as i32);
        assert!(own.is_some_and(|kib| kib > 0), "{own:?}");
        // Beyond the kernel's PID_MAX_LIMIT (4194304): never a process.
        assert_eq!(peak_rss_kib(i32::MAX), None);
    }
}
