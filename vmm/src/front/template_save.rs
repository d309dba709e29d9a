//! The first run of a machine saves its template (docs/snapshots.md):
//! it serves the machine until guest-init is ready, pauses it, writes the
//! snapshot and lets it go on.

use std::time::{Duration, Instant};

use super::template::{self, Creating};
use super::{vmm_failure, Failure};

/// How often the loop looks for guest-init's ready marker.
const MARKER_POLL: Duration = Duration::from_millis(2);

/// Serves the machine until guest-init is ready, then pauses it, saves it
/// as the template and lets it go on. False when the machine stopped
/// first (its outcome says why). A template that cannot be written is a
/// warning: the run goes on as a cold boot would.
pub(super) fn save_template(
    machine: &mut crate::machine::Machine,
    creating: &Creating,
    deadline: Option<Instant>,
    print_stats: bool,
) -> Result<bool, Failure> {
    use crate::machine::event_loop::Wait;
    use mvm_protocol::boot::MARKER_INIT_READY;
    loop {
        if machine.has_marker(MARKER_INIT_READY) {
            break;
        }
        let step = Instant::now() + MARKER_POLL;
        let until = deadline.map_or(step, |d| d.min(step));
        if machine.run_until(Some(until)).map_err(vmm_failure)? == Wait::Stopped {
            return Ok(false);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            // machine.wait() sees the deadline and stops it.
            return Ok(false);
        }
    }
    let at = Instant::now();
    machine.pause().map_err(vmm_failure)?;
    let saved = machine.snapshot(&creating.dir);
    machine.resume();
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
                    "mvm: template {} saved in {:.1} ms",
                    creating.key,
                    took.as_secs_f64() * 1e3
                );
            }
        }
        Err(e) => eprintln!(
            "mvm: warning: cannot save template {} ({e}); the next run boots cold again",
            creating.key
        ),
    }
    Ok(true)
}
