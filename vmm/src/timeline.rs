//! Where a run's time goes: named moments, each taken when a phase of
//! the run ends, printed by `--print-stats` as `mvm: phase: +MS NAME`
//! (docs/benchmarks.md, "The timeline"). Taking one costs a clock read.

use std::borrow::Cow;
use std::time::Instant;

#[derive(Debug, Default, Clone)]
pub struct Timeline(Vec<(Cow<'static, str>, Instant)>);

impl Timeline {
    /// `name` ends now.
    pub fn mark(&mut self, name: &'static str) {
        self.0.push((Cow::Borrowed(name), Instant::now()));
    }

    /// `name` ended at `at` (a moment taken elsewhere, e.g. a guest marker).
    pub fn mark_at(&mut self, name: impl Into<Cow<'static, str>>, at: Instant) {
        self.0.push((name.into(), at));
    }

    pub fn extend(&mut self, other: &Timeline) {
        self.0.extend_from_slice(&other.0);
    }

    /// Every moment as milliseconds after `start`, in time order.
    pub fn since(&self, start: Instant) -> Vec<(f64, &str)> {
        let mut out: Vec<(f64, &str)> = self
            .0
            .iter()
            .map(|(name, at)| {
                (
                    at.saturating_duration_since(start).as_secs_f64() * 1e3,
                    name.as_ref(),
                )
            })
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn moments_come_out_in_time_order_whoever_took_them() {
        let start = Instant::now();
        let mut a = Timeline::default();
        a.mark("first");
        let later = Instant::now() + Duration::from_millis(5);
        let mut b = Timeline::default();
        b.mark_at("third", later + Duration::from_millis(5));
        b.mark_at("second", later);
        a.extend(&b);
        let names: Vec<_> = a.since(start).into_iter().map(|(_, n)| n).collect();
        assert_eq!(names, ["first", "second", "third"]);
        assert!(a.since(start)[2].0 >= 10.0);
    }
}
