//! vCPUs: their boot state, and the thread each one runs on.
//!
//! A vCPU thread loops in `KVM_RUN` and serves port and MMIO exits itself,
//! synchronously, through the buses; everything else (the console input,
//! stopping the VM) happens on the event loop thread.

use std::io;
use std::sync::Barrier;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use crate::confine::{seccomp, ThreadKind};

use kvm_bindings::CpuId;
use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};
use mvm_devices::bus::Bus;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::arch::x86_64::{cpuid, interrupts, msr, regs};

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
}

/// Why a vCPU stopped running the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuStop {
    /// Triple fault or a failed reset: the guest is gone.
    Shutdown,
    /// KVM or the VMM could not continue; the text says why.
    Failed(String),
}

/// Where a stopping vCPU records why before waking the event loop.
#[derive(Clone)]
pub struct StopSignal {
    pub reason: Arc<Mutex<Option<VcpuStop>>>,
    pub evt: Arc<EventFd>,
    /// Set by the event loop once it has seen the stop.
    pub stopped: Arc<std::sync::atomic::AtomicBool>,
}

impl StopSignal {
    /// The first reason wins: later vCPUs stopping in its wake add nothing.
    pub fn stop(&self, why: VcpuStop) {
        if let Ok(mut reason) = self.reason.lock() {
            reason.get_or_insert(why);
        }
        // If the eventfd cannot be written the event loop never wakes; the
        // counter only fails on overflow, which one write cannot reach.
        let _ = self.evt.write(1);
    }
}

pub struct Vcpu {
    id: u8,
    fd: VcpuFd,
}

fn configure_err(id: u8, what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |e| Error::Configure {
        id,
        what,
        source: io::Error::from_raw_os_error(e.errno()),
    }
}

impl Vcpu {
    pub fn new(vm: &VmFd, id: u8) -> Result<Self, Error> {
        let fd = vm.create_vcpu(u64::from(id)).map_err(|e| Error::Create {
            id,
            source: io::Error::from_raw_os_error(e.errno()),
        })?;
        Ok(Self { id, fd })
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

    /// Runs the guest on a new thread until it stops, then reports why.
    ///
    /// The thread installs its seccomp filter first, then waits at `go`
    /// until the main thread has installed its own: no guest instruction
    /// runs before every filter is in.
    pub fn start(
        self,
        pio: Arc<Bus>,
        mmio: Arc<Bus>,
        stop: StopSignal,
        go: Arc<Barrier>,
    ) -> Result<JoinHandle<()>, Error> {
        let id = self.id;
        thread::Builder::new()
            .name(format!("mvm-vcpu{id}"))
            .spawn(move || {
                seccomp::block_forwarded_signals();
                let confined = seccomp::install(ThreadKind::Vcpu);
                go.wait();
                let why = match confined {
                    Ok(()) => self.run(&pio, &mmio),
                    Err(e) => VcpuStop::Failed(e.to_string()),
                };
                stop.stop(why);
            })
            .map_err(|source| Error::Spawn { id, source })
    }

    fn run(mut self, pio: &Bus, mmio: &Bus) -> VcpuStop {
        loop {
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
