//! `mvm create` and `mvm start`: the record (create only), then the
//! supervisor, started detached (a session of its own, stdin closed, its
//! messages in the runtime directory's `supervisor.log`), and a wait in
//! the foreground until the guest serves commands or the supervisor
//! says why it cannot. A `create` that fails leaves nothing behind.

use std::fs::{self, File};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::super::console_tail;
use super::super::run::{plan_machine, Purpose};
use super::super::{setup_failure, Failure};
use super::{disk_bytes, last_error, refuse_one_shot_options, sandbox_failure, CreateArgs};
use crate::exit_code;
use crate::sandboxes::{Paths, Record, State, SUPERVISOR_LOG};

/// How often the foreground looks at the supervisor while it starts.
const POLL: Duration = Duration::from_millis(20);

/// `mvm create NAME OPTIONS`: `args` are the words after `create` as
/// given (the record keeps them for `start`).
pub fn create(name: &str, options: &CreateArgs, args: Vec<String>) -> Result<i32, Failure> {
    let paths = Paths::of(name).map_err(sandbox_failure)?;
    refuse_one_shot_options(options)?;
    if paths.exists() {
        return Err(sandbox_failure(crate::sandboxes::Error::Exists(
            name.to_string(),
        )));
    }
    let disk = disk_bytes(&options.disk)?;
    // Everything a run checks (shares, KVM, kernel) and the image pulled
    // and converted, here where its progress can be seen.
    let machine = plan_machine(&options.vm, &options.run, Purpose::Sandbox)?;
    let image_root = machine.config.has_image_root();
    let cwd = std::env::current_dir()
        .map_err(|e| setup_failure(format!("cannot read the current directory: {e}")))?;
    let record = Record {
        name: name.to_string(),
        args: pin_image(args, &options.run.image),
        cwd,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        image: match &options.run.rootfs {
            Some(path) => format!("rootfs:{}", path.display()),
            None => options.run.image.clone(),
        },
        memory: options.vm.memory.clone(),
        cpus: options.vm.cpus,
        shares: shares_shown(options),
        allow: options.run.egress.allow.clone(),
        disk: match image_root {
            true => options.disk.clone(),
            false => String::new(),
        },
    };
    paths.create_record(&record).map_err(sandbox_failure)?;
    let started = match image_root {
        true => make_disk(&paths.disk_path(), disk),
        false => Ok(()),
    }
    .and_then(|()| run_supervisor(&paths, &record));
    match started {
        Ok(()) => {
            eprintln!("mvm: sandbox '{name}' is running: mvm exec {name} -- CMD");
            Ok(0)
        }
        Err(failure) => {
            let _ = fs::remove_dir_all(&paths.runtime);
            let _ = fs::remove_dir_all(&paths.data);
            crate::sandboxes::remove_empty_roots();
            Err(failure)
        }
    }
}

/// `mvm start NAME`: a stopped (or dead) sandbox started again with the
/// options it was created with, its shares checked anew.
pub fn start(name: &str) -> Result<i32, Failure> {
    let paths = Paths::of(name).map_err(sandbox_failure)?;
    let record = paths.read_record().map_err(sandbox_failure)?;
    match paths.state() {
        State::Running | State::Starting => Err(setup_failure(format!(
            "sandbox '{name}' is running already (pid {})",
            paths.pid().map_or("?".into(), |p| p.to_string())
        ))),
        State::Stopped | State::Dead => {
            run_supervisor(&paths, &record)?;
            eprintln!("mvm: sandbox '{name}' is running");
            Ok(0)
        }
    }
}

/// The sandbox's disk: a sparse file of `bytes`, private to the user;
/// the guest makes its filesystem on first use.
fn make_disk(path: &Path, bytes: u64) -> Result<(), Failure> {
    let fail = |e: std::io::Error| {
        setup_failure(format!(
            "cannot make the sandbox's disk {}: {e}",
            path.display()
        ))
    };
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(fail)?;
    file.set_len(bytes).map_err(fail)
}

/// The record's args with the image made explicit: a later `start` must
/// not pick up another `$MVM_IMAGE`.
fn pin_image(mut args: Vec<String>, image: &str) -> Vec<String> {
    let named = args
        .iter()
        .any(|a| a.starts_with("--image") || a.starts_with("--rootfs"));
    if !named {
        args.extend(["--image".to_string(), image.to_string()]);
    }
    args
}

fn shares_shown(options: &CreateArgs) -> Vec<String> {
    let run = &options.run;
    let mode = if run.write { "rw" } else { "ro" };
    let workspace = match (&run.workspace, run.no_workspace) {
        (_, true) => None,
        (Some(dir), false) => Some(format!("{}:/workspace:{mode}", dir.display())),
        (None, false) => Some(format!(".:/workspace:{mode}")),
    };
    workspace.into_iter().chain(run.mounts.clone()).collect()
}

/// Starts the supervisor and waits until the guest serves, the
/// supervisor gives up (its last `mvm:` line is the error), or this
/// process is interrupted (the supervisor is then stopped).
fn run_supervisor(paths: &Paths, record: &Record) -> Result<(), Failure> {
    let mut child = spawn(paths, record)?;
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let _ = signal_hook::flag::register(sig, interrupted.clone());
    }
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let code = status.code().unwrap_or(exit_code::SETUP_FAILED);
            if [exit_code::GUEST_CRASHED, exit_code::SETUP_FAILED].contains(&code) {
                console_tail::print(&paths.runtime_file("console.log"));
            }
            let log = paths.runtime_file(SUPERVISOR_LOG);
            return Err(Failure {
                message: last_error(&log).unwrap_or_else(|| {
                    format!(
                        "sandbox '{}' did not start ({status}): see {}",
                        record.name,
                        log.display()
                    )
                }),
                code,
            });
        }
        if paths.state() == State::Running {
            return Ok(());
        }
        if interrupted.load(Ordering::SeqCst) {
            // SAFETY: plain syscall on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
            return Err(setup_failure(format!(
                "interrupted: sandbox '{}' was stopped before it was ready",
                record.name
            )));
        }
        std::thread::sleep(POLL);
    }
}

fn spawn(paths: &Paths, record: &Record) -> Result<Child, Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| setup_failure(format!("cannot find the mvm binary: {e}")))?;
    crate::sandboxes::ensure_runtime_root().map_err(sandbox_failure)?;
    let made = fs::DirBuilder::new().mode(0o700).create(&paths.runtime);
    made.or_else(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => Ok(()),
        _ => Err(e),
    })
    .map_err(|e| setup_failure(format!("cannot create {}: {e}", paths.runtime.display())))?;
    clear_old_run(&paths.runtime);
    let log_path = paths.runtime_file(SUPERVISOR_LOG);
    let log = File::create(&log_path)
        .map_err(|e| setup_failure(format!("cannot create {}: {e}", log_path.display())))?;
    let log2 = log
        .try_clone()
        .map_err(|e| setup_failure(format!("cannot duplicate the log's fd: {e}")))?;
    let mut command = Command::new(exe);
    command
        .arg("__supervise")
        .arg(&record.name)
        .current_dir(&record.cwd)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    // SAFETY: setsid is async-signal-safe and touches no memory of ours.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn().map_err(|e| {
        setup_failure(format!(
            "cannot start the supervisor of '{}' in {}: {e}",
            record.name,
            record.cwd.display()
        ))
    })
}

/// What a previous supervisor left: its logs and, if it was killed, its
/// pid and sockets. Its helpers died with it (PR_SET_PDEATHSIG).
fn clear_old_run(runtime: &Path) {
    let Ok(entries) = fs::read_dir(runtime) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name() != "lock" {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_is_pinned_unless_named() {
        let pinned = pin_image(vec!["--memory".into(), "1G".into()], "default");
        assert_eq!(pinned, ["--memory", "1G", "--image", "default"]);
        let named = vec!["--image=alpine".to_string()];
        assert_eq!(pin_image(named.clone(), "default"), named);
        let rootfs = vec!["--rootfs".to_string(), "r.erofs".into()];
        assert_eq!(pin_image(rootfs.clone(), "default"), rootfs);
    }
}
