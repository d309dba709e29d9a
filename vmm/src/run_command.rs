//! `mvm run`: a session directory, a VM with a vsock device whose host
//! side lives there, the exec client talking to the guest agent, and the
//! mapping of however it ended to one exit code.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;
use std::sync::{Arc, Mutex};

use mvm_protocol::{ExecRequest, GUEST_CID};

use crate::builder;
use crate::cli::{outcome_failure, print_stats, setup_failure, vmm_failure, Failure, RunArgs};
use crate::config::{VmConfig, VsockConfig};
use crate::console::{Capped, ConsoleOutput};
use crate::runner::{self, Outcome, RunOptions};
use crate::session::{self, signals, terminal, SessionDir, Teardown, VmHandle};

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
) -> Result<i32, Failure> {
    let request = exec_request(args, argv)?;
    let dir = SessionDir::create().map_err(setup_failure)?;
    config.vsock = Some(VsockConfig {
        cid: GUEST_CID,
        uds_path: dir.vsock_path(),
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
    let vmm = builder::build(&config, ConsoleOutput::new(console))?;

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
        (Outcome::Exited(status), _) if status <= 255 => return Ok(status as i32),
        (Outcome::Stopped, Err(e)) => Failure {
            message: format!("the guest stopped without reporting the command's exit status ({e})"),
            code: crate::exit_code::GUEST_CRASHED,
        },
        (other, _) => outcome_failure(other, opts.timeout_secs()),
    };
    if !args.quiet && !args.console && failure.code == crate::exit_code::GUEST_CRASHED {
        print_console_tail(&dir.console_path());
    }
    Err(failure)
}

fn exec_request(args: &RunArgs, argv: Vec<String>) -> Result<ExecRequest, Failure> {
    let mut env = Vec::with_capacity(args.env.len());
    for item in &args.env {
        match item.split_once('=') {
            Some((key, value)) if !key.is_empty() => env.push((key.to_string(), value.to_string())),
            _ => return Err(setup_failure(format!("--env '{item}' is not KEY=VALUE"))),
        }
    }
    if !args.workdir.starts_with('/') {
        return Err(setup_failure(format!(
            "--workdir '{}' must be an absolute path in the guest",
            args.workdir
        )));
    }
    let (uid, gid) = if args.root {
        (0, 0)
    } else {
        (session::dir::current_uid(), session::dir::current_gid())
    };
    let (rows, cols) = if args.tty { terminal::size() } else { (0, 0) };
    Ok(ExecRequest {
        argv,
        env,
        cwd: args.workdir.clone(),
        uid,
        gid,
        tty: args.tty,
        rows,
        cols,
        max_procs: args.max_procs,
    })
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
