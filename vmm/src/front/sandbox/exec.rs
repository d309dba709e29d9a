//! `mvm exec NAME -- CMD`: one command in a running sandbox, with what
//! `mvm run` offers (stdin with -i, a pty with -t, signals forwarded, the
//! exact exit status). A client process like any other: it connects to
//! the sandbox's vsock socket (in the user's private runtime directory)
//! and speaks the exec channel; the supervisor is not involved.

use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use mvm_protocol::{ExecRequest, AGENT_PORT};

use super::super::command_args::CommandArgs;
use super::super::console_tail;
use super::super::join;
use super::super::stats::print_exec_stats;
use super::super::vm_args::timeout_duration;
use super::super::{setup_failure, Failure};
use super::{last_error, sandbox_failure};
use crate::exit_code;
use crate::sandboxes::{Paths, State, EXEC_DEFAULTS, SUPERVISOR_LOG};
use crate::session::client;
use crate::session::signals::TERMINATE_GRACE;
use crate::session::terminal;

/// How long an exec waits for a running sandbox's agent to take it.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

/// How long an exec whose channel broke waits to see whether the
/// sandbox's machine ended with it (a guest panic, a reboot, `mvm stop`):
/// its supervisor then exits, leaving why in its log.
const ENDED_WAIT: Duration = Duration::from_secs(3);

/// `mvm exec`'s options of its own, beside the command's.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Kill the command after this many seconds (exit status 124); the
    /// sandbox runs on
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Print measurements on stderr at the end: this exec's wall time, CPU
    /// time and peak RSS, and the sandbox's peak RSS (its supervisor's,
    /// since it started: the VMM and the guest memory it touched)
    #[arg(long)]
    pub print_stats: bool,
}

/// Runs `argv` in sandbox `name`; returns its exit status. With
/// `--print-stats`, says what it cost at the end, whatever the outcome.
pub fn exec(
    name: &str,
    args: &CommandArgs,
    options: &ExecArgs,
    argv: Vec<String>,
) -> Result<i32, Failure> {
    let started = Instant::now();
    let timeout = timeout_duration(options.timeout)?;
    let paths = Paths::of(name).map_err(sandbox_failure)?;
    let supervisor = paths.pid();
    let result = exec_in(name, &paths, args, timeout, argv);
    if options.print_stats {
        print_exec_stats(started, supervisor);
    }
    result
}

fn exec_in(
    name: &str,
    paths: &Paths,
    args: &CommandArgs,
    timeout: Option<Duration>,
    argv: Vec<String>,
) -> Result<i32, Failure> {
    paths.read_record().map_err(sandbox_failure)?;
    match paths.state() {
        State::Running => {}
        State::Starting => {
            return Err(setup_failure(format!(
                "sandbox '{name}' is still starting: try again in a moment"
            )))
        }
        State::Stopped => {
            return Err(setup_failure(format!(
                "sandbox '{name}' is stopped: start it with mvm start {name}"
            )))
        }
        State::Dead => {
            return Err(setup_failure(format!(
                "sandbox '{name}' is dead (its supervisor was killed): mvm start {name}, or mvm rm {name}"
            )))
        }
    }
    if argv.is_empty() {
        return Err(setup_failure(format!(
            "no command given: put it after -- (e.g. mvm exec {name} -- uname -a)"
        )));
    }
    let request = request(paths, args, argv)?;
    let socket = paths.runtime_file("vsock.sock");
    // The agent of a running sandbox listens: a connection it does not
    // take within the limit is refused (the socket's owner is another
    // user, say), not worth waiting for.
    let deadline = Instant::now() + CONNECT_LIMIT;
    let gone = || !paths.supervised() || Instant::now() > deadline;
    let stream = client::connect(&socket, AGENT_PORT, &gone).map_err(|e| match e {
        client::Error::VmGone if paths.supervised() => setup_failure(format!(
            "sandbox '{name}' did not take the command within {} s (is {} yours?)",
            CONNECT_LIMIT.as_secs(),
            socket.display()
        )),
        e => lost(name, paths, &e),
    })?;
    let call = join::Call {
        request,
        interactive: args.interactive,
        raw_terminal: args.tty && args.interactive,
        timeout,
    };
    let ended = join::run(stream, call, || {}).map_err(setup_failure)?;
    match ended {
        join::Ended::Exited(exit) => {
            if exit.oom_kill {
                // From the guest kernel's log, as the agent read it at the end.
                eprintln!(
                    "mvm: the sandbox's guest ran out of memory during the command: its kernel killed a process (mvm logs {name})"
                );
            }
            Ok(i32::from(exit.status))
        }
        join::Ended::Lost(e) => Err(lost(name, paths, &e)),
        join::Ended::Cut {
            by: join::CUT_BY_TIMEOUT,
        } => Err(Failure {
            message: format!(
                "the command did not finish within --timeout {}s; it was killed in the sandbox",
                timeout.unwrap_or_default().as_secs_f64()
            ),
            code: exit_code::TIMEOUT,
        }),
        // As `mvm run` ends after a signal's grace: 128 + the signal.
        join::Ended::Cut { by: sig } => Err(Failure {
            message: format!(
                "stopped by signal {sig}; the command did not end within {} s and was killed in the sandbox",
                TERMINATE_GRACE.as_secs()
            ),
            code: 128 + sig,
        }),
    }
}

/// The command's channel broke (exit 121, as for `mvm run`). If the
/// sandbox's machine ended with it, say how, as `mvm run` would: the
/// supervisor's own error and the guest console's last lines.
fn lost(name: &str, paths: &Paths, err: &client::Error) -> Failure {
    let deadline = Instant::now() + ENDED_WAIT;
    while paths.supervised() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    let message = if paths.supervised() {
        format!("sandbox '{name}': {err}")
    } else {
        match last_error(&paths.runtime_file(SUPERVISOR_LOG)) {
            Some(why) => {
                console_tail::print(&paths.runtime_file("console.log"));
                format!("sandbox '{name}' ended during the command: {why}")
            }
            None => format!(
                "sandbox '{name}' ended during the command (stopped, or powered off from inside): {err}"
            ),
        }
    };
    Failure {
        message,
        code: exit_code::GUEST_CRASHED,
    }
}

/// The sandbox's defaults (what its supervisor wrote) with this exec's
/// options applied.
fn request(paths: &Paths, args: &CommandArgs, argv: Vec<String>) -> Result<ExecRequest, Failure> {
    let path = paths.runtime_file(EXEC_DEFAULTS);
    let mut request: ExecRequest = std::fs::read(&path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(|| {
            setup_failure(format!(
                "cannot read the sandbox's exec defaults {}: restart it (mvm stop, mvm start)",
                path.display()
            ))
        })?;
    request.argv = argv;
    for item in &args.env {
        match item.split_once('=') {
            Some((key, value)) if !key.is_empty() => {
                request.env.push((key.to_string(), value.to_string()))
            }
            _ => return Err(setup_failure(format!("--env '{item}' is not KEY=VALUE"))),
        }
    }
    if let Some(dir) = &args.workdir {
        if !dir.starts_with('/') {
            return Err(setup_failure(format!(
                "--workdir '{dir}' must be an absolute path in the guest"
            )));
        }
        request.cwd = dir.clone();
    }
    if args.root {
        (request.uid, request.gid, request.user) = (0, 0, None);
        request.user_name = None;
    }
    if let Some(user) = &args.user {
        request.user = Some(user.clone());
    }
    request.tty = args.tty;
    (request.rows, request.cols) = if args.tty { terminal::size() } else { (0, 0) };
    Ok(request)
}
