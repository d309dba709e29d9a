//! The guest console lines shown on stderr when a guest crashed or could
//! not start its command. Usually the log's last lines; but after a panic
//! the kernel prints a stack dump that can be longer than that tail, and
//! the line that says why (the panic's own, and the oops before it) would
//! scroll out of view. So when the last panic banner lies before the tail,
//! the excerpt starts a few lines before it instead.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use crate::console::PANIC_BANNER;

/// Lines shown at most.
const SHOWN: usize = 20;
/// Lines kept before the panic banner: the oops or BUG that led to it.
const BEFORE_PANIC: usize = 6;

/// Prints the excerpt of the console log at `path`; nothing when the log
/// is missing or empty.
pub(super) fn print(path: &Path) {
    let Ok(file) = File::open(path) else {
        return;
    };
    let lines: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
    let shown = excerpt(&lines);
    if shown.lines.is_empty() {
        return;
    }
    eprintln!("mvm: last lines of the guest console:");
    for line in shown.lines {
        eprintln!("  | {line}");
    }
    if shown.after > 0 {
        eprintln!("  | ({} more lines of the stack dump)", shown.after);
    }
}

struct Excerpt<'a> {
    lines: &'a [String],
    /// Lines of the log after the excerpt, not shown.
    after: usize,
}

fn excerpt(lines: &[String]) -> Excerpt<'_> {
    let tail_start = lines.len().saturating_sub(SHOWN);
    let panic = lines.iter().rposition(|l| l.contains(PANIC_BANNER));
    let start = match panic {
        Some(at) if at < tail_start => at.saturating_sub(BEFORE_PANIC),
        _ => tail_start,
    };
    let end = lines.len().min(start + SHOWN);
    Excerpt {
        lines: &lines[start..end],
        after: lines.len() - end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(n: usize, panic_at: Option<usize>) -> Vec<String> {
        (0..n)
            .map(|i| match panic_at {
                Some(p) if p == i => format!("{PANIC_BANNER}: sysrq triggered crash"),
                _ => format!("line {i}"),
            })
            .collect()
    }

    #[test]
    fn without_a_panic_the_last_lines_are_shown() {
        let lines = log(50, None);
        let shown = excerpt(&lines);
        assert_eq!(shown.lines, &lines[30..]);
        assert_eq!(shown.after, 0);
        let short = log(3, None);
        assert_eq!(excerpt(&short).lines, &short[..]);
    }

    #[test]
    fn a_panic_inside_the_tail_keeps_the_tail() {
        let lines = log(50, Some(35));
        let shown = excerpt(&lines);
        assert_eq!(shown.lines, &lines[30..]);
        assert_eq!(shown.after, 0);
    }

    #[test]
    fn a_panic_followed_by_a_long_dump_is_shown_with_what_led_to_it() {
        let lines = log(60, Some(20));
        let shown = excerpt(&lines);
        assert_eq!(shown.lines, &lines[14..34]);
        assert!(shown.lines.iter().any(|l| l.contains(PANIC_BANNER)));
        assert_eq!(shown.after, 26);
        let early = log(40, Some(2));
        assert_eq!(excerpt(&early).lines, &early[..20]);
    }

    #[test]
    fn the_last_of_two_panics_counts() {
        let mut lines = log(80, Some(10));
        lines[40] = format!("{PANIC_BANNER}: Fatal exception");
        let shown = excerpt(&lines);
        assert_eq!(shown.lines[BEFORE_PANIC], lines[40]);
    }
}
