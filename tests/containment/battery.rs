//! What every check of the battery shares: its report row, the attacker
//! binary, the shell snippets that look at the host, and the calls.

use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use mvm_e2e::{note_event, repo_root, stat_in, Options, Run, ALLOW_SKIPS};

use crate::via::{self, Via};

/// Where the rows go, one JSON object a line; `make battery` empties it
/// first and `tests/containment/report.py` turns it into the table.
pub fn rows_path() -> PathBuf {
    std::env::var_os("MVM_BATTERY_ROWS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/containment/rows.jsonl"))
}

/// Where a piece of a check's evidence comes from; the report states it
/// per row rather than claiming one kind for all.
#[derive(Clone, Copy)]
pub enum Source {
    /// The machine mvm ran on, looked at by the setup and after scripts:
    /// files, processes, memory, its clock and boot id.
    Host,
    /// mvm itself: its exit status, its messages, `--print-stats`, and the
    /// bytes it let out of the VM.
    Mvm,
    /// The sandboxed command's own report of what it saw or what it got
    /// (its uid, its errors, its counts): the guest's word.
    Guest,
    /// The real host-side code run in this process against a fake peer.
    InProcess,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Host => "host",
            Source::Mvm => "mvm",
            Source::Guest => "guest",
            Source::InProcess => "in-process",
        }
    }
}

/// One check's report row. `finish` writes it and then fails the test if
/// the check did not hold, so a red check is in the report too; a test
/// that stops before its verdict (a harness assertion, a panic) still
/// leaves a failed row when this is dropped.
pub struct Check {
    id: &'static str,
    tried: &'static str,
    expected: &'static str,
    evidence: Vec<(Source, &'static str)>,
    control: Option<(Source, &'static str)>,
    mode: Option<String>,
    started: Instant,
    written: bool,
}

impl Check {
    pub fn new(id: &'static str, tried: &'static str, expected: &'static str) -> Check {
        Check {
            id,
            tried,
            expected,
            evidence: Vec::new(),
            control: None,
            mode: None,
            started: Instant::now(),
            written: false,
        }
    }

    /// A piece of the evidence the verdict rests on, and where it comes
    /// from (for the report's evidence column and its summary).
    pub fn evidence(mut self, source: Source, what: &'static str) -> Check {
        self.evidence.push((source, what));
        self
    }

    /// The positive control: what shows that the attack would have been
    /// seen, and where that comes from. Every row needs one (the report
    /// flags a row without).
    pub fn control(mut self, source: Source, what: &'static str) -> Check {
        self.control = Some((source, what));
        self
    }

    /// Makes the check's call (`attack`, `control`) and notes how mvm ran
    /// (hardware KVM or the TCG test host) for the report. A call the
    /// harness itself fails (mvm left something behind, say) still leaves
    /// a row saying so before the test fails with it.
    pub fn run(&mut self, call: impl FnOnce() -> Run) -> Run {
        match panic::catch_unwind(AssertUnwindSafe(call)) {
            Ok(run) => {
                if self.mode.is_none() {
                    self.mode = run.mode().map(str::to_string);
                }
                run
            }
            Err(payload) => {
                let why = payload
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| payload.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                self.write(
                    false,
                    &format!("the harness failed the call: {}", excerpt(why, 400)),
                );
                panic::resume_unwind(payload)
            }
        }
    }

    /// For a row whose evidence comes from another row's call (several
    /// attacks in one VM): that call's mode.
    pub fn shares(&mut self, run: &Run) {
        if self.mode.is_none() {
            self.mode = run.mode().map(str::to_string);
        }
    }

    /// Writes the row and returns the verdict instead of asserting it, for
    /// tests that write several rows and assert once all are written.
    pub fn record(mut self, verdict: Verdict) -> Result<(), String> {
        let observed = verdict.observed();
        self.write_row(verdict.pass(), verdict.skipped, &observed);
        if verdict.pass() {
            Ok(())
        } else {
            Err(format!("check {} failed: {observed}", self.id))
        }
    }

    /// For checks that run no VM at all.
    pub fn in_process(&mut self) {
        self.mode = Some("in process: the real host-side code against a fake peer, no VM".into());
    }

    /// Writes the row, then asserts the verdict.
    pub fn finish(mut self, verdict: Verdict) {
        let observed = verdict.observed();
        self.write_row(verdict.pass(), verdict.skipped, &observed);
        assert!(verdict.pass(), "check {} failed: {observed}", self.id);
    }

    fn write(&mut self, pass: bool, observed: &str) {
        self.write_row(pass, false, observed)
    }

    fn write_row(&mut self, pass: bool, skipped: bool, observed: &str) {
        self.written = true;
        let evidence: Vec<_> = self
            .evidence
            .iter()
            .map(|(source, what)| serde_json::json!({"source": source.name(), "what": what}))
            .collect();
        let control = self
            .control
            .map(|(source, what)| serde_json::json!({"source": source.name(), "what": what}));
        let row = serde_json::json!({
            "id": self.id,
            "tried": self.tried,
            "expected": self.expected,
            "evidence": evidence,
            "control": control,
            "observed": observed,
            "pass": pass,
            "skipped": skipped,
            "weakened": extra_args().join(" "),
            "via": Via::current().name(),
            "mode": self.mode,
            "seconds": self.started.elapsed().as_secs_f64().round(),
        });
        let path = rows_path();
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).expect("create the battery's rows directory");
        }
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        writeln!(file, "{row}").expect("write a battery row");
    }
}

impl Drop for Check {
    fn drop(&mut self) {
        if !self.written {
            self.write(
                false,
                "the test stopped before its verdict (a harness assertion or a panic: see the test log)",
            );
        }
    }
}

/// The observations of one check and which of them did not hold.
#[derive(Default)]
pub struct Verdict {
    seen: Vec<String>,
    failed: Vec<String>,
    skipped: bool,
}

impl Verdict {
    pub fn new() -> Verdict {
        Verdict::default()
    }

    /// Records what was observed, for the report.
    pub fn saw(&mut self, what: impl Into<String>) {
        self.seen.push(what.into());
    }

    /// A condition the check needs; `what` says what was wrong if not.
    pub fn require(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.failed.push(what.into());
        }
    }

    /// A part of the check that cannot run here (`why`): a failure, unless
    /// `MVM_ALLOW_SKIPS=1`, when the row says "skipped" and the skip is
    /// noted for the summary. Never "pass" for what did not run.
    pub fn skip(&mut self, id: &str, why: &str) {
        if std::env::var(ALLOW_SKIPS).as_deref() == Ok("1") {
            self.skipped = true;
            self.saw(format!("SKIPPED: {why}"));
            note_event("skip", &format!("battery check {id}: {why}"));
        } else {
            self.require(
                false,
                format!("cannot run here: {why} (set {ALLOW_SKIPS}=1 to skip it explicitly)"),
            );
        }
    }

    pub fn pass(&self) -> bool {
        self.failed.is_empty()
    }

    fn observed(&self) -> String {
        let mut text = self.seen.join("; ");
        if !self.failed.is_empty() {
            let _ = write!(text, ". FAILED: {}", self.failed.join("; "));
        }
        text
    }
}

/// The attacker (tests/containment/attacker.c), relative to the repo root
/// (the default workspace, so `/workspace/ATTACKER` in the guest, and the
/// test host's working directory): built once per test process.
pub const ATTACKER: &str = "target/containment/attacker";

pub fn attacker() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = repo_root();
        let out = root.join(ATTACKER);
        fs::create_dir_all(out.parent().unwrap()).unwrap();
        // Static: the guest has no libc; the system compiler is the one the
        // kernel builds already need.
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-static", "-O2", "-Wall", "-o"])
            .arg(&out)
            .arg(root.join("tests/containment/attacker.c"))
            .status()
            .expect("run the C compiler (cc) for tests/containment/attacker.c");
        assert!(status.success(), "cc failed to build the attacker");
    });
    ATTACKER
}

/// Extra `mvm run` flags for every attack (never for a control), to show
/// that a check goes red when a protection is removed, e.g.
/// `MVM_BATTERY_EXTRA_ARGS=--write` (docs/containment.md).
pub fn extra_args() -> Vec<String> {
    std::env::var("MVM_BATTERY_EXTRA_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// `mvm run ARGS` through the harness (or the same through a sandbox:
/// `via`), with `extra_args` right after `run`.
pub fn attack(options: &Options, args: &[&str]) -> Run {
    let extra = extra_args();
    let mut full: Vec<&str> = extra.iter().map(String::as_str).collect();
    full.extend_from_slice(args);
    via::call(&with_battery_limit(options), &full)
}

/// The test-host limit of a battery call that sets none: attacks run long
/// on a slow test host (a search of every file, a memory or fork bomb
/// under nested TCG took 70-100 s on the slowest seen, past the harness's
/// 90 s), so only a call that really hangs should meet it.
const BATTERY_TESTHOST_TIMEOUT: u32 = 240;

fn with_battery_limit<'a>(options: &Options<'a>) -> Options<'a> {
    Options {
        testhost_timeout: options.testhost_timeout.or(Some(BATTERY_TESTHOST_TIMEOUT)),
        ..*options
    }
}

/// [`attack`] with a setup and an after script on the host, the common case.
pub fn attack_scripted(setup: &str, after: &str, args: &[&str]) -> Run {
    attack(
        &Options {
            setup: Some(setup),
            after: Some(after),
            ..Options::default()
        },
        args,
    )
}

/// `mvm run ARGS` as given (or through a sandbox: `via`): a control,
/// which must not be weakened.
pub fn control(options: &Options, args: &[&str]) -> Run {
    via::call(&with_battery_limit(options), args)
}

/// Shell for setup and after scripts: `$MVM` is the mvm binary where the
/// scripts run (the test host's `/mvm`, or `build/` in direct mode), and
/// `leftovers` lists what a run started from a script left behind, the
/// way the test host does for the harness's own call (session
/// directories, live mvm and virtiofsd processes), after giving helpers
/// two seconds to exit by themselves.
pub const SH_LIB: &str = r#"
MVM=/mvm/bin/mvm; [ -x "$MVM" ] || MVM=build/bin/mvm
alive() {
    for p in /proc/[0-9]*; do
        case $(cat "$p/comm" 2>/dev/null) in
        mvm | virtiofsd)
            s=$(cut -d')' -f2 "$p/stat" 2>/dev/null | cut -d' ' -f2)
            [ -n "$s" ] && [ "$s" != Z ] && echo "$(cat "$p/comm" 2>/dev/null) process ${p#/proc/}" ;;
        esac
    done
}
leftovers() {
    i=0
    while [ -n "$(alive)" ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i + 1)); done
    ls -d "${TMPDIR:-/tmp}"/mvm-*/* 2>/dev/null
    alive
}
"#;

/// `SH_LIB` followed by `body`.
pub fn script(body: &str) -> String {
    format!("{SH_LIB}\n{body}")
}

/// The value after `key=` on the first line of `lines` that has it.
pub fn value<'a>(lines: &[&'a str], key: &str) -> Option<&'a str> {
    let prefix = format!("{key}=");
    lines.iter().find_map(|l| l.strip_prefix(prefix.as_str()))
}

/// A number after `key=`.
pub fn number(lines: &[&str], key: &str) -> Option<f64> {
    value(lines, key).and_then(|v| v.trim().parse().ok())
}

/// mvm's peak RSS in KiB from the `--print-stats` lines in `text`: `mvm
/// run`'s one process (VMM, guest memory and exec client); through a
/// sandbox, `mvm exec`'s own plus its sandbox's (the supervisor's: VMM and
/// guest memory), which together hold what run's one process does.
pub fn peak_rss(text: &str) -> Option<f64> {
    let own = stat_in(text, "peak rss")?;
    Some(own + stat_in(text, "sandbox peak rss").unwrap_or(0.0))
}

/// A short, single-line excerpt of some output for the report.
pub fn excerpt(text: &str, max: usize) -> String {
    let flat: String = text
        .trim()
        .chars()
        .map(|c| if c == '\n' { '|' } else { c })
        .filter(|c| !c.is_control())
        .collect();
    match flat.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &flat[..cut]),
        None => flat,
    }
}

/// What mvm itself said on stderr: its `mvm:` lines less the
/// `--print-stats` figures and the console tail's heading, joined.
pub fn mvm_says(run: &Run) -> String {
    const SKIP: [&str; 10] = [
        "phase:",
        "sandbox peak rss:",
        "boot to init:",
        "guest kernel to init:",
        "wall:",
        "cpu:",
        "peak rss:",
        "guest resident:",
        "teardown:",
        "last lines of the guest console:",
    ];
    run.mvm_stderr()
        .lines()
        .filter_map(|l| l.strip_prefix("mvm: "))
        .filter(|l| !SKIP.iter().any(|s| l.starts_with(s)))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// mvm's exit status as the report shows it.
pub fn code(run: &Run) -> String {
    match run.code {
        Some(c) => c.to_string(),
        None => "none (the wrapper was killed by a signal)".into(),
    }
}
