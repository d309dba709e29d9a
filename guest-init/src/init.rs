//! The boot sequence of PID 1, in order. Guest-only, no unit tests: each
//! step acts on the real system.

use std::ffi::CStr;
use std::io;

use mvm_protocol::DEFAULT_HOSTNAME;

use crate::error::Error;
use crate::vmm_port::Ports;
use crate::{
    agent, cmdline, console, hostname, loopback, mounts, power, reap, rootfs, say, shares,
    shutdown, spawn, status, thrash,
};

/// Runs the whole guest lifetime and ends it with a reboot.
pub fn run() -> ! {
    let mut ports = None;
    let status = match boot_and_run(&mut ports) {
        Ok(status) => status,
        Err(err) => {
            match err {
                // A documented line of its own (docs/protocol.md).
                Error::Share { .. } => say!("{err}"),
                _ => say!("error: {err}"),
            }
            status::INIT_FAILURE
        }
    };
    shutdown::report_and_reboot(ports.as_ref(), status)
}

fn boot_and_run(ports: &mut Option<Ports>) -> Result<u32, Error> {
    // Try the console even if /dev failed to mount (the initramfs might
    // carry a node), so that the mount error can be printed.
    let dev = mounts::mount_dev();
    let console = console::open();
    // Ports next, whatever happened to the console, so that any failure
    // still reaches the VMM as status 125. The VMM measures boot time up to
    // this marker.
    ports
        .insert(Ports::enable().map_err(Error::Ports)?)
        .boot_marker();
    console?;
    dev?;
    mounts::mount_others()?;
    if let Err(e) = thrash::prevent() {
        say!("warning: no thrashing prevention (a memory bomb may thrash until --timeout): {e}");
    }
    let line = std::fs::read("/proc/cmdline").map_err(Error::Cmdline)?;
    let line = String::from_utf8_lossy(&line);
    if let Some(root) = cmdline::root(&line)? {
        rootfs::enter(&root, false)?;
    }
    // The kernel's own default is "(none)", which tools such as git then
    // put into addresses.
    hostname::set(DEFAULT_HOSTNAME);
    // Before the shares, which may lie inside it: /root keeps its mode.
    mounts::ensure_dir(c"/root", 0o700)?;
    // A kernel of the user's without IPv4 has no lo to bring up; the
    // command then simply has no loopback network.
    if let Err(e) = loopback::up() {
        say!("warning: {e}");
    }
    // Before readiness, the agent and the command, which may use them.
    shares::mount_all(&cmdline::shares(&line)?)?;
    // The VMM gave us a vsock device: the command comes over it. Listening
    // before the ready marker: a template is taken at the marker.
    let agent = match cmdline::agent_requested(&line) {
        true => Some(agent::listen()?),
        false => None,
    };
    std::thread::sleep(cmdline::ready_delay(&line));
    say!("ready (kernel {})", kernel_release());
    if let Some(ports) = ports.as_ref() {
        if cmdline::bounce_requested(&line) {
            match agent::kernel_log::bounce_pool() {
                Some(pool) => ports.bounce_pool(&pool),
                None => say!("warning: the kernel logged no DMA bounce pool: a restore of this machine copies its memory"),
            }
        }
        ports.ready_marker();
    }

    if let Some(listener) = agent {
        return Ok(agent::run(listener, ports.as_ref())?);
    }
    let launch = cmdline::parse(&line)?;
    chdir(&launch.workdir)?;
    if let Err(e) = power::install() {
        say!("warning: poweroff/reboot requests will be ignored: {e}");
    }
    let pid = spawn::spawn(&launch.argv, launch.interactive)?;
    reap::wait_for(pid)
}

/// Changes init's own directory; the command inherits it across fork.
fn chdir(dir: &CStr) -> Result<(), Error> {
    // SAFETY: dir is a valid NUL-terminated string.
    if unsafe { libc::chdir(dir.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(Error::Chdir {
            path: dir.to_string_lossy().into_owned(),
            source: io::Error::last_os_error(),
        })
    }
}

fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; all-zero is a valid value.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uts is a valid out-pointer; on success `release` holds a
    // NUL-terminated string within the array.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return "unknown".into();
    }
    // SAFETY: see above; the array outlives the borrow.
    unsafe { CStr::from_ptr(uts.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}
