//! `mvm run`: a session directory, the shared directories' virtiofsd
//! helpers, a VM with a vsock device whose host side lives there, the exec
//! client talking to the guest agent, and the mapping of however it ended
//! to one exit code.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use mvm_protocol::{ExecRequest, GUEST_CID};

use crate::builder;
use crate::cli::{outcome_failure, print_stats, setup_failure, vmm_failure, Failure, RunArgs};
use crate::config::{FsShare, VmConfig, VsockConfig};
use crate::console::{Capped, ConsoleOutput};
use crate::runner::{self, Outcome, RunOptions};
use crate::session::{self, signals, terminal, SessionDir, Teardown, VmHandle};
use crate::shares::{self, Share, WORKSPACE_GUEST_PATH};
use crate::virtiofsd::{self, Virtiofsd};

/// The console log keeps this much of what the guest prints; a guest that
/// floods its console cannot fill the host's disk.
const CONSOLE_LOG_LIMIT: u64 = 4 << 20;

/// Console lines shown when the guest crashed (unless --quiet).
const CONSOLE_TAIL_LINES: usize = 20;

pub(crate) fn run(
    mut config: VmConfig,
    args: &RunArgs,
    argv: Vec<String>,
    opts: RunOptions,
    want_stats: bool,
    confinement: crate::confine::Options,
) -> Result<i32, Failure> {
    let shares = plan_shares(args)?;
    let request = exec_request(args, argv, !args.no_workspace)?;
    preflight(&config)?;
    let virtiofsd_binary = match shares.is_empty() {
        true => None,
        false => Some(find_virtiofsd(args)?),
    };
    let dir = SessionDir::create().map_err(setup_failure)?;
    config.vsock = Some(VsockConfig {
        cid: GUEST_CID,
        uds_path: dir.vsock_path(),
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
    let vmm = match builder::build(&config, console) {
        Ok(vmm) => vmm,
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

    // Everything is open and virtiofsd started: confine before any other
    // thread exists (they inherit it).
    let base_dir = dir.path().parent().unwrap_or(dir.path()).to_path_buf();
    crate::cli::confine_vmm(
        confinement,
        Some(crate::confine::landlock::Writable {
            session_dir: dir.path(),
            base_dir: &base_dir,
        }),
    )?;

    let teardown = Teardown::new(vmm.stop.evt.clone());
    let target: session::Target = Arc::new(Mutex::new(None));
    signals::forward(teardown.clone(), target.clone())
        .map_err(|e| setup_failure(format!("cannot install signal handlers: {e}")))?;
    let raw_mode = (args.tty && args.interactive).then(terminal::RawMode::enter);
    let session = session::start(
        dir.vsock_path(),
        request,
        args.interactive,
        VmHandle {
            stopped: vmm.stop.stopped.clone(),
            stop_evt: vmm.stop.evt.clone(),
        },
        target,
    )
    .map_err(|e| setup_failure(format!("cannot start the session thread: {e}")))?;

    let report = runner::run(vmm, opts.clone()).map_err(vmm_failure)?;
    let result = session.finish();
    drop(raw_mode);
    print_stats(
        want_stats,
        opts.started,
        &report,
        result.as_ref().ok().map(|(_, at)| *at),
    );

    if oom_seen.load(std::sync::atomic::Ordering::SeqCst) {
        eprintln!(
            "mvm: the guest ran out of memory (--memory {} MiB): its kernel killed a process (see the guest console)",
            config.mem_size >> 20
        );
    }
    if let Ok((exit, _)) = &result {
        return Ok(i32::from(exit.status));
    }
    if let Some(sig) = teardown.signal() {
        return Err(Failure {
            message: format!("stopped by signal {sig}; the VM was destroyed"),
            code: 128 + sig,
        });
    }
    let failure = match (report.outcome, result) {
        (Outcome::TimedOut, _) => outcome_failure(Outcome::TimedOut, opts.timeout_secs()),
        // The agent's channel broke but guest-init still reported on the
        // status port (it reports every exit there too).
        // guest-init's own failed start (a share it could not mount, say):
        // its reason is on the console.
        (Outcome::Exited(status), Err(_)) if status == crate::exit_code::SETUP_FAILED as u32 => {
            Failure {
                message: "guest-init could not start the command (see the guest console)".into(),
                code: crate::exit_code::SETUP_FAILED,
            }
        }
        (Outcome::Exited(status), _) if status <= 255 => return Ok(status as i32),
        (Outcome::Stopped, Err(e)) => Failure {
            message: format!("the guest stopped without reporting the command's exit status ({e})"),
            code: crate::exit_code::GUEST_CRASHED,
        },
        (other, _) => outcome_failure(other, opts.timeout_secs()),
    };
    let console_explains = [
        crate::exit_code::GUEST_CRASHED,
        crate::exit_code::SETUP_FAILED,
    ];
    if !args.quiet && !args.console && console_explains.contains(&failure.code) {
        print_console_tail(&dir.console_path());
    }
    Err(failure)
}

/// KVM usable, kernel and initramfs readable: what would fail the build
/// anyway, checked before any helper process or session directory exists.
fn preflight(config: &VmConfig) -> Result<(), Failure> {
    crate::vm::open_kvm().map_err(|e| Failure::from(builder::Error::Kvm(e)))?;
    crate::kernel::check_readable(&config.kernel, config.initrd.as_deref())
        .map_err(|e| Failure::from(builder::Error::Kernel(e)))
}

fn plan_shares(args: &RunArgs) -> Result<Vec<Share>, Failure> {
    let cwd;
    let workspace = match (&args.workspace, args.no_workspace) {
        (_, true) => None,
        (Some(dir), false) => Some(dir.as_path()),
        (None, false) => {
            cwd = std::env::current_dir().map_err(|e| {
                setup_failure(format!(
                    "cannot share the current directory as the workspace: {e} (use --workspace DIR or --no-workspace)"
                ))
            })?;
            Some(cwd.as_path())
        }
    };
    shares::plan(&shares::Wanted {
        workspace,
        write: args.write,
        mounts: &args.mounts,
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
    let beside = crate::cli::beside_binary("libexec/mvm/virtiofsd");
    let in_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("virtiofsd"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
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
        shared_dir: &share.host,
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

fn exec_request(
    args: &RunArgs,
    argv: Vec<String>,
    workspace: bool,
) -> Result<ExecRequest, Failure> {
    let mut env = Vec::with_capacity(args.env.len());
    for item in &args.env {
        match item.split_once('=') {
            Some((key, value)) if !key.is_empty() => env.push((key.to_string(), value.to_string())),
            _ => return Err(setup_failure(format!("--env '{item}' is not KEY=VALUE"))),
        }
    }
    let default_workdir = if workspace { WORKSPACE_GUEST_PATH } else { "/" };
    let workdir = args.workdir.as_deref().unwrap_or(default_workdir);
    if !workdir.starts_with('/') {
        return Err(setup_failure(format!(
            "--workdir '{workdir}' must be an absolute path in the guest"
        )));
    }
    let (uid, gid) = guest_identity(
        args.root,
        session::dir::current_uid(),
        session::dir::current_gid(),
    );
    let (rows, cols) = if args.tty { terminal::size() } else { (0, 0) };
    Ok(ExecRequest {
        argv,
        env,
        cwd: workdir.to_string(),
        uid,
        gid,
        tty: args.tty,
        rows,
        cols,
        max_procs: args.max_procs,
    })
}

/// The uid and gid the command gets in the guest: root with --root;
/// otherwise the caller's own, except that a root caller gets the
/// unprivileged [`UNPRIVILEGED_GUEST_ID`] (root in the guest only when
/// asked for).
fn guest_identity(root: bool, uid: u32, gid: u32) -> (u32, u32) {
    match (root, uid) {
        (true, _) => (0, 0),
        (false, 0) => (UNPRIVILEGED_GUEST_ID, UNPRIVILEGED_GUEST_ID),
        (false, _) => (uid, gid),
    }
}

/// The guest uid and gid a root caller's command runs as.
pub const UNPRIVILEGED_GUEST_ID: u32 = 1000;

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
    fn a_root_caller_is_unprivileged_in_the_guest_unless_root_is_asked() {
        assert_eq!(guest_identity(false, 0, 0), (1000, 1000));
        assert_eq!(guest_identity(true, 0, 0), (0, 0));
        assert_eq!(guest_identity(false, 1234, 100), (1234, 100));
        assert_eq!(guest_identity(true, 1234, 100), (0, 0));
    }
}
