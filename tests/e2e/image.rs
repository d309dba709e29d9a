//! Images as the guest's root (docs/images.md): the suite's own two-layer
//! image (tests/e2e/images/make-test-image.sh: GNU tar layers, the
//! docker-archive written by Debian's skopeo) imported from both sources
//! into a store of the test's own, then booted through the test host.
//! Each check has a positive control beside it, so that an absent file is
//! the whiteout's doing and not an empty root.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use mvm_e2e::{build_dir, mvm_with, repo_root, Options, Run};

/// Where the test image and the store live: under the repo root, which
/// the test host mounts at the same path.
fn work_dir() -> PathBuf {
    repo_root().join("target/e2e-images")
}

fn store_dir() -> String {
    work_dir().join("store").display().to_string()
}

/// `build/bin/mvm ARGS` on this machine (the store needs no KVM), with
/// the test's store; (status, stdout, stderr).
fn mvm_here(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(build_dir().join("bin/mvm"))
        .args(args)
        .env("MVM_IMAGES", store_dir())
        // `mvm run` checks KVM before the image: this machine's PVM-backed
        // one is allowed here, since these runs end at the image.
        .env("MVM_ALLOW_SOFTWARE_KVM", "1")
        .output()
        .expect("run build/bin/mvm");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    eprintln!(
        "mvm {args:?} -> {:?}\n{}{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// The blobs an import says it copied ("... (N blobs copied, ...").
fn blobs_copied(stdout: &str) -> Option<u32> {
    stdout
        .split_once(" (")?
        .1
        .split_once(" blobs copied")?
        .0
        .parse()
        .ok()
}

/// Builds the test image and imports it from both sources into a fresh
/// store, once per test process; checks the import counts on the way.
fn imported() -> &'static () {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let dir = work_dir();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let status = Command::new(repo_root().join("tests/e2e/images/make-test-image.sh"))
            .arg(dir.join("layers"))
            // Its stdout is the manifest digest, not wanted in the test log.
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run make-test-image.sh");
        assert!(status.success(), "make-test-image.sh failed");
        let oci = format!("oci:{}:layers", dir.join("layers/oci").display());
        let (code, out, err) = mvm_here(&["image", "import", &oci, "--name", "layers"]);
        assert_eq!(code, 0, "{err}");
        // Manifest, config and two layers.
        assert_eq!(blobs_copied(&out), Some(4), "{out}");
        // Control for the check below: the first import does convert.
        assert!(err.contains("mvm: converted"), "{err}");
        let (code, again, err) = mvm_here(&["image", "import", &oci, "--name", "layers"]);
        assert_eq!(code, 0, "{err}");
        assert!(
            !err.contains("converted"),
            "a second import converted again: {err}"
        );
        assert_eq!(
            blobs_copied(&again),
            Some(0),
            "a second import copies nothing: {again}"
        );
        let archive = format!("docker-archive:{}", dir.join("layers/image.tar").display());
        // Named here: the tag skopeo writes into the archive carries a
        // registry prefix, and the store keeps names as given.
        let (code, out, err) =
            mvm_here(&["image", "import", &archive, "--name", "mvm-test/layers:1"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("mvm-test/layers:1 "), "{out}");
        // The default image, as `make` built it: converted here, so the
        // runs in the test host find it ready (and check the digest only).
        let default = format!(
            "oci:{}:debian-bookworm",
            build_dir().join("share/mvm/images/debian").display()
        );
        let (code, out, err) =
            mvm_here(&["image", "import", &default, "--name", "debian-bookworm"]);
        assert_eq!(code, 0, "{err}");
        assert!(
            err.contains("converted debian-bookworm:latest"),
            "{out}{err}"
        );
        let (_, list, _) = mvm_here(&["image", "ls"]);
        assert!(
            list.contains("layers:latest") || list.contains("layers "),
            "{list}"
        );
    })
}

fn run_image(image: &str, extra: &[&str], script: &str) -> Run {
    imported();
    let store = store_dir();
    let env = [("MVM_IMAGES", store.as_str())];
    let mut args = vec!["run", "--image", image, "--no-workspace"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    mvm_with(
        &Options {
            env: &env,
            ..Options::default()
        },
        &args,
    )
}

const LAYERS_SCRIPT: &str = "\
echo opq=$(ls /opq | tr '\\n' ' '); \
echo keep=$(ls /keep | tr '\\n' ' '); \
test -e /gone && echo gone=present || echo gone=absent; \
echo inodes=$(stat -c %i /links/x /links/y | tr '\\n' ' '); \
echo y=$(cat /links/y); \
echo env=$MVM_TEST_IMAGE; \
echo pwd=$(pwd)";

fn check_layers(run: &Run) {
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Converted at import: no run converts it again.
    assert!(!run.stderr.contains("mvm: converted"), "{}", run.stderr);
    let line = |key: &str| {
        run.stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} line in {}", run.stdout))
            .trim()
            .to_string()
    };
    // Control: layer 1's /keep/old is there, so layer 1 is visible at all.
    assert_eq!(line("keep="), "new old");
    assert_eq!(line("gone="), "absent", "the whiteout did not hide /gone");
    assert_eq!(
        line("opq="),
        "c",
        "the opaque directory shows lower entries"
    );
    let inodes: Vec<String> = line("inodes=").split(' ').map(String::from).collect();
    assert_eq!(inodes.len(), 2);
    assert_eq!(inodes[0], inodes[1], "hard links do not share an inode");
    assert_eq!(line("y="), "linked");
    assert_eq!(line("env="), "layers", "the image's Env is not applied");
    assert_eq!(
        line("pwd="),
        "/keep",
        "WorkingDir is not the default with --no-workspace"
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn layers_flatten_as_oci_says_from_an_oci_layout() {
    check_layers(&run_image("layers", &[], LAYERS_SCRIPT));
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn layers_flatten_as_oci_says_from_a_docker_archive() {
    check_layers(&run_image("mvm-test/layers:1", &[], LAYERS_SCRIPT));
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn without_a_command_the_images_cmd_runs() {
    imported();
    let store = store_dir();
    let env = [("MVM_IMAGES", store.as_str())];
    let run = mvm_with(
        &Options {
            env: &env,
            ..Options::default()
        },
        &["run", "--image", "layers", "--no-workspace"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "default-cmd\n");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn the_caller_gets_a_passwd_entry_and_setuid_raises_nothing() {
    let run = run_image(
        "layers",
        &[],
        "id -u; whoami; echo home=$HOME; touch $HOME/x && echo home-writable; \
         stat -c 'mode=%a owner=%u' /setuid; echo setuid-euid=$(/setuid); \
         grep -c ':/home/' /etc/passwd",
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    let uid = lines[0];
    assert_ne!(uid, "0", "the command must not be root by default");
    // The image's passwd has root and nobody only: the entry is mvm's.
    assert!(
        !lines[1].is_empty() && !lines[1].contains("unknown"),
        "{lines:?}"
    );
    assert_eq!(lines[2], format!("home=/home/{}", lines[1]));
    assert_eq!(lines[3], "home-writable");
    // The mode is kept as data (control: the check can see a setuid bit)...
    assert_eq!(lines[4], "mode=4755 owner=0");
    // ...and raises nothing: nosuid and no_new_privs.
    assert_eq!(lines[5], format!("setuid-euid={uid}"));
    assert_eq!(lines[6], "1");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn writes_anywhere_are_kept_for_the_run_and_gone_after() {
    let first = run_image(
        "layers",
        &["--root"],
        "echo installed > /bin/newtool && cat /bin/newtool && rm /etc/group && echo removed",
    );
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    assert_eq!(first.stdout, "installed\nremoved\n");
    let second = run_image(
        "layers",
        &["--root"],
        "test -e /bin/newtool && echo newtool=present || echo newtool=absent; test -e /etc/group && echo group=present",
    );
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    assert_eq!(second.stdout, "newtool=absent\ngroup=present\n");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn scratch_bounds_what_the_command_can_write() {
    // Control: 1 MiB fits in 4M; 8 MiB does not.
    let run = run_image(
        "layers",
        &["--root", "--scratch", "4M"],
        "dd if=/dev/zero of=/small bs=1024 count=1024 2>/dev/null && echo small-ok; \
         dd if=/dev/zero of=/big bs=1024 count=8192 2>&1 | grep -o 'No space left on device' | head -n 1",
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "small-ok\nNo space left on device\n");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_loopback_server_and_its_client_in_one_command() {
    let run = run_image(
        "layers",
        &[],
        "nc -l -p 8080 -e echo served-over-lo & sleep 1; nc 127.0.0.1 8080 </dev/null",
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout.trim(), "served-over-lo");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn unknown_images_are_one_line_and_exit_125() {
    imported();
    for (image, says) in [
        ("no-such-image", "is not in the store"),
        ("oci:/nonexistent/layout", "/nonexistent/layout"),
        ("registry.invalid:5000/app:1", "registry"),
    ] {
        let (code, _, err) = mvm_here(&["run", "--image", image, "--", "true"]);
        assert_eq!(code, 125, "{image}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{image}: {err}");
        assert!(
            lines[0].starts_with("mvm: ") && lines[0].contains(says),
            "{image}: {err}"
        );
    }
}

/// A fresh workspace on the test host's own tmpfs (a 9p-backed one under
/// the repo would test 9p, not mvm).
const FRESH_WS: &str = "rm -rf /run/tmp/ws && mkdir -p /run/tmp/ws && echo hello > /run/tmp/ws/f";

fn run_default(extra: &[&str], setup: Option<&str>, after: Option<&str>, script: &str) -> Run {
    imported();
    let store = store_dir();
    let env = [("MVM_IMAGES", store.as_str())];
    let mut args = vec!["run", "--image", "default"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    mvm_with(
        &Options {
            env: &env,
            setup,
            after,
            ..Options::default()
        },
        &args,
    )
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn the_run_names_the_guest_and_its_hosts_file_resolves_the_name() {
    let run = run_default(
        &["--no-workspace", "--hostname", "ci-runner-7"],
        None,
        None,
        "hostname; getent hosts ci-runner-7; getent hosts mvm",
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<Vec<&str>> = run
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    // The kernel's name (the guest boots as mvm; a template, too, was
    // saved with that name).
    assert_eq!(lines.first(), Some(&vec!["ci-runner-7"]), "{}", run.stdout);
    // The name resolves through the image's /etc/hosts, where mvm added it;
    // the image's own line for mvm is kept (its lookup is the control that
    // getent reads that file).
    assert_eq!(
        lines.get(1),
        Some(&vec!["127.0.1.1", "ci-runner-7.localdomain", "ci-runner-7"]),
        "{}",
        run.stdout
    );
    assert!(
        lines.get(2).is_some_and(|l| l.contains(&"mvm")),
        "{}",
        run.stdout
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn the_default_image_runs_python_with_its_standard_library() {
    let run = run_default(
        &["--no-workspace"],
        None,
        None,
        "python3 -c 'import sys, json, sqlite3; print(sys.version_info[:2], sqlite3.sqlite_version_info >= (3, 0))'",
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "(3, 11) True\n");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn git_commits_in_a_writable_workspace_belong_to_the_caller() {
    // --write-hooks: a git repository made in the guest brings its own
    // .git/config and hooks, which a plain --write keeps from the host
    // (battery checks 2b and 7b).
    let run = run_default(
        &["--workspace", "/run/tmp/ws", "--write", "--write-hooks"],
        Some(FRESH_WS),
        // The test host has no git: the owners of what the commit wrote
        // (every object file included) are read there, the log in the guest.
        Some("cd /run/tmp/ws && stat -c '%u' .git/HEAD .git/index && find .git/objects -type f | wc -l && find .git/objects -type f ! -user $(id -u) | wc -l"),
        "git init -q && git add . && git commit -q -m x && whoami && git log --format='%s %ae'",
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    let me = lines.first().copied().unwrap_or("");
    assert!(!me.is_empty() && me != "root", "{}", run.stdout);
    let commit = format!("x {me}@mvm.localdomain");
    assert_eq!(
        lines.get(1).copied(),
        Some(commit.as_str()),
        "{}",
        run.stdout
    );
    let caller = mvm_e2e::caller_uid().to_string();
    // The host (test host) side: the repository is the caller's. Three
    // objects at least (blob, tree, commit), none owned by anyone else.
    let after = run.after_lines();
    assert_eq!(
        after[..2],
        [caller.as_str(), caller.as_str()],
        "{}",
        run.stderr
    );
    assert!(
        after[2].trim().parse::<u32>().unwrap_or(0) >= 3,
        "{}",
        run.stderr
    );
    assert_eq!(
        after[3].trim(),
        "0",
        "objects not owned by the caller: {}",
        run.stderr
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn root_installs_into_usr_for_one_run_only() {
    let first = run_default(
        &["--no-workspace", "--root"],
        None,
        None,
        "printf '#!/bin/sh\\necho tool-ran\\n' > /usr/local/bin/tool && chmod +x /usr/local/bin/tool && tool && \
         echo extra >> /usr/lib/os-release && tail -n 1 /usr/lib/os-release",
    );
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    assert_eq!(first.stdout, "tool-ran\nextra\n");
    let second = run_default(
        &["--no-workspace", "--root"],
        None,
        None,
        "command -v tool || echo no-tool; tail -n 1 /usr/lib/os-release | grep -c extra",
    );
    assert_eq!(second.stdout, "no-tool\n0\n", "{}", second.stderr);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_python_server_on_localhost_answers_curl_in_the_same_command() {
    let run = run_default(
        &["--no-workspace"],
        None,
        None,
        "cd /tmp && echo page > index.html && \
         (python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &) && \
         for i in 1 2 3 4 5 6 7 8 9 10; do curl -s http://localhost:8000/index.html && break; sleep 1; done",
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "page\n");
}

#[test]
fn import_counts_are_read_from_the_output() {
    assert_eq!(
        blobs_copied("layers:latest sha256:ab (4 blobs copied, 10 bytes)"),
        Some(4)
    );
    assert_eq!(blobs_copied("x (0 blobs copied, 0 bytes)"), Some(0));
    assert_eq!(blobs_copied("nothing"), None);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_long_import_shows_progress_on_a_terminal_only() {
    // The default image takes seconds to copy and convert: long enough
    // for the progress line, which waits a second before it shows.
    let layout = format!(
        "oci:{}:debian-bookworm",
        build_dir().join("share/mvm/images/debian").display()
    );
    let mvm = build_dir().join("bin/mvm");
    let fresh = |name: &str| {
        let dir = work_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        dir.display().to_string()
    };
    // On a terminal: util-linux's script gives mvm a pty and keeps what
    // it drew.
    let store = fresh("progress-tty");
    let line = format!(
        "MVM_IMAGES={store} {} image import {layout} --name p",
        mvm.display()
    );
    let tty = Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        .output()
        .expect("run script");
    let drawn = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{drawn}");
    assert!(
        drawn.contains('\r') && drawn.contains(" MiB"),
        "no progress line on a terminal: {drawn:?}"
    );
    // Control: the same import with stderr a pipe draws nothing.
    let store = fresh("progress-pipe");
    let piped = Command::new(&mvm)
        .args(["image", "import", &layout, "--name", "p"])
        .env("MVM_IMAGES", &store)
        .output()
        .expect("run mvm");
    let err = String::from_utf8_lossy(&piped.stderr);
    assert!(piped.status.success(), "{err}");
    assert!(!err.contains('\r'), "progress drawn into a pipe: {err:?}");
    for d in ["progress-tty", "progress-pipe"] {
        let _ = std::fs::remove_dir_all(work_dir().join(d));
    }
}

/// `--rootfs DIR`: a root filesystem directory on the test host (a static
/// busybox and a marker file made by the setup script, with a nonce, so
/// the guest can only read it from there), served through virtiofsd under
/// the same overlay as an image, with the workspace shared inside it. As
/// guest root, so that its writes to the image's /etc may land (above).
#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_directory_is_the_root_under_the_overlay() {
    let nonce = format!("{:x}", std::process::id() as u64 * 7919 + 17);
    let setup = format!(
        "rm -rf /run/tmp/rd && mkdir -p /run/tmp/rd/bin /run/tmp/rd/etc /run/tmp/rd/workspace \
         && cp /bin/busybox /run/tmp/rd/bin/ && ln -s busybox /run/tmp/rd/bin/sh \
         && echo {nonce} > /run/tmp/rd/etc/marker && chmod 0644 /run/tmp/rd/etc/marker"
    );
    let script = "busybox cat /etc/marker; busybox stat -c owner=%u /etc/marker; \
                  echo overlay > /etc/marker && busybox cat /etc/marker; \
                  echo new > /created && busybox cat /created; \
                  busybox test -f /workspace/Cargo.toml && echo workspace-inside; \
                  busybox grep -q ' / overlay ' /proc/mounts && echo root-is-overlay";
    let after = "echo \"host-marker:$(cat /run/tmp/rd/etc/marker)\"; \
                 test -e /run/tmp/rd/created && echo host-created || echo host-clean; \
                 rm -rf /run/tmp/rd";
    let run = mvm_with(
        &Options {
            setup: Some(&setup),
            after: Some(after),
            ..Options::default()
        },
        &[
            "run",
            "--rootfs",
            "/run/tmp/rd",
            "--root",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    // The directory's file (its nonce), owned as on the host (the root
    // caller's 0: not mapped to the command's uid as a share's files are).
    assert_eq!(lines.first(), Some(&nonce.as_str()), "{}", run.stdout);
    assert!(lines.contains(&"owner=0"), "{}", run.stdout);
    // Writes land above: read back in the guest, absent on the host.
    assert!(lines.contains(&"overlay"), "{}", run.stdout);
    assert!(lines.contains(&"new"), "{}", run.stdout);
    assert!(lines.contains(&"workspace-inside"), "{}", run.stdout);
    assert!(lines.contains(&"root-is-overlay"), "{}", run.stdout);
    let after = run.after_lines();
    assert!(
        after.contains(&format!("host-marker:{nonce}").as_str()),
        "{after:?}"
    );
    assert!(after.contains(&"host-clean"), "{after:?}");
}

/// A --rootfs that is neither a readable file nor a directory, and the
/// host's own root: one line each, exit 125, before anything starts.
#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_bad_directory_root_is_one_line_and_exit_125() {
    for (rootfs, says) in [
        (
            "/nonexistent/root",
            "cannot read the root image /nonexistent/root",
        ),
        ("/", "--rootfs: / is the root directory"),
    ] {
        let (code, _, stderr) = mvm_here(&["run", "--rootfs", rootfs, "--", "true"]);
        assert_eq!(code, 125, "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}
