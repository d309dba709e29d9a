//! mvm's virtio-fs backend: the published virtiofsd's passthrough file
//! system and vhost-user daemon, with mvm's guard in front of a writable
//! share (`--guard`, guard.rs).
//!
//! It takes the subset of virtiofsd's command line that mvm passes
//! (vmm/src/virtiofsd.rs builds it), with the same meaning, and sets up
//! the same way virtiofsd 1.14's own `main` does: the sandbox (a new mount,
//! pid and net namespace with the share as its root), seccomp, then the
//! capabilities it keeps as root. The vhost-user backend is virtiofsd's,
//! behind a watch that ends the daemon on a queue the guest broke
//! (watch.rs). Everything else is virtiofsd's default: `--cache=auto`
//! unless mvm asks for `always` (a read-only share of `mvm run`),
//! readdirplus, announced submounts, file handles where the file system
//! has them, no xattrs, no writeback, no DAX.

mod guard;
mod names;
mod watch;

use std::collections::HashSet;
use std::os::unix::io::{FromRawFd, RawFd};
use std::process;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use log::{error, info, LevelFilter};
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use virtiofsd::filesystem::{FileSystem, SerializableFileSystem};
use virtiofsd::passthrough::read_only::PassthroughFsRo;
use virtiofsd::passthrough::{self, CachePolicy, InodeFileHandlesMode, PassthroughFs};
use virtiofsd::sandbox::{Sandbox, SandboxMode};
use virtiofsd::seccomp::{enable_seccomp, SeccompAction};
use virtiofsd::soft_idmap::cmdline::IdMap;
use virtiofsd::vhost_user::VhostUserFsBackendBuilder;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

/// File descriptors virtiofsd keeps for itself out of RLIMIT_NOFILE: one
/// per vhost-user memory slot (509 in vhost-user-backend) and 100 more,
/// as virtiofsd's own `main` reserves.
const INTERNAL_FD_RESERVE: u64 = 509 + 100;

/// Seconds the guest may cache entries and attributes: virtiofsd's
/// `--cache=auto`.
const CACHE_AUTO_TIMEOUT: Duration = Duration::from_secs(1);
/// The same with virtiofsd's `--cache=always`: a day, and the page cache
/// is kept between opens.
const CACHE_ALWAYS_TIMEOUT: Duration = Duration::from_secs(86400);

#[derive(Parser, Debug)]
#[command(
    name = "virtiofsd",
    version = concat!(env!("CARGO_PKG_VERSION"), " (mvm; virtiofsd 1.14.0)"),
    about = "virtiofsd's passthrough file system for mvm, with a guard for files the host runs later"
)]
struct Opt {
    /// The directory to share (mvm passes `.`, the share it opened).
    #[arg(long)]
    shared_dir: String,
    /// A listening vhost-user socket, already bound.
    #[arg(long)]
    fd: RawFd,
    /// namespace, chroot or none, as virtiofsd's.
    #[arg(long, default_value = "namespace")]
    sandbox: SandboxMode,
    /// kill or none.
    #[arg(long, default_value = "kill", value_parser = parse_seccomp)]
    seccomp: SeccompAction,
    /// Capabilities to add to or remove from what a root caller keeps,
    /// e.g. `-mknod` (virtiofsd's syntax: `+cap:-cap`).
    #[arg(long)]
    modcaps: Option<String>,
    #[arg(long = "log-level", default_value = "info")]
    log_level: LevelFilter,
    /// virtiofsd's `--translate-uid`.
    #[arg(long)]
    translate_uid: Vec<IdMap>,
    /// virtiofsd's `--translate-gid`.
    #[arg(long)]
    translate_gid: Vec<IdMap>,
    /// Refuse every change to the share.
    #[arg(long)]
    readonly: bool,
    /// Keep the files the host runs later read-only in a writable share
    /// (.git/hooks, .git/config, .envrc, ...: guard.rs, names.rs).
    #[arg(long, conflicts_with = "readonly")]
    guard: bool,
    /// virtiofsd's `--cache`: auto (entries and attributes for 1 s, the
    /// page cache dropped when a changed file is opened) or always (for
    /// a day, the page cache kept).
    #[arg(long, default_value = "auto", value_parser = parse_cache)]
    cache: CachePolicy,
}

fn parse_cache(value: &str) -> Result<CachePolicy, String> {
    match value {
        "auto" => Ok(CachePolicy::Auto),
        "always" => Ok(CachePolicy::Always),
        other => Err(format!("'{other}': use auto or always")),
    }
}

fn parse_seccomp(value: &str) -> Result<SeccompAction, String> {
    match value {
        "kill" => Ok(SeccompAction::Kill),
        "none" => Ok(SeccompAction::Allow),
        other => Err(format!("'{other}': use kill or none")),
    }
}

fn main() {
    let opt = Opt::parse();
    env_logger::Builder::new()
        .filter_level(opt.log_level)
        .format_timestamp(None)
        .init();
    if let Err(e) = serve(opt) {
        error!("{e}");
        process::exit(1);
    }
}

fn serve(opt: Opt) -> Result<(), String> {
    exit_on_term();
    // SAFETY: mvm hands the listening socket over as this fd and nothing
    // else in this process owns it.
    let listener = unsafe { Listener::from_raw_fd(opt.fd) };

    let fd_limit = virtiofsd::limits::setup_rlimit_nofile(None)
        .map_err(|e| format!("cannot raise the open file limit: {e}"))?;
    let guest_fd_limit = fd_limit
        .checked_sub(INTERNAL_FD_RESERVE + 1)
        .ok_or_else(|| format!("the open file limit {fd_limit} is too small"))?;

    let mut sandbox = Sandbox::new(opt.shared_dir.clone(), opt.sandbox, Vec::new(), Vec::new());
    let mountinfo_prefix = sandbox
        .get_mountinfo_prefix()
        .map_err(|e| format!("cannot read the share's mount: {e}"))?;
    let listener = sandbox
        .enter(listener)
        .map_err(|e| format!("cannot enter the sandbox: {e}"))?;

    let timeout = match opt.cache {
        CachePolicy::Always => CACHE_ALWAYS_TIMEOUT,
        _ => CACHE_AUTO_TIMEOUT,
    };
    let config = passthrough::Config {
        entry_timeout: timeout,
        attr_timeout: timeout,
        cache_policy: opt.cache,
        root_dir: sandbox.get_root_dir(),
        mountinfo_prefix,
        proc_sfd_rawfd: sandbox.get_proc_self_fd(),
        proc_mountinfo_rawfd: sandbox.get_mountinfo_fd(),
        announce_submounts: true,
        inode_file_handles: InodeFileHandlesMode::Prefer,
        readdirplus: true,
        uid_map: Some(opt.translate_uid),
        gid_map: Some(opt.translate_gid),
        guest_fd_limit,
        ..Default::default()
    };

    // Before the thread pool starts, so every thread has it.
    if !matches!(opt.seccomp, SeccompAction::Allow) {
        enable_seccomp(opt.seccomp, false).map_err(|e| format!("cannot apply seccomp: {e}"))?;
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        keep_capabilities(opt.modcaps.as_deref())?;
    }

    let inner =
        |config| PassthroughFs::new(config).map_err(|e| format!("cannot open the share: {e}"));
    if opt.readonly {
        let fs = PassthroughFsRo::new(config).map_err(|e| format!("cannot open the share: {e}"))?;
        run(fs, listener)
    } else if opt.guard {
        run(guard::Guard::new(inner(config)?), listener)
    } else {
        run(inner(config)?, listener)
    }
}

/// Serves the vhost-user connection until the VMM hangs up.
fn run<F>(fs: F, mut listener: Listener) -> Result<(), String>
where
    F: FileSystem + SerializableFileSystem + Send + Sync + 'static,
{
    let backend = VhostUserFsBackendBuilder::default()
        .build(fs)
        .map_err(|e| format!("cannot make the vhost-user backend: {e}"))?;
    let mut daemon = VhostUserDaemon::new(
        "virtiofsd-backend".into(),
        Arc::new(watch::Watched::new(backend)),
        GuestMemoryAtomic::new(GuestMemoryMmap::new()),
    )
    .map_err(|e| format!("cannot make the vhost-user daemon: {e:?}"))?;
    daemon
        .start(&mut listener)
        .map_err(|e| format!("cannot accept the VMM's connection: {e:?}"))?;
    match daemon.wait() {
        Ok(()) => Ok(()),
        Err(vhost_user_backend::Error::HandleRequest(vhost::vhost_user::Error::Disconnected)) => {
            info!("the VMM hung up");
            Ok(())
        }
        Err(e) => Err(format!("serving the VMM failed: {e:?}")),
    }
}

/// SIGTERM and SIGHUP end the process at once, as virtiofsd's do.
fn exit_on_term() {
    extern "C" fn exit_now(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(1) };
    }
    for signal in [libc::SIGHUP, libc::SIGTERM] {
        if let Err(e) = vmm_sys_util::signal::register_signal_handler(signal, exit_now) {
            error!("cannot handle signal {signal}: {e}");
            process::exit(1);
        }
    }
}

/// What a root caller keeps: the capabilities virtiofsd needs to act for
/// any guest uid, changed by `--modcaps`, and DAC_READ_SEARCH for file
/// handles. The parent process of the sandbox keeps none.
fn keep_capabilities(modcaps: Option<&str>) -> Result<(), String> {
    let caps = capabilities(modcaps)?;
    capng::clear(capng::Set::BOTH);
    capng::updatev(
        capng::Action::ADD,
        capng::Type::PERMITTED | capng::Type::EFFECTIVE,
        caps.iter().map(String::as_str).collect(),
    )
    .map_err(|e| format!("cannot set the capabilities: {e}"))?;
    capng::apply(capng::Set::BOTH).map_err(|e| format!("cannot apply the capabilities: {e}"))
}

/// virtiofsd's default set with `--modcaps` applied.
fn capabilities(modcaps: Option<&str>) -> Result<HashSet<String>, String> {
    let mut caps: HashSet<String> = [
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "SETGID",
        "SETUID",
        "MKNOD",
        "SETFCAP",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    for change in modcaps.into_iter().flat_map(|m| m.split(':')) {
        let (action, name) = change.split_at(change.len().min(1));
        let name = name.to_uppercase();
        if name.is_empty() {
            return Err(format!("--modcaps: '{change}' names no capability"));
        }
        match action {
            "+" => caps.insert(name),
            "-" => caps.remove(&name),
            _ => return Err(format!("--modcaps: '{change}' must start with + or -")),
        };
    }
    // File handles (`--inode-file-handles=prefer`) need it.
    caps.insert("DAC_READ_SEARCH".into());
    Ok(caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modcaps_remove_and_add() {
        let caps = capabilities(Some("-mknod:+sys_admin")).unwrap();
        assert!(!caps.contains("MKNOD"));
        assert!(caps.contains("SYS_ADMIN"));
        assert!(caps.contains("DAC_READ_SEARCH"));
        assert!(capabilities(Some("mknod")).is_err());
        assert!(capabilities(Some("-")).is_err());
    }

    #[test]
    fn guard_and_readonly_exclude_each_other() {
        let parsed = Opt::try_parse_from([
            "virtiofsd",
            "--shared-dir=.",
            "--fd=3",
            "--readonly",
            "--guard",
        ]);
        assert!(parsed.is_err());
        let opt =
            Opt::try_parse_from(["virtiofsd", "--shared-dir=.", "--fd=3", "--guard"]).unwrap();
        assert!(opt.guard && !opt.readonly);
    }
}
