//! vCPUs: their boot state, the thread each one runs on, and the handle
//! that pauses, resumes and ends that thread.
//!
//! A vCPU thread loops in `KVM_RUN` and serves port and MMIO exits itself,
//! synchronously, through the buses; everything else (the console input,
//! stopping the VM) happens on the event loop thread.
//!
//! Pausing and ending a vCPU needs it out of `KVM_RUN`, where it can sit
//! for as long as the guest keeps it busy or halted: the handle records
//! what it wants, then kicks the thread with [`kick_signal`] (a no-op
//! handler, so `KVM_RUN` returns EINTR) until the thread says it got
//! there. A kick that lands just before the thread enters `KVM_RUN` is
//! lost, hence the repeated kicks rather than one.

use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::confine::{seccomp, ThreadKind};

use kvm_bindings::CpuId;
use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};
use mvm_devices::bus::Bus;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::signal::{register_signal_handler, Killable};

use super::snapshot::vcpu_state::{Error as VcpuStateError, VcpuState};
use super::stop::{StopHandle, StopReason};
use crate::arch::x86_64::{cpuid, interrupts, msr, regs};

/// How often a vCPU that has not answered yet is kicked again.
const KICK_INTERVAL: Duration = Duration::from_millis(2);
/// How long a vCPU gets to leave: one stuck in a device (a backend that
/// does not answer) is left behind rather than hanging the VMM's exit.
pub const VCPU_EXIT_GRACE: Duration = Duration::from_secs(2);

/// The real-time signal that kicks a vCPU thread out of `KVM_RUN` (the
/// one signal the vmm thread's filter lets it send).
pub fn kick_signal() -> i32 {
    seccomp::vcpu_kick_signal()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Nothing to do: interrupting KVM_RUN is the point.
}

/// Installs the kick handler for the process; before confinement
/// (rt_sigaction is in no thread's allow-list) and before any vCPU thread.
pub fn install_kick_handler() -> Result<(), Error> {
    register_signal_handler(kick_signal(), on_kick)
        .map_err(|e| Error::KickHandler(io::Error::from_raw_os_error(e.errno())))
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("KVM could not create vCPU {id}: {source}")]
    Create { id: u8, source: io::Error },
    #[error("KVM could not set {what} on vCPU {id}: {source}")]
    Configure {
        id: u8,
        what: &'static str,
        source: io::Error,
    },
    #[error("KVM accepted only {set} of {total} boot MSRs on vCPU {id}")]
    Msrs { id: u8, set: usize, total: usize },
    #[error("boot register setup failed: {0}")]
    Regs(#[from] regs::Error),
    #[error("cannot start the vCPU {id} thread: {source}")]
    Spawn { id: u8, source: io::Error },
    #[error("cannot install the vCPU kick signal handler: {0}")]
    KickHandler(io::Error),
    #[error("vCPU {id} did not pause within {VCPU_EXIT_GRACE:?}")]
    PauseTimeout { id: u8 },
    #[error("vCPU {id} is not paused")]
    NotPaused { id: u8 },
    #[error("cannot save vCPU {id}: {why}")]
    Save { id: u8, why: String },
    #[error(transparent)]
    State(#[from] VcpuStateError),
}

/// Where new vCPU threads wait until the machine lets them into the
/// guest: after each has installed its seccomp filter and the main thread
/// its own (no guest instruction runs before every filter is in), or never
/// if starting the machine failed halfway.
#[derive(Default)]
pub struct StartGate {
    /// vCPU threads arrived, and the decision once made.
    state: Mutex<(usize, Option<bool>)>,
    changed: Condvar,
}

impl StartGate {
    fn lock(&self) -> MutexGuard<'_, (usize, Option<bool>)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A vCPU thread: true to run the guest, false to leave.
    fn arrive_and_wait(&self) -> bool {
        let mut state = self.lock();
        state.0 += 1;
        self.changed.notify_all();
        loop {
            if let Some(go) = state.1 {
                return go;
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The main thread, once `count` vCPU threads have arrived.
    pub fn wait_for(&self, count: usize) {
        let mut state = self.lock();
        while state.0 < count {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub fn open(&self) {
        self.decide(true);
    }

    pub fn abort(&self) {
        self.decide(false);
    }

    fn decide(&self, go: bool) {
        self.lock().1.get_or_insert(go);
        self.changed.notify_all();
    }
}

/// What the handle wants the vCPU thread to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Run,
    Pause,
    /// Save the state, then stay paused.
    Save,
    Exit,
}

/// Where the vCPU thread is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    Running,
    Paused,
    Gone,
}

struct ControlState {
    want: Want,
    at: Where,
    /// A save the handle asked for, once the thread made it.
    saved: Option<Result<VcpuState, String>>,
}

struct Control {
    state: Mutex<ControlState>,
    changed: Condvar,
}

impl Control {
    fn lock(&self) -> MutexGuard<'_, ControlState> {
        // The state is plain data: a panic elsewhere leaves it consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The vCPU thread, between two KVM_RUNs: false when it must leave.
    /// While paused it also serves save requests, so the vCPU's state is
    /// read by the thread that owns its fd.
    fn checkpoint(&self, vcpu: &Vcpu) -> bool {
        let mut state = self.lock();
        loop {
            match state.want {
                Want::Run => {
                    state.at = Where::Running;
                    self.changed.notify_all();
                    return true;
                }
                Want::Exit => return false,
                Want::Save => {
                    state.saved = Some(
                        VcpuState::save(vcpu.id, &vcpu.fd, &vcpu.msr_index)
                            .map_err(|e| e.to_string()),
                    );
                    state.want = Want::Pause;
                    self.changed.notify_all();
                }
                Want::Pause => {
                    if state.at != Where::Paused {
                        state.at = Where::Paused;
                        self.changed.notify_all();
                    }
                    state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }

    fn gone(&self) {
        self.lock().at = Where::Gone;
        self.changed.notify_all();
    }
}

/// A running vCPU thread.
pub struct VcpuHandle {
    id: u8,
    control: Arc<Control>,
    /// The thread hands its vCPU back when it ends, so the fd is closed by
    /// the joining thread rather than in a thread whose filter is made for
    /// KVM_RUN.
    thread: Option<JoinHandle<Vcpu>>,
}

impl VcpuHandle {
    pub fn id(&self) -> u8 {
        self.id
    }

    fn want(&self, want: Want) {
        let mut state = self.control.lock();
        if state.want != Want::Exit {
            state.want = want;
        }
        self.control.changed.notify_all();
    }

    /// Kicks the thread until `arrived` holds or `grace` passes.
    fn kick_until(&self, arrived: impl Fn(Where) -> bool, grace: Duration) -> bool {
        let deadline = Instant::now() + grace;
        let mut state = self.control.lock();
        loop {
            if arrived(state.at) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if let Some(thread) = &self.thread {
                // Fails only once the thread is gone, which `arrived` sees.
                let _ = thread.kill(kick_signal());
            }
            let wait = KICK_INTERVAL.min(deadline - now);
            state = self
                .control
                .changed
                .wait_timeout(state, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Returns once the vCPU is out of the guest and waiting (or gone).
    pub fn pause(&self) -> Result<(), Error> {
        self.want(Want::Pause);
        if self.kick_until(|w| w != Where::Running, VCPU_EXIT_GRACE) {
            Ok(())
        } else {
            Err(Error::PauseTimeout { id: self.id })
        }
    }

    pub fn resume(&self) {
        self.want(Want::Run);
    }

    /// Whether the thread is paused right now.
    pub fn is_paused(&self) -> bool {
        self.control.lock().at == Where::Paused
    }

    /// The vCPU's state, read by its own thread; only while paused.
    pub fn save_state(&self) -> Result<VcpuState, Error> {
        let mut state = self.control.lock();
        if state.at != Where::Paused || state.want != Want::Pause {
            return Err(Error::NotPaused { id: self.id });
        }
        state.saved = None;
        state.want = Want::Save;
        self.control.changed.notify_all();
        loop {
            if let Some(saved) = state.saved.take() {
                return saved.map_err(|why| Error::Save { id: self.id, why });
            }
            if state.at == Where::Gone {
                return Err(Error::NotPaused { id: self.id });
            }
            state = self
                .control
                .changed
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Ends the thread and joins it; false if it did not leave within
    /// [`VCPU_EXIT_GRACE`] (it is then left to the process's exit).
    pub fn stop_and_join(&mut self) -> bool {
        self.want(Want::Exit);
        let left = self.kick_until(|w| w == Where::Gone, VCPU_EXIT_GRACE);
        if left {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
        left
    }
}

/// Why a vCPU stopped running the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
enum VcpuStop {
    /// Triple fault or a failed reset: the guest is gone.
    Shutdown,
    /// KVM or the VMM could not continue; the text says why.
    Failed(String),
    /// The handle asked it to leave.
    Asked,
}

pub struct Vcpu {
    id: u8,
    fd: VcpuFd,
    /// The MSRs KVM saves and restores (`KVM_GET_MSR_INDEX_LIST`).
    msr_index: Arc<Vec<u32>>,
}

fn configure_err(id: u8, what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |e| Error::Configure {
        id,
        what,
        source: io::Error::from_raw_os_error(e.errno()),
    }
}

impl Vcpu {
    pub fn id(&self) -> u8 {
        self.id
    }

    pub fn new(vm: &VmFd, id: u8, msr_index: Arc<Vec<u32>>) -> Result<Self, Error> {
        let fd = vm.create_vcpu(u64::from(id)).map_err(|e| Error::Create {
            id,
            source: io::Error::from_raw_os_error(e.errno()),
        })?;
        Ok(Self { id, fd, msr_index })
    }

    /// The state of a vCPU that is not running (not started, or handed
    /// back by its thread).
    pub fn save_state(&self) -> Result<VcpuState, Error> {
        Ok(VcpuState::save(self.id, &self.fd, &self.msr_index)?)
    }

    /// Maps guest memory that holds data ahead of the guest's first touch
    /// (prefault.rs); returns the bytes mapped.
    pub fn prefault(&self, ranges: &[std::ops::Range<u64>]) -> io::Result<u64> {
        super::prefault::prefault(&self.fd, ranges)
    }

    /// Its KVM counters (kvm_counters.rs), opened now: the file stays
    /// readable after confinement, which forbids the ioctl that opens it.
    pub fn counters(&self) -> Option<super::kvm_counters::Counters> {
        super::kvm_counters::Counters::open(&self.fd)
    }

    /// Sets saved state on a vCPU that has not run yet.
    pub fn restore_state(&self, state: &VcpuState) -> Result<(), Error> {
        Ok(state.restore(&self.fd)?)
    }

    /// CPUID, MSRs and LAPIC for every vCPU; registers for the boot vCPU
    /// only (`entry` is Some), since the others wait in KVM for the guest's
    /// INIT/SIPI and start wherever it tells them.
    pub fn configure(
        &self,
        supported_cpuid: &CpuId,
        cpu_count: u8,
        mem: &GuestMemoryMmap,
        entry: Option<GuestAddress>,
    ) -> Result<(), Error> {
        let id = self.id;
        let mut cpuid = supported_cpuid.clone();
        cpuid::filter(&mut cpuid, id, cpu_count);
        self.fd
            .set_cpuid2(&cpuid)
            .map_err(configure_err(id, "CPUID"))?;
        if let Some(xcr0) = cpuid::boot_xcr0(&cpuid) {
            let mut xcrs = kvm_bindings::kvm_xcrs {
                nr_xcrs: 1,
                ..Default::default()
            };
            xcrs.xcrs[0].value = xcr0;
            self.fd.set_xcrs(&xcrs).map_err(configure_err(id, "XCR0"))?;
        }

        let msrs = msr::boot_msrs();
        let set = self.fd.set_msrs(&msrs).map_err(configure_err(id, "MSRs"))?;
        if set != msrs.as_slice().len() {
            return Err(Error::Msrs {
                id,
                set,
                total: msrs.as_slice().len(),
            });
        }

        if let Some(entry) = entry {
            self.fd
                .set_regs(&regs::boot_regs(entry))
                .map_err(configure_err(id, "registers"))?;
            let mut sregs = self
                .fd
                .get_sregs()
                .map_err(configure_err(id, "special registers"))?;
            regs::setup_sregs(mem, &mut sregs)?;
            self.fd
                .set_sregs(&sregs)
                .map_err(configure_err(id, "special registers"))?;
            self.fd
                .set_fpu(&regs::boot_fpu())
                .map_err(configure_err(id, "FPU state"))?;
        }

        let mut lapic = self.fd.get_lapic().map_err(configure_err(id, "LAPIC"))?;
        interrupts::set_lint(&mut lapic);
        self.fd
            .set_lapic(&lapic)
            .map_err(configure_err(id, "LAPIC"))?;
        Ok(())
    }

    /// Runs the guest on a new thread until it stops or the handle ends
    /// it; a stop the guest caused goes to `stop`.
    ///
    /// The thread installs its seccomp filter first, then waits at `gate`
    /// until the machine opens it.
    pub fn start(
        self,
        pio: Arc<Bus>,
        mmio: Arc<Bus>,
        stop: StopHandle,
        gate: Arc<StartGate>,
    ) -> Result<VcpuHandle, Error> {
        let id = self.id;
        let control = Arc::new(Control {
            state: Mutex::new(ControlState {
                want: Want::Run,
                at: Where::Running,
                saved: None,
            }),
            changed: Condvar::new(),
        });
        let thread_control = control.clone();
        let thread = thread::Builder::new()
            .name(format!("mvm-vcpu{id}"))
            .spawn(move || {
                let mut vcpu = self;
                seccomp::block_forwarded_signals();
                let confined = seccomp::install(ThreadKind::Vcpu);
                let why = match (gate.arrive_and_wait(), confined) {
                    (false, _) => VcpuStop::Asked,
                    (true, Ok(())) => vcpu.run(&pio, &mmio, &thread_control),
                    (true, Err(e)) => VcpuStop::Failed(e.to_string()),
                };
                thread_control.gone();
                match why {
                    VcpuStop::Shutdown => stop.stop(StopReason::VcpuShutdown),
                    VcpuStop::Failed(why) => stop.stop(StopReason::Failed(why)),
                    VcpuStop::Asked => {}
                }
                vcpu
            })
            .map_err(|source| Error::Spawn { id, source })?;
        Ok(VcpuHandle {
            id,
            control,
            thread: Some(thread),
        })
    }

    fn run(&mut self, pio: &Bus, mmio: &Bus, control: &Control) -> VcpuStop {
        loop {
            if !control.checkpoint(self) {
                return VcpuStop::Asked;
            }
            match self.fd.run() {
                // Unclaimed ports read as all ones, like a floating ISA bus,
                // so drivers probing absent hardware find nothing.
                Ok(VcpuExit::IoIn(port, data)) => {
                    if !pio.read(u64::from(port), data) {
                        data.fill(0xff);
                    }
                }
                Ok(VcpuExit::IoOut(port, data)) => {
                    pio.write(u64::from(port), data);
                }
                Ok(VcpuExit::MmioRead(addr, data)) => {
                    if !mmio.read(addr, data) {
                        data.fill(0xff);
                    }
                }
                Ok(VcpuExit::MmioWrite(addr, data)) => {
                    mmio.write(addr, data);
                }
                Ok(VcpuExit::Shutdown) => return VcpuStop::Shutdown,
                // With the in-kernel irqchip KVM handles HLT itself; seeing
                // it here means the guest halted with interrupts off.
                Ok(VcpuExit::Hlt) => return VcpuStop::Shutdown,
                Ok(VcpuExit::FailEntry(reason, cpu)) => {
                    return VcpuStop::Failed(format!(
                    "vCPU {} failed to enter the guest (hardware reason {reason:#x}, cpu {cpu})",
                    self.id
                ))
                }
                Ok(VcpuExit::InternalError) => {
                    return VcpuStop::Failed(format!(
                        "KVM internal error on vCPU {} (instruction emulation failed)",
                        self.id
                    ))
                }
                Ok(other) => {
                    return VcpuStop::Failed(format!(
                        "unexpected exit from vCPU {}: {other:?}",
                        self.id
                    ))
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
                Err(e) => {
                    return VcpuStop::Failed(format!("KVM_RUN failed on vCPU {}: {e}", self.id))
                }
            }
        }
    }
}
