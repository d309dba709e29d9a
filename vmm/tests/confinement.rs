//! The VMM's own confinement (docs/security.md), checked on the real
//! binary with a parked hand-written guest on this machine's /dev/kvm:
//! every thread kind dies of SIGSYS on a forbidden call, the host
//! filesystem is out of reach once running, and the running process has
//! no capabilities, no_new_privs, a filter on every thread, no inherited
//! fds and no environment.
//!
//! The hooks (`MVM_TEST_FORBIDDEN_SYSCALL`, `MVM_TEST_OPEN`) exist only in
//! debug builds, which is what `cargo test` builds.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{kvm_or_skip, parked_guest};

/// `mvm run --no-workspace` of the parked guest with `flags`.
fn mvm(guest: &str, flags: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mvm"));
    cmd.args([
        "run",
        "--no-workspace",
        "--kernel",
        guest,
        "--initrd",
        guest,
    ]);
    cmd.args(flags);
    cmd.args(["--", "true"]);
    // The hand-written guest runs on a PVM-backed /dev/kvm too, and has
    // no use for an image root.
    cmd.env("MVM_ALLOW_SOFTWARE_KVM", "1")
        .env("MVM_IMAGE", "none")
        // Session directories under the target directory, not /tmp
        // (`/tmp/mvm-<uid>` would outlive the tests).
        .env("XDG_RUNTIME_DIR", env!("CARGO_TARGET_TMPDIR"));
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

fn run(guest: &str, flags: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut all = vec!["--timeout", "2"];
    all.extend_from_slice(flags);
    mvm(guest, &all, envs).output().expect("run mvm")
}

#[test]
fn a_forbidden_call_kills_every_thread_kind_with_sigsys() {
    let Some(()) = kvm_or_skip("a_forbidden_call_kills_every_thread_kind_with_sigsys") else {
        return;
    };
    let guest = parked_guest();
    let guest = guest.as_path().to_str().unwrap();
    // The writer thread exists in a run that makes a template: one with a
    // template store of its own and none in it.
    let store = vmm_sys_util::tempdir::TempDir::new_with_prefix(
        std::env::temp_dir().join("mvm-confinement-templates-"),
    )
    .unwrap();
    let store = store.as_path().to_str().unwrap();
    // A process killed by SIGSYS cannot remove its session directory: they
    // go to a runtime directory of this test's, removed with it.
    let runtime = vmm_sys_util::tempdir::TempDir::new_with_prefix(
        std::env::temp_dir().join("mvm-confinement-runtime-"),
    )
    .unwrap();
    let runtime = runtime.as_path().to_str().unwrap();
    for kind in ["vmm", "vcpu", "session", "signals", "writer"] {
        let out = run(
            guest,
            &[],
            &[
                ("MVM_TEST_FORBIDDEN_SYSCALL", kind),
                ("MVM_NO_SNAPSHOT", "0"),
                ("MVM_TEMPLATES", store),
                ("XDG_RUNTIME_DIR", runtime),
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{kind}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "forbidden system call {} in a {kind} thread",
                libc::SYS_getppid
            )),
            "{kind}: {stderr}"
        );
    }
}

#[test]
fn a_run_with_every_filter_on_ends_normally() {
    let Some(()) = kvm_or_skip("a_run_with_every_filter_on_ends_normally") else {
        return;
    };
    let guest = parked_guest();
    let out = run(guest.as_path().to_str().unwrap(), &[], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The parked guest never exits: the timeout ends it, not a filter.
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(!stderr.contains("seccomp"), "{stderr}");
}

#[test]
fn host_files_are_out_of_reach_once_running() {
    let Some(()) = kvm_or_skip("host_files_are_out_of_reach_once_running") else {
        return;
    };
    let guest = parked_guest();
    let guest = guest.as_path().to_str().unwrap();
    // A file the caller can read, outside any shared directory.
    let file = vmm_sys_util::tempfile::TempFile::new().unwrap();
    let path = file.as_path().to_str().unwrap();
    let out = run(guest, &[], &[("MVM_TEST_OPEN", path)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "mvm: test hook: cannot open {path}: Permission denied"
        )),
        "{stderr}"
    );
    // The same with Landlock off: readable, and the user was warned.
    let out = run(guest, &["--no-landlock"], &[("MVM_TEST_OPEN", path)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("mvm: test hook: opened {path}")),
        "{stderr}"
    );
    assert!(stderr.contains("mvm: warning: --no-landlock"), "{stderr}");
}

#[test]
fn no_seccomp_is_said_out_loud() {
    let Some(()) = kvm_or_skip("no_seccomp_is_said_out_loud") else {
        return;
    };
    let guest = parked_guest();
    let out = run(
        guest.as_path().to_str().unwrap(),
        &["--no-seccomp"],
        &[("MVM_TEST_FORBIDDEN_SYSCALL", "vcpu")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // No filter, so the forbidden call is just a call.
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(stderr.contains("mvm: warning: --no-seccomp"), "{stderr}");
}

/// `Name:\tvalue` from a /proc status file.
fn field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

#[test]
fn the_running_vmm_holds_no_privileges_fds_or_environment() {
    let Some(()) = kvm_or_skip("the_running_vmm_holds_no_privileges_fds_or_environment") else {
        return;
    };
    let guest = parked_guest();
    // An fd the caller leaves open across exec: mvm must not keep it.
    let inherited = vmm_sys_util::tempfile::TempFile::new().unwrap();
    let inherited_path = inherited.as_path().to_owned();
    let mut cmd = mvm(
        guest.as_path().to_str().unwrap(),
        &["--timeout", "4"],
        &[("MVM_SOME_SECRET", "hunter2")],
    );
    let raw = {
        use std::os::fd::AsRawFd;
        let fd = inherited.as_file().as_raw_fd();
        // SAFETY: dup without CLOEXEC, closed below after the spawn.
        unsafe { libc::dup(fd) }
    };
    let child = cmd.stderr(Stdio::piped()).spawn().expect("start mvm");
    // SAFETY: our duplicate, no longer needed here.
    unsafe { libc::close(raw) };
    let pid = child.id();
    // Confined once the vCPU threads run: the boot marker is written by
    // then; give it a moment, then look.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut threads = Vec::new();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        threads = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        let all_filtered = threads.iter().all(|t| {
            std::fs::read_to_string(t.join("status"))
                .is_ok_and(|s| field(&s, "Seccomp") == Some("2"))
        });
        if threads.len() >= 3 && all_filtered {
            break;
        }
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let fds: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect();
    let per_thread: Vec<(String, Option<String>)> = threads
        .iter()
        .map(|t| {
            let s = std::fs::read_to_string(t.join("status")).unwrap_or_default();
            (
                field(&s, "Name").unwrap_or("?").to_string(),
                field(&s, "Seccomp").map(str::to_string),
            )
        })
        .collect();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");

    assert_eq!(field(&status, "NoNewPrivs"), Some("1"), "{status}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(
            field(&status, set),
            Some("0000000000000000"),
            "{set}: {status}"
        );
    }
    // main, at least one vCPU, the session and signal threads: all filtered.
    assert!(per_thread.len() >= 4, "{per_thread:?}");
    for (name, seccomp) in &per_thread {
        assert_eq!(seccomp.as_deref(), Some("2"), "thread {name} unfiltered");
    }
    // The strings the process started with are wiped, not just unlinked.
    assert!(
        environ.iter().all(|&b| b == 0),
        "environment left: {:?}",
        String::from_utf8_lossy(&environ)
    );
    assert!(
        !fds.contains(&inherited_path),
        "the inherited fd is still open: {fds:?}"
    );
}
