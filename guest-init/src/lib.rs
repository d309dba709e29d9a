//! Guest PID 1 for mvm: mounts the basic filesystems and the virtio-fs
//! shares the VMM announces (`mvm.mount`), runs the command the
//! VMM put on the kernel command line, or with `mvm.agent=1` serves the
//! exec channel over vsock (`agent`), and reports the exit status back to
//! the VMM over an I/O port before rebooting (which stops the VM).
//!
//! Pure logic (`cmdline`, `status`, the agent's request, framing, buffering
//! and drain rules) is unit-tested on the host, and `tests/relay.rs` runs the
//! agent's spawn and relay against real processes. Everything that mounts,
//! listens on vsock, touches I/O ports or reboots only makes sense as PID 1
//! inside the guest and is exercised by booting a VM, not by unit tests.

#[cfg(not(target_arch = "x86_64"))]
compile_error!("mvm-init reports to the VMM through x86 I/O ports");

pub mod agent;
pub mod cmdline;
pub mod console;
pub mod errno;
pub mod error;
pub mod forwarder;
pub mod hostname;
pub mod init;
pub mod loopback;
pub mod mounts;
pub mod power;
pub mod reap;
pub mod rootfs;
pub mod sandbox_disk;
pub mod shares;
pub mod shutdown;
pub mod spawn;
pub mod status;
pub mod thrash;
pub mod vmm_port;
