//! The pages a machine's guest touches first (machine/working_set.rs),
//! kept in the template store and mapped ahead by the machines that find
//! them (docs/snapshots.md, "The pages a run touches first"):
//!
//! - of a template, as `pages` in its directory: what a restored run
//!   touches up to the agent's "machine set up" marker;
//! - of a machine that boots, as `boot-pages/KEY` (KEY: the template key
//!   of the same machine): what a cold boot and its run's set-up touch up
//!   to the same marker.
//!
//! Where there is none yet, the run that finds none records it.
//!
//! The file is only a hint (a wrong one changes what is mapped, never
//! what the guest reads), so it gets no checksum: one that does not parse
//! is removed, unless a run is still writing it (it holds a lock on it
//! until then), and the next run records it again.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::template::{self, TemplateInfo};
use super::{vmm_failure, Failure};
use crate::config::VmConfig;
use crate::machine::event_loop::Wait;
use crate::machine::working_set::{WorkingSet, MAX_SHARE};
use crate::machine::Machine;
use crate::timeline::Timeline;

/// The file's name in a template's directory.
pub const PAGES_FILE: &str = "pages";
/// The directory, in the template store, of the sets of booted machines.
pub const BOOT_PAGES_DIR: &str = "boot-pages";

/// What a restore or a boot does about the pages its guest touches first.
pub enum FirstPages {
    /// Maps these ahead.
    Ahead(WorkingSet),
    /// There are none yet: this run records them.
    Record(Recorder),
    /// Neither: another run is recording them, this one removed a file
    /// nobody finished (a later run records them), or this one may not
    /// record (a sandbox, whose agent serves many commands and sends no
    /// marker).
    Neither,
}

impl FirstPages {
    /// The set to map ahead and the recorder, whichever there is.
    pub fn split(self) -> (Option<WorkingSet>, Option<Recorder>) {
        match self {
            FirstPages::Ahead(set) => (Some(set), None),
            FirstPages::Record(recorder) => (None, Some(recorder)),
            FirstPages::Neither => (None, None),
        }
    }
}

/// The file this run records into, locked, and its page table.
pub struct Recorder {
    out: File,
    /// `/proc/self/pagemap`, opened before confinement.
    pagemap: File,
}

/// The pages for a restore of the template in `dir`, of `mem_size`
/// bytes of guest RAM; `may_record`: this run's agent sends the marker.
/// Everything here happens before confinement.
pub fn for_restore(dir: &Path, mem_size: u64, may_record: bool) -> FirstPages {
    at(&dir.join(PAGES_FILE), mem_size, may_record)
}

/// The pages for a boot of the machine `config` describes, in the
/// template store `store`; `may_record` as for [`for_restore`]. A machine
/// that cannot be keyed, or a directory for the sets that cannot be made
/// or is not the caller's alone (mode 0700), has neither, without a
/// word: the boot goes on as it would without them.
pub fn for_boot(store: &Path, config: &VmConfig, may_record: bool) -> FirstPages {
    let Ok(info) = TemplateInfo::of(config) else {
        return FirstPages::Neither;
    };
    if template::make_store(store).is_err() {
        return FirstPages::Neither;
    }
    // Made here when missing; whether it may be used is for `sets_dir`
    // to say, which looks at it once and does not follow a link.
    match fs::DirBuilder::new()
        .mode(0o700)
        .create(store.join(BOOT_PAGES_DIR))
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(_) => return FirstPages::Neither,
    }
    match sets_dir(store) {
        Some(dir) => at(&dir.join(info.key()), config.mem_size, may_record),
        None => FirstPages::Neither,
    }
}

/// The directory of the boot sets in `store`, if it is one of the
/// caller's alone: a directory itself, not a link to one (a link planted
/// by someone who can write to the store could point at any directory of
/// the caller's), of the caller's with mode 0700.
fn sets_dir(store: &Path) -> Option<PathBuf> {
    let dir = store.join(BOOT_PAGES_DIR);
    let meta = fs::symlink_metadata(&dir).ok()?;
    let own = meta.is_dir()
        && meta.uid() == crate::session::dir::current_uid()
        && meta.mode() & 0o077 == 0;
    own.then_some(dir)
}

/// Removes the boot sets that no run is writing (`mvm snapshot prune`
/// and `rm --all`: each is recorded again by the next cold boot of its
/// machine); returns how many. Only files named as keys are, and only in
/// a directory of the caller's alone.
pub fn remove_boot_sets(store: &Path) -> usize {
    let Some(dir) = sets_dir(store) else {
        return 0;
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(template::is_key))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .filter(|p| !is_being_written(p) && fs::remove_file(p).is_ok())
        .count()
}

/// How many boot sets `store` holds (`mvm snapshot ls`).
pub fn count_boot_sets(store: &Path) -> usize {
    sets_dir(store)
        .and_then(|dir| fs::read_dir(dir).ok())
        .map_or(0, |entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_str().is_some_and(template::is_key))
                .count()
        })
}

/// Removes the boot set of template `key`'s machine, if any (`mvm
/// snapshot rm KEY` removes it with its template).
pub fn remove_boot_set(store: &Path, key: &str) {
    if let Some(dir) = sets_dir(store) {
        let _ = fs::remove_file(dir.join(key));
    }
}

fn at(path: &Path, mem_size: u64, may_record: bool) -> FirstPages {
    match fs::read(path) {
        Ok(bytes) => match WorkingSet::parse(&bytes, mem_size) {
            Ok(set) => FirstPages::Ahead(set),
            Err(_) => {
                if !is_being_written(path) {
                    let _ = fs::remove_file(path);
                }
                FirstPages::Neither
            }
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound && may_record => {
            Recorder::create(path).map_or(FirstPages::Neither, FirstPages::Record)
        }
        Err(_) => FirstPages::Neither,
    }
}

impl Recorder {
    fn create(path: &Path) -> io::Result<Recorder> {
        let pagemap = File::open("/proc/self/pagemap")?;
        // Only one run records: the others find the file.
        let out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        // SAFETY: flock on an fd this File owns; the lock goes with it.
        if unsafe { libc::flock(out.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Recorder { out, pagemap })
    }

    /// Records the pages `machine` maps now (at the marker: those its
    /// run touched since the restore, or since the boot began), at most
    /// 1/[`MAX_SHARE`] of its RAM, and writes them; returns the bytes
    /// recorded. The file is closed, and so unlocked, either way.
    pub fn record(self, machine: &Machine) -> io::Result<u64> {
        let set = machine.working_set(&self.pagemap)?;
        self.write(set)
    }

    fn write(mut self, mut set: WorkingSet) -> io::Result<u64> {
        set.truncate(set.mem_size / MAX_SHARE);
        let bytes = serde_json::to_vec(&set).map_err(io::Error::other)?;
        self.out.write_all(&bytes)?;
        Ok(set.len())
    }
}

/// Serves `machine` (restored or booted, started) until its guest
/// reports `marker` (`mvm run`: the agent has set the machine up; `mvm
/// boot`: guest-init is ready), then records there the pages it touched
/// so far: the run that found none. A machine that stops first records
/// nothing. Marks the timeline when it recorded; a recording that fails
/// is a warning.
pub fn record_at_marker(
    machine: &mut Machine,
    recorder: Recorder,
    marker: u8,
    deadline: Option<Instant>,
    front: &mut Timeline,
) -> Result<(), Failure> {
    let wait = machine
        .run_until_marker(marker, deadline)
        .map_err(vmm_failure)?;
    if wait != Wait::Done {
        return Ok(());
    }
    match recorder.record(machine) {
        Ok(_) => front.mark("pages touched so far recorded"),
        Err(e) => eprintln!(
            "mvm: warning: cannot record the pages this machine's runs touch first ({e}); runs go on without them, and a later run records them again"
        ),
    }
    Ok(())
}

/// Whether a run holds the lock on `path` (it is recording into it).
fn is_being_written(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    // SAFETY: flock on an fd this File owns; a lock taken is released
    // when it closes, here.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
}

#[cfg(test)]
mod tests;
