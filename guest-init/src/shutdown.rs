//! The end of every guest run: report the status, then reboot. With
//! `reboot=k` the kernel resets through the i8042, which the VMM takes as
//! "stop the VM", exiting with the status it saw on the exit port.
//! Guest-only, no unit tests.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::console;
use crate::say;
use crate::vmm_port::Ports;

/// Set once the status line is on the console and the file systems are
/// synced.
static ANNOUNCED: AtomicBool = AtomicBool::new(false);

/// Says the exit status on the console, waits for the line to leave the
/// serial port and syncs every file system: after this the machine may be
/// stopped from outside without losing anything. The exec agent calls it
/// before its `Exit` frame, on which the VMM stops the machine at once
/// (docs/protocol.md).
pub fn announce(status: u32) {
    if ANNOUNCED.swap(true, Ordering::SeqCst) {
        return;
    }
    say!("exit status {status}");
    console::drain();
    // SAFETY: plain syscall.
    unsafe { libc::sync() };
}

/// Never returns: PID 1 exiting would panic the kernel.
pub fn report_and_reboot(ports: Option<&Ports>, status: u32) -> ! {
    announce(status);
    match ports {
        Some(ports) => ports.exit_status(status),
        None => say!("error: cannot report the exit status to the VMM"),
    }
    // SAFETY: plain syscalls; reboot(2) only returns on failure.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_AUTOBOOT);
    }
    say!("error: reboot: {}", std::io::Error::last_os_error());
    loop {
        // SAFETY: plain syscall; init just sleeps until the VMM kills the VM.
        unsafe { libc::pause() };
    }
}
