//! Helpers for the end-to-end tests: they call `tests/testhost/mvm`, which
//! runs the real `build/bin/mvm` directly on hardware KVM or inside the QEMU
//! TCG test host otherwise (docs/testing.md), exactly as a user would.
//!
//! The tests need `make` to have built everything and take seconds each
//! (a test-host boot plus a guest boot), so they are `#[ignore]`d for a
//! plain `cargo test`; `make e2e` (part of `make test`) runs them with
//! `--ignored`.

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

/// Runs `tests/testhost/mvm ARGS` with `stdin` as its input, in the repo
/// root as working directory, and checks that mvm left nothing behind
/// (the test host looks for session directories and mvm processes).
pub fn mvm(args: &[&str], stdin: &[u8]) -> Run {
    mvm_signalled(args, stdin, None)
}

/// As `mvm`, with the test host sending mvm `signal` ("TERM 8": SIGTERM
/// 8 s after it starts), as a user or supervisor would.
///
/// One retry, loudly, for one failure only: the test host itself hung
/// (the wrapper's own timeout, nothing at all from mvm). That is the
/// nested-KVM-under-TCG environment, not mvm (docs/testing.md); a real mvm
/// bug shows up on the second try too, or as output, a status, a message.
pub fn mvm_signalled(args: &[&str], stdin: &[u8], signal: Option<&str>) -> Run {
    mvm_retrying(&[], args, stdin, signal)
}

/// As `mvm`, but the caller is the unprivileged `nobody` (through
/// util-linux's setpriv): mvm then runs, and runs the command, as 65534.
/// Only root can switch users; anyone else already is unprivileged.
pub fn mvm_as_nobody(args: &[&str]) -> Run {
    const NOBODY: &[&str] = &[
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    mvm_retrying(NOBODY, args, b"", None)
}

fn mvm_retrying(prefix: &[&str], args: &[&str], stdin: &[u8], signal: Option<&str>) -> Run {
    let run = mvm_once(prefix, args, stdin, signal);
    if run.code == Some(125)
        && run.stdout.is_empty()
        && run.stderr.contains("the test host did not finish within")
    {
        eprintln!("RETRY {args:?}: the test host hung before mvm said anything");
        return mvm_once(prefix, args, stdin, signal);
    }
    run
}

fn mvm_once(prefix: &[&str], args: &[&str], stdin: &[u8], signal: Option<&str>) -> Run {
    let wrapper = repo_root().join("tests/testhost/mvm");
    let mut command = match prefix.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(&wrapper);
            c
        }
        None => Command::new(&wrapper),
    };
    let mut child = command
        .args(args)
        .env("MVM_TESTHOST_SIGNAL", signal.unwrap_or(""))
        // A hung test host fails the call in a minute and a half, not the
        // wrapper's default quarter of an hour.
        .env("MVM_TESTHOST_TIMEOUT", "90")
        .current_dir(repo_root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tests/testhost/mvm");
    let mut input = child.stdin.take().expect("stdin pipe");
    input.write_all(stdin).expect("write stdin");
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
    assert!(
        !run.stderr.contains("mvm left behind:"),
        "mvm left something behind: {}",
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

/// At most a few KiB of an output, for the test log.
fn clip(text: &str) -> &str {
    let mut end = text.len().min(4096);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
