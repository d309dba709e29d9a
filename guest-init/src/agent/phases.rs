//! Where the guest's time goes on a request: named moments from the
//! request's arrival to its `Exit`, which carries them
//! (`Exit.guest_phases`) for the host's `--print-stats` timeline
//! (docs/benchmarks.md). Taking one costs a clock read.

use std::sync::Mutex;

use mvm_protocol::GuestPhase;

/// The request's arrival and the moments since, by CLOCK_MONOTONIC (ns).
struct Phases {
    start: u64,
    marks: Vec<(&'static str, u64)>,
}

static PHASES: Mutex<Option<Phases>> = Mutex::new(None);

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the valid timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

fn with(f: impl FnOnce(&mut Option<Phases>)) {
    // A poisoned lock only means a panic elsewhere: the list is still
    // plain data.
    let mut guard = PHASES.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut guard)
}

/// A request arrived: the moments from here on are its own.
pub fn begin() {
    let start = now_ns();
    with(|p| {
        *p = Some(Phases {
            start,
            marks: Vec::new(),
        })
    });
}

/// `name` ends now (nothing before the first [`begin`]).
pub fn mark(name: &'static str) {
    let at = now_ns();
    with(|p| {
        if let Some(p) = p {
            p.marks.push((name, at));
        }
    });
}

/// The request's moments, as offsets from its arrival; none are kept.
pub fn take() -> Vec<GuestPhase> {
    let mut out = Vec::new();
    with(|p| {
        if let Some(p) = p.take() {
            out = p
                .marks
                .into_iter()
                .map(|(name, at)| GuestPhase {
                    name: name.to_string(),
                    after_ns: at.saturating_sub(p.start),
                })
                .collect();
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_the_requests_own_in_order_and_taken_once() {
        mark("before any request");
        assert!(take().is_empty(), "nothing is kept before a request");
        begin();
        mark("one");
        std::thread::sleep(std::time::Duration::from_millis(2));
        mark("two");
        let phases = take();
        let names: Vec<&str> = phases.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["one", "two"]);
        assert!(phases[1].after_ns >= phases[0].after_ns + 2_000_000);
        assert!(take().is_empty(), "taken once");
        begin();
        assert!(take().is_empty(), "a new request starts a new list");
    }
}
