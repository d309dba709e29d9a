//! A pull, for `mvm image pull` and `mvm run --image HOST/NAME:TAG`: run
//! by mvm-pull, the registry client in a process of its own
//! (mvm_image::pull_helper says why), so that none of that client is in
//! mvm's binary. It runs in the foreground, before any VM: its progress
//! line is on mvm's stderr, a Ctrl-C ends both, and it dies with mvm.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use mvm_image::pull_helper::{self, Answer};
use mvm_image::{Image, Store};

use super::{libexec_helper, setup_failure, Failure};

/// REF pulled into the store, as mvm-pull reports it. A digest reference
/// whose image is whole in the store needs no client: it is found here,
/// as `Store::pull` would find it (so a stored image runs offline even
/// where mvm-pull is missing).
pub(super) fn pull(store: &Store, reference: &str, insecure: &[String]) -> Result<Image, Failure> {
    if let Some(image) = store
        .find_by_registry_digest(reference)
        .map_err(setup_failure)?
    {
        return Ok(image);
    }
    let binary = libexec_helper("MVM_PULL", pull_helper::BINARY, "the registry client")?;
    let parent = std::process::id() as libc::pid_t;
    let mut command = Command::new(&binary);
    for host in insecure {
        command.arg("--insecure-registry").arg(host);
    }
    command
        .arg("--")
        .arg(reference)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // Its progress line, where mvm's would be (`output` would
        // capture it otherwise).
        .stderr(Stdio::inherit());
    // SAFETY: the closure runs in the forked child and makes only the
    // async-signal-safe calls of `die_with` (prctl, getppid; no
    // allocation).
    unsafe {
        command.pre_exec(move || crate::helper_process::die_with(parent));
    }
    let output = command.output().map_err(|e| {
        setup_failure(format!(
            "cannot start {} ({}): {e}: run 'make', or set MVM_PULL to mvm-pull",
            pull_helper::BINARY,
            binary.display()
        ))
    })?;
    match Answer::from_output(&output.stdout) {
        Some(Answer::Pulled(image)) if output.status.success() => Ok(*image),
        Some(Answer::Failed(why)) => Err(setup_failure(why)),
        _ => Err(setup_failure(format!(
            "{} ({}) ended without an answer ({}); the image store is as it was: retry, and report it if it happens again",
            pull_helper::BINARY,
            binary.display(),
            output.status
        ))),
    }
}
