//! `mvm run`: a session directory, the shared directories' virtiofsd
//! helpers, a machine with a vsock device whose host side lives there, the
//! exec client talking to the guest agent, and the mapping of however it
//! ended to one exit code.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use mvm_protocol::{boot::agent_param, ExecRequest, GUEST_CID};

use super::request::{exec_request, machine_setup, root_disk};
use super::template::{self, Plan};
use super::template_save::save_template;
use super::{
    beside_binary, confine_vmm, outcome_failure, print_stats, refuse_software_kvm, setup_failure,
    vmm_failure, Failure, VmArgs, BASE_CMDLINE,
};
use crate::config::{FsShare, VmConfig, VsockConfig};
use crate::console::{Capped, ConsoleOutput};
use crate::exit_code;
use crate::machine::{boot, Outcome};
use crate::session::{self, signals, terminal, SessionDir};
use crate::shares::{self, Share};
use crate::timeline::Timeline;
use crate::virtiofsd::{self, Virtiofsd};
use mvm_image::ImageConfig;

/// The console log keeps this much of what the guest prints; a guest that
/// floods its console cannot fill the host's disk.
const CONSOLE_LOG_LIMIT: u64 = 4 << 20;

/// Console lines shown when the guest crashed (unless --quiet).
const CONSOLE_TAIL_LINES: usize = 20;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Forward stdin to the command (otherwise it reads end-of-file)
    #[arg(short, long)]
    pub interactive: bool,
    /// Run the command on a pseudo-terminal in the guest (with -i: an
    /// interactive shell; the window size follows this terminal)
    #[arg(short, long)]
    pub tty: bool,
    /// Set an environment variable for the command (repeatable)
    #[arg(short, long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory of the command in the guest [default: /workspace,
    /// or / with --no-workspace]
    #[arg(short, long, value_name = "DIR")]
    pub workdir: Option<String>,
    /// Host directory shared with the guest at /workspace, read-only unless
    /// --write [default: the current directory]
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Let the command write to the workspace (files it creates belong to
    /// you); without it every write fails with "Read-only file system"
    #[arg(long, conflicts_with = "no_workspace")]
    pub write: bool,
    /// Share no workspace at all
    #[arg(long, conflicts_with = "workspace")]
    pub no_workspace: bool,
    /// Allow sharing / , your home directory ($HOME) or a directory above
    /// it (refused otherwise: the guest would see your shell startup
    /// files, keys and every project; with --write it could change them)
    #[arg(long)]
    pub allow_home_share: bool,
    /// Also share host directory HOST at GUEST (an absolute guest path),
    /// read-only unless ":rw" (repeatable)
    #[arg(long = "mount", value_name = "HOST:GUEST[:ro|rw]")]
    pub mounts: Vec<String>,
    /// The virtio-fs backend [default: $MVM_VIRTIOFSD, else
    /// ../libexec/mvm/virtiofsd next to the mvm binary, else virtiofsd in
    /// PATH]
    #[arg(long, value_name = "PATH")]
    pub virtiofsd: Option<PathBuf>,
    /// Run the command as root in the guest (default: your own uid and gid)
    #[arg(long, conflicts_with = "user")]
    pub root: bool,
    /// Run the command as USER[:GROUP] of the guest's root: names are
    /// looked up in its /etc/passwd and /etc/group (e.g. an image's own
    /// user), numbers taken as they are [default: your own uid and gid]
    #[arg(short, long, value_name = "USER[:GROUP]")]
    pub user: Option<String>,
    /// Most processes the command's user may have in the guest
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_procs: u64,
    /// Copy the guest console (kernel and init messages) to stderr
    #[arg(long)]
    pub console: bool,
    /// Print no guest console lines when the guest crashes
    #[arg(short, long)]
    pub quiet: bool,
    /// The guest's root: an OCI image (oci:DIR[:TAG], docker-archive:FILE,
    /// HOST[:PORT]/NAME:TAG from a registry, NAME[:TAG] or sha256:DIGEST in
    /// the store: `mvm image ls`), `default` (the Debian image `make`
    /// builds: bash, coreutils, git, python3, gcc, curl...), or `none` (the
    /// busybox initramfs alone). Read-only underneath, writable above;
    /// every write is gone when the VM ends (docs/images.md). Its Env,
    /// WorkingDir (with --no-workspace), Entrypoint and Cmd apply as in
    /// `docker run`
    #[arg(
        long,
        value_name = "REF",
        env = "MVM_IMAGE",
        default_value = super::image::DEFAULT_IMAGE,
        conflicts_with = "rootfs"
    )]
    pub image: String,
    /// Pull --image over plain HTTP from this registry (HOST[:PORT]);
    /// repeatable, added to $MVM_INSECURE_REGISTRIES
    #[arg(long, value_name = "HOST[:PORT]")]
    pub insecure_registry: Vec<String>,
    #[command(flatten)]
    pub egress: super::egress::EgressArgs,
    /// Boot with this EROFS image (a file) as the guest's read-only root,
    /// under the same writable overlay as --image
    #[arg(long, value_name = "FILE")]
    pub rootfs: Option<PathBuf>,
    /// Most bytes the command may write to the image root (kept in guest
    /// memory, gone when the VM ends) [default: half of --memory]
    #[arg(long, value_name = "SIZE")]
    pub scratch: Option<String>,
    /// Boot the kernel instead of restoring a template, and save none
    /// (by default a run restores the template of its machine, made by the
    /// first run that needed it: docs/snapshots.md)
    /// ($MVM_NO_SNAPSHOT: 1 or true for on, 0, false or empty for off)
    #[arg(
        long,
        env = "MVM_NO_SNAPSHOT",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub no_snapshot: bool,
}

/// `mvm run`: the VM options, the run options and the command.
pub fn run(
    vm: &VmArgs,
    run: &RunArgs,
    argv: Vec<String>,
    started: Instant,
) -> Result<i32, Failure> {
    let mut front = Timeline::default();
    front.mark("arguments parsed");
    let cmdline = format!("{BASE_CMDLINE} quiet {} {}", agent_param(), vm.cmdline);
    let mut config = vm.vm_config(cmdline)?;
    // The shares, then KVM, kernel and initramfs: cheap checks, made
    // before an image pull or conversion that would be in vain.
    let shares = plan_shares(run)?;
    preflight(&config)?;
    front.mark("shares and kvm checked");
    // --rootfs names the root itself; `none` is the initramfs alone.
    let image = match (&run.rootfs, run.image.as_str()) {
        (Some(_), _) | (None, super::image::NO_IMAGE) => None,
        (None, reference) => Some(super::image::prepare(reference, &run.insecure_registry)?),
    };
    let rootfs = image
        .as_ref()
        .map(|i| i.rootfs.clone())
        .or(run.rootfs.clone());
    config.root_disk = root_disk(rootfs, run.scratch.as_deref(), config.mem_size)?;
    let image_config = image.map(|i| i.config);
    let argv = match &image_config {
        Some(c) => super::image::argv(c, argv),
        None => argv,
    };
    if argv.is_empty() {
        return Err(setup_failure(match image_config {
            Some(_) => "the image has no Entrypoint or Cmd: give the command after --",
            None => "no command given: put it after -- (e.g. mvm run -- uname -a)",
        }));
    }
    front.mark("image ready");
    let timeout = vm.timeout()?;
    run_in_vm(
        config,
        run,
        Planned {
            argv,
            image: image_config.as_ref(),
            shares,
            front,
        },
        vm,
        started,
        timeout,
    )
}

/// What `run` worked out before the session starts.
struct Planned<'a> {
    argv: Vec<String>,
    image: Option<&'a ImageConfig>,
    shares: Vec<Share>,
    front: Timeline,
}

fn run_in_vm(
    mut config: VmConfig,
    args: &RunArgs,
    planned: Planned,
    vm: &VmArgs,
    started: Instant,
    timeout: Option<Duration>,
) -> Result<i32, Failure> {
    let Planned {
        argv,
        image,
        shares,
        mut front,
    } = planned;
    let request = exec_request(
        args,
        argv,
        !args.no_workspace,
        config.root_disk.is_some(),
        image,
    )?;
    let virtiofsd_binary = match shares.is_empty() {
        true => None,
        false => Some(find_virtiofsd(args)?),
    };
    let dir = SessionDir::create().map_err(setup_failure)?;
    // Declared after `dir` (dropped before it), like the backends below.
    let mut request = request;
    let mut ca_cert = None;
    let mut egress = args.egress.start(&dir, &args.env)?.map(|s| {
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
    // Declared after `dir`, so dropped before it: the helpers are killed
    // and reaped before their sockets' directory goes.
    let mut backends = Vec::with_capacity(shares.len());
    for (index, share) in shares.iter().enumerate() {
        let binary = virtiofsd_binary
            .as_deref()
            .unwrap_or(Path::new("virtiofsd"));
        let (backend, fs) = start_backend(&dir, binary, index, share, &request)?;
        backends.push(backend);
        config.shares.push(fs);
    }
    request.setup = Some(Box::new(machine_setup(&config)?));
    front.mark("helpers started");
    // After the helpers, so that a template's key sees the whole machine.
    let plan = match args.no_snapshot {
        true => Plan::Cold,
        false => template::plan(&config),
    };
    front.mark(match plan {
        Plan::Restore { .. } => "template found",
        Plan::Create(_) => "no template: this run makes it",
        Plan::Cold => "booting cold",
    });
    let console: Box<dyn io::Write + Send> = if args.console {
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
    let (built, creating) = match plan {
        Plan::Restore { key, loaded } => (
            crate::machine::restore_loaded(&config, console, loaded).inspect_err(|_| {
                // A template that passed its checks but does not fit this
                // machine: the next run must not find it again.
                if let Some(store) = template::store_dir() {
                    template::remove(&store, &key);
                }
            }),
            None,
        ),
        Plan::Create(creating) => (boot::boot(&config, console), Some(creating)),
        Plan::Cold => (boot::boot(&config, console), None),
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

    front.mark("vmm confined");
    let stop = machine.stop_handle();
    let target: session::Target = Arc::new(Mutex::new(None));
    signals::forward(stop.clone(), target.clone())
        .map_err(|e| setup_failure(format!("cannot install signal handlers: {e}")))?;
    let raw_mode = (args.tty && args.interactive).then(terminal::RawMode::enter);
    let (gate, gate_rx) = match creating {
        Some(_) => {
            let (tx, rx) = std::sync::mpsc::channel();
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let dialer = machine
        .take_vsock_dialer()
        .ok_or_else(|| setup_failure("the machine has no vsock device".to_string()))?;
    let session = session::start(
        dialer,
        request,
        args.interactive,
        stop.clone(),
        target,
        gate_rx,
    )
    .map_err(|e| setup_failure(format!("cannot start the session thread: {e}")))?;

    let deadline = timeout.map(|t| Instant::now() + t);
    machine.start().map_err(vmm_failure)?;
    if let (Some(creating), Some(gate)) = (creating, gate) {
        if save_template(&mut machine, &creating, deadline, vm.print_stats)? {
            // The guest is ready and saved: the session may connect.
            let _ = gate.send(());
        }
        front.mark("template saved");
    }
    let ended = machine.wait(deadline).map_err(vmm_failure)?;
    if let Some(at) = session.command_started() {
        front.mark_at("agent connected, command sent", at);
    }
    let result = session.finish();
    drop(raw_mode);
    print_stats(
        vm.print_stats,
        started,
        &front,
        &machine,
        &ended,
        result.as_ref().ok().map(|(_, at)| *at),
    );
    if let Some((proxy, _)) = egress.as_mut() {
        // The VM is gone: what it left open is cut and logged first.
        proxy.finish();
        args.egress.report(proxy, vm.print_stats);
    }

    if oom_seen.load(std::sync::atomic::Ordering::SeqCst) {
        eprintln!(
            "mvm: the guest ran out of memory (--memory {} MiB): its kernel killed a process (see the guest console)",
            config.mem_size >> 20
        );
    }
    let failure = match conclude(ended.outcome, result, vm.timeout) {
        Ok(status) => return Ok(status),
        Err(failure) => failure,
    };
    let console_explains = [exit_code::GUEST_CRASHED, exit_code::SETUP_FAILED];
    if !args.quiet && !args.console && console_explains.contains(&failure.code) {
        print_console_tail(&dir.console_path());
    }
    Err(failure)
}

/// The run's exit status from how the machine ended and what the exec
/// session got: the command's own status when it arrived (whatever the
/// machine did after), else the machine's outcome.
fn conclude(
    outcome: Outcome,
    session: Result<session::Ended, session::client::Error>,
    timeout: Option<f64>,
) -> Result<i32, Failure> {
    let lost = match session {
        Ok((exit, _)) => return Ok(i32::from(exit.status)),
        Err(lost) => lost,
    };
    Err(match outcome {
        // guest-init's own failed start (a share it could not mount, say):
        // its reason is on the console.
        Outcome::Exited(status) if status == exit_code::SETUP_FAILED as u32 => Failure {
            message: "guest-init could not start the command (see the guest console)".into(),
            code: exit_code::SETUP_FAILED,
        },
        // The agent's channel broke but guest-init still reported on the
        // status port (it reports every exit there too).
        Outcome::Exited(status) if status <= 255 => return Ok(status as i32),
        Outcome::Stopped => Failure {
            message: format!(
                "the guest stopped without reporting the command's exit status ({lost})"
            ),
            code: exit_code::GUEST_CRASHED,
        },
        other => outcome_failure(other, timeout),
    })
}

/// KVM usable, kernel and initramfs readable: what would fail the build
/// anyway, checked before any helper process or session directory exists.
fn preflight(config: &VmConfig) -> Result<(), Failure> {
    crate::machine::kvm::open_kvm().map_err(|e| Failure::from(crate::machine::Error::Kvm(e)))?;
    crate::machine::kernel::check_readable(&config.kernel, config.initrd.as_deref())
        .map_err(|e| Failure::from(crate::machine::Error::Kernel(e)))?;
    refuse_software_kvm()
}

fn plan_shares(args: &RunArgs) -> Result<Vec<Share>, Failure> {
    let workspace = match (&args.workspace, args.no_workspace) {
        (_, true) => None,
        (Some(dir), false) => Some(dir.as_path()),
        (None, false) => {
            // The current directory itself ("."), opened without a lookup
            // by name; its name is checked only to say what went wrong.
            std::env::current_dir().map_err(|e| {
                setup_failure(format!(
                    "cannot share the current directory as the workspace: {e} (use --workspace DIR or --no-workspace)"
                ))
            })?;
            Some(Path::new("."))
        }
    };
    let home = shares::home_dir();
    shares::plan(&shares::Wanted {
        workspace,
        write: args.write,
        mounts: &args.mounts,
        home: home.as_deref(),
        allow_home: args.allow_home_share,
    })
    .map_err(setup_failure)
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
    request: &ExecRequest,
) -> Result<(Virtiofsd, FsShare), Failure> {
    let socket = dir.path().join(format!("fs{index}.sock"));
    let backend = virtiofsd::spawn(&virtiofsd::Request {
        binary,
        shared_dir: &share.dir,
        read_only: share.read_only,
        socket: &socket,
        log: &dir.path().join(format!("fs{index}.log")),
        uid: session::dir::current_uid(),
        gid: session::dir::current_gid(),
        guest_uid: request.uid,
        guest_gid: request.gid,
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

fn print_console_tail(path: &Path) {
    let Ok(file) = File::open(path) else {
        return;
    };
    let lines: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
    let tail = &lines[lines.len().saturating_sub(CONSOLE_TAIL_LINES)..];
    if tail.is_empty() {
        return;
    }
    eprintln!("mvm: last lines of the guest console:");
    for line in tail {
        eprintln!("  | {line}");
    }
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
