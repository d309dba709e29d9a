//! The end of every guest run: report the status, then reboot. With
//! `reboot=k` the kernel resets through the i8042, which the VMM takes as
//! "stop the VM", exiting with the status it saw on the exit port.
//! Guest-only, no unit tests.

use crate::console;
use crate::say;
use crate::vmm_port::Ports;

/// Never returns: PID 1 exiting would panic the kernel.
pub fn report_and_reboot(ports: Option<&Ports>, status: u32) -> ! {
    say!("exit status {status}");
    console::drain();
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
