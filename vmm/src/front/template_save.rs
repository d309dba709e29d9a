//! The first run of a machine saves its template (docs/snapshots.md): it
//! serves the machine until guest-init is ready, pauses it only to copy
//! it (state and RAM, in this process), lets it go on to the run's
//! command, and writes the copy as the template once the machine has
//! stopped: the command does not wait for the checksum and the writes.

use std::time::{Duration, Instant};

use super::template::{self, Creating};
use super::{vmm_failure, Failure};
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
    creating: &Creating,
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
                "mvm: warning: cannot save template {} ({e}); the next run boots cold again",
                creating.key
            );
            Ok(Ready::Captured(None))
        }
    }
}

/// Writes the copy as the template (after the run: the machine has
/// stopped). A template that cannot be written is a warning.
pub(super) fn write_template(taken: Box<Taken>, creating: &Creating, print_stats: bool) {
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
                    "mvm: template {} saved in {:.1} ms after the run (the guest paused {:.1} ms for a copy of {:.1} MiB)",
                    creating.key,
                    took.as_secs_f64() * 1e3,
                    taken.paused.as_secs_f64() * 1e3,
                    taken.capture.copied() as f64 / f64::from(1 << 20),
                );
            }
        }
        Err(e) => eprintln!(
            "mvm: warning: cannot save template {} ({e}); the next run boots cold again",
            creating.key
        ),
    }
}
