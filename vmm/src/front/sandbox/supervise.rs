//! A sandbox's supervisor (`mvm __supervise NAME`, started detached by
//! `create` and `start`): the one process that owns the sandbox's
//! machine, its helpers and its runtime directory, for as long as the
//! machine lives. It sets the guest up (a first request with the machine's
//! setup, `keep_serving` and no command), says `ready`, and then only
//! waits: each `mvm exec` connects to the vsock socket by itself. SIGTERM
//! (`mvm stop`), SIGINT or SIGHUP ask the guest to shut down cleanly; one
//! that does not within [`STOP_GRACE`] is stopped.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use mvm_devices::virtio::vsock::Dialer;
use mvm_protocol::{ExecRequest, Exit, Message, AGENT_PORT};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use super::super::launch::{launch, Launched, Spec, Templates};
use super::super::request::exec_request;
use super::super::run::{plan_machine, Machine, Purpose};
use super::super::{outcome_failure, setup_failure, vmm_failure, Failure};
use super::{parse_stored, sandbox_failure, CreateArgs};
use crate::confine::{seccomp, ThreadKind};
use crate::machine::{Outcome, StopHandle, StopReason};
use crate::sandboxes::{Paths, EXEC_DEFAULTS, PID, READY};
use crate::session::client;
use crate::session::SessionDir;

/// How long the guest gets to end its commands and power off after a
/// stop request before the machine is stopped.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs sandbox `name` until its machine ends; the exit code says how.
pub fn supervise(name: &str) -> Result<i32, Failure> {
    let paths = Paths::of(name).map_err(sandbox_failure)?;
    let record = paths.read_record().map_err(sandbox_failure)?;
    std::env::set_current_dir(&record.cwd).map_err(|e| {
        setup_failure(format!(
            "cannot enter {}, where sandbox '{name}' was created: {e}",
            record.cwd.display()
        ))
    })?;
    let options = parse_stored(&record)?;
    let dir = SessionDir::claim(&paths.runtime)
        .map_err(setup_failure)?
        .ok_or_else(|| setup_failure(format!("sandbox '{name}' is running already")))?;
    match supervise_claimed(name, &paths, &options, &dir) {
        Ok(code) => Ok(code),
        // Said here, while the runtime directory's lock is still held: an
        // `mvm exec` whose command the end cut off waits for the lock to
        // go, then reads this line from the log (exec.rs, `lost`).
        Err(failure) => {
            eprintln!("mvm: {}", failure.message);
            drop(dir);
            Ok(failure.code)
        }
    }
}

/// The machine of a sandbox whose runtime directory `dir` is claimed.
fn supervise_claimed(
    name: &str,
    paths: &Paths,
    options: &CreateArgs,
    dir: &SessionDir,
) -> Result<i32, Failure> {
    let (vm, run) = (&options.vm, &options.run);
    let file_err =
        |what: &str, e: std::io::Error| setup_failure(format!("cannot write {what}: {e}"));
    fs::write(paths.runtime_file(PID), format!("{}\n", std::process::id()))
        .map_err(|e| file_err(PID, e))?;
    // Made now: once confined, the VMM's threads may write but not create.
    let mut defaults_file =
        File::create(paths.runtime_file(EXEC_DEFAULTS)).map_err(|e| file_err(EXEC_DEFAULTS, e))?;
    let ready = File::create(paths.runtime_file(READY)).map_err(|e| file_err(READY, e))?;

    let Machine {
        mut config,
        image,
        shares,
        mut front,
    } = plan_machine(vm, run, Purpose::Sandbox)?;
    if config.has_image_root() {
        let disk = paths.disk_path();
        if !disk.is_file() {
            return Err(setup_failure(format!(
                "the sandbox's disk {} is missing, and with it what was written to its root: remove the sandbox (mvm rm {name}) and create it again",
                disk.display()
            )));
        }
        config.sandbox_disk = Some(disk);
    }
    // A machine that lives for hours gives back what its guest frees.
    config.free_page_reporting = true;
    let mut request = exec_request(
        run,
        Vec::new(),
        !run.no_workspace,
        config.has_image_root(),
        image.as_ref(),
    )?;
    request.keep_serving = true;
    let spec = Spec {
        args: run,
        vm,
        dir,
        shares: &shares,
        templates: Templates::RestoreOnly,
        console_to_stderr: false,
        cache_read_only: false,
    };
    let Launched {
        mut machine,
        backends: _backends,
        mut egress,
        request,
        ..
    } = launch(config, request, &spec, &mut front)?;
    // What every exec starts from: the request as the guest got it (the
    // image's environment, the proxy's variables, the identity), less the
    // machine's setup.
    let defaults = ExecRequest {
        setup: None,
        keep_serving: false,
        ..request.clone()
    };
    let json = serde_json::to_vec(&defaults).map_err(|e| file_err(EXEC_DEFAULTS, e.into()))?;
    defaults_file
        .write_all(&json)
        .map_err(|e| file_err(EXEC_DEFAULTS, e))?;

    let stop = machine.stop_handle();
    let dialer = machine
        .take_vsock_dialer()
        .ok_or_else(|| setup_failure("the machine has no vsock device".to_string()))?;
    let (shutdown_tx, shutdown_rx) = mpsc::channel();
    let stopping = watch_signals(stop.clone(), shutdown_tx)?;
    let guest = stop.clone();
    let failed = Arc::new(Mutex::new(None));
    let failed_slot = failed.clone();
    thread::Builder::new()
        .name("mvm-sandbox".into())
        .spawn(move || {
            seccomp::install_or_exit(ThreadKind::Session);
            if let Err(why) = serve(&dialer, request, &guest, ready, &shutdown_rx) {
                if let Ok(mut slot) = failed_slot.lock() {
                    *slot = Some(why);
                }
                guest.stop(StopReason::Host);
            }
        })
        .map_err(|e| setup_failure(format!("cannot start the sandbox thread: {e}")))?;

    machine.start().map_err(vmm_failure)?;
    let ended = machine.wait(None).map_err(vmm_failure)?;
    if let Some((proxy, _)) = egress.as_mut() {
        proxy.finish();
    }
    if let Some(why) = failed.lock().ok().and_then(|mut f| f.take()) {
        return Err(setup_failure(why));
    }
    let asked = stopping.load(Ordering::SeqCst);
    match ended.outcome {
        // Powered off: after a stop request, or by root in the guest.
        Outcome::Exited(0) => Ok(0),
        Outcome::Signalled(_) | Outcome::Stopped if asked => {
            eprintln!(
                "mvm: sandbox '{name}' did not power off within {} s of the stop request: stopped",
                STOP_GRACE.as_secs()
            );
            Ok(0)
        }
        other => Err(outcome_failure(other, None)),
    }
}

/// SIGTERM, SIGINT and SIGHUP ask the guest to end (through the sandbox
/// thread) and arm the timer that stops the machine if it does not.
/// Returns whether a stop was asked for.
fn watch_signals(stop: StopHandle, shutdown: mpsc::Sender<()>) -> Result<Arc<AtomicBool>, Failure> {
    let asked = Arc::new(AtomicBool::new(false));
    let seen = asked.clone();
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| setup_failure(format!("cannot install signal handlers: {e}")))?;
    thread::Builder::new()
        .name("mvm-signals".into())
        .spawn(move || {
            seccomp::install_or_exit(ThreadKind::Signals);
            for sig in signals.forever() {
                seen.store(true, Ordering::SeqCst);
                let _ = shutdown.send(());
                let stop = stop.clone();
                thread::spawn(move || {
                    seccomp::inherited(ThreadKind::Signals);
                    thread::sleep(STOP_GRACE);
                    stop.stop(StopReason::Signal(sig));
                });
            }
        })
        .map_err(|e| setup_failure(format!("cannot start the signal thread: {e}")))?;
    Ok(asked)
}

/// The supervisor's own talk with the guest: the setup, `ready`, and on
/// request the shutdown. Fails with why the guest could not be set up
/// (the caller then stops it).
fn serve(
    dialer: &Dialer,
    request: ExecRequest,
    vm: &StopHandle,
    mut ready: File,
    shutdown: &Receiver<()>,
) -> Result<(), String> {
    match set_up(dialer, request, vm) {
        Ok(exit) if exit.status == 0 => {
            let _ = ready.write_all(b"ready\n");
        }
        Ok(exit) => {
            return Err(format!(
                "the guest could not set the sandbox up (status {}; see the guest console)",
                exit.status
            ))
        }
        Err(_) if vm.is_stopped() => return Ok(()),
        Err(e) => return Err(format!("the guest could not set the sandbox up: {e}")),
    }
    if shutdown.recv().is_err() {
        return Ok(());
    }
    if let Err(e) = ask_shutdown(dialer, vm) {
        eprintln!("mvm: cannot ask the guest to shut down ({e}): stopping it");
        vm.stop(StopReason::Host);
    }
    Ok(())
}

fn set_up(
    dialer: &Dialer,
    mut request: ExecRequest,
    vm: &StopHandle,
) -> Result<Exit, client::Error> {
    let stream = client::connect_dialing(dialer, AGENT_PORT, &|| vm.is_stopped())?;
    if let Some(setup) = request.setup.as_mut() {
        setup.wall_clock_ns = crate::session::wall_clock_ns();
    }
    let writer = writer(&stream)?;
    let (mut reader, _) = client::start(&stream, &writer, request)?;
    client::send(&writer, &Message::StdinEof)?;
    client::relay_output(&mut reader, &client::StdinWindow::default())
}

fn ask_shutdown(dialer: &Dialer, vm: &StopHandle) -> Result<(), client::Error> {
    let stream = client::connect_dialing(dialer, AGENT_PORT, &|| vm.is_stopped())?;
    let writer = writer(&stream)?;
    let _greeted = client::greet(&stream, &writer)?;
    client::send(&writer, &Message::Shutdown)
}

fn writer(stream: &UnixStream) -> Result<client::Writer, client::Error> {
    Ok(Arc::new(Mutex::new(
        stream.try_clone().map_err(client::Error::Write)?,
    )))
}
