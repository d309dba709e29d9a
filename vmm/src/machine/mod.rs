//! A machine: the VM fd, guest memory, the devices (on their buses and in
//! the registry), the event loop, the vCPUs and the one stop handle.
//!
//! Its life: [`boot::boot`] (or, later, a restore) gives a machine ready
//! to start; [`Machine::start`] runs the vCPUs; [`Machine::pause`] and
//! [`Machine::resume`] hold and release them (devices can then be saved);
//! [`Machine::wait`] serves devices until the machine stops or the
//! deadline passes, ends and joins the vCPU threads, and decides the one
//! [`Outcome`]. The machine is still there afterwards (its memory can be
//! measured); dropping it ends anything still running.

pub mod attach;
pub mod balloon;
pub mod block;
pub mod boot;
pub mod capture;
mod create;
pub mod event_loop;
pub mod fs;
mod fs_windows;
mod huge_pages;
pub mod kernel;
pub mod kvm;
mod kvm_counters;
pub mod memory;
pub mod outcome;
mod prefault;
pub mod registry;
mod restore;
pub mod snapshot;
pub mod stop;
pub mod vcpu;
pub mod vsock;
pub mod working_set;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvm_ioctls::VmFd;
use mvm_devices::bus::Bus;
use mvm_devices::legacy::GuestReport;
use mvm_devices::state::SaveError;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::arch::x86_64::layout::CMDLINE_MAX_SIZE;
use crate::arch::x86_64::{boot_params, mptable};
use crate::confine::{seccomp, ThreadKind};
use crate::timeline::Timeline;
use attach::SerialConsole;
use event_loop::{EventLoop, Wait};
use registry::{DeviceRegistry, DeviceStates};
use snapshot::vm_state::VmState;
use snapshot::MachineState;
use vcpu::{StartGate, Vcpu, VcpuHandle};

pub use outcome::Outcome;
pub use stop::{StopHandle, StopReason};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kvm(#[from] kvm::Error),
    #[error(transparent)]
    Memory(#[from] memory::Error),
    #[error(transparent)]
    Devices(#[from] attach::Error),
    #[error(transparent)]
    Kernel(#[from] kernel::Error),
    #[error("the kernel command line is too long ({len} bytes; the guest accepts {CMDLINE_MAX_SIZE}): shorten the command or its arguments")]
    CmdlineTooLong { len: usize },
    #[error("invalid kernel command line: {0}")]
    Cmdline(linux_loader::cmdline::Error),
    #[error("cannot write the kernel command line into guest memory: {0}")]
    CmdlineWrite(linux_loader::loader::Error),
    #[error(transparent)]
    BootParams(#[from] boot_params::Error),
    #[error(transparent)]
    MpTable(#[from] mptable::Error),
    #[error("KVM cannot report its supported CPUID: {0}")]
    SupportedCpuid(kvm_ioctls::Error),
    #[error(transparent)]
    Vcpu(#[from] vcpu::Error),
    #[error("cannot create the stop eventfd: {0}")]
    StopEvent(std::io::Error),
    #[error(transparent)]
    EventLoop(#[from] event_loop::Error),
    #[error("the machine was started already")]
    AlreadyStarted,
    #[error("devices can be saved only while every vCPU is paused")]
    NotPaused,
    #[error(transparent)]
    Save(#[from] SaveError),
    #[error(transparent)]
    Snapshot(#[from] snapshot::Error),
    #[error(transparent)]
    VmState(#[from] snapshot::vm_state::Error),
    #[error(transparent)]
    Capture(#[from] capture::Error),
    #[error("cannot restore: {0}")]
    Restore(String),
}

pub struct Machine {
    /// The memory regions and irqfds belong to it; the in-kernel devices'
    /// state is read and set through it.
    vm: VmFd,
    mem: GuestMemoryMmap,
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    registry: DeviceRegistry,
    event_loop: EventLoop,
    stop: StopHandle,
    serial: SerialConsole,
    report: GuestReport,
    panic_seen: Arc<AtomicBool>,
    /// The kernel parameters the devices asked for.
    device_params: Vec<String>,
    /// The whole command line the guest was booted with.
    cmdline: String,
    /// Created and configured, not started yet.
    vcpus: Vec<Vcpu>,
    /// Each vCPU's KVM counters, where KVM keeps them (kvm_counters.rs).
    counters: Vec<(u8, kvm_counters::Counters)>,
    handles: Vec<VcpuHandle>,
    /// When each step of building and running it ended.
    timeline: Timeline,
    /// Restored from a snapshot, not booted: guest-init's boot markers are
    /// the saved machine's.
    restored: bool,
    /// The pages mapped ahead of its guest (working_set.rs), and how many
    /// of them were made private first (a restored machine's copies of
    /// template pages; a booted one's anonymous pages), in bytes.
    mapped_ahead: Option<(u64, u64)>,
    /// Where a booted machine that makes the bounce pool had it mapped
    /// ahead (fs.rs, `expected_bounce_pool`).
    pool_ahead: Option<std::ops::Range<u64>>,
    /// The vsock device's in-process way in, until a front end takes it.
    vsock_dialer: Option<mvm_devices::virtio::vsock::Dialer>,
}

/// How a machine's run ended, and what the guest reported on the way.
pub struct Ended {
    pub outcome: Outcome,
    /// guest-init's boot markers, with when each first arrived.
    pub markers: Vec<(u8, Instant)>,
    /// vCPU threads that did not leave within the grace period (stuck in
    /// a device); they end with the process.
    pub vcpus_left_behind: usize,
}

pub use restore::{restore, restore_loaded};

/// A machine whose devices are rebuilt from `saved` instead of fresh, its
/// vCPUs created but not configured: the half of a restore that boot
/// shares (guest memory and vCPU, irqchip and clock state come with
/// snapshots).
pub fn with_saved_devices(
    config: &crate::config::VmConfig,
    console: crate::console::ConsoleOutput,
    saved: &DeviceStates,
) -> Result<Machine, Error> {
    create::create(config, console, Some(saved), None, Default::default())
        .map(|(machine, _)| machine)
}

impl Machine {
    /// Maps `ranges` of guest memory into the VM before the first run
    /// (prefault.rs), through the first vCPU. It only saves the guest
    /// exits, so a KVM that cannot do it, or fails, changes nothing but
    /// the timeline, which shows the step only where something was mapped.
    fn prefault(&mut self, ranges: &[std::ops::Range<u64>]) {
        let Some(vcpu) = self.vcpus.first() else {
            return;
        };
        if matches!(vcpu.prefault(ranges), Ok(mapped) if mapped > 0) {
            self.timeline.mark("guest memory pre-faulted");
        }
    }

    /// The pages of guest memory this process maps now
    /// ([`working_set::WorkingSet::record`]): of a restored machine,
    /// those its run touched so far.
    pub fn working_set(&self, pagemap: &std::fs::File) -> std::io::Result<working_set::WorkingSet> {
        working_set::WorkingSet::record(&self.mem, pagemap)
    }

    /// Stops this machine from any thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The vsock device's [`Dialer`](mvm_devices::virtio::vsock::Dialer),
    /// once (None without a vsock device, or when taken already).
    pub fn take_vsock_dialer(&mut self) -> Option<mvm_devices::virtio::vsock::Dialer> {
        self.vsock_dialer.take()
    }

    /// The kernel command line the guest was booted with.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }

    /// When each step of building and running it ended.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// The bytes of guest memory mapped ahead of its guest (the pages
    /// its template's runs, or its machine's boots, touch first) and how
    /// many of them were made private first; None where there was no
    /// such set.
    pub fn mapped_ahead(&self) -> Option<(u64, u64)> {
        self.mapped_ahead
    }

    /// The bounce pool where it was mapped ahead of a boot, and where the
    /// guest reported it (None until it has).
    pub fn bounce_pool_ahead(
        &self,
    ) -> Option<(std::ops::Range<u64>, Option<std::ops::Range<u64>>)> {
        let ahead = self.pool_ahead.clone()?;
        Some((ahead, self.report.snapshot().bounce_pool.range()))
    }

    /// Whether it was restored from a snapshot rather than booted.
    pub fn is_restored(&self) -> bool {
        self.restored
    }

    /// Whether guest-init has written `marker` to the status port yet.
    pub fn has_marker(&self, marker: u8) -> bool {
        self.report.has_marker(marker)
    }

    /// Registry ids of the devices, in attach order.
    pub fn device_ids(&self) -> Vec<&str> {
        self.registry.ids()
    }

    /// Adds host-side work to the event loop (a helper's log pump, say).
    pub fn add_subscriber(&mut self, subscriber: attach::Subscriber) {
        self.event_loop.add_subscriber(subscriber);
    }

    /// Feeds this process's stdin to the guest console once guest-init is
    /// ready (`mvm boot`).
    pub fn forward_console_input(&mut self) {
        self.event_loop
            .forward_stdin(self.serial.clone(), self.report.clone());
    }

    /// Starts every vCPU thread, then confines the calling thread (it
    /// serves the event loop from here on, and may no longer create
    /// threads), then lets the vCPUs into the guest.
    pub fn start(&mut self) -> Result<(), Error> {
        if !self.handles.is_empty() || self.vcpus.is_empty() {
            return Err(Error::AlreadyStarted);
        }
        let gate = Arc::new(StartGate::default());
        for vcpu in self.vcpus.drain(..) {
            let handle = vcpu.start(
                self.pio.clone(),
                self.mmio.clone(),
                self.stop.clone(),
                gate.clone(),
            );
            match handle {
                Ok(handle) => self.handles.push(handle),
                Err(e) => {
                    // The threads already started leave without entering
                    // the guest.
                    gate.abort();
                    return Err(e.into());
                }
            }
        }
        // This thread's filter (no thread creation in it) goes in once every
        // vCPU thread exists and has its own; only then do the vCPUs enter
        // the guest.
        gate.wait_for(self.handles.len());
        seccomp::install_or_exit(ThreadKind::Vmm);
        gate.open();
        self.timeline.mark("vcpus started");
        Ok(())
    }

    /// Takes every vCPU out of the guest; returns once all are waiting.
    pub fn pause(&self) -> Result<(), Error> {
        for handle in &self.handles {
            handle.pause()?;
        }
        Ok(())
    }

    pub fn resume(&self) {
        for handle in &self.handles {
            handle.resume();
        }
    }

    /// Whether every vCPU is paused (a machine never started counts).
    pub fn is_paused(&self) -> bool {
        self.handles.iter().all(VcpuHandle::is_paused)
    }

    /// Every device's state; only while paused.
    pub fn save_devices(&self) -> Result<DeviceStates, Error> {
        if !self.is_paused() {
            return Err(Error::NotPaused);
        }
        Ok(self.registry.save()?)
    }

    /// Saves the whole machine to a snapshot at `dir` (snapshot/mod.rs):
    /// every vCPU (read by its own thread), the VM's in-kernel devices,
    /// every device in the registry and guest RAM. Only while paused (or
    /// before the start); the machine can resume afterwards.
    pub fn snapshot(&self, dir: &Path) -> Result<(), Error> {
        let skip = self.unsaved();
        snapshot::write_with(dir, &self.state()?, &self.mem, &|_, region| {
            memory::without(region.start_addr().0, memory::data_ranges(region), &skip)
        })?;
        Ok(())
    }

    /// Guest memory a snapshot leaves out, as holes that a restore reads
    /// as zeros: the DMA bounce pool, which only virtio-fs requests use
    /// (fs_windows.rs). A machine saves only while no request ever crossed
    /// a virtio-fs device (devices/src/virtio/fs), so nothing in it is in
    /// use; the kernel zeroed it at boot, 8 MiB the save need not copy.
    fn unsaved(&self) -> Vec<std::ops::Range<u64>> {
        self.report
            .snapshot()
            .bounce_pool
            .range()
            .into_iter()
            .collect()
    }

    /// The machine's state and a copy of its RAM's data, taken in this
    /// process so that it can resume at once and the copy be written
    /// later ([`capture::Capture::write`]). Only while paused.
    pub fn capture(&self) -> Result<capture::Capture, Error> {
        Ok(capture::Capture::take(
            self.state()?,
            &self.mem,
            &self.unsaved(),
        )?)
    }

    /// Everything but RAM: every vCPU (read by its own thread), the VM's
    /// in-kernel devices, every device in the registry, the memory
    /// layout. Only while paused (or before the start).
    fn state(&self) -> Result<MachineState, Error> {
        if !self.is_paused() {
            return Err(Error::NotPaused);
        }
        let vcpus = if self.handles.is_empty() {
            self.vcpus
                .iter()
                .map(Vcpu::save_state)
                .collect::<Result<Vec<_>, _>>()?
        } else {
            self.handles
                .iter()
                .map(VcpuHandle::save_state)
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(MachineState {
            mem_size: self.mem.iter().map(|r| r.len()).sum(),
            cmdline: self.cmdline.clone(),
            vm: VmState::save(&self.vm)?,
            vcpus,
            devices: self.registry.save()?,
            regions: snapshot::layout(&self.mem),
        })
    }

    /// Serves the devices until the machine stops or `deadline` passes,
    /// leaving the vCPUs as they are.
    pub fn run_until(&mut self, deadline: Option<Instant>) -> Result<Wait, Error> {
        Ok(self.event_loop.run_until_stopped(deadline)?)
    }

    /// Serves the devices until the guest has written boot marker
    /// `marker` ([`Wait::Done`]), the machine stops or `deadline` passes,
    /// leaving the vCPUs as they are. Sleeps between events: the status
    /// port wakes the loop on each new marker.
    pub fn run_until_marker(
        &mut self,
        marker: u8,
        deadline: Option<Instant>,
    ) -> Result<Wait, Error> {
        let report = self.report.clone();
        Ok(self
            .event_loop
            .run_until(deadline, &|| report.has_marker(marker))?)
    }

    /// Runs the machine to its end (a deadline that passes stops it with
    /// [`StopReason::Timeout`]), ends the vCPU threads and says how it
    /// ended.
    pub fn wait(&mut self, deadline: Option<Instant>) -> Result<Ended, Error> {
        if self.run_until(deadline)? == Wait::Deadline {
            self.stop.stop(StopReason::Timeout);
        }
        self.timeline.mark("vm stopped");
        let vcpus_left_behind = self.end_vcpus();
        self.timeline.mark("vcpus joined");
        if let Ok(mut serial) = self.serial.lock() {
            // Console loss must not hide the command's status.
            let _ = serial.writer_mut().drain();
        }
        let report = self.report.snapshot();
        let outcome = Outcome::decide(
            self.stop.reason(),
            report.exit_status,
            self.panic_seen.load(Ordering::SeqCst),
        );
        Ok(Ended {
            outcome,
            markers: report.markers,
            vcpus_left_behind,
        })
    }

    /// Ends and joins every vCPU thread; returns how many did not leave.
    fn end_vcpus(&mut self) -> usize {
        let mut left = 0;
        for handle in &mut self.handles {
            if !handle.stop_and_join() {
                left += 1;
            }
        }
        self.handles.clear();
        left
    }

    /// Each vCPU's plain KVM counters by name (kvm_counters.rs), read
    /// now; empty where KVM keeps none.
    pub fn kvm_counters(&self) -> Vec<(u8, std::io::Result<kvm_counters::Named>)> {
        self.counters
            .iter()
            .map(|(id, c)| (*id, c.read()))
            .collect()
    }

    /// Pages of guest memory resident in this process (mincore), in KiB:
    /// the part of mvm's RSS that is the guest's, not the VMM's.
    pub fn guest_resident_kib(&self) -> Option<u64> {
        const PAGE: usize = 4096;
        let mut total = 0u64;
        for region in self.mem.iter() {
            let len = region.len() as usize;
            let mut vec = vec![0u8; len.div_ceil(PAGE)];
            // SAFETY: the region is a live page-aligned mapping of `len`
            // bytes owned by `self.mem`; `vec` has one byte per page, as
            // mincore needs.
            let rc = unsafe { libc::mincore(region.as_ptr().cast(), len, vec.as_mut_ptr()) };
            if rc != 0 {
                return None;
            }
            total += vec.iter().filter(|b| *b & 1 == 1).count() as u64 * (PAGE as u64 / 1024);
        }
        Some(total)
    }
}

impl Drop for Machine {
    /// A machine dropped while running (an error on the way, a test) takes
    /// its vCPU threads with it rather than leaving them in the guest.
    fn drop(&mut self) {
        self.end_vcpus();
    }
}
