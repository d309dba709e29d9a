//! What `mvm run` and a named sandbox's supervisor share: from the exec
//! request and the session directory to a machine that is built, with
//! its helpers (virtiofsd per share, the egress proxy) started and the
//! VMM confined, ready to `start`. What differs (who talks to the guest,
//! and when the machine ends) is the caller's.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use mvm_devices::virtio::vsock::GuestPort;
use mvm_protocol::{ExecRequest, GUEST_CID};

use super::first_pages::{self, Recorder};
use super::request::machine_setup;
use super::run::RunArgs;
use super::template::{self, Creating, Plan};
use super::{beside_binary, confine_vmm, setup_failure, Failure, VmArgs};
use crate::config::{FsShare, VmConfig, VsockConfig, ROOT_GUEST_PATH};
use crate::console::{Capped, ConsoleOutput};
use crate::egress::Egress;
use crate::machine::{boot, Machine};
use crate::session::{self, SessionDir};
use crate::shares::Share;
use crate::timeline::Timeline;
use crate::virtiofsd::{self, Virtiofsd};

/// The console log keeps this much of what the guest prints; a guest that
/// floods its console cannot fill the host's disk.
const CONSOLE_LOG_LIMIT: u64 = 4 << 20;

/// Which templates a launch may use (docs/snapshots.md).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Templates {
    /// `mvm run`: restore one, or make it when there is none.
    RestoreOrCreate,
    /// A sandbox's supervisor: restore one when it is there, else boot
    /// (making one needs a run's session gate).
    RestoreOnly,
}

impl Templates {
    fn may_create(self) -> bool {
        self == Templates::RestoreOrCreate
    }
}

/// A machine ready to start. Fields drop in order: the machine first,
/// then the helpers, so that they go before their sockets' directory.
pub(super) struct Launched {
    pub machine: Machine,
    pub backends: Vec<Virtiofsd>,
    pub egress: Option<(Egress, GuestPort)>,
    /// With the machine's setup filled in (root, shares, the run's CA).
    pub request: ExecRequest,
    /// The template this run makes, if it makes one.
    pub creating: Option<Creating>,
    /// Where this run, restored, records the pages its set-up touches.
    pub recorder: Option<Recorder>,
    /// Set when the guest's kernel killed a process for memory.
    pub oom_seen: Arc<AtomicBool>,
}

/// How to launch: the options, where the helpers' sockets and the
/// console log go, and what the caller allows.
pub(super) struct Spec<'a> {
    pub args: &'a RunArgs,
    pub vm: &'a VmArgs,
    pub dir: &'a SessionDir,
    pub shares: &'a [Share],
    pub templates: Templates,
    /// The guest console to stderr instead of the log (`--console`).
    pub console_to_stderr: bool,
    /// Read-only shares are cached by the guest for the machine's whole
    /// life (virtiofsd's `--cache=always`): for `mvm run`, whose machine
    /// lives for one command. A sandbox's commands must see the host's
    /// edits between them, so its shares keep virtiofsd's `auto` (1 s).
    pub cache_read_only: bool,
}

/// Starts the helpers in `dir`, builds (boots or restores) the machine
/// and confines the VMM. `front` gets the steps' marks.
pub(super) fn launch(
    mut config: VmConfig,
    request: ExecRequest,
    spec: &Spec,
    front: &mut Timeline,
) -> Result<Launched, Failure> {
    let Spec {
        args,
        vm,
        dir,
        shares,
        templates,
        console_to_stderr,
        cache_read_only,
    } = *spec;
    let virtiofsd_binary = match shares.is_empty() {
        true => None,
        false => Some(find_virtiofsd(args)?),
    };
    let mut request = request;
    let mut ca_cert = None;
    let mut egress = args.egress.start(dir, &args.command.env)?.map(|s| {
        let (proxy, port, ca) = s.attach(&mut request);
        ca_cert = ca;
        (proxy, port)
    });
    let guest_ports = egress.iter().map(|(_, port)| port.clone()).collect();
    config.vsock = Some(VsockConfig {
        cid: GUEST_CID,
        uds_path: dir.vsock_path(),
        guest_ports,
    });
    // Dropped before `dir` (the caller's): the helpers are killed and
    // reaped before their sockets' directory goes.
    let mut backends = Vec::with_capacity(shares.len());
    for (index, share) in shares.iter().enumerate() {
        let binary = virtiofsd_binary
            .as_deref()
            .unwrap_or(Path::new("virtiofsd"));
        let cache_always = cache_read_only && share.read_only;
        let (backend, fs) = start_backend(dir, binary, index, share, cache_always, &request)?;
        backends.push(backend);
        config.shares.push(fs);
    }
    let mut setup = machine_setup(&config)?;
    setup.hostname = args.hostname.clone();
    request.setup = Some(Box::new(setup));
    front.mark("helpers started");
    // After the helpers, so that a template's key sees the whole machine.
    let plan = match args.no_snapshot {
        true => Plan::Cold,
        false => match template::plan(&config) {
            Plan::Create(_) if !templates.may_create() => Plan::Cold,
            plan => plan,
        },
    };
    front.mark(match plan {
        Plan::Restore { .. } => "template found",
        Plan::Create(_) => "no template: this run makes it",
        Plan::Cold => "booting cold",
    });
    let console: Box<dyn io::Write + Send> = if console_to_stderr {
        Box::new(io::stderr())
    } else {
        Box::new(Capped::new(
            File::create(dir.console_path())
                .map_err(|e| setup_failure(format!("cannot create the console log: {e}")))?,
            CONSOLE_LOG_LIMIT,
        ))
    };
    let console = ConsoleOutput::new(console);
    let oom_seen = console.oom_flag();
    // Recorded only where the agent sends the marker: `mvm run`'s one
    // command, not a sandbox's or a served run's.
    let may_record = templates.may_create() && !request.keep_serving;
    let store = template::store_dir();
    let (built, creating, recorder) = match plan {
        Plan::Restore { key, dir, loaded } => {
            let (ahead, recorder) =
                first_pages::for_restore(&dir, config.mem_size, may_record).split();
            let restored = crate::machine::restore_loaded(&config, console, loaded, ahead.as_ref())
                .inspect_err(|_| {
                    // A template that passed its checks but does not fit
                    // this machine: the next run must not find it again.
                    if let Some(store) = &store {
                        template::remove(store, &key);
                    }
                });
            (restored, None, recorder)
        }
        // Only a machine that becomes a template bounces its virtio-fs
        // buffers through the pool that its restores share with virtiofsd
        // (a restored one has the template's). It neither records nor
        // maps ahead the pages cold boots touch: its guest also zeroes
        // the pool, which their boots would then map for nothing, and
        // their set-up's pages, mapped ahead, would be memory its copy
        // reads through for nothing (docs/snapshots.md).
        Plan::Create(creating) => {
            config.fs_bounce_pool = true;
            (boot::boot(&config, console), Some(creating), None)
        }
        // A sandbox's machine (its disk, the balloon) is never one that
        // `mvm run` boots, which alone records: it has no set to find.
        Plan::Cold => {
            let (ahead, recorder) = match (&store, templates.may_create()) {
                (Some(store), true) => first_pages::for_boot(store, &config, may_record).split(),
                _ => (None, None),
            };
            (
                boot::boot_mapping_ahead(&config, console, ahead.as_ref()),
                None,
                recorder,
            )
        }
    };
    let mut machine = match built {
        Ok(machine) => machine,
        // A backend that failed to start shows up as a broken connection;
        // its own words say why.
        Err(e) => {
            let mut failure = Failure::from(e);
            if let Some(why) = backends.iter_mut().find_map(Virtiofsd::exit_report) {
                failure.message = format!("{}; {why}", failure.message);
            }
            return Err(failure);
        }
    };

    for backend in &mut backends {
        if let Some(pump) = backend.take_log_pump() {
            machine.add_subscriber(Box::new(pump));
        }
    }
    // Checked now, after the VM was built: the proxy came up meanwhile.
    if let Some((proxy, _)) = egress.as_mut() {
        proxy.wait_ready().map_err(setup_failure)?;
    }
    // With secrets, the guest trusts the proxy's per-run CA.
    if let (Some(path), Some(setup)) = (&ca_cert, request.setup.as_mut()) {
        setup.trust = Some(super::egress::read_ca(path)?);
    }
    if let Some(pump) = egress.as_mut().and_then(|(e, _)| e.take_log_pump()) {
        machine.add_subscriber(Box::new(pump));
    }

    // Everything is open and virtiofsd started: confine before any other
    // thread exists (they inherit it). The vmm thread may kill only these
    // helpers' groups.
    crate::confine::seccomp::allow_killing_groups(
        &backends
            .iter()
            .map(Virtiofsd::process_group)
            .chain(egress.as_ref().map(|(e, _)| e.process_group()))
            .collect::<Vec<_>>(),
    );
    if let Some((proxy, _)) = &egress {
        crate::confine::seccomp::allow_ending_groups(&[proxy.process_group()]);
    }
    let base_dir = dir.path().parent().unwrap_or(dir.path()).to_path_buf();
    if creating.is_some() {
        crate::confine::seccomp::allow_snapshots();
    }
    confine_vmm(
        vm.confinement(),
        Some(crate::confine::landlock::Writable {
            session: Some((dir.path(), &base_dir)),
            snapshot_parent: creating.as_ref().map(|c| c.store.as_path()),
        }),
    )?;

    Ok(Launched {
        machine,
        backends,
        egress,
        request,
        creating,
        recorder,
        oom_seen,
    })
}

/// --virtiofsd, $MVM_VIRTIOFSD, the one `make` builds beside mvm, then
/// PATH and the distributions' libexec.
fn find_virtiofsd(args: &RunArgs) -> Result<PathBuf, Failure> {
    if let Some(path) = args
        .virtiofsd
        .clone()
        .or_else(|| std::env::var_os("MVM_VIRTIOFSD").map(PathBuf::from))
    {
        return Ok(path);
    }
    let beside = beside_binary("libexec/mvm/virtiofsd");
    let in_path = path_candidates(std::env::var_os("PATH").as_deref(), "virtiofsd");
    beside
        .into_iter()
        .chain(in_path)
        .chain([PathBuf::from("/usr/libexec/virtiofsd")])
        .find(|p| p.is_file())
        .ok_or_else(|| {
            setup_failure(
                "cannot find virtiofsd, which shares the workspace: run 'make', install virtiofsd, pass --virtiofsd PATH, or use --no-workspace",
            )
        })
}

/// `name` in each absolute directory of a PATH value. Relative entries
/// (`.`, an empty one, `bin`) are skipped: they name directories below the
/// current one, i.e. usually the workspace, where an earlier `--write`
/// run could have planted a `virtiofsd` of its own.
fn path_candidates(path: Option<&std::ffi::OsStr>, name: &str) -> Vec<PathBuf> {
    path.map(|p| {
        std::env::split_paths(p)
            .filter(|d| d.is_absolute())
            .map(|d| d.join(name))
            .collect()
    })
    .unwrap_or_default()
}

/// virtiofsd for share `index`, serving as the command's user.
fn start_backend(
    dir: &SessionDir,
    binary: &Path,
    index: usize,
    share: &Share,
    cache_always: bool,
    request: &ExecRequest,
) -> Result<(Virtiofsd, FsShare), Failure> {
    let socket = dir.path().join(format!("fs{index}.sock"));
    // A root directory's files keep their owners (root's stay root's); a
    // share's files show as the command's own.
    let (guest_uid, guest_gid) = match share.guest == ROOT_GUEST_PATH {
        true => (session::dir::current_uid(), session::dir::current_gid()),
        false => (request.uid, request.gid),
    };
    let backend = virtiofsd::spawn(&virtiofsd::Request {
        binary,
        shared_dir: &share.dir,
        read_only: share.read_only,
        guard: share.guard,
        cache_always,
        socket: &socket,
        log: &dir.path().join(format!("fs{index}.log")),
        uid: session::dir::current_uid(),
        gid: session::dir::current_gid(),
        guest_uid,
        guest_gid,
    })
    .map_err(setup_failure)?;
    Ok((
        backend,
        FsShare {
            tag: format!("mvm{index}"),
            socket,
            guest_path: share.guest.clone(),
            read_only: share.read_only,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_path_entries_are_not_searched_for_virtiofsd() {
        let path = std::ffi::OsString::from("bin::.:/usr/local/bin:./tools:/usr/bin");
        assert_eq!(
            path_candidates(Some(&path), "virtiofsd"),
            [
                PathBuf::from("/usr/local/bin/virtiofsd"),
                PathBuf::from("/usr/bin/virtiofsd")
            ]
        );
        assert!(path_candidates(None, "virtiofsd").is_empty());
    }
}
