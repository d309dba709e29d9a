//! Templates for `mvm run` (docs/snapshots.md): a machine saved when
//! guest-init is ready and before anything of a run reached it, kept in
//! the user's cache, and restored by later runs of the same machine
//! instead of a boot.
//!
//! A template is keyed by everything that the saved guest depends on: the
//! mvm binary, the kernel and initramfs files, the kernel command line,
//! memory, vCPUs and the device layout (a root disk or not, how many
//! shares). What differs between runs (the image, the shared
//! directories, the command, the clock and entropy) is not in it: it
//! reaches the guest after the restore, over the exec channel.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::VmConfig;
use crate::machine::snapshot::{self, Loaded, MemoryCheck};

/// What a template's key is made of, kept beside it as `KEY.json` for
/// `mvm snapshot ls` and `prune`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateInfo {
    pub mvm: FileIdentity,
    pub kernel: FileIdentity,
    pub initrd: Option<FileIdentity>,
    pub cmdline: String,
    pub mem_mib: u64,
    pub vcpus: u8,
    pub root_disk: bool,
    /// A machine with a sandbox's disk is another machine (left out of
    /// the key when absent, so that every other key stays as it was).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sandbox_disk: bool,
    /// So is one with the balloon (left out when absent, likewise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free_page_reporting: bool,
    pub shares: usize,
    pub vsock_cid: Option<u64>,
    pub snapshot_format: u32,
}

/// A file as the key sees it: a rebuilt kernel (new size, time or inode)
/// is another key. Cheaper than hashing the file on every run, and the
/// files are the user's own build outputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    pub path: PathBuf,
    pub len: u64,
    pub mtime_ns: i128,
    pub dev: u64,
    pub ino: u64,
}

impl FileIdentity {
    /// The file at `path`, named by its canonical path.
    pub fn of(path: &Path) -> io::Result<FileIdentity> {
        Self::at(&path.canonicalize()?)
    }

    /// The file at `path` as given: no lookup of links (which the confined
    /// VMM may not make, and which a template's own files do not need).
    fn at(path: &Path) -> io::Result<FileIdentity> {
        let path = path.to_path_buf();
        let meta = fs::metadata(&path)?;
        Ok(FileIdentity {
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            dev: meta.dev(),
            ino: meta.ino(),
            path,
        })
    }
}

impl TemplateInfo {
    /// The key inputs of a run's machine.
    pub fn of(config: &VmConfig) -> io::Result<TemplateInfo> {
        Ok(TemplateInfo {
            mvm: FileIdentity::of(&std::env::current_exe()?)?,
            kernel: FileIdentity::of(&config.kernel)?,
            initrd: config.initrd.as_deref().map(FileIdentity::of).transpose()?,
            cmdline: config.cmdline.clone(),
            mem_mib: config.mem_size >> 20,
            vcpus: config.vcpus,
            root_disk: config.root_disk.is_some(),
            sandbox_disk: config.sandbox_disk.is_some(),
            free_page_reporting: config.free_page_reporting,
            shares: config.shares.len(),
            vsock_cid: config.vsock.as_ref().map(|v| v.cid),
            snapshot_format: snapshot::FORMAT_VERSION,
        })
    }

    /// The template's name in the store: the SHA-256 of the inputs.
    pub fn key(&self) -> String {
        let json = serde_json::to_vec(self).expect("plain data serialises");
        Sha256::digest(&json)
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether the files it was made from are still the ones the key
    /// names (`prune` removes it otherwise: no run can match it again).
    pub fn is_current(&self) -> bool {
        let same = |id: &FileIdentity| FileIdentity::of(&id.path).is_ok_and(|now| now == *id);
        same(&self.mvm)
            && same(&self.kernel)
            && self.initrd.as_ref().is_none_or(same)
            && self.snapshot_format == snapshot::FORMAT_VERSION
    }
}

/// The template directory: `$MVM_TEMPLATES`, else
/// `$XDG_CACHE_HOME/mvm/templates`, else `~/.cache/mvm/templates`.
pub fn store_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MVM_TEMPLATES").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| crate::shares::home_dir().map(|h| h.join(".cache")))?;
    Some(cache.join("mvm").join("templates"))
}

/// What a run does about templates.
// Made once per run and moved once: boxing the largest variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub enum Plan {
    /// Boot as always and save nothing (`--no-snapshot`, no usable store,
    /// or another run is making this template right now).
    Cold,
    /// Restore this template (in `dir`) instead of booting.
    Restore {
        key: String,
        dir: PathBuf,
        loaded: Loaded,
    },
    /// Boot, and save the machine as this template when guest-init is
    /// ready.
    Create(Creating),
}

/// A template a run is making.
pub struct Creating {
    pub key: String,
    /// Where it goes: `store/key`.
    pub dir: PathBuf,
    pub store: PathBuf,
    pub info: TemplateInfo,
    /// Held until the template is written: one writer per key.
    _lock: File,
}

/// The plan for a machine `config` describes. Problems are one warning
/// line each and a cold boot: a template is only ever a shortcut.
pub fn plan(config: &VmConfig) -> Plan {
    let Some(store) = store_dir() else {
        return Plan::Cold;
    };
    let info = match TemplateInfo::of(config) {
        Ok(info) => info,
        Err(e) => {
            eprintln!("mvm: warning: cannot key a template for this machine ({e}); booting cold");
            return Plan::Cold;
        }
    };
    if let Err(e) = make_store(&store) {
        eprintln!(
            "mvm: warning: cannot use the template directory {} ({e}); booting cold (--no-snapshot silences this)",
            store.display()
        );
        return Plan::Cold;
    }
    let key = info.key();
    let dir = store.join(&key);
    if let Some(loaded) = load(&store, &key) {
        return Plan::Restore { key, dir, loaded };
    }
    let lock = match lock(&store, &key) {
        Ok(Some(lock)) => lock,
        // Another run is writing it: this one boots cold.
        Ok(None) => return Plan::Cold,
        Err(e) => {
            eprintln!(
                "mvm: warning: cannot lock template {key} in {} ({e}); booting cold",
                store.display()
            );
            return Plan::Cold;
        }
    };
    // It may have been finished while this run waited for nothing.
    if let Some(loaded) = load(&store, &key) {
        return Plan::Restore { key, dir, loaded };
    }
    Plan::Create(Creating {
        key,
        dir,
        store,
        info,
        _lock: lock,
    })
}

/// The template `key`; a damaged one is removed with a warning (the run
/// then boots cold and makes a new one). Its memory file's checksum is
/// read in full only when the file is not the one last verified (its
/// identity is kept in `KEY.checked`): hashing tens of MiB costs a
/// restore more than the rest of it (docs/snapshots.md).
fn load(store: &Path, key: &str) -> Option<Loaded> {
    let dir = store.join(key);
    if !dir.exists() {
        return None;
    }
    let memory = dir.join("memory");
    let stamp = checked_path(store, key);
    let verified = fs::read(&stamp)
        .ok()
        .and_then(|b| serde_json::from_slice::<FileIdentity>(&b).ok())
        .is_some_and(|was| FileIdentity::at(&memory).is_ok_and(|now| now == was));
    let check = match verified {
        true => MemoryCheck::LengthOnly,
        false => MemoryCheck::Full,
    };
    match snapshot::read_with(&dir, check) {
        Ok(loaded) => {
            if !verified {
                let _ = stamp_checked(store, key);
            }
            // "Last used", for `mvm snapshot ls`.
            let _ = File::options()
                .append(true)
                .open(info_path(store, key))
                .and_then(|f| f.set_modified(SystemTime::now()));
            Some(loaded)
        }
        Err(e) => {
            eprintln!("mvm: warning: template {key} is unusable ({e}); removed it, booting cold");
            remove(store, key);
            None
        }
    }
}

/// Records the memory file of template `key` as verified: just written
/// (its checksum computed from guest memory) or just checked in full.
pub fn stamp_checked(store: &Path, key: &str) -> io::Result<()> {
    let id = FileIdentity::at(&store.join(key).join("memory"))?;
    write_private(
        &checked_path(store, key),
        &serde_json::to_vec(&id).map_err(io::Error::other)?,
    )
}

fn checked_path(store: &Path, key: &str) -> PathBuf {
    store.join(format!("{key}.checked"))
}

/// Writes the description of a template just saved, and records its
/// memory file as verified.
pub fn describe(store: &Path, key: &str, info: &TemplateInfo) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(info).map_err(io::Error::other)?;
    write_private(&info_path(store, key), &json)?;
    stamp_checked(store, key)
}

/// Writes `path` whole or not at all (a temporary name, then a rename).
fn write_private(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut file| io::Write::write_all(&mut file, data))
        .and_then(|()| fs::rename(&tmp, path));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

pub fn info_path(store: &Path, key: &str) -> PathBuf {
    store.join(format!("{key}.json"))
}

/// Whether `name` is a template key (32 hex digits): what the store's
/// entries are named by.
pub fn is_key(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Removes template `key` and what belongs to it.
pub fn remove(store: &Path, key: &str) {
    let _ = fs::remove_dir_all(store.join(key));
    super::first_pages::remove_boot_set(store, key);
    let _ = fs::remove_file(info_path(store, key));
    let _ = fs::remove_file(checked_path(store, key));
    let _ = fs::remove_file(store.join(format!("{key}.lock")));
}

pub fn make_store(store: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(store)?;
    // Owner-only whoever made it: guest memory is in there.
    let meta = fs::metadata(store)?;
    if meta.uid() != crate::session::dir::current_uid() || meta.mode() & 0o077 != 0 {
        return Err(io::Error::other(
            "it must be a directory of your own with mode 0700",
        ));
    }
    Ok(())
}

/// An exclusive lock on `KEY.lock`, or None when another run holds it.
fn lock(store: &Path, key: &str) -> io::Result<Option<File>> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(store.join(format!("{key}.lock")))?;
    // SAFETY: flock on an fd this File owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(file));
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(None),
        _ => Err(err),
    }
}

/// Whether some run holds `KEY.lock` now (it is writing that template).
pub fn is_locked(store: &Path, key: &str) -> bool {
    let Ok(file) = File::open(store.join(format!("{key}.lock"))) else {
        return false;
    };
    // SAFETY: flock on an fd this File owns; a lock taken is released
    // when the file closes at the end of this function.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::{FsShare, RootDisk, VmConfig};

    /// A machine of 512 MiB whose kernel is a file in `dir` (written once:
    /// a rewritten kernel is another key).
    pub(crate) fn config(dir: &Path) -> VmConfig {
        let kernel = dir.join("vmlinux");
        if !kernel.exists() {
            fs::write(&kernel, b"kernel").unwrap();
        }
        VmConfig {
            sandbox_disk: None,
            free_page_reporting: false,
            fs_bounce_pool: false,
            kernel,
            initrd: None,
            cmdline: "panic=-1".into(),
            vcpus: 1,
            mem_size: 512 << 20,
            vsock: None,
            shares: Vec::new(),
            root_disk: None,
            root_dir: None,
        }
    }

    #[test]
    fn the_key_follows_what_the_guest_depends_on_and_nothing_else() {
        let tmp = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let tmp = tmp.as_path();
        let base = config(tmp);
        let key = |c: &VmConfig| TemplateInfo::of(c).unwrap().key();
        let k0 = key(&base);
        assert_eq!(key(&base), k0, "the same machine, the same key");
        let mut c = config(tmp);
        c.mem_size = 1 << 30;
        assert_ne!(key(&c), k0);
        let mut c = config(tmp);
        c.cmdline.push_str(" quiet");
        assert_ne!(key(&c), k0);
        let mut c = config(tmp);
        c.root_disk = Some(RootDisk {
            path: "/any".into(),
            scratch_bytes: 1,
        });
        let with_root = key(&c);
        assert_ne!(with_root, k0);
        // Which image, and how much scratch, is the run's, not the key's.
        c.root_disk = Some(RootDisk {
            path: "/other".into(),
            scratch_bytes: 99,
        });
        assert_eq!(key(&c), with_root);
        let mut c = config(tmp);
        c.shares.push(FsShare {
            tag: "mvm0".into(),
            socket: "/s".into(),
            guest_path: "/workspace".into(),
            read_only: true,
        });
        let one_share = key(&c);
        assert_ne!(one_share, k0);
        c.shares[0].guest_path = "/elsewhere".into();
        c.shares[0].read_only = false;
        assert_eq!(key(&c), one_share, "where a share goes is the run's");
        // A sandbox's machine (its disk, the balloon) is another machine.
        let mut c = config(tmp);
        c.sandbox_disk = Some("/disk".into());
        assert_ne!(key(&c), k0);
        let mut c = config(tmp);
        c.free_page_reporting = true;
        assert_ne!(key(&c), k0);
        // A rebuilt kernel is another key, and the old one is not current.
        let info = TemplateInfo::of(&base).unwrap();
        assert!(info.is_current());
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&base.kernel, b"another kernel").unwrap();
        assert!(!info.is_current());
        assert_ne!(key(&base), k0);
    }

    #[test]
    fn one_creator_at_a_time_and_damaged_templates_go() {
        let tmp = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let tmp = tmp.as_path();
        let store = tmp.join("templates");
        make_store(&store).unwrap();
        let first = lock(&store, "k").unwrap();
        assert!(first.is_some());
        assert!(is_locked(&store, "k"));
        assert!(lock(&store, "k").unwrap().is_none(), "held by the first");
        drop(first);
        assert!(!is_locked(&store, "k"));
        assert!(lock(&store, "k").unwrap().is_some());

        fs::create_dir(store.join("bad")).unwrap();
        fs::write(store.join("bad").join("manifest.json"), b"{").unwrap();
        fs::write(info_path(&store, "bad"), b"{}").unwrap();
        assert!(load(&store, "bad").is_none());
        assert!(!store.join("bad").exists(), "a damaged template is removed");
        assert!(!info_path(&store, "bad").exists());
        assert!(load(&store, "absent").is_none());
    }

    #[test]
    fn a_store_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = vmm_sys_util::tempdir::TempDir::new().unwrap();
        let tmp = tmp.as_path();
        let store = tmp.join("t");
        make_store(&store).unwrap();
        fs::set_permissions(&store, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(make_store(&store).is_err());
    }
}
