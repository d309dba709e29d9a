//! I/O ports through which the guest reports to the VMM.
//!
//! The port numbers and marker values are the boot contract
//! (`mvm_protocol::boot`, docs/protocol.md), shared with the VMM.
//! Port I/O only works as a privileged process inside the guest, so this
//! module has no unit tests.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use mvm_protocol::boot;

/// First port of the mvm range.
pub const PORT_BASE: u16 = boot::STATUS_PORT;
/// Number of ports in the range we ask `ioperm` for.
pub const PORT_COUNT: u16 = boot::STATUS_PORT_LEN;
/// The u8 boot progress marker.
pub const BOOT_MARKER_PORT: u16 = PORT_BASE + boot::MARKER_OFFSET;
/// The u32 exit status of the guest command.
pub const EXIT_STATUS_PORT: u16 = PORT_BASE + boot::EXIT_STATUS_OFFSET;
/// The u32 registers for where the DMA bounce pool lies.
const POOL_PFN_PORT: u16 = PORT_BASE + boot::BOUNCE_POOL_PFN_OFFSET;
const POOL_PAGES_PORT: u16 = PORT_BASE + boot::BOUNCE_POOL_PAGES_OFFSET;

/// The kernel's `CLOCK_BOOTTIME` (ns) at the boot marker; 0: not taken.
static INIT_STARTED_NS: AtomicU64 = AtomicU64::new(0);

/// The kernel's `CLOCK_BOOTTIME` in nanoseconds when init wrote its boot
/// marker, if it did (the agent's `Hello` carries it to the host).
pub fn init_started_ns() -> Option<u64> {
    Some(INIT_STARTED_NS.load(Ordering::Relaxed)).filter(|&ns| ns != 0)
}

/// Gives up this process's access to the mvm ports (ioperm off): for a
/// child between fork and exec, since the I/O bitmap is inherited and
/// survives setuid and exec. Returns 0, or -1 with errno set; a kernel
/// without ioperm (ENOSYS) never granted access, so that is success.
pub fn revoke() -> libc::c_int {
    // SAFETY: plain syscall with integer arguments; turning access off
    // needs no privilege and only changes this process's I/O bitmap.
    let rc = unsafe {
        libc::ioperm(
            libc::c_ulong::from(PORT_BASE),
            libc::c_ulong::from(PORT_COUNT),
            0,
        )
    };
    if rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        return 0;
    }
    rc
}

/// Proof that `ioperm` granted access to the mvm ports. An `out` without it
/// would fault, killing PID 1 and panicking the kernel, so the port writes
/// are only reachable through this type.
pub struct Ports(());

impl Ports {
    /// Asks the kernel for access to the mvm port range.
    pub fn enable() -> io::Result<Ports> {
        // SAFETY: plain syscall with integer arguments; it only changes this
        // process's I/O permission bitmap.
        let rc = unsafe {
            libc::ioperm(
                libc::c_ulong::from(PORT_BASE),
                libc::c_ulong::from(PORT_COUNT),
                1,
            )
        };
        if rc == 0 {
            Ok(Ports(()))
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Tells the VMM that init is running in userspace (it timestamps this),
    /// and notes the kernel's clock at that moment for the agent's hello.
    pub fn boot_marker(&self) {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: plain syscall filling the valid out-pointer it is given.
        if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } == 0 {
            let ns = now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64;
            INIT_STARTED_NS.store(ns, Ordering::Relaxed);
        }
        self.marker(boot::MARKER_INIT_STARTED);
    }

    /// Tells the VMM that init is ready and the command starts next.
    pub fn ready_marker(&self) {
        self.marker(boot::MARKER_INIT_READY);
    }

    /// Tells the VMM that the machine is set up for its run and the
    /// command is prepared and started next.
    pub fn machine_set_up_marker(&self) {
        self.marker(boot::MARKER_MACHINE_SET_UP);
    }

    fn marker(&self, value: u8) {
        // SAFETY: `self` proves ioperm covers this port; the VMM handles the
        // write as a device access and no guest memory is touched.
        unsafe {
            std::arch::asm!(
                "out dx, al",
                in("dx") BOOT_MARKER_PORT,
                in("al") value,
                options(nomem, nostack, preserves_flags),
            );
        }
    }

    /// Hands the guest command's exit status to the VMM.
    pub fn exit_status(&self, status: u32) {
        self.out32(EXIT_STATUS_PORT, status);
    }

    /// Tells the VMM where the kernel's DMA bounce pool lies (page-aligned
    /// guest-physical bytes), before the ready marker: a template taken
    /// there keeps it (docs/snapshots.md). A pool beyond 32-bit page
    /// numbers is not reported.
    pub fn bounce_pool(&self, pool: &std::ops::Range<u64>) {
        const PAGE: u64 = 4096;
        let pfn = u32::try_from(pool.start / PAGE);
        let pages = u32::try_from((pool.end - pool.start) / PAGE);
        if let (Ok(pfn), Ok(pages)) = (pfn, pages) {
            self.out32(POOL_PFN_PORT, pfn);
            self.out32(POOL_PAGES_PORT, pages);
        }
    }

    fn out32(&self, port: u16, value: u32) {
        // SAFETY: `self` proves ioperm covers the whole range, and every
        // 32-bit register of it lies inside (the asserts in
        // `mvm_protocol::boot`); the VMM handles the write as a device
        // access, no memory touched.
        unsafe {
            std::arch::asm!(
                "out dx, eax",
                in("dx") port,
                in("eax") value,
                options(nomem, nostack, preserves_flags),
            );
        }
    }
}
