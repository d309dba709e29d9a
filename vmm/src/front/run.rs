//! `mvm run`: a session directory, the shared directories' virtiofsd
//! helpers, a machine with a vsock device whose host side lives there, the
//! exec client talking to the guest agent, and the mapping of however it
//! ended to one exit code.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use mvm_protocol::boot::{agent_param, MARKER_MACHINE_SET_UP};
use mvm_protocol::ExecRequest;

use super::command_args::CommandArgs;
use super::console_tail;
use super::first_pages;
use super::launch::{launch, Launched, Spec, Templates};
use super::request::{exec_request, root_disk, scratch_bytes};
use super::template_save::{capture_at_ready, Ready, TemplateWriter};
use super::{
    outcome_failure, print_stats, refuse_software_kvm, setup_failure, vmm_failure, Failure,
    InitramfsNeeds, SessionMoments, VmArgs, BASE_CMDLINE,
};
use crate::config::{RootDir, VmConfig};
use crate::exit_code;
use crate::machine::Outcome;
use crate::sandboxes::EXEC_DEFAULTS;
use crate::session::{self, signals, terminal, SessionDir};
use crate::shares::{self, Share};
use crate::timeline::Timeline;
use mvm_image::ImageConfig;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub command: CommandArgs,
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
    /// Let writable shares (--write, --mount ...:rw) change the files your
    /// tools run later: .git/hooks, .git/config, .envrc, .vscode/, shell
    /// rc files and the like, at any depth (docs/security.md). Without it
    /// they stay read-only ("Read-only file system") and cannot be made,
    /// removed or renamed
    #[arg(long)]
    pub write_hooks: bool,
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
    /// Boot with this root instead of an image: an EROFS image file, or a
    /// directory (an unpacked root filesystem, served read-only through
    /// virtiofsd), under the same writable overlay as --image
    #[arg(long, value_name = "FILE|DIR")]
    pub rootfs: Option<PathBuf>,
    /// Most bytes the command may write to the image root (kept in guest
    /// memory, gone when the VM ends) [default: half of --memory]
    #[arg(long, value_name = "SIZE")]
    pub scratch: Option<String>,
    /// The guest's hostname (1 to 64 bytes: a-z, A-Z, 0-9, '-' and '_' in
    /// labels separated by dots), also added to the root's /etc/hosts
    /// [default: mvm]
    #[arg(long, value_name = "NAME", value_parser = parse_hostname)]
    pub hostname: Option<String>,
    /// Boot the kernel instead of restoring a template, and save none
    /// (by default a run restores the template of its machine, made by the
    /// first run that needed it: docs/snapshots.md); the boot still maps
    /// ahead the pages its machine's first cold boot touched, which that
    /// boot records in the template directory (`mvm snapshot prune`
    /// removes them)
    /// ($MVM_NO_SNAPSHOT: 1 or true for on, 0, false or empty for off)
    #[arg(
        long,
        env = "MVM_NO_SNAPSHOT",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub no_snapshot: bool,
}

fn parse_hostname(name: &str) -> Result<String, String> {
    mvm_protocol::check_hostname(name)
        .map(|()| name.to_string())
        .map_err(|problem| problem.to_string())
}

/// `mvm run`: the VM options, the run options and the command; with
/// `serve_exec`, other commands may join it (`mvm oci exec`).
pub fn run(
    vm: &VmArgs,
    run: &RunArgs,
    serve_exec: bool,
    argv: Vec<String>,
    started: Instant,
) -> Result<i32, Failure> {
    let Machine {
        config,
        image: image_config,
        shares,
        mut front,
    } = plan_machine(vm, run, Purpose::Run)?;
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
            serve_exec,
        },
        vm,
        started,
        timeout,
    )
}

/// The machine the options describe, everything checked and the image
/// ready; what `mvm run` and a sandbox's supervisor both start from.
pub(super) struct Machine {
    pub config: VmConfig,
    pub image: Option<ImageConfig>,
    pub shares: Vec<Share>,
    pub front: Timeline,
}

/// What the machine is for: a sandbox's formats its disk from the
/// initramfs (busybox's mke2fs) when its root is an image.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    Run,
    Sandbox,
}

pub(super) fn plan_machine(
    vm: &VmArgs,
    run: &RunArgs,
    purpose: Purpose,
) -> Result<Machine, Failure> {
    let mut front = Timeline::default();
    front.mark("arguments parsed");
    let cmdline = format!("{BASE_CMDLINE} quiet {} {}", agent_param(), vm.cmdline);
    let mut config = vm.vm_config(cmdline)?;
    // The shares, then KVM, kernel and initramfs: cheap checks, made
    // before an image pull or conversion that would be in vain.
    let mut shares = plan_shares(run)?;
    // A directory root is one more share, the first: served before the
    // others, which may lie inside it.
    let root_dir = match &run.rootfs {
        Some(dir) if dir.is_dir() => Some(
            shares::root_dir(dir, shares::home_dir().as_deref(), run.allow_home_share)
                .map_err(|e| setup_failure(format!("--rootfs: {e}")))?,
        ),
        _ => None,
    };
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
    let scratch = scratch_bytes(rootfs.is_some(), run.scratch.as_deref(), config.mem_size)?;
    match (rootfs, scratch, root_dir) {
        (Some(_), Some(scratch_bytes), Some(share)) => {
            config.root_dir = Some(RootDir { scratch_bytes });
            shares.insert(0, share);
        }
        (Some(path), Some(scratch_bytes), None) => {
            config.root_disk = Some(root_disk(path, scratch_bytes)?);
        }
        _ => {}
    }
    let needs = match (config.has_image_root(), purpose) {
        (true, Purpose::Run) => InitramfsNeeds::InitAlone,
        _ => InitramfsNeeds::Busybox,
    };
    if let Some(initrd) = vm.slimmer_initrd(needs) {
        config.initrd = Some(initrd);
    }
    Ok(Machine {
        config,
        image: image.map(|i| i.config),
        shares,
        front,
    })
}

/// What `run` worked out before the session starts.
struct Planned<'a> {
    argv: Vec<String>,
    image: Option<&'a ImageConfig>,
    shares: Vec<Share>,
    front: Timeline,
    /// The agent serves more connections beside the command, which get
    /// their defaults from the session directory's `exec.json`.
    serve_exec: bool,
}

fn run_in_vm(
    config: VmConfig,
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
        serve_exec,
    } = planned;
    let mut request = exec_request(
        args,
        argv,
        !args.no_workspace,
        config.has_image_root(),
        image,
    )?;
    request.keep_serving = serve_exec;
    let mem_size = config.mem_size;
    let dir = SessionDir::create().map_err(setup_failure)?;
    // Made now: once confined, the VMM's threads may write but not create.
    let exec_defaults = match serve_exec {
        true => Some(
            std::fs::File::create(dir.path().join(EXEC_DEFAULTS))
                .map_err(|e| setup_failure(format!("cannot write {EXEC_DEFAULTS}: {e}")))?,
        ),
        false => None,
    };
    let spec = Spec {
        args,
        vm,
        dir: &dir,
        shares: &shares,
        templates: Templates::RestoreOrCreate,
        console_to_stderr: args.console,
        cache_read_only: true,
    };
    // Declared after `dir`, so dropped before it.
    let Launched {
        mut machine,
        backends: _backends,
        mut egress,
        request,
        creating,
        recorder,
        oom_seen,
    } = launch(config, request, &spec, &mut front)?;
    front.mark("vmm confined");
    if let Some(file) = exec_defaults {
        write_exec_defaults(file, &request)?;
    }
    let stop = machine.stop_handle();
    let target: session::Target = Arc::new(Mutex::new(None));
    signals::forward(stop.clone(), target.clone())
        .map_err(|e| setup_failure(format!("cannot install signal handlers: {e}")))?;
    let raw_mode = (args.command.tty && args.command.interactive).then(terminal::RawMode::enter);
    let (gate, gate_rx) = match creating {
        Some(_) => {
            let (tx, rx) = std::sync::mpsc::channel();
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let key = creating.as_ref().map(|c| c.key.clone());
    let writer = creating
        .map(|c| TemplateWriter::start(c, vm.print_stats))
        .transpose()
        .map_err(|e| {
            setup_failure(format!(
                "cannot start the template's writer thread ({e}): out of memory or threads? --no-snapshot runs without templates"
            ))
        })?;
    let dialer = machine
        .take_vsock_dialer()
        .ok_or_else(|| setup_failure("the machine has no vsock device".to_string()))?;
    let session = session::start(
        dialer,
        request,
        args.command.interactive,
        stop.clone(),
        target,
        gate_rx,
    )
    .map_err(|e| setup_failure(format!("cannot start the session thread: {e}")))?;

    let deadline = timeout.map(|t| Instant::now() + t);
    machine.start().map_err(vmm_failure)?;
    if let (Some(key), Some(gate), Some(writer)) = (&key, gate, &writer) {
        if let Ready::Captured(copy) = capture_at_ready(&mut machine, key, deadline)? {
            // The guest is ready and copied: the session may connect.
            let _ = gate.send(());
            if let Some(copy) = copy {
                front.mark("template copied");
                writer.write(copy);
            }
        }
    }
    if let Some(recorder) = recorder {
        first_pages::record_at_marker(
            &mut machine,
            recorder,
            MARKER_MACHINE_SET_UP,
            deadline,
            &mut front,
        )?;
    }
    let ended = machine.wait(deadline).map_err(vmm_failure)?;
    if let Some(at) = writer.and_then(TemplateWriter::finish) {
        front.mark_at("template saved", at);
    }
    let command_sent = session.command_started();
    if let Some(at) = command_sent {
        front.mark_at("agent connected, command sent", at);
    }
    let guest_init_clock = session.guest_init_clock();
    let connect_tries = session.connect_tries();
    let result = session.finish();
    drop(raw_mode);
    print_stats(
        vm.print_stats,
        started,
        &front,
        &machine,
        &ended,
        SessionMoments {
            exit_received: result.as_ref().ok().map(|(_, at)| *at),
            guest_init_clock,
            connect_tries,
            guest_phases: command_sent.zip(
                result
                    .as_ref()
                    .ok()
                    .map(|(exit, _)| exit.guest_phases.as_slice()),
            ),
        },
    );
    if let Some((proxy, _)) = egress.as_mut() {
        // The VM is gone: what it left open is cut and logged first.
        proxy.finish();
        args.egress.report(proxy, vm.print_stats);
    }

    // The agent reports a kill from the kernel's log; the console's banner
    // covers a run whose channel broke before its `Exit`.
    let oom_reported = result.as_ref().is_ok_and(|(exit, _)| exit.oom_kill);
    if oom_reported || oom_seen.load(std::sync::atomic::Ordering::SeqCst) {
        eprintln!(
            "mvm: the guest ran out of memory (--memory {} MiB): its kernel killed a process (see the guest console)",
            mem_size >> 20
        );
    }
    let failure = match conclude(ended.outcome, result, vm.timeout) {
        Ok(status) => return Ok(status),
        Err(failure) => failure,
    };
    let console_explains = [exit_code::GUEST_CRASHED, exit_code::SETUP_FAILED];
    if !args.quiet && !args.console && console_explains.contains(&failure.code) {
        console_tail::print(&dir.console_path());
    }
    Err(failure)
}

/// What every command that joins the run starts from (`mvm oci exec`):
/// the request as the guest got it, less the machine's setup, as a
/// sandbox's `exec.json` is.
fn write_exec_defaults(mut file: std::fs::File, request: &ExecRequest) -> Result<(), Failure> {
    let defaults = ExecRequest {
        setup: None,
        keep_serving: false,
        ..request.clone()
    };
    let json = serde_json::to_vec(&defaults).expect("plain data serialises");
    std::io::Write::write_all(&mut file, &json)
        .map_err(|e| setup_failure(format!("cannot write {EXEC_DEFAULTS}: {e}")))
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
    crate::machine::kvm::check_kvm().map_err(|e| Failure::from(crate::machine::Error::Kvm(e)))?;
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
        write_hooks: args.write_hooks,
    })
    .map_err(setup_failure)
}
