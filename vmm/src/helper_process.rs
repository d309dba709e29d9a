//! What every helper process mvm starts (virtiofsd, mvm-egress) shares:
//! in the child before exec, a process group of its own (a Ctrl-C at the
//! terminal is mvm's to handle) and SIGKILL when mvm dies; and at the end,
//! the whole group killed and the child reaped. mvm-pull, which runs in
//! the foreground before any VM, only dies with mvm (a Ctrl-C reaches both).

use std::io;
use std::process::Child;

/// In the forked child, before exec: its own process group and death
/// with `parent` (see [`die_with`]).
pub fn own_group_and_die_with(parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: a plain syscall about this process only.
    if unsafe { libc::setpgid(0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    die_with(parent)
}

/// In the forked child, before exec: SIGKILL when `parent` dies, and
/// ESRCH if it already has (the parent may have died before the prctl
/// took effect). Nothing here allocates: between fork and exec only
/// async-signal-safe calls are allowed, and only an OS error code
/// reaches the parent anyway.
pub fn die_with(parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: plain syscalls about this process only.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::getppid() != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    Ok(())
}

/// Kills the helper's process group (its pid: see above; a sandboxed
/// grandchild is in it too) and reaps the helper.
pub fn end_group(child: &mut Child) {
    let pgid = child.id() as libc::pid_t;
    // SAFETY: signals a process group this process created.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
    let _ = child.wait();
}
