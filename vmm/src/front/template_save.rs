//! The first run of a machine saves its template (docs/snapshots.md): it
//! serves the machine until guest-init is ready, pauses it only to copy
//! it (state and RAM, in this process), lets it go on to the run's
//! command, and a thread of its own writes the copy as the template
//! meanwhile: the command waits for neither the checksum nor the writes.

use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::template::{self, Creating};
use super::{vmm_failure, Failure};
use crate::confine::{seccomp, ThreadKind};
use crate::machine::capture::Capture;

/// How serving the machine to guest-init's ready point ended.
pub(super) enum Ready {
    /// Ready, and copied (None: the copy failed, with a warning; the run
    /// goes on as a cold boot would).
    Captured(Option<Box<Taken>>),
    /// The machine stopped first (its outcome says why).
    Stopped,
}

/// A copy of the machine at guest-init's ready point.
pub(super) struct Taken {
    capture: Capture,
    /// How long the guest was paused for it.
    paused: Duration,
}

/// Serves the machine until guest-init is ready, then pauses it, copies
/// it and lets it go on.
pub(super) fn capture_at_ready(
    machine: &mut crate::machine::Machine,
    key: &str,
    deadline: Option<Instant>,
) -> Result<Ready, Failure> {
    use crate::machine::event_loop::Wait;
    use mvm_protocol::boot::MARKER_INIT_READY;
    // A deadline that passes is seen by machine.wait(), which stops it.
    if machine
        .run_until_marker(MARKER_INIT_READY, deadline)
        .map_err(vmm_failure)?
        != Wait::Done
    {
        return Ok(Ready::Stopped);
    }
    let at = Instant::now();
    machine.pause().map_err(vmm_failure)?;
    let captured = machine.capture();
    machine.resume();
    let paused = at.elapsed();
    match captured {
        Ok(capture) => Ok(Ready::Captured(Some(Box::new(Taken { capture, paused })))),
        Err(e) => {
            eprintln!(
                "mvm: warning: cannot copy the machine for template {key} ({e}); this run goes on, the next one boots cold again (--no-snapshot skips templates)"
            );
            Ok(Ready::Captured(None))
        }
    }
}

/// The thread that writes a first run's template: started before the
/// machine (its filter installed by itself, Landlock inherited), handed
/// the copy at the ready point, and joined at the end. It holds the
/// template's lock until the template is written, so that other runs of
/// the same machine restore it from then on.
pub(super) struct TemplateWriter {
    copy: Sender<Box<Taken>>,
    thread: JoinHandle<Option<Instant>>,
}

impl TemplateWriter {
    pub(super) fn start(creating: Creating, print_stats: bool) -> std::io::Result<TemplateWriter> {
        let (copy, taken): (Sender<Box<Taken>>, Receiver<Box<Taken>>) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("mvm-template".into())
            .spawn(move || {
                yield_to_the_run();
                seccomp::install_or_exit(ThreadKind::Writer);
                // No copy: the machine stopped before it was ready, or the
                // copy failed. Dropping `creating` frees its lock.
                let taken = taken.recv().ok()?;
                write(&taken, &creating, print_stats).then(Instant::now)
            })?;
        Ok(TemplateWriter { copy, thread })
    }

    /// Hands the copy over; the thread writes it at once.
    pub(super) fn write(&self, taken: Box<Taken>) {
        let _ = self.copy.send(taken);
    }

    /// Waits for the write, if there was one: when it was saved, if it was.
    pub(super) fn finish(self) -> Option<Instant> {
        drop(self.copy);
        self.thread.join().ok().flatten()
    }
}

/// Gives this thread the lowest priority (nice 19): where the run has
/// one CPU to itself, the writer otherwise takes it from the guest while
/// its command starts, which a first run must not wait for (in the test
/// host, with the pool mapped ahead in both, the command ended a median
/// 88 ms sooner with the writer at the idle class; at nice 19 the
/// template is written mostly after the command: docs/snapshots.md).
/// Not the idle class: nice 19 still gets some time against busy
/// threads, so the run's end, which waits for the writer, is not held up
/// for long on a loaded host. Failing is no error: only the order of the
/// work changes.
fn yield_to_the_run() {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority reads its three integer arguments only; the
    // target is this thread (Linux keeps a nice value per thread).
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) };
}

/// Writes the copy as the template. A template that cannot be written is
/// a warning: the run goes on.
fn write(taken: &Taken, creating: &Creating, print_stats: bool) -> bool {
    let at = Instant::now();
    let saved = taken.capture.write(&creating.dir);
    let took = at.elapsed();
    match saved {
        Ok(()) => {
            if let Err(e) = template::describe(&creating.store, &creating.key, &creating.info) {
                eprintln!(
                    "mvm: warning: cannot describe template {}: {e}",
                    creating.key
                );
            }
            if print_stats {
                eprintln!(
                    "mvm: template {} saved in {:.1} ms while the run went on (the guest paused {:.1} ms for a copy of {:.1} MiB)",
                    creating.key,
                    took.as_secs_f64() * 1e3,
                    taken.paused.as_secs_f64() * 1e3,
                    taken.capture.copied() as f64 / f64::from(1 << 20),
                );
            }
            true
        }
        Err(e) => {
            eprintln!(
                "mvm: warning: cannot save template {} ({e}); the next run boots cold again (--no-snapshot skips templates)",
                creating.key
            );
            false
        }
    }
}
