//! Progress reports for long imports and conversions.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Receives progress of a long operation. `phase` is a short word
/// ("copying", "reading layers", "writing"), `done` and `total` count bytes
/// (or entries, as the phase says).
pub trait Progress {
    fn update(&mut self, phase: &str, done: u64, total: Option<u64>);
    fn finish(&mut self) {}
}

/// Reports nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn update(&mut self, _phase: &str, _done: u64, _total: Option<u64>) {}
}

/// A progress line on stderr, only when stderr is a terminal and only once
/// the work has taken more than a second (quick operations stay silent), at
/// most ten redraws a second.
pub struct TerminalProgress {
    start: Instant,
    last: Option<Instant>,
    shown: bool,
    tty: bool,
}

impl TerminalProgress {
    pub fn new() -> TerminalProgress {
        TerminalProgress {
            start: Instant::now(),
            last: None,
            shown: false,
            tty: std::io::stderr().is_terminal(),
        }
    }
}

impl Default for TerminalProgress {
    fn default() -> Self {
        TerminalProgress::new()
    }
}

impl Progress for TerminalProgress {
    fn update(&mut self, phase: &str, done: u64, total: Option<u64>) {
        let now = Instant::now();
        if !self.tty || now.duration_since(self.start) < Duration::from_secs(1) {
            return;
        }
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        self.shown = true;
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let line = match total {
            Some(t) if t > 0 => format!(
                "{phase}: {:.1} of {:.1} MiB ({}%)",
                mib(done),
                mib(t),
                done.saturating_mul(100) / t
            ),
            _ => format!("{phase}: {:.1} MiB", mib(done)),
        };
        // \r and clear-to-end-of-line: one line redrawn in place.
        let _ = write!(std::io::stderr(), "\r{line}\x1b[K");
    }

    fn finish(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
            self.shown = false;
        }
    }
}
