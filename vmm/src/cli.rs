//! The `mvm` command line: parsing, running, and mapping every way a run
//! can end to one line on stderr and a documented exit code.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};

use crate::builder;
use crate::config::{self, VmConfig};
use crate::console::ConsoleOutput;
use crate::exit_code;
use crate::guest_cmd;
use crate::runner::{self, Outcome, RunOptions};
use crate::vm;

/// Kernel parameters every mvm guest gets (devices add their own): a
/// panic or oops resets the VM at once instead of hanging it.
const BASE_CMDLINE: &str = "panic=-1 oops=panic nomodules";

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

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Boot a kernel and initramfs, streaming the guest console to stdout
    /// (stdin goes to the console); exits 0 when the guest powers off.
    Boot {
        #[command(flatten)]
        vm: VmArgs,
    },
    /// Run CMD in a fresh microVM and exit with its status.
    Run {
        #[command(flatten)]
        vm: VmArgs,
        /// The command and its arguments, after `--`.
        #[arg(required = true, last = true, value_name = "CMD")]
        argv: Vec<String>,
    },
}

#[derive(Args, Debug)]
pub struct VmArgs {
    /// Guest kernel: ELF vmlinux or bzImage [default: $MVM_KERNEL, else
    /// ../share/mvm/vmlinux next to the mvm binary]
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Guest initramfs (newc cpio) [default: $MVM_INITRD, else
    /// ../share/mvm/initramfs.cpio next to the mvm binary]
    #[arg(long, value_name = "PATH")]
    pub initrd: Option<PathBuf>,
    /// Extra kernel command line parameters, appended (later ones win)
    #[arg(long, value_name = "ARGS", default_value = "")]
    pub cmdline: String,
    /// Number of vCPUs (1-32)
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub cpus: u32,
    /// Guest memory, e.g. 256M or 2G (at least 64M)
    #[arg(long, default_value = "512M", value_name = "SIZE")]
    pub memory: String,
    /// Destroy the VM after this many seconds (exit status 124)
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Print the time from mvm's start to guest-init's first instruction
    /// (the boot marker) on stderr
    #[arg(long)]
    pub print_boot_time: bool,
}

/// A failure before or while running the VM: message and exit code.
struct Failure {
    message: String,
    code: i32,
}

impl From<builder::Error> for Failure {
    fn from(e: builder::Error) -> Self {
        let code = match &e {
            builder::Error::Kvm(
                vm::Error::NoKvm(_) | vm::Error::KvmPermission(_) | vm::Error::OpenKvm(..),
            ) => exit_code::KVM_UNAVAILABLE,
            _ => exit_code::SETUP_FAILED,
        };
        Failure {
            message: e.to_string(),
            code,
        }
    }
}

fn setup_failure(message: impl ToString) -> Failure {
    Failure {
        message: message.to_string(),
        code: exit_code::SETUP_FAILED,
    }
}

/// `<dir of the mvm binary>/../share/mvm/<name>`, the layout `make`
/// produces and an install keeps.
fn default_artifact(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join("share/mvm").join(name))
}

fn vm_config(args: &VmArgs, cmdline: String) -> Result<VmConfig, Failure> {
    let mem_size = config::parse_size(&args.memory)
        .and_then(config::check_memory)
        .map_err(setup_failure)?;
    let vcpus = config::check_cpus(args.cpus).map_err(setup_failure)?;
    let kernel = args
        .kernel
        .clone()
        .or_else(|| default_artifact("MVM_KERNEL", "vmlinux"))
        .ok_or_else(|| setup_failure("cannot locate the guest kernel: pass --kernel PATH"))?;
    let initrd = args
        .initrd
        .clone()
        .or_else(|| default_artifact("MVM_INITRD", "initramfs.cpio"));
    Ok(VmConfig {
        kernel,
        initrd,
        cmdline,
        vcpus,
        mem_size,
    })
}

fn timeout(args: &VmArgs) -> Result<Option<Duration>, Failure> {
    match args.timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t > 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(setup_failure(format!(
            "--timeout must be a positive number of seconds, not {t}"
        ))),
    }
}

fn execute(cli: Cli, started: Instant) -> Result<i32, Failure> {
    let (args, cmdline, is_run) = match &cli.command {
        Command::Boot { vm } => (vm, format!("{BASE_CMDLINE} {}", vm.cmdline), false),
        Command::Run { vm, argv } => (
            vm,
            format!(
                "{BASE_CMDLINE} quiet {} {}",
                guest_cmd::cmdline_params(argv, None),
                vm.cmdline
            ),
            true,
        ),
    };
    let config = vm_config(args, cmdline)?;
    let timeout = timeout(args)?;
    let console = ConsoleOutput::new(Box::new(std::io::stdout()));
    let vmm = builder::build(&config, console)?;
    let report = runner::run(
        vmm,
        RunOptions {
            started,
            timeout,
            forward_stdin: !is_run,
        },
    )
    .map_err(|e| Failure {
        message: e.to_string(),
        code: exit_code::VMM_FAILED,
    })?;

    if args.print_boot_time {
        match report.boot_to_init {
            Some(d) => eprintln!("mvm: boot to init: {:.1} ms", d.as_secs_f64() * 1e3),
            None => eprintln!("mvm: boot to init: no boot marker from the guest"),
        }
    }
    match report.outcome {
        Outcome::Exited(status) if is_run => match i32::try_from(status) {
            Ok(code) if code <= 255 => Ok(code),
            _ => Err(Failure {
                message: format!("the guest reported an impossible exit status {status}"),
                code: exit_code::GUEST_CRASHED,
            }),
        },
        Outcome::Exited(_) | Outcome::Stopped if !is_run => Ok(0),
        Outcome::Stopped | Outcome::Exited(_) => Err(Failure {
            message: "the guest stopped without reporting the command's exit status (an unexpected reboot or crash; the console output above says more)".into(),
            code: exit_code::GUEST_CRASHED,
        }),
        Outcome::Panicked => Err(Failure {
            message: "the guest kernel panicked (its console output above says why)".into(),
            code: exit_code::GUEST_CRASHED,
        }),
        Outcome::TimedOut => Err(Failure {
            message: format!(
                "the guest did not finish within --timeout {}s; the VM was destroyed",
                args.timeout.unwrap_or_default()
            ),
            code: exit_code::TIMEOUT,
        }),
        Outcome::Failed(why) => Err(Failure {
            message: why,
            code: exit_code::VMM_FAILED,
        }),
    }
}

/// Parses the process arguments, runs, and returns the exit code.
pub fn main() -> i32 {
    let started = Instant::now();
    let cli = match Cli::try_parse() {
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

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("mvm").chain(args.iter().copied()))
    }

    #[test]
    fn run_takes_the_command_after_double_dash() {
        let cli = parse(&["run", "--cpus", "2", "--", "sh", "-c", "exit 3"]).unwrap();
        match cli.command {
            Command::Run { vm, argv } => {
                assert_eq!(argv, ["sh", "-c", "exit 3"]);
                assert_eq!(vm.cpus, 2);
                assert_eq!(vm.memory, "512M");
            }
            _ => panic!("not run"),
        }
    }

    #[test]
    fn run_without_command_is_an_error() {
        assert!(parse(&["run"]).is_err());
        assert!(parse(&["run", "--bogus", "--", "true"]).is_err());
    }

    #[test]
    fn bad_sizes_and_counts_are_setup_failures() {
        let cli = parse(&["boot", "--memory", "16M"]).unwrap();
        let Command::Boot { vm } = cli.command else {
            panic!()
        };
        let f = vm_config(&vm, String::new()).err().unwrap();
        assert_eq!(f.code, exit_code::SETUP_FAILED);
        assert!(f.message.contains("too small"), "{}", f.message);

        let cli = parse(&["boot", "--cpus", "0"]).unwrap();
        let Command::Boot { vm } = cli.command else {
            panic!()
        };
        assert!(vm_config(&vm, String::new()).is_err());
    }

    #[test]
    fn timeout_must_be_positive() {
        let cli = parse(&["boot", "--timeout=-1"]).unwrap();
        let Command::Boot { vm } = cli.command else {
            panic!()
        };
        assert!(timeout(&vm).is_err());
        let cli = parse(&["boot", "--timeout", "2.5"]).unwrap();
        let Command::Boot { vm } = cli.command else {
            panic!()
        };
        assert_eq!(
            timeout(&vm).ok().flatten(),
            Some(Duration::from_millis(2500))
        );
    }
}
