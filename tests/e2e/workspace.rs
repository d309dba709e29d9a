//! The workspace through virtio-fs (virtiofsd behind a vhost-user
//! frontend): read-only unless asked, enforced by the host side, no way
//! out of a shared directory, files owned by the caller, extra mounts.
//!
//! Each test prepares its directories with a setup script on the machine
//! mvm runs on (the test host's own tmpfs, /run/tmp) and inspects them
//! afterwards with an after script, so what is checked is the host's view,
//! not the guest's.

use mvm_e2e::{caller_uid, mvm_with, Options, Run};

/// A fresh workspace with one file, and a directory beside it (outside the
/// share) holding a secret.
const FRESH: &str = "rm -rf /run/tmp/ws /run/tmp/outside && \
    mkdir -p /run/tmp/ws /run/tmp/outside && \
    echo original >/run/tmp/ws/f && \
    echo OUTSIDE-SECRET >/run/tmp/outside/secret";

fn run_in_workspace(setup: &str, after: &str, as_nobody: bool, args: &[&str]) -> Run {
    let mut full = vec!["run", "--workspace", "/run/tmp/ws"];
    full.extend_from_slice(args);
    mvm_with(
        &Options {
            setup: Some(setup),
            after: Some(after),
            as_nobody,
            ..Options::default()
        },
        &full,
    )
}

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
fn guest_sees_its_own_root_plus_the_mounts_never_the_hosts_files() {
    // A marker in the host's /etc/shadow when we may write it (root
    // caller in the test host, whose root is a throwaway tmpfs).
    let setup = format!(
        "{FRESH} && if [ \"$(id -u)\" = 0 ] && [ -f /io/argv ]; then \
         echo HOST-SHADOW >/etc/shadow; fi"
    );
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

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn swapping_a_directory_for_a_symlink_during_lookups_never_escapes() {
    // On the host, d flips between a real directory (secret: INSIDE) and a
    // symlink to the outside directory while the guest reads d/secret over
    // and over. Every read sees INSIDE or fails; none sees the outside.
    let setup = format!(
        "{FRESH} && cd /run/tmp/ws && mkdir real && echo INSIDE >real/secret && \
         ln -s /run/tmp/outside link && mv real d && \
         (i=0; while [ $i -lt 3000 ]; do \
            mv d real; mv link d; mv d link; mv real d; i=$((i+1)); done) \
            >/dev/null 2>&1 </dev/null &"
    );
    let run = run_in_workspace(
        &setup,
        "true",
        false,
        &[
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 300 ]; do cat d/secret 2>/dev/null; i=$((i+1)); done \
             | sort | uniq -c",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(!run.stdout.contains("OUTSIDE"), "{}", run.stdout);
    assert!(
        run.stdout.contains("INSIDE"),
        "the race never ran: {}",
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
            "cat /mnt/a/a; echo no > /mnt/a/x 2>/dev/null || echo a is ro; echo B > /mnt/b/b",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "A\na is ro\n");
    assert_eq!(run.after_lines(), ["B"]);
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn killing_mvm_leaves_no_virtiofsd_behind() {
    let run = mvm_with(
        &Options {
            setup: Some(FRESH),
            signal: Some("KILL 4"),
            after: Some(
                "sleep 1; for p in /proc/[0-9]*; do \
                 [ \"$(cat $p/comm 2>/dev/null)\" = virtiofsd ] && echo \"alive ${p#/proc/}\"; \
                 done; echo checked",
            ),
            ..Options::default()
        },
        &["run", "--workspace", "/run/tmp/ws", "--", "sleep", "60"],
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
    let stderr = run.mvm_stderr();
    assert!(
        stderr.contains("mvm: guest-init could not start the command"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "cannot mount shared directory mvm1 at /workspace/sub: Read-only file system"
        ),
        "{stderr}"
    );
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_backend_that_dies_stops_the_vm_with_its_own_error() {
    // virtiofsd killed while the guest runs: file operations would wait
    // forever, so mvm stops the VM and says why (exit 123).
    let setup =
        format!("{FRESH} && (sleep 5; killall -KILL virtiofsd) >/dev/null 2>&1 </dev/null &");
    let run = run_in_workspace(
        &setup,
        "true",
        false,
        &["--", "sh", "-c", "sleep 30; cat f"],
    );
    assert_eq!(run.code, Some(123), "{}", run.stderr);
    assert!(
        run.mvm_stderr()
            .contains("the virtio-fs backend (virtiofsd) closed its connection"),
        "{}",
        run.stderr
    );
}
