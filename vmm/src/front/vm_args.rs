//! The VM options every subcommand takes, and what they turn into: the
//! machine's configuration, the deadline, the confinement.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::failure::{setup_failure, Failure};
use crate::config::{self, VmConfig};
use crate::confine;

#[derive(Args, Debug)]
pub struct VmArgs {
    /// Guest kernel: ELF vmlinux or bzImage [default: $MVM_KERNEL, else
    /// ../share/mvm/vmlinux next to the mvm binary]
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Guest initramfs (newc cpio) [default: $MVM_INITRD, else
    /// ../share/mvm/initramfs.cpio next to the mvm binary; a run whose root
    /// is an image, outside a sandbox, uses initramfs-image.cpio beside it,
    /// guest-init without busybox, where there is one]
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
    pub(crate) fn confinement(&self) -> confine::Options {
        confine::Options {
            seccomp: !self.no_seccomp,
            landlock: !self.no_landlock,
        }
    }

    /// The machine these options describe, with `cmdline` as its kernel
    /// command line (devices add their own entries).
    pub(crate) fn vm_config(&self, cmdline: String) -> Result<VmConfig, Failure> {
        let mem_size = config::parse_size(&self.memory)
            .and_then(config::check_memory)
            .map_err(setup_failure)?;
        let vcpus = config::check_cpus(self.cpus).map_err(setup_failure)?;
        let kernel = self
            .kernel
            .clone()
            .or_else(|| default_artifact("MVM_KERNEL", "vmlinux"))
            .ok_or_else(|| setup_failure("cannot locate the guest kernel: pass --kernel PATH"))?;
        let initrd = self
            .initrd
            .clone()
            .or_else(|| default_artifact("MVM_INITRD", "initramfs.cpio"));
        Ok(VmConfig {
            sandbox_disk: None,
            free_page_reporting: false,
            fs_bounce_pool: false,
            kernel,
            initrd,
            cmdline,
            vcpus,
            mem_size,
            vsock: None,
            shares: Vec::new(),
            root_disk: None,
            root_dir: None,
        })
    }

    pub(crate) fn timeout(&self) -> Result<Option<Duration>, Failure> {
        timeout_duration(self.timeout)
    }
}

/// A `--timeout SECS` (of `run`, `boot` or `exec`) as a duration.
pub(crate) fn timeout_duration(secs: Option<f64>) -> Result<Option<Duration>, Failure> {
    match secs {
        None => Ok(None),
        Some(t) if t.is_finite() && t > 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(setup_failure(format!(
            "--timeout must be a positive number of seconds, not {t}"
        ))),
    }
}

/// Refuses a `/dev/kvm` that cannot boot a standard Linux guest: one
/// provided by PVM (the `kvm_pvm` module, with neither `kvm_intel` nor
/// `kvm_amd`), which emulates guest kernel code instruction by instruction
/// and fails on instructions its emulator lacks (`xrstor`, TLB flushes):
/// a run would crawl for seconds and end in "KVM internal error".
/// `MVM_ALLOW_SOFTWARE_KVM=1` runs anyway (the hand-written test guests
/// run fine there); `MVM_SYS_MODULE` points at another `/sys/module` (for
/// the tests of this check).
pub(crate) fn refuse_software_kvm() -> Result<(), Failure> {
    if std::env::var_os("MVM_ALLOW_SOFTWARE_KVM").is_some_and(|v| v == "1") {
        return Ok(());
    }
    let modules = std::env::var_os("MVM_SYS_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/module"));
    let loaded = |m: &str| modules.join(m).exists();
    if loaded("kvm_pvm") && !loaded("kvm_intel") && !loaded("kvm_amd") {
        return Err(Failure {
            message: "this host's /dev/kvm is PVM-backed (kvm_pvm, no kvm_intel or kvm_amd) and cannot boot a Linux guest: run on hardware virtualization, or through tests/testhost/mvm, which runs mvm inside an emulated AMD SVM machine".into(),
            code: crate::exit_code::KVM_UNAVAILABLE,
        });
    }
    Ok(())
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

/// What a machine's initramfs must hold beside guest-init.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InitramfsNeeds {
    /// Its root is an image and nothing runs from the initramfs but
    /// guest-init.
    InitAlone,
    /// Busybox too: the root is the initramfs itself, or a sandbox's disk
    /// is formatted by busybox's mke2fs before the switch to the image.
    Busybox,
}

impl VmArgs {
    /// The initramfs for a machine that `needs`, where the user chose none
    /// (neither --initrd nor $MVM_INITRD): guest-init alone, when that is
    /// enough and installed; `None` keeps the default, busybox included.
    pub(crate) fn slimmer_initrd(&self, needs: InitramfsNeeds) -> Option<PathBuf> {
        let chosen = self.initrd.is_some() || std::env::var_os("MVM_INITRD").is_some();
        let slim = beside_binary(Path::new("share/mvm").join(INIT_ALONE));
        pick_slimmer(needs, chosen, slim.filter(|p| p.is_file()))
    }
}

/// The initramfs of guest-init alone, beside the default one
/// (`rootfs/build.sh --init-only`): half as much to unpack at every boot.
const INIT_ALONE: &str = "initramfs-image.cpio";

fn pick_slimmer(
    needs: InitramfsNeeds,
    chosen: bool,
    installed: Option<PathBuf>,
) -> Option<PathBuf> {
    match (needs, chosen) {
        (InitramfsNeeds::InitAlone, false) => installed,
        _ => None,
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

/// A helper program mvm runs: `$ENV`, else `libexec/mvm/NAME` where `make`
/// installs it beside mvm; `what` says what it is, for the one line when
/// neither is there.
pub(crate) fn libexec_helper(env: &str, name: &str, what: &str) -> Result<PathBuf, Failure> {
    std::env::var_os(env)
        .map(PathBuf::from)
        .or_else(|| beside_binary(Path::new("libexec/mvm").join(name)))
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            setup_failure(format!(
                "cannot find {name}, {what}: run 'make' or set {env}"
            ))
        })
}

/// `<dir of the mvm binary>/../<relative>`.
pub(crate) fn beside_binary(relative: impl AsRef<Path>) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join(relative))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// guest-init alone only for an image root the user left to mvm, and
    /// only where that initramfs is installed.
    #[test]
    fn the_slimmer_initramfs_only_where_nothing_else_runs_from_it() {
        let slim = Some(PathBuf::from("/x/initramfs-image.cpio"));
        assert_eq!(
            pick_slimmer(InitramfsNeeds::InitAlone, false, slim.clone()),
            slim
        );
        assert_eq!(
            pick_slimmer(InitramfsNeeds::Busybox, false, slim.clone()),
            None
        );
        assert_eq!(
            pick_slimmer(InitramfsNeeds::InitAlone, true, slim.clone()),
            None,
            "--initrd or $MVM_INITRD wins"
        );
        assert_eq!(pick_slimmer(InitramfsNeeds::InitAlone, false, None), None);
    }
}
