//! `mvm oci` (also installed as `mvm-oci`, a link to mvm): the runtime
//! command line containerd's runc shim drives (`io.containerd.runc.v2`
//! with `BinaryName`), so that each container runs in its own microVM
//! (docs/kubernetes.md). runc's global flags come before the subcommand;
//! those that mean nothing to a VM are accepted and ignored. Errors are
//! one line on stderr (and in `--log`, as JSON with `--log-format json`)
//! and exit status 1, as runc's are.

mod bundle;
mod container;
mod exec;
mod lifecycle;

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};

use super::Failure;

#[derive(Args, Debug)]
pub struct OciArgs {
    /// Where containers' state lives [default: /run/mvm-oci for root,
    /// else $XDG_RUNTIME_DIR/mvm-oci]
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Also write errors to FILE (the shim reads it)
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// How --log lines are written
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Accepted and ignored: a VM is not put in a host cgroup by mvm
    #[arg(long)]
    pub systemd_cgroup: bool,
    /// Accepted and ignored
    #[arg(long)]
    pub debug: bool,
    #[command(subcommand)]
    pub command: OciCommand,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum OciCommand {
    /// Create a container from an OCI bundle: its process waits for
    /// `start`, then boots the VM and runs config.json's process in it
    Create {
        /// The bundle: a directory with config.json and the root
        /// filesystem it names
        #[arg(long, short = 'b', value_name = "DIR", default_value = ".")]
        bundle: PathBuf,
        /// Write the container process's pid here (the VMM's, once started)
        #[arg(long, value_name = "FILE")]
        pid_file: Option<PathBuf>,
        /// A Unix socket to send the pty's controlling end to (process.terminal)
        #[arg(long, value_name = "SOCKET")]
        console_socket: Option<PathBuf>,
        /// Accepted and ignored (no pivot_root on the host: the root is the guest's)
        #[arg(long)]
        no_pivot: bool,
        /// Accepted and ignored (no host keyring is shared with a VM)
        #[arg(long)]
        no_new_keyring: bool,
        id: String,
    },
    /// Start a created container's process
    Start { id: String },
    /// Print a container's state (runtime spec JSON)
    State { id: String },
    /// Send a signal (default SIGTERM) to a container's process; SIGTERM,
    /// SIGINT and SIGHUP reach the command in the guest, SIGKILL ends the VM
    Kill {
        /// Accepted: the container has one process on the host
        #[arg(long, short = 'a')]
        all: bool,
        id: String,
        #[arg(default_value = "SIGTERM")]
        signal: String,
    },
    /// Delete a stopped container's state (--force: kill it first)
    Delete {
        #[arg(long, short = 'f')]
        force: bool,
        id: String,
    },
    /// The container's host processes: the VMM's pid
    Ps {
        #[arg(long, short = 'f', default_value = "table")]
        format: String,
        id: String,
        /// Accepted and ignored (ps(1)'s options)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        ps_args: Vec<String>,
    },
    /// Run another process in a running container's VM (its exit status
    /// is the process's; with --detach, the pid in --pid-file is the one
    /// to wait for)
    Exec {
        /// The process to run (runtime spec process JSON), instead of the
        /// command line's
        #[arg(long, short = 'p', value_name = "FILE")]
        process: Option<PathBuf>,
        /// Return once the guest started the process; a process of its own
        /// relays its stdio and exits with its status
        #[arg(long, short = 'd')]
        detach: bool,
        /// Write the detached process's pid here
        #[arg(long, value_name = "FILE")]
        pid_file: Option<PathBuf>,
        /// A Unix socket to send the pty's controlling end to (with a terminal)
        #[arg(long, value_name = "SOCKET")]
        console_socket: Option<PathBuf>,
        /// Run the process on a pty in the guest
        #[arg(long, short = 't')]
        tty: bool,
        /// Working directory in the guest [default: /]
        #[arg(long, value_name = "DIR")]
        cwd: Option<String>,
        /// Set an environment variable (repeatable)
        #[arg(long, short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// UID[:GID] in the guest [default: 0:0]
        #[arg(long, short = 'u', value_name = "UID[:GID]")]
        user: Option<String>,
        id: String,
        /// The command and its arguments (without --process)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// What this runtime supports (runtime spec features JSON)
    Features,
}

/// `mvm oci ...`: the exit status, 0 or 1.
pub fn command(args: &OciArgs) -> Result<i32, Failure> {
    let root = container::runtime_root(args.root.as_deref());
    let done = match &args.command {
        OciCommand::Create {
            bundle,
            pid_file,
            console_socket,
            id,
            ..
        } => lifecycle::create(&lifecycle::CreateArgs {
            root: &root,
            bundle,
            pid_file: pid_file.as_deref(),
            console_socket: console_socket.as_deref(),
            id,
        }),
        OciCommand::Start { id } => lifecycle::start(&root, id),
        OciCommand::State { id } => state(&root, id),
        OciCommand::Kill { id, signal, .. } => lifecycle::kill(&root, id, signal),
        OciCommand::Delete { id, force } => lifecycle::delete(&root, id, *force),
        OciCommand::Ps { format, id, .. } => ps(&root, id, format),
        OciCommand::Exec {
            process,
            detach,
            pid_file,
            console_socket,
            tty,
            cwd,
            env,
            user,
            id,
            args: argv,
        } => {
            let status = exec::exec(&exec::ExecArgs {
                root: &root,
                id,
                process: process.as_deref(),
                detach: *detach,
                pid_file: pid_file.as_deref(),
                console_socket: console_socket.as_deref(),
                tty: *tty,
                cwd: cwd.as_deref(),
                env,
                user: user.as_deref(),
                args: argv,
            });
            return match status {
                Ok(status) => Ok(status),
                Err(message) => Ok(fail(args, &message)),
            };
        }
        OciCommand::Features => {
            println!("{}", features());
            Ok(())
        }
    };
    match done {
        Ok(()) => Ok(0),
        Err(message) => Ok(fail(args, &message)),
    }
}

/// Says `message` as runc would (stderr, and `--log`); exit status 1.
fn fail(args: &OciArgs, message: &str) -> i32 {
    log_error(args.log.as_deref(), args.log_format, message);
    eprintln!("mvm oci: {message}");
    1
}

fn state(root: &Path, id: &str) -> Result<(), String> {
    let (_, record, status) = lifecycle::find(root, id)?;
    let json = container::state_json(&record, status);
    println!(
        "{}",
        serde_json::to_string_pretty(&json).expect("plain data serialises")
    );
    Ok(())
}

fn ps(root: &Path, id: &str, format: &str) -> Result<(), String> {
    let (_, record, status) = lifecycle::find(root, id)?;
    let pids: Vec<i32> = match status {
        container::Status::Stopped => Vec::new(),
        _ => vec![record.pid],
    };
    match format {
        "json" => println!("{}", serde_json::to_string(&pids).expect("numbers")),
        "table" => {
            println!("PID");
            for pid in pids {
                println!("{pid}");
            }
        }
        other => return Err(format!("unknown ps format {other:?}: use table or json")),
    }
    Ok(())
}

/// The runtime spec's features document: what this runtime honours.
fn features() -> String {
    let json = serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.2.0",
        "hooks": [],
        "mountOptions": ["bind", "rbind", "ro", "rw"],
        "annotations": {
            "org.opencontainers.runtime-spec.features.mvm": "each container runs in its own microVM; see docs/kubernetes.md"
        }
    });
    serde_json::to_string_pretty(&json).expect("plain data serialises")
}

/// runc's --log: one line per error, logrus-style JSON or text.
fn log_error(log: Option<&Path>, format: LogFormat, message: &str) {
    let Some(path) = log else { return };
    let line = match format {
        LogFormat::Json => serde_json::json!({
            "level": "error",
            "msg": message,
            "time": container::now_rfc3339(),
        })
        .to_string(),
        LogFormat::Text => format!("level=error msg={message:?}"),
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}
