//! The `mvm` command line: parsing, then handing each subcommand to its
//! front end (`front::run`, `front::boot`), whose failure becomes one line
//! on stderr and a documented exit code.

use std::time::Instant;

use clap::{Parser, Subcommand};

use crate::confine;
use crate::exit_code;
use crate::front::{self, run::RunArgs, Failure, VmArgs};

#[derive(Parser, Debug)]
#[command(
    name = "mvm",
    version,
    about = "Run a command in a throwaway KVM microVM with its own Linux kernel",
    long_about = "Run a command in a throwaway KVM microVM with its own Linux kernel.\n\n\
        Each `mvm run` boots a fresh VM (mvm's guest kernel and init), runs the \
        command there and exits with its status. The VM has no network device.",
    after_help = exit_code::HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process and moved once: the size of the largest
// variant costs nothing worth boxing it for.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Boot a kernel and initramfs, streaming the guest console to stdout
    /// (stdin goes to the console); exits 0 when the guest powers off. The
    /// first boot of a machine records, in the template store, the guest
    /// pages it touched until guest-init was ready; later boots of the
    /// same machine map them ahead (`mvm snapshot prune` removes them).
    Boot {
        #[command(flatten)]
        vm: VmArgs,
        #[command(flatten)]
        snapshot: front::boot::SnapshotArgs,
    },
    /// Run CMD in a fresh microVM and exit with its status. Its stdout and
    /// stderr come back separately; the guest console goes to a log in the
    /// session directory (see --console).
    Run {
        #[command(flatten)]
        vm: VmArgs,
        #[command(flatten)]
        run: RunArgs,
        /// Let more commands join this one in the VM through its session's
        /// vsock socket, as `mvm oci exec` does for a container; the VM
        /// still ends with this command (docs/kubernetes.md)
        #[arg(long, hide = true)]
        serve_exec: bool,
        /// The command and its arguments, after `--` (may be left out to run
        /// the image's Entrypoint and Cmd).
        #[arg(last = true, value_name = "CMD")]
        argv: Vec<String>,
    },
    /// Create a named sandbox and start it: a microVM that outlives each
    /// command (run them with `mvm exec`), with the options of `mvm run`
    /// (its image, shares, size and egress; --env, --workdir, --root and
    /// --user become every exec's defaults). docs/sandboxes.md
    Create {
        /// The sandbox's name: 1 to 63 of a-z, 0-9, '.', '_', '-'
        name: String,
        #[command(flatten)]
        options: front::sandbox::CreateArgs,
    },
    /// Run CMD in a running sandbox and exit with its status
    Exec {
        name: String,
        #[command(flatten)]
        args: front::command_args::CommandArgs,
        #[command(flatten)]
        options: front::sandbox::ExecArgs,
        /// The command and its arguments, after `--`
        #[arg(last = true, value_name = "CMD")]
        argv: Vec<String>,
    },
    /// List your sandboxes: name, state (running, starting, stopped, dead),
    /// image, uptime, size, pid, shares and egress policy
    Ls {
        #[command(flatten)]
        args: front::sandbox::LsArgs,
    },
    /// Stop a sandbox: its commands get SIGTERM and the guest powers off;
    /// after a grace period the machine is stopped
    Stop { name: String },
    /// Start a stopped (or dead) sandbox again, with the options it was
    /// created with (its shares are checked again)
    Start { name: String },
    /// Remove a sandbox and every file of it (-f: stop it first)
    Rm {
        name: String,
        #[command(flatten)]
        args: front::sandbox::RmArgs,
    },
    /// Print a sandbox's logs: the guest console, the egress audit log and
    /// its supervisor's messages
    Logs { name: String },
    /// A sandbox's supervisor, started by create and start (not for
    /// direct use)
    #[command(name = "__supervise", hide = true)]
    Supervise { name: String },
    /// Manage the image store: OCI images imported for `mvm run --image`
    /// (docs/images.md)
    Image {
        #[command(subcommand)]
        command: front::image::ImageCommand,
    },
    /// Manage the templates `mvm run` restores instead of booting: a
    /// machine saved when guest-init was ready, before any run's files,
    /// command or secrets reached it (docs/snapshots.md)
    Snapshot {
        #[command(subcommand)]
        command: front::snapshot_cmd::SnapshotCommand,
    },
    /// The OCI runtime command line containerd's runc shim drives: each
    /// container in its own microVM (also installed as `mvm-oci`, for the
    /// shim's BinaryName; docs/kubernetes.md)
    Oci(front::oci::OciArgs),
}

fn execute(cli: Cli, started: Instant) -> Result<i32, Failure> {
    match cli.command {
        Command::Boot { vm, snapshot } => front::boot::boot(&vm, &snapshot, started),
        Command::Run {
            vm,
            run,
            serve_exec,
            argv,
        } => front::run::run(&vm, &run, serve_exec, argv, started),
        Command::Create { name, options } => {
            // The words after `create`, kept for `start` to parse again.
            let words = std::env::args().skip(2).collect();
            front::sandbox::create(&name, &options, words)
        }
        Command::Exec {
            name,
            args,
            options,
            argv,
        } => front::sandbox::exec(&name, &args, &options, argv),
        Command::Ls { args } => front::sandbox::ls(&args),
        Command::Stop { name } => front::sandbox::stop(&name),
        Command::Start { name } => front::sandbox::start(&name),
        Command::Rm { name, args } => front::sandbox::rm(&name, &args),
        Command::Logs { name } => front::sandbox::logs(&name),
        Command::Supervise { name } => front::sandbox::supervise(&name),
        Command::Image { command } => front::image::command(&command),
        Command::Snapshot { command } => front::snapshot_cmd::command(&command),
        Command::Oci(args) => front::oci::command(&args),
    }
}

/// The process's arguments; called as `mvm-oci` (a link to mvm, for a
/// shim that runs one binary with runc's arguments), `mvm oci`'s.
fn arguments(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut args: Vec<_> = args.collect();
    let as_oci = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|name| name == "mvm-oci");
    if as_oci {
        args.insert(1, "oci".into());
    }
    args
}

/// Parses the process arguments, runs, and returns the exit code.
pub fn main() -> i32 {
    let started = Instant::now();
    // Before anything is opened: what the VMM holds, it opened itself.
    if let Err(e) = confine::close_inherited_fds() {
        eprintln!("mvm: cannot close inherited file descriptors: {e}");
        return exit_code::SETUP_FAILED;
    }
    let cli = match Cli::try_parse_from(arguments(std::env::args_os())) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit_code::SETUP_FAILED
            } else {
                0 // --help, --version
            };
            let _ = e.print();
            return code;
        }
    };
    match execute(cli, started) {
        Ok(code) => code,
        Err(f) => {
            eprintln!("mvm: {}", f.message);
            f.code
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("mvm").chain(args.iter().copied()))
    }

    #[test]
    fn called_as_mvm_oci_it_parses_runc_arguments() {
        let words = |w: &[&str]| w.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let args = arguments(
            words(&[
                "/usr/local/bin/mvm-oci",
                "--root",
                "/run/x",
                "--log",
                "/l.json",
                "--log-format",
                "json",
                "--systemd-cgroup",
                "create",
                "--bundle",
                "/b",
                "--pid-file",
                "/p",
                "c1",
            ])
            .into_iter(),
        );
        let Command::Oci(oci) = Cli::try_parse_from(args).unwrap().command else {
            panic!("not oci")
        };
        assert_eq!(oci.root.as_deref(), Some(std::path::Path::new("/run/x")));
        assert!(matches!(
            oci.command,
            front::oci::OciCommand::Create { ref id, .. } if id == "c1"
        ));
        // Called as mvm, nothing is added.
        assert_eq!(
            arguments(words(&["mvm", "run"]).into_iter()),
            words(&["mvm", "run"])
        );
    }

    #[test]
    fn run_takes_the_command_after_double_dash() {
        let cli = parse(&["run", "--cpus", "2", "--", "sh", "-c", "exit 3"]).unwrap();
        match cli.command {
            Command::Run { vm, argv, .. } => {
                assert_eq!(argv, ["sh", "-c", "exit 3"]);
                assert_eq!(vm.cpus, 2);
                assert_eq!(vm.memory, "512M");
            }
            _ => panic!("not run"),
        }
    }

    #[test]
    fn a_hostname_is_checked_when_parsed() {
        let Command::Run { run, .. } = parse(&["run", "--hostname", "ci-7", "--", "true"])
            .unwrap()
            .command
        else {
            panic!("not run")
        };
        assert_eq!(run.hostname.as_deref(), Some("ci-7"));
        let Command::Run { run, .. } = parse(&["run", "--", "true"]).unwrap().command else {
            panic!("not run")
        };
        assert_eq!(run.hostname, None);
        for bad in ["web/1", "a..b", "", "a b"] {
            let err = parse(&["run", "--hostname", bad, "--", "true"]).unwrap_err();
            assert!(err.to_string().contains("--hostname"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn run_without_command_parses_and_bad_flags_do_not() {
        // No command: the image's own runs (or `run` says one is missing).
        assert!(parse(&["run"]).is_ok());
        assert!(parse(&["run", "--bogus", "--", "true"]).is_err());
        let Command::Run { run, .. } = parse(&["run", "--", "true"]).unwrap().command else {
            panic!("not run")
        };
        assert_eq!(
            run.image, "default",
            "the default image is the default root"
        );
    }

    #[test]
    fn no_snapshot_is_a_flag_and_a_variable_of_1_or_0() {
        let no_snapshot = |args: &[&str]| match parse(args).unwrap().command {
            Command::Run { run, .. } => run.no_snapshot,
            _ => panic!("not run"),
        };
        assert!(no_snapshot(&["run", "--no-snapshot", "--", "true"]));
        // SAFETY: no other thread of this test reads the variable.
        unsafe { std::env::set_var("MVM_NO_SNAPSHOT", "0") };
        assert!(!no_snapshot(&["run", "--", "true"]));
        // SAFETY: as above.
        unsafe { std::env::set_var("MVM_NO_SNAPSHOT", "1") };
        assert!(no_snapshot(&["run", "--", "true"]));
        // SAFETY: as above.
        unsafe { std::env::remove_var("MVM_NO_SNAPSHOT") };
        assert!(!no_snapshot(&["run", "--", "true"]));
    }

    #[test]
    fn bad_sizes_and_counts_are_setup_failures() {
        let cli = parse(&["boot", "--memory", "16M"]).unwrap();
        let Command::Boot { vm, .. } = cli.command else {
            panic!()
        };
        let f = vm.vm_config(String::new()).err().unwrap();
        assert_eq!(f.code, exit_code::SETUP_FAILED);
        assert!(f.message.contains("too small"), "{}", f.message);

        let cli = parse(&["boot", "--cpus", "0"]).unwrap();
        let Command::Boot { vm, .. } = cli.command else {
            panic!()
        };
        assert!(vm.vm_config(String::new()).is_err());
    }

    #[test]
    fn timeout_must_be_positive() {
        let cli = parse(&["boot", "--timeout=-1"]).unwrap();
        let Command::Boot { vm, .. } = cli.command else {
            panic!()
        };
        assert!(vm.timeout().is_err());
        let cli = parse(&["boot", "--timeout", "2.5"]).unwrap();
        let Command::Boot { vm, .. } = cli.command else {
            panic!()
        };
        assert_eq!(
            vm.timeout().ok().flatten(),
            Some(Duration::from_millis(2500))
        );
    }
}
