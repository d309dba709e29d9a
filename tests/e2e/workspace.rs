//! The workspace through virtio-fs (virtiofsd behind a vhost-user
//! frontend): read-only unless asked, enforced by the host side, no way
//! out of a shared directory, files owned by the caller, extra mounts.
//!
//! Each test prepares its directories with a setup script on the machine
//! mvm runs on (the test host's own tmpfs, /run/tmp) and inspects them
//! afterwards with an after script, so what is checked is the host's view,
//! not the guest's.

use mvm_e2e::{caller_uid, mvm_with, skip_or_fail, Options, Run};

/// A fresh workspace with one file, and a directory beside it (outside the
/// share) holding a secret.
const FRESH: &str = "rm -rf /run/tmp/ws /run/tmp/outside && \
    mkdir -p /run/tmp/ws /run/tmp/outside && \
    echo original >/run/tmp/ws/f && \
    echo OUTSIDE-SECRET >/run/tmp/outside/secret";

fn run_in_workspace(setup: &str, after: &str, as_nobody: bool, args: &[&str]) -> Run {
    run_in_workspace_for(None, setup, after, as_nobody, args)
}

/// As `run_in_workspace`, with the test host's time limit in seconds
/// (`None`: the harness's 90).
fn run_in_workspace_for(
    testhost_timeout: Option<u32>,
    setup: &str,
    after: &str,
    as_nobody: bool,
    args: &[&str],
) -> Run {
    let mut full = vec!["run", "--workspace", "/run/tmp/ws"];
    full.extend_from_slice(args);
    mvm_with(
        &Options {
            setup: Some(setup),
            after: Some(after),
            as_nobody,
            testhost_timeout,
            ..Options::default()
        },
        &full,
    )
}

/// The symlink races: the host's flipper shares the test host's one
/// emulated CPU with the guest's reads; a generous bound over the
/// harness's 90 s.
const RACE_TIMEOUT: Option<u32> = Some(240);

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn workspace_is_read_only_by_default_and_the_error_is_visible() {
    let run = run_in_workspace(
        FRESH,
        "cat /run/tmp/ws/f; ls /run/tmp/ws",
        false,
        &["--", "sh", "-c", "pwd; cat f; echo x > f"],
    );
    assert_ne!(run.code, Some(0), "the write must fail");
    assert_eq!(run.stdout, "/workspace\noriginal\n");
    assert!(
        run.mvm_stderr().contains("Read-only file system"),
        "{}",
        run.stderr
    );
    assert_eq!(run.after_lines(), ["original", "f"], "host side unchanged");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn write_creates_files_owned_by_the_caller_with_their_modes() {
    // As nobody: an unprivileged caller, virtiofsd in a user namespace.
    let run = run_in_workspace(
        FRESH,
        "cd /run/tmp/ws && stat -c '%n %u %g %a' new dir exe && cat new",
        true,
        &[
            "--write",
            "--",
            "sh",
            "-c",
            "echo x > new && mkdir dir && touch exe && chmod 750 exe && \
             id -u && stat -c %u f",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // The guest user is the caller, and the caller's files are its own.
    assert_eq!(run.stdout, "65534\n65534\n");
    // Even guest root's files belong to the caller on the host.
    let run_root = run_in_workspace(
        FRESH,
        "cd /run/tmp/ws && stat -c '%n %u %g %a' byroot",
        true,
        &["--write", "--root", "--", "sh", "-c", "id -u; touch byroot"],
    );
    assert_eq!(run_root.code, Some(0), "{}", run_root.stderr);
    assert_eq!(run_root.stdout, "0\n");
    assert_eq!(run_root.after_lines(), ["byroot 65534 65534 644"]);
    let lines = run.after_lines();
    assert!(lines.contains(&"new 65534 65534 644"), "{lines:?}");
    assert!(lines.contains(&"dir 65534 65534 755"), "{lines:?}");
    assert!(lines.contains(&"exe 65534 65534 750"), "{lines:?}");
    assert!(lines.contains(&"x"), "{lines:?}");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn what_the_command_wrote_is_on_the_host_when_the_run_ends() {
    // mvm stops the machine as soon as the command's exit status arrives
    // (docs/protocol.md, "The end of a run"), without the guest's reboot:
    // a plain write and pages dirtied through a shared mapping (left to
    // the process's exit to unmap) must be on the host by then.
    const WRITER: &str = "import mmap, os\n\
open('written', 'w').write('through-write')\n\
f = open('mapped', 'w+b'); f.truncate(8192)\n\
m = mmap.mmap(f.fileno(), 8192); m[0:12] = b'through-mmap'; m[4096:4101] = b'page2'\n\
os._exit(0)\n";
    let run = run_in_workspace(
        FRESH,
        "cd /run/tmp/ws && cat written; echo; head -c 12 mapped; echo; tail -c +4097 mapped | head -c 5; echo",
        false,
        &["--write", "--", "python3", "-c", WRITER],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.after_lines(),
        ["through-write", "through-mmap", "page2"]
    );
}

/// A marker in the host's /etc/shadow, where we may write it: a root
/// caller in the test host, whose root is a throwaway tmpfs. The setup
/// prints what the file then holds, so that a test knows it was planted.
const PLANT_SHADOW: &str = "if [ \"$(id -u)\" = 0 ] && [ -f /io/argv ]; then \
     echo HOST-SHADOW >/etc/shadow; fi; echo \"host shadow: $(cat /etc/shadow 2>/dev/null)\"";

/// Whether the setup's `PLANT_SHADOW` did plant the marker; a skip (or a
/// failure) where it cannot.
fn shadow_planted(run: &Run, test: &str) -> bool {
    if run.setup_lines().contains(&"host shadow: HOST-SHADOW") {
        return true;
    }
    skip_or_fail(
        test,
        "the HOST-SHADOW marker needs a root caller and the QEMU test host",
    );
    false
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn guest_sees_its_own_root_plus_the_mounts_never_the_hosts_files() {
    let setup = format!("{FRESH} && {PLANT_SHADOW}");
    let run = run_in_workspace(
        &setup,
        "true",
        false,
        &[
            "--mount",
            "/run/tmp/outside:/data",
            "--",
            "sh",
            "-c",
            "cat /etc/shadow 2>&1; echo; ls /; grep virtiofs /proc/mounts",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    shadow_planted(
        &run,
        "guest_sees_its_own_root_plus_the_mounts_never_the_hosts_files",
    );
    assert!(!run.stdout.contains("HOST-SHADOW"), "{}", run.stdout);
    let root: Vec<&str> = run
        .stdout
        .lines()
        .skip_while(|l| !l.is_empty())
        .skip(1)
        .take_while(|l| !l.starts_with("mvm"))
        .collect();
    for must in ["workspace", "data", "bin", "proc"] {
        assert!(root.contains(&must), "{must} missing from ls /: {root:?}");
    }
    // The test host's own top-level directories are not in the guest.
    for never in ["mvm", "io", "newroot", "work"] {
        assert!(!root.contains(&never), "{never} in ls /: {root:?}");
    }
    let mounts: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("mvm"))
        .collect();
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    assert!(
        mounts[0].starts_with("mvm0 /workspace virtiofs ro,"),
        "{mounts:?}"
    );
    assert!(
        mounts[1].starts_with("mvm1 /data virtiofs ro,"),
        "{mounts:?}"
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn the_host_shadow_marker_shows_when_the_hosts_etc_is_shared() {
    // Positive control for the test above: the marker is there and the
    // guest's `cat` does print it once the host's /etc is deliberately
    // shared, so its absence above is the sandbox's doing.
    let setup = format!("{FRESH} && {PLANT_SHADOW}");
    let run = run_in_workspace(
        &setup,
        "true",
        false,
        &[
            "--mount",
            "/etc:/hostetc",
            "--",
            "sh",
            "-c",
            "cat /hostetc/shadow 2>&1",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    if shadow_planted(
        &run,
        "the_host_shadow_marker_shows_when_the_hosts_etc_is_shared",
    ) {
        assert_eq!(run.stdout, "HOST-SHADOW\n", "{}", run.stderr);
    }
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn remounting_read_write_in_the_guest_still_cannot_change_host_files() {
    // Guest root remounts the share read-write: the guest kernel then sends
    // real write requests (WRITE, CREATE, MKDIR, UNLINK, SETATTR, RENAME),
    // which only virtiofsd's --readonly stands in the way of.
    let run = run_in_workspace(
        FRESH,
        "cd /run/tmp/ws && ls && cat f && stat -c %a f",
        false,
        &[
            "--root",
            "--",
            "sh",
            "-c",
            "mount -o remount,rw /workspace && grep ' /workspace ' /proc/mounts; \
             for op in 'echo x > f' 'echo x >> f' 'touch g' 'mkdir d' 'rm f' \
                       'mv f h' 'chmod 777 f' 'ln -s f s' 'truncate -s 0 f'; do \
               sh -c \"$op\" 2>/dev/null && echo \"WROTE: $op\"; \
             done; echo done",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains(" rw,"),
        "remount did not happen: {}",
        run.stdout
    );
    assert!(!run.stdout.contains("WROTE"), "{}", run.stdout);
    assert!(run.stdout.ends_with("done\n"), "{}", run.stdout);
    assert_eq!(run.after_lines(), ["f", "original", "644"]);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn symlinks_dotdot_and_hard_links_do_not_leave_the_share() {
    let setup = format!(
        "{FRESH} && cd /run/tmp/ws && ln -s /run/tmp/outside/secret abs && \
         ln -s ../outside/secret rel && ln -s /run/tmp/outside absdir"
    );
    let run = run_in_workspace(
        &setup,
        "cat /run/tmp/outside/secret; ls /run/tmp/outside; ls /run/tmp/ws",
        false,
        &[
            "--write",
            "--root",
            "--",
            "sh",
            "-c",
            "cat abs rel absdir/secret ../outside/secret /workspace/../outside/secret \
                 /workspace/../../run/tmp/outside/secret 2>/dev/null; \
             echo pwned > abs; echo pwned > rel; echo pwned > absdir/new; \
             ln /etc/passwd /workspace/pw 2>/dev/null && echo LINKED; \
             ln abs hard && readlink hard; echo done",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(!run.stdout.contains("OUTSIDE-SECRET"), "{}", run.stdout);
    assert!(!run.stdout.contains("LINKED"), "{}", run.stdout);
    // A hard link to a symlink is another symlink with the same target,
    // resolved in the guest like the first.
    assert_eq!(run.stdout, "/run/tmp/outside/secret\ndone\n");
    let after = run.after_lines();
    assert_eq!(after[0], "OUTSIDE-SECRET", "{after:?}");
    assert_eq!(after[1], "secret", "nothing new outside: {after:?}");
    assert!(!after.contains(&"pw"), "{after:?}");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn device_nodes_can_neither_be_made_nor_opened() {
    // Guest root asks for /dev/mem's numbers in a writable share; the host
    // must not get such a node, and a node already on the host must not
    // open the guest's device (nodev).
    let host_node = if caller_uid() == 0 {
        " && mknod /run/tmp/ws/hostnull c 1 3"
    } else {
        ""
    };
    let setup = format!("{FRESH}{host_node}");
    let run = run_in_workspace(
        &setup,
        "ls /run/tmp/ws",
        false,
        &[
            "--write",
            "--root",
            "--",
            "sh",
            "-c",
            "mknod mem c 1 1 2>/dev/null && echo MADE; \
             [ -e hostnull ] && { echo x > hostnull 2>/dev/null && echo OPENED; }; \
             mkfifo fifo && echo fifo ok",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(!run.stdout.contains("MADE"), "{}", run.stdout);
    assert!(!run.stdout.contains("OPENED"), "{}", run.stdout);
    assert!(
        !run.after_lines().contains(&"mem"),
        "{:?}",
        run.after_lines()
    );
}

/// The flip for the symlink race: on the host, d alternates between a real
/// directory (secret: INSIDE) and a symlink to the outside directory
/// (`../outside`: on the host that is /run/tmp/outside, in the guest
/// /outside, where nothing is unless a test mounts it) until
/// the after script stops it, counting its rounds; it runs for the whole
/// of mvm's run, whatever the guest's speed.
const FLIPPER: &str = "cd /run/tmp/ws && mkdir real && echo INSIDE >real/secret && \
     ln -s ../outside link && mv real d && \
     (i=0; while [ ! -e /run/tmp/stop ]; do \
        mv d real; mv link d; mv d link; mv real d; i=$((i+1)); echo $i >/run/tmp/flips; done; \
        : >/run/tmp/flipper.done) >/dev/null 2>&1 </dev/null &";

/// After mvm: whether the flipper was still going (it ends only when told
/// to), then stops it, waits for it to end (an event, with a generous
/// bound) and says how many rounds it made.
const FLIPS: &str =
    "[ -e /run/tmp/flipper.done ] && echo 'flipper: ended early' || echo 'flipper: running'; \
     touch /run/tmp/stop; i=0; while [ ! -e /run/tmp/flipper.done ] && [ $i -lt 300 ]; do \
     sleep 0.1; i=$((i+1)); done; echo \"flips: $(cat /run/tmp/flips)\"";

/// Reads d/secret over and over in the guest, counting each outcome: at
/// least 300 reads, and on (up to 20000) until it has seen both INSIDE and
/// a failure. Only shell builtins in the loop (`read` with a redirect
/// opens the path through virtio-fs like `cat` would): a fork and exec
/// per read in the nested guest made 300 reads take minutes while the
/// flipper shared the test host's one CPU, past the time limit in CI.
const READER: &str = "{ i=0; inside=0; failed=0; \
     while [ $i -lt 20000 ] && { [ $i -lt 300 ] || [ $inside = 0 ] || [ $failed = 0 ]; }; do \
       if read -r line <d/secret; then echo \"$line\"; [ \"$line\" != INSIDE ] || inside=1; \
       else echo FAILED; failed=1; fi; i=$((i+1)); \
     done; } 2>/dev/null | sort | uniq -c";

/// The count of `what` lines in the reader's `uniq -c` output.
fn reads(stdout: &str, what: &str) -> u32 {
    stdout
        .lines()
        .find_map(|l| l.trim().strip_suffix(what)?.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn swapping_a_directory_for_a_symlink_during_lookups_never_escapes() {
    // Every read sees INSIDE or fails (the symlink resolves in the guest,
    // to a /outside that does not exist there); none sees the outside.
    let setup = format!("{FRESH} && rm -f /run/tmp/stop /run/tmp/flipper.done && {FLIPPER}");
    let run = run_in_workspace_for(
        RACE_TIMEOUT,
        &setup,
        FLIPS,
        false,
        // Writable, so the guest caches lookups for 1 s (virtiofsd's
        // auto) and keeps looking the path up while the host flips it: a
        // read-only share of `mvm run` is cached for the run, and the
        // guest would never ask again.
        &["--write", "--", "sh", "-c", READER],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(!run.stdout.contains("OUTSIDE"), "{}", run.stdout);
    // The race ran: the guest saw both states while the host kept flipping.
    let (inside, failed) = (reads(&run.stdout, "INSIDE"), reads(&run.stdout, "FAILED"));
    assert!(
        inside > 0 && failed > 0,
        "the guest did not see both states (INSIDE {inside}, failed {failed}): {}",
        run.stdout
    );
    let after = run.after_lines();
    let flips = after
        .iter()
        .find_map(|l| l.strip_prefix("flips: "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        after.contains(&"flipper: running") && flips > 0,
        "the flipper was not running until the end: {after:?}"
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn the_symlink_race_would_show_a_reachable_outside() {
    // Positive control for the test above: the same race and reader, but
    // the outside directory shared at the path the symlink names in the
    // guest, so following it does reach it: the reader must then see it.
    let setup = format!("{FRESH} && rm -f /run/tmp/stop /run/tmp/flipper.done && {FLIPPER}");
    let run = run_in_workspace_for(
        RACE_TIMEOUT,
        &setup,
        FLIPS,
        false,
        &[
            // Writable, as above: the guest must keep looking it up.
            "--write",
            "--mount",
            "/run/tmp/outside:/outside",
            "--",
            "sh",
            "-c",
            READER,
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        reads(&run.stdout, "OUTSIDE-SECRET") > 0,
        "the reader never saw the outside through the symlink: {}",
        run.stdout
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn extra_mounts_are_read_only_unless_rw() {
    let setup = format!(
        "{FRESH} && rm -rf /run/tmp/a /run/tmp/b && mkdir /run/tmp/a /run/tmp/b && \
         echo A >/run/tmp/a/a"
    );
    let run = run_in_workspace(
        &setup,
        "cat /run/tmp/b/b",
        false,
        &[
            "--mount",
            "/run/tmp/a:/mnt/a",
            "--mount",
            "/run/tmp/b:/mnt/b:rw",
            "--",
            "sh",
            "-c",
            "cat /mnt/a/a; echo no > /mnt/a/x 2>/dev/null || echo a is ro; echo B > /mnt/b/b; \
             for m in /workspace /mnt/a /mnt/b; do \
             dev=$(awk -v m=$m '$5 == m {print $3}' /proc/self/mountinfo); \
             echo \"$m readahead $(cat /sys/class/bdi/$dev/read_ahead_kb)\"; done",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Each share reads ahead one FUSE request's most (guest-init's
    // SHARE_READAHEAD_KB), not the kernel's 128 KiB.
    assert_eq!(
        run.stdout,
        "A\na is ro\n/workspace readahead 1024\n/mnt/a readahead 1024\n/mnt/b readahead 1024\n"
    );
    assert_eq!(run.after_lines(), ["B"]);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn killing_mvm_leaves_no_virtiofsd_behind() {
    let run = mvm_with(
        &Options {
            setup: Some(FRESH),
            signal: Some("KILL @ready"),
            // The test host's own leftover check has already waited for
            // helpers to go; this looks again, by name.
            after: Some(
                "for p in /proc/[0-9]*; do \
                 [ \"$(cat $p/comm 2>/dev/null)\" = virtiofsd ] && echo \"alive ${p#/proc/}\"; \
                 done; echo checked",
            ),
            ..Options::default()
        },
        &[
            "run",
            "--workspace",
            "/run/tmp/ws",
            "--",
            "sh",
            "-c",
            "echo ready; sleep 60",
        ],
    );
    assert_eq!(run.code, Some(137), "{}", run.stderr);
    assert_eq!(run.after_lines(), ["checked"]);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_share_guest_init_cannot_mount_fails_the_run_with_its_reason() {
    // The mount point would have to be made inside the read-only workspace.
    let run = run_in_workspace(
        FRESH,
        "true",
        false,
        &["--mount", "/run/tmp/outside:/workspace/sub", "--", "true"],
    );
    assert_eq!(run.code, Some(125), "{}", run.stderr);
    // The agent mounts the shares (the first Exec's setup) and says why
    // it could not, in one line.
    let stderr = run.mvm_stderr();
    assert!(
        stderr.contains(
            "mvm: cannot set up the machine: cannot mount shared directory mvm1 at /workspace/sub: Read-only file system"
        ),
        "{stderr}"
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_backend_that_dies_stops_the_vm_with_its_own_error() {
    // virtiofsd killed while the guest runs (once the command says it has
    // started): file operations would wait forever, so mvm stops the VM
    // and says why (exit 123), well before the command would end.
    let run = mvm_with(
        &Options {
            setup: Some(FRESH),
            after: Some("true"),
            signal: Some("KILL @ready virtiofsd"),
            ..Options::default()
        },
        &[
            "run",
            "--workspace",
            "/run/tmp/ws",
            "--",
            "sh",
            "-c",
            "echo ready; sleep 30; cat f",
        ],
    );
    assert_eq!(run.code, Some(123), "{}", run.stderr);
    let stopped = run
        .signal_to_exit()
        .unwrap_or_else(|| panic!("no signal timing from the test host: {}", run.stderr));
    assert!(stopped < 25.0, "mvm stopped {stopped:.1} s after the kill");
    assert!(
        run.mvm_stderr()
            .contains("the virtio-fs backend (virtiofsd) closed its connection"),
        "{}",
        run.stderr
    );
}
