//! The VMM's view of the host filesystem after start: nothing, except
//! removing its own session directory at the end (and reading the console
//! log in it for a crash report), and for `mvm boot --snapshot-at-ready`
//! writing the snapshot below its parent directory. Everything else it needs (kernel,
//! initramfs, /dev/kvm, sockets, guest memory) is open by then.
//! Landlock does not cover connecting to a Unix socket by path, which is
//! how the exec client reaches the vsock device's socket.

use std::path::Path;

use landlock::{
    Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    ABI,
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
