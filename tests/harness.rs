//! Helpers for the end-to-end tests: they call `tests/testhost/mvm`, which
//! runs the real `build/bin/mvm` directly on hardware KVM or inside the QEMU
//! TCG test host otherwise (docs/testing.md), exactly as a user would.
//!
//! The tests need `make` to have built everything and take seconds each
//! (a test-host boot plus a guest boot), so they are `#[ignore]`d for a
//! plain `cargo test`; `make e2e` (part of `make test`) runs them with
//! `--ignored`.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

pub fn build_dir() -> PathBuf {
    repo_root().join("build")
}

/// Builds a test peer of `tests/e2e/peers/` (one Rust file, std only) into
/// `target/e2e-peers/`, statically linked (the test host has no libc of
/// its own); returns the binary's path.
pub fn build_peer(source: &str) -> PathBuf {
    let dir = repo_root().join("target/e2e-peers");
    fs::create_dir_all(&dir).unwrap();
    let name = source.trim_end_matches(".rs");
    let out = dir.join(name);
    let status = Command::new("rustc")
        .args([
            "--edition",
            "2021",
            "-O",
            "--target",
            "x86_64-unknown-linux-gnu",
        ])
        .args(["-C", "target-feature=+crt-static", "--crate-name", name])
        .arg(repo_root().join("tests/e2e/peers").join(source))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run rustc");
    assert!(status.success(), "cannot build tests/e2e/peers/{source}");
    out
}

/// The variable that lets a test that cannot run here pass as skipped
/// instead of failing (docs/testing.md): `MVM_ALLOW_SKIPS=1`.
pub const ALLOW_SKIPS: &str = "MVM_ALLOW_SKIPS";

/// Where tests note what `make test`'s summary counts (skips, retries): one
/// line per event in `target/test-events/KIND.log`.
pub fn events_dir() -> PathBuf {
    repo_root().join("target/test-events")
}

/// Notes an event for the summary and says so on this process's real
/// stderr: not through `eprintln!`, which libtest swallows for a passing
/// test, so a skip or a retry shows in the run's output either way.
pub fn note_event(kind: &str, line: &str) {
    let _ = writeln!(std::io::stderr(), "{}: {line}", kind.to_uppercase());
    let dir = events_dir();
    let _ = fs::create_dir_all(&dir);
    if let Ok(mut f) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{kind}.log")))
    {
        // One write: the two lanes of `make test` append here at once.
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

/// A test that cannot run here: fails, unless `MVM_ALLOW_SKIPS=1` says a
/// skip is acceptable, in which case the skip is noted for the summary and
/// the caller returns. Never for something only an mvm bug would cause.
pub fn skip_or_fail(test: &str, why: &str) {
    if std::env::var(ALLOW_SKIPS).as_deref() == Ok("1") {
        note_event("skip", &format!("{test}: {why}"));
    } else {
        panic!("{test} cannot run here: {why} (set {ALLOW_SKIPS}=1 to skip it explicitly)");
    }
}

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// What the wrapper puts before each line of its own on stderr.
pub const WRAPPER_PREFIX: &str = "mvm (test host): ";

impl Run {
    /// The output of the call's `after` script (`Options::after`), line by
    /// line: stderr's `mvm (test host): after: LINE` lines, prefix removed.
    pub fn after_lines(&self) -> Vec<&str> {
        wrapper_lines(&self.stderr, "after: ")
    }

    /// The output of the call's `teardown` script (`Options::teardown`),
    /// the same way (`mvm (test host): teardown: LINE`).
    pub fn teardown_lines(&self) -> Vec<&str> {
        wrapper_lines(&self.stderr, "teardown: ")
    }

    /// The output of the call's `setup` script (`Options::setup`), the same
    /// way (`mvm (test host): setup: LINE`).
    pub fn setup_lines(&self) -> Vec<&str> {
        wrapper_lines(&self.stderr, "setup: ")
    }

    /// stderr less every line of the wrapper's own (its mode line, setup:
    /// and after: lines, messages): what mvm itself wrote, newline-ended.
    pub fn mvm_stderr(&self) -> String {
        self.stderr
            .lines()
            .filter(|l| !l.starts_with(WRAPPER_PREFIX))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// A `mvm: NAME: VALUE UNIT` line of `--print-stats` (e.g. "peak rss"),
    /// as a number; `None` without such a line.
    pub fn stat(&self, name: &str) -> Option<f64> {
        stat_in(&self.stderr, name)
    }

    /// Seconds from the test host's signal (`Options::signal`) to mvm's
    /// exit, both taken on the test host's clock: the wrapper's
    /// `signal: sent at S s, mvm exited at E s` line. `None` without one
    /// (no signal was sent, or not through the QEMU test host).
    pub fn signal_to_exit(&self) -> Option<f64> {
        let line = wrapper_lines(&self.stderr, "signal: sent at ")
            .into_iter()
            .next()?;
        let (sent, exited) = line.split_once(" s, mvm exited at ")?;
        let exited = exited.strip_suffix(" s")?;
        Some(exited.trim().parse::<f64>().ok()? - sent.trim().parse::<f64>().ok()?)
    }

    /// The wrapper's first line: how mvm ran ("hardware KVM, running
    /// directly" or "no hardware virtualization (...), running inside the
    /// QEMU TCG test host").
    pub fn mode(&self) -> Option<&str> {
        self.stderr
            .lines()
            .find_map(|l| l.strip_prefix(WRAPPER_PREFIX))
    }
}

/// The value of a `mvm: NAME: VALUE UNIT` line of `--print-stats` in any
/// text (stderr of a run, or output an after script collected).
pub fn stat_in(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("mvm: {name}: ")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// What follows `KEY: ` on the first line of `out` that starts with it (a
/// test's guest script prints its results as such lines); panics, showing
/// `out`, when there is none.
pub fn field<'a>(out: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}: ");
    out.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no '{key}:' line in\n{out}"))
}

/// `mvm run` options binding secret TOKEN (its value: `MVM_TEST_TOKEN` in
/// mvm's environment) to the peer servers' api.test:8443 (tests/e2e/peers,
/// their CA as the upstream's), and allowing the other peers a leak test
/// sends it to: plain.test:8080 and sink.test:9000 (with their address,
/// 127.0.0.1, since they resolve to it).
pub const PEER_SECRET_ARGS: &[&str] = &[
    "--secret",
    "TOKEN=env:MVM_TEST_TOKEN@api.test:8443",
    "--upstream-ca",
    "/run/tmp/peers/pub/ca.pem",
    "--allow",
    "127.0.0.1:8443",
    "--allow",
    "plain.test:8080",
    "--allow",
    "127.0.0.1:8080",
    "--allow",
    "sink.test:9000",
    "--allow",
    "127.0.0.1:9000",
];

/// SHA-256 of `text`, hex (coreutils' sha256sum, as the guest computes it).
pub fn sha256_hex(text: &str) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start sha256sum");
    child
        .stdin
        .take()
        .expect("stdin pipe")
        .write_all(text.as_bytes())
        .expect("write to sha256sum");
    let out = child.wait_with_output().expect("wait for sha256sum");
    String::from_utf8_lossy(&out.stdout)[..64].to_string()
}

/// The `mvm (test host): KIND LINE` lines of a wrapper's stderr, with that
/// prefix removed (`kind` is e.g. "after: ").
pub fn wrapper_lines<'a>(stderr: &'a str, kind: &str) -> Vec<&'a str> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix(WRAPPER_PREFIX)?.strip_prefix(kind))
        .collect()
}

/// Everything about one call of `tests/testhost/mvm` beyond its arguments;
/// `Options::default()` is a plain call with empty stdin.
///
/// ```no_run
/// use mvm_e2e::{mvm_with, Options};
/// let run = mvm_with(
///     &Options {
///         setup: Some("mkdir -p /run/tmp/ws && echo hi >/run/tmp/ws/f"),
///         after: Some("ls -ln /run/tmp/ws; echo status=$MVM_STATUS"),
///         ..Options::default()
///     },
///     &["run", "--", "true"],
/// );
/// assert!(run.after_lines().contains(&"status=0"));
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct Options<'a> {
    /// mvm's stdin (read to its end before the test host starts).
    pub stdin: &'a [u8],
    /// `MVM_TESTHOST_SIGNAL`: "TERM @ready" has the test host send mvm
    /// SIGTERM as soon as a line `ready` is in mvm's stdout (the command
    /// printed it), as a user or supervisor would; "TERM 8" 8 s after mvm
    /// starts; "KILL @ready virtiofsd" kills every virtiofsd instead.
    /// Prefer a marker: a fixed time assumes how fast the guest boots.
    /// `Run::signal_to_exit` then gives the time from signal to exit.
    pub signal: Option<&'a str>,
    /// Call the wrapper as the unprivileged `nobody` (util-linux's setpriv;
    /// only root can switch users, anyone else already is unprivileged):
    /// mvm, the command and the scripts then run as 65534.
    pub as_nobody: bool,
    /// `MVM_TESTHOST_SETUP`: a `sh -c` script run just before mvm where mvm
    /// runs (the test host, or this machine on hardware KVM), as the
    /// caller, in the repo root; if it fails the call exits 125 and mvm
    /// does not run. The test host's TMPDIR, /run/tmp, is its own tmpfs.
    /// A retried call (see `mvm_with`) runs it again: keep it idempotent.
    pub setup: Option<&'a str>,
    /// `MVM_TESTHOST_AFTER`: a script run the same way just after mvm exits
    /// (after the leftover check), with `MVM_STATUS` set to mvm's status;
    /// its output comes back in `Run::after_lines`.
    pub after: Option<&'a str>,
    /// `MVM_TESTHOST_TEARDOWN`: a script run the same way right after mvm
    /// exits and before the leftover check, e.g. `$MVM rm -f NAME` for a
    /// sandbox `setup` created (what it fails to stop is left behind); its
    /// output comes back in `Run::teardown_lines`.
    pub teardown: Option<&'a str>,
    /// `MVM_TESTHOST_TIMEOUT` in seconds, for a call whose scripts run
    /// long (e.g. more mvm runs of their own); `None` is 90.
    pub testhost_timeout: Option<u32>,
    /// Extra environment for the wrapper (MVM_* variables reach mvm in the
    /// test host), e.g. `MVM_IMAGES` for an image store of the test's own.
    pub env: &'a [(&'a str, &'a str)],
}

/// Runs `tests/testhost/mvm ARGS` with `stdin` as its input, in the repo
/// root as working directory, and checks that mvm left nothing behind
/// (the test host looks for session directories and mvm and virtiofsd
/// processes).
pub fn mvm(args: &[&str], stdin: &[u8]) -> Run {
    mvm_with(
        &Options {
            stdin,
            ..Options::default()
        },
        args,
    )
}

/// As `mvm`, with the test host sending mvm `signal` ("TERM @ready":
/// SIGTERM once the command printed a line `ready`; see `Options::signal`).
pub fn mvm_signalled(args: &[&str], stdin: &[u8], signal: Option<&str>) -> Run {
    mvm_with(
        &Options {
            stdin,
            signal,
            ..Options::default()
        },
        args,
    )
}

/// As `mvm` with empty stdin, but the caller is the unprivileged `nobody`
/// (through util-linux's setpriv): mvm then runs, and runs the command, as
/// 65534. Only root can switch users; anyone else already is unprivileged.
pub fn mvm_as_nobody(args: &[&str]) -> Run {
    mvm_with(
        &Options {
            as_nobody: true,
            ..Options::default()
        },
        args,
    )
}

/// Runs `tests/testhost/mvm ARGS` as `options` say, in the repo root, and
/// checks that mvm left nothing behind. Every other call goes through here.
///
/// Retries, loudly, for one failure only: the test host itself hung (the
/// wrapper saw its heartbeat stop, or it never came up). That is the
/// nested-KVM-under-TCG environment, not mvm (docs/testing.md). An mvm
/// that does not finish while the test host keeps beating is not retried:
/// the wrapper says "mvm did not finish" and shows its output so far. Each
/// retry is printed on the real stderr and noted for `make test`'s summary.
pub fn mvm_with(options: &Options, args: &[&str]) -> Run {
    let mut run = mvm_once(options, args);
    for _ in 0..TESTHOST_RETRIES {
        let Some(why) = testhost_hang(&run) else {
            break;
        };
        note_event("retry", &format!("{args:?}: {why}"));
        // The hung attempt's whole stderr (the test host's console tail
        // included), kept for finding out why the test host hangs.
        let dir = events_dir();
        if let Ok(mut f) = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("retry-attempts.log"))
        {
            let _ = writeln!(f, "=== {args:?}\n{}", run.stderr);
        }
        run = mvm_once(options, args);
    }
    run
}

/// How many times a call whose test host hung is made again. Two: under
/// heavy guest traffic the test host's own kernel livelocks often enough
/// (docs/testing.md, "Known test-host hangs") that one retry lost CI runs.
const TESTHOST_RETRIES: usize = 2;

/// The wrapper's words when the test host itself hung (not mvm).
pub fn testhost_hang(run: &Run) -> Option<&str> {
    if run.code != Some(125) {
        return None;
    }
    wrapper_lines(&run.stderr, "the test host hung: ")
        .into_iter()
        .next()
        .map(|why| why.trim_end_matches("; its console log follows"))
}

fn mvm_once(options: &Options, args: &[&str]) -> Run {
    const NOBODY: &[&str] = &[
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    let wrapper = repo_root().join("tests/testhost/mvm");
    let mut command = if options.as_nobody {
        let mut c = Command::new(NOBODY[0]);
        c.args(&NOBODY[1..]).arg(&wrapper);
        c
    } else {
        Command::new(&wrapper)
    };
    command
        .args(args)
        .env("MVM_TESTHOST_SIGNAL", options.signal.unwrap_or(""))
        // A hung test host fails the call in a minute and a half, not the
        // wrapper's default quarter of an hour.
        .env(
            "MVM_TESTHOST_TIMEOUT",
            options.testhost_timeout.unwrap_or(90).to_string(),
        );
    // The start path (docs/testing.md): a cold boot, unless the suite runs
    // through templates (MVM_E2E_TEMPLATES=1), which then persist across
    // test-host calls in target/e2e-templates, so that every call but a
    // layout's first restores one. A call's own `env` overrides either.
    if !options.as_nobody && std::env::var_os("MVM_E2E_TEMPLATES").is_some_and(|v| v == "1") {
        command
            .env("MVM_TEMPLATES", repo_root().join("target/e2e-templates"))
            .env("MVM_NO_SNAPSHOT", "0");
    } else {
        command.env("MVM_NO_SNAPSHOT", "1");
    }
    command.envs(options.env.iter().copied());
    // Only what this call asks for, never scripts from the environment.
    for (name, script) in [
        ("MVM_TESTHOST_SETUP", options.setup),
        ("MVM_TESTHOST_TEARDOWN", options.teardown),
        ("MVM_TESTHOST_AFTER", options.after),
    ] {
        match script {
            Some(script) => command.env(name, script),
            None => command.env_remove(name),
        };
    }
    let mut child = command
        .current_dir(repo_root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tests/testhost/mvm");
    let mut input = child.stdin.take().expect("stdin pipe");
    input.write_all(options.stdin).expect("write stdin");
    drop(input);
    let out = child
        .wait_with_output()
        .expect("wait for tests/testhost/mvm");
    let run = Run::from(out);
    eprintln!(
        "mvm {args:?} -> {:?}\n--- stdout\n{}--- stderr\n{}---",
        run.code,
        clip(&run.stdout),
        clip(&run.stderr)
    );
    // SIGKILL skips mvm's cleanup, so its session directory stays (the
    // next run sweeps it); processes left alive are a bug even then.
    let killed = options
        .signal
        .is_some_and(|s| s.starts_with("KILL") && !s.ends_with("virtiofsd"));
    let leftovers: Vec<&str> = wrapper_lines(&run.stderr, "mvm left behind: ")
        .into_iter()
        .filter(|what| !(killed && what.starts_with("/run/tmp/mvm-")))
        .collect();
    assert!(
        leftovers.is_empty(),
        "mvm left something behind: {leftovers:?}\n{}",
        run.stderr
    );
    run
}

/// The real uid of this test process.
pub fn caller_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().next())
                .and_then(|uid| uid.parse().ok())
        })
        .expect("Uid: line in /proc/self/status")
}

/// The guest kernel's release string, as recorded by its build.
pub fn guest_kernel_release() -> String {
    std::fs::read_to_string(build_dir().join("share/mvm/kernel.release"))
        .expect("build/share/mvm/kernel.release: run make")
        .trim()
        .to_string()
}

/// At most a few KiB of an output for the test log: its start and its end
/// (where a failure usually shows), the middle left out.
fn clip(text: &str) -> String {
    const EACH: usize = 2048;
    if text.len() <= 2 * EACH {
        return text.to_string();
    }
    let mut head = EACH;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - EACH;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[... {} bytes left out ...]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}
