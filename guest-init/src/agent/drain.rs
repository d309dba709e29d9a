//! When to stop reading the command's output after it exited. Whatever the
//! command wrote before exiting is already in the pipe (or pty) and arrives
//! at once; only another process that inherited the pipe can keep it open
//! (a daemon it started). So: read until end of file on both, but give up
//! once the output has been quiet for `QUIET` while we listened, or at the
//! latest `LIMIT` after the exit (a chatty background process must not keep
//! the run alive forever). Pure, unit-tested.

use std::time::{Duration, Instant};

pub const QUIET: Duration = Duration::from_millis(500);
pub const LIMIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
pub struct Drain {
    quiet_until: Instant,
    limit: Instant,
}

impl Drain {
    /// The command exited at `now`.
    pub fn start(now: Instant) -> Drain {
        Drain {
            quiet_until: now + QUIET,
            limit: now + LIMIT,
        }
    }

    /// Output arrived, or the relay was not reading output (its queue to
    /// the host was full): either way the output was not quiet.
    pub fn activity(&mut self, now: Instant) {
        self.quiet_until = now + QUIET;
    }

    pub fn deadline(&self) -> Instant {
        self.quiet_until.min(self.limit)
    }

    pub fn expired(&self, now: Instant) -> bool {
        now >= self.deadline()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn quiet_output_ends_the_drain() {
        let t0 = Instant::now();
        let d = Drain::start(t0);
        assert!(!d.expired(t0 + 499 * MS));
        assert!(d.expired(t0 + 500 * MS));
        assert_eq!(d.deadline(), t0 + QUIET);
    }

    #[test]
    fn activity_extends_it() {
        let t0 = Instant::now();
        let mut d = Drain::start(t0);
        d.activity(t0 + 400 * MS);
        assert!(!d.expired(t0 + 800 * MS));
        assert!(d.expired(t0 + 900 * MS));
    }

    #[test]
    fn but_never_past_the_limit() {
        let t0 = Instant::now();
        let mut d = Drain::start(t0);
        let mut t = t0;
        while t < t0 + LIMIT {
            d.activity(t);
            t += 100 * MS;
        }
        d.activity(t0 + LIMIT - MS);
        assert_eq!(d.deadline(), t0 + LIMIT);
        assert!(d.expired(t0 + LIMIT));
    }
}
