//! The VMM's view of the host filesystem after start: nothing, except
//! removing its own session directory at the end (and reading the console
//! log in it for a crash report), and for `mvm boot --snapshot-at-ready`
//! writing the snapshot below its parent directory. Everything else it needs (kernel,
//! initramfs, /dev/kvm, sockets, guest memory) is open by then.
//! Landlock does not cover connecting to a Unix socket by path, which is
//! how the exec client reaches the vsock device's socket.
//!
//! Where the kernel has Landlock's scopes (ABI 6, Linux 6.12), the VMM
//! cannot connect to an abstract Unix socket made outside its domain
//! either (an X server's, a desktop bus's): nothing mvm uses is one. The
//! signal scope is not set: the helpers (virtiofsd, mvm-egress) are started
//! before confinement, outside the domain, and the VMM must still end
//! them; seccomp already limits its `kill` to their process groups and its
//! `tgkill` to its own threads (seccomp.rs). On an older kernel the scope
//! is left out and the rest still holds (best effort, as for the
//! filesystem rights of newer ABIs).

use std::path::Path;

use landlock::{
    Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    Scope, ABI,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the host kernel does not enforce Landlock (Linux 5.13 or later, with landlock in the lsm= list): pass --no-landlock to run without it")]
    Unsupported,
    #[error("cannot set up Landlock: {0}")]
    Ruleset(String),
}

/// What the run may still touch.
#[derive(Default)]
pub struct Writable<'a> {
    /// Reading and removing entries of the session directory, and
    /// removing it from its parent (`base_dir`).
    pub session: Option<(&'a Path, &'a Path)>,
    /// Writing a snapshot: making, writing, renaming and removing entries
    /// below this directory (the snapshot's parent).
    pub snapshot_parent: Option<&'a Path>,
}

/// Restricts the calling thread and every thread and process it starts
/// from now on.
pub fn restrict(writable: Option<Writable>) -> Result<(), Error> {
    let ruleset_err = |e: landlock::RulesetError| Error::Ruleset(e.to_string());
    let abi = ABI::V5;
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(ruleset_err)?
        .scope(Scope::AbstractUnixSocket)
        .map_err(ruleset_err)?
        .create()
        .map_err(ruleset_err)?;
    let w = writable.unwrap_or_default();
    let fd = |p: &Path| PathFd::new(p).map_err(|e| Error::Ruleset(e.to_string()));
    if let Some((session_dir, base_dir)) = w.session {
        ruleset = ruleset
            .add_rule(PathBeneath::new(
                fd(session_dir)?,
                AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::RemoveFile | AccessFs::RemoveDir,
            ))
            .map_err(ruleset_err)?
            .add_rule(PathBeneath::new(fd(base_dir)?, AccessFs::RemoveDir))
            .map_err(ruleset_err)?;
    }
    if let Some(parent) = w.snapshot_parent {
        ruleset = ruleset
            .add_rule(PathBeneath::new(
                fd(parent)?,
                AccessFs::MakeDir
                    | AccessFs::MakeReg
                    | AccessFs::WriteFile
                    | AccessFs::ReadFile
                    | AccessFs::ReadDir
                    | AccessFs::RemoveDir
                    | AccessFs::RemoveFile
                    | AccessFs::Truncate,
            ))
            .map_err(ruleset_err)?;
    }
    let status = ruleset.restrict_self().map_err(ruleset_err)?;
    match status.ruleset {
        RulesetStatus::NotEnforced => Err(Error::Unsupported),
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

    /// The running kernel's Landlock ABI (0: none).
    fn kernel_abi() -> i64 {
        const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
        // SAFETY: landlock_create_ruleset with a null attribute and the
        // VERSION flag only returns a number; it creates nothing.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        v.max(0)
    }

    #[test]
    fn a_confined_vmm_cannot_reach_an_abstract_socket_made_outside() {
        if kernel_abi() < 6 {
            eprintln!(
                "skipped: this kernel's Landlock ABI is {} (scopes need 6, Linux 6.12)",
                kernel_abi()
            );
            return;
        }
        let name = format!("mvm-landlock-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let _listener = UnixListener::bind_addr(&addr).unwrap();
        // SAFETY: fork in a test; the child only connects, restricts itself
        // and connects again, then _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // The control: before confinement the socket is reachable.
            let code = if UnixStream::connect_addr(&addr).is_err() {
                10
            } else if restrict(None).is_err() {
                11
            } else {
                match UnixStream::connect_addr(&addr) {
                    Ok(_) => 12,
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => 0,
                    Err(_) => 13,
                }
            };
            // SAFETY: ends the forked child.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "{status:#x}");
        let what = match libc::WEXITSTATUS(status) {
            0 => return,
            10 => "the socket was unreachable even before confinement",
            11 => "Landlock could not be set up",
            12 => "the confined process still connected",
            _ => "the confined connect failed with another error than EPERM",
        };
        panic!("{what}");
    }
}
