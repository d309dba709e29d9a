//! The `mvm` command line: parsing, running, and mapping every way a run
//! can end to one line on stderr and a documented exit code.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};

use crate::builder;
use crate::config::{self, VmConfig};
use crate::confine;
use crate::console::ConsoleOutput;
use crate::exit_code;
use crate::run_command;
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
    /// Run CMD in a fresh microVM and exit with its status. Its stdout and
    /// stderr come back separately; the guest console goes to a log in the
    /// session directory (see --console).
    Run {
        #[command(flatten)]
        vm: VmArgs,
        #[command(flatten)]
        run: RunArgs,
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
    /// Print measurements on stderr at the end: boot to init (mvm start to
    /// guest-init's boot marker), wall time, CPU time and peak RSS of the
    /// mvm process (VMM threads and vCPUs together), guest RAM resident in
    /// it, and for `run` the teardown time (docs/benchmarks.md)
    #[arg(long)]
    pub print_stats: bool,
    /// Run the VMM without its per-thread system call filters (for
    /// debugging only; prints a warning)
    #[arg(long)]
    pub no_seccomp: bool,
    /// Run the VMM without Landlock, keeping your view of the host
    /// filesystem (for host kernels without Landlock; prints a warning)
    #[arg(long)]
    pub no_landlock: bool,
}

impl VmArgs {
    fn confinement(&self) -> confine::Options {
        confine::Options {
            seccomp: !self.no_seccomp,
            landlock: !self.no_landlock,
        }
    }
}

/// Confines this process once the VM is built (docs/security.md); what
/// the user switched off is said on stderr.
pub(crate) fn confine_vmm(
    opts: confine::Options,
    writable: Option<confine::landlock::Writable>,
) -> Result<(), Failure> {
    for warning in opts.warnings() {
        eprintln!("{warning}");
    }
    confine::process(opts, writable).map_err(setup_failure)
}

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
    #[arg(long)]
    pub root: bool,
    /// Most processes the command's user may have in the guest
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_procs: u64,
    /// Copy the guest console (kernel and init messages) to stderr
    #[arg(long)]
    pub console: bool,
    /// Print no guest console lines when the guest crashes
    #[arg(short, long)]
    pub quiet: bool,
}

/// A failure before or while running the VM: message and exit code.
pub(crate) struct Failure {
    pub message: String,
    pub code: i32,
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

pub(crate) fn setup_failure(message: impl ToString) -> Failure {
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
    beside_binary(Path::new("share/mvm").join(name))
}

/// `<dir of the mvm binary>/../<relative>`.
pub(crate) fn beside_binary(relative: impl AsRef<Path>) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join(relative))
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
        vsock: None,
        shares: Vec::new(),
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
    match cli.command {
        Command::Boot { vm } => boot(&vm, started),
        Command::Run { vm, run, argv } => {
            let cmdline = format!("{BASE_CMDLINE} quiet mvm.agent=1 {}", vm.cmdline);
            let config = vm_config(&vm, cmdline)?;
            let timeout = timeout(&vm)?;
            run_command::run(
                config,
                &run,
                argv,
                RunOptions {
                    started,
                    timeout,
                    forward_stdin: false,
                    measure: vm.print_stats,
                },
                vm.print_stats,
                vm.confinement(),
            )
        }
    }
}

/// `mvm boot`: the console is the interface; the run ends when the guest
/// powers off.
fn boot(args: &VmArgs, started: Instant) -> Result<i32, Failure> {
    let config = vm_config(args, format!("{BASE_CMDLINE} {}", args.cmdline))?;
    let timeout = timeout(args)?;
    let console = ConsoleOutput::new(Box::new(std::io::stdout()));
    let vmm = builder::build(&config, console)?;
    confine_vmm(args.confinement(), None)?;
    let report = runner::run(
        vmm,
        RunOptions {
            started,
            timeout,
            forward_stdin: true,
            measure: args.print_stats,
        },
    )
    .map_err(vmm_failure)?;
    print_stats(args.print_stats, started, &report, None);
    match report.outcome {
        Outcome::Exited(_) | Outcome::Stopped => Ok(0),
        other => Err(outcome_failure(other, args.timeout)),
    }
}

pub(crate) fn vmm_failure(e: runner::Error) -> Failure {
    Failure {
        message: e.to_string(),
        code: exit_code::VMM_FAILED,
    }
}

/// `teardown_from`: when the command's exit status arrived (`mvm run`).
pub(crate) fn print_stats(
    wanted: bool,
    started: Instant,
    report: &runner::RunReport,
    teardown_from: Option<Instant>,
) {
    if !wanted {
        return;
    }
    match report.boot_to_init {
        Some(d) => eprintln!("mvm: boot to init: {:.1} ms", d.as_secs_f64() * 1e3),
        None => eprintln!("mvm: boot to init: no boot marker from the guest"),
    }
    eprintln!("mvm: wall: {:.3} s", started.elapsed().as_secs_f64());
    if let Some(usage) = self_usage() {
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        eprintln!(
            "mvm: cpu: {:.3} s",
            secs(usage.ru_utime) + secs(usage.ru_stime)
        );
        eprintln!("mvm: peak rss: {} KiB", usage.ru_maxrss);
    }
    if let Some(kib) = report.guest_resident_kib {
        eprintln!("mvm: guest resident: {kib} KiB");
    }
    if let Some(at) = teardown_from {
        eprintln!("mvm: teardown: {:.1} ms", at.elapsed().as_secs_f64() * 1e3);
    }
}

fn self_usage() -> Option<libc::rusage> {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the valid out-pointer it is given.
    (unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0).then_some(usage)
}

/// The failure for a run that ended without the command's exit status.
pub(crate) fn outcome_failure(outcome: Outcome, timeout: Option<f64>) -> Failure {
    match outcome {
        Outcome::Panicked => Failure {
            message: "the guest kernel panicked (see the guest console)".into(),
            code: exit_code::GUEST_CRASHED,
        },
        Outcome::TimedOut => Failure {
            message: format!(
                "the guest did not finish within --timeout {}s; the VM was destroyed",
                timeout.unwrap_or_default()
            ),
            code: exit_code::TIMEOUT,
        },
        Outcome::Failed(why) => Failure {
            message: why,
            code: exit_code::VMM_FAILED,
        },
        Outcome::Exited(_) | Outcome::Stopped => Failure {
            message: "the guest stopped without reporting the command's exit status (an unexpected reboot or crash; see the guest console)".into(),
            code: exit_code::GUEST_CRASHED,
        },
    }
}

/// Parses the process arguments, runs, and returns the exit code.
pub fn main() -> i32 {
    let started = Instant::now();
    // Before anything is opened: what the VMM holds, it opened itself.
    if let Err(e) = confine::close_inherited_fds() {
        eprintln!("mvm: cannot close inherited file descriptors: {e}");
        return exit_code::SETUP_FAILED;
    }
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
            Command::Run { vm, argv, .. } => {
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
