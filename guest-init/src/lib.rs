//! Guest PID 1 for mvm: mounts the basic filesystems, runs the command the
//! VMM put on the kernel command line, and reports its exit status back to
//! the VMM over an I/O port before rebooting (which stops the VM).
//!
//! Pure logic (`cmdline`, `status`) is unit-tested on the host. Everything
//! that mounts, forks, touches I/O ports or reboots only makes sense as PID 1
//! inside the guest and is exercised by booting a VM, not by unit tests.

#[cfg(not(target_arch = "x86_64"))]
compile_error!("mvm-init reports to the VMM through x86 I/O ports");

pub mod cmdline;
pub mod console;
pub mod error;
pub mod init;
pub mod mounts;
pub mod reap;
pub mod shutdown;
pub mod spawn;
pub mod status;
pub mod vmm_port;
