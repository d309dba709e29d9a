//! Running a built VM to its end and deciding what that end was.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mvm_devices::legacy::BOOT_MARKER_INIT_STARTED;

use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::builder::Vmm;
use crate::confine::{seccomp, ThreadKind};
use crate::event_loop::{self, EventLoop, Wait};
use crate::vcpu::{self, VcpuStop};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    EventLoop(#[from] event_loop::Error),
    #[error(transparent)]
    Vcpu(#[from] vcpu::Error),
}

/// How the VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Guest-init reported the command's exit status.
    Exited(u32),
    /// The guest reset or shut down without reporting a status.
    Stopped,
    /// The guest kernel panicked.
    Panicked,
    /// The deadline passed first.
    TimedOut,
    /// KVM or the VMM failed.
    Failed(String),
}

pub struct RunReport {
    pub outcome: Outcome,
    /// From `started` to guest-init's boot marker, if it came.
    pub boot_to_init: Option<Duration>,
    /// Guest RAM resident in this process when the VM stopped, in KiB: the
    /// part of mvm's RSS that is the guest's, not the VMM's.
    pub guest_resident_kib: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    /// When the mvm process started; the boot marker is measured from here.
    pub started: Instant,
    pub timeout: Option<Duration>,
    pub forward_stdin: bool,
    /// Measure what `--print-stats` reports that costs work at teardown
    /// (the guest's resident memory).
    pub measure: bool,
}

impl RunOptions {
    pub fn timeout_secs(&self) -> Option<f64> {
        self.timeout.map(|t| t.as_secs_f64())
    }
}

pub fn run(vmm: Vmm, opts: RunOptions) -> Result<RunReport, Error> {
    let mut event_loop = EventLoop::new(vmm.stop.evt.clone(), vmm.stop.stopped.clone())?;
    for subscriber in vmm.subscribers {
        event_loop.add_subscriber(subscriber);
    }
    if opts.forward_stdin {
        event_loop.forward_stdin(vmm.serial.clone(), vmm.report.clone());
    }
    let deadline = opts.timeout.map(|t| Instant::now() + t);
    // vCPU threads are not joined: a vCPU can be blocked in KVM_RUN on a
    // halted guest, and the VM's memory and fds are released when the
    // process exits right after this returns.
    let go = Arc::new(Barrier::new(vmm.vcpus.len() + 1));
    for vcpu in vmm.vcpus {
        vcpu.start(
            vmm.pio.clone(),
            vmm.mmio.clone(),
            vmm.stop.clone(),
            go.clone(),
        )?;
    }
    // This thread's filter (no thread creation in it) goes in once every
    // vCPU thread exists; only then do the vCPUs enter the guest.
    seccomp::install_or_exit(ThreadKind::Vmm);
    go.wait();
    let wait = event_loop.run_until_stopped(deadline)?;

    if let Ok(mut serial) = vmm.serial.lock() {
        // Console loss must not hide the command's status.
        let _ = serial.writer_mut().drain();
    }
    let report = vmm.report.snapshot();
    let boot_to_init = report
        .markers
        .iter()
        .find(|(m, _)| *m == BOOT_MARKER_INIT_STARTED)
        .map(|(_, at)| at.saturating_duration_since(opts.started));
    let stop_reason = vmm.stop.reason.lock().ok().and_then(|r| r.clone());

    let outcome = match (wait, report.exit_status, stop_reason) {
        (Wait::TimedOut, _, _) => Outcome::TimedOut,
        (_, _, Some(VcpuStop::Failed(why))) => Outcome::Failed(why),
        (_, Some(status), _) => Outcome::Exited(status),
        _ if vmm.panic_seen.load(Ordering::SeqCst) => Outcome::Panicked,
        _ => Outcome::Stopped,
    };
    Ok(RunReport {
        outcome,
        boot_to_init,
        guest_resident_kib: if opts.measure {
            resident_kib(&vmm.mem)
        } else {
            None
        },
    })
}

/// Pages of guest memory that are resident (mincore), in KiB.
fn resident_kib(mem: &GuestMemoryMmap) -> Option<u64> {
    const PAGE: usize = 4096;
    let mut total = 0u64;
    for region in mem.iter() {
        let len = region.len() as usize;
        let mut vec = vec![0u8; len.div_ceil(PAGE)];
        // SAFETY: the region is a live page-aligned mapping of `len` bytes
        // owned by `mem`; `vec` has one byte per page, as mincore needs.
        let rc = unsafe { libc::mincore(region.as_ptr().cast(), len, vec.as_mut_ptr()) };
        if rc != 0 {
            return None;
        }
        total += vec.iter().filter(|b| *b & 1 == 1).count() as u64 * (PAGE as u64 / 1024);
    }
    Some(total)
}
