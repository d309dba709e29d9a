//! `mvm oci` (as `mvm-oci`, the name a shim's BinaryName gives) driven the
//! way containerd's runc shim drives a runtime: tests/e2e/peers/oci_shim.rs
//! (built here with rustc) becomes a child subreaper, creates, starts,
//! signals, waits for and deletes a container made from a bundle this
//! test writes, all inside the test host. The bundle's root is a
//! directory (a static busybox and a marker with a nonce), so the
//! container's output can only come from that root in the VM.

use std::path::PathBuf;
use std::sync::OnceLock;

use mvm_e2e::{build_dir, build_peer, mvm_with, repo_root, Options, Run};

fn work_dir() -> PathBuf {
    let dir = repo_root().join("target/e2e-oci");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The shim stand-in, built once.
fn shim() -> &'static str {
    static BUILT: OnceLock<String> = OnceLock::new();
    BUILT.get_or_init(|| build_peer("oci_shim.rs").display().to_string())
}

/// A bundle's config.json with `args` as its process.
fn config(args: &[&str]) -> String {
    serde_json::json!({
        "ociVersion": "1.0.2",
        "root": {"path": "rootfs", "readonly": true},
        "process": {
            "args": args,
            "env": ["PATH=/bin", "FROM_BUNDLE=yes"],
            "cwd": "/",
            "user": {"uid": 0, "gid": 0},
            "terminal": false
        },
        "hostname": "oci-box",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
            {"destination": "/data", "type": "bind", "source": "data", "options": ["rbind", "ro"]}
        ],
        "linux": {
            "resources": {"memory": {"limit": 268435456i64}},
            "namespaces": [{"type": "pid"}, {"type": "mount"}]
        }
    })
    .to_string()
}

/// The setup script: a bundle at /run/tmp/oci/NAME for each config file.
fn make_bundles(nonce: &str, configs: &[(&str, String)]) -> String {
    let dir = work_dir();
    let mut script = String::from("set -e; rm -rf /run/tmp/oci; mkdir -p /run/tmp/oci\n");
    for (name, json) in configs {
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, json).unwrap();
        let b = format!("/run/tmp/oci/{name}");
        script.push_str(&format!(
            "mkdir -p {b}/rootfs/bin {b}/rootfs/etc {b}/data && cp /bin/busybox {b}/rootfs/bin/ \
             && ln -s busybox {b}/rootfs/bin/sh && echo {nonce} > {b}/rootfs/etc/marker \
             && echo data-{nonce} > {b}/data/f && cp {} {b}/config.json\n",
            file.display()
        ));
    }
    script.push_str("set +e\n");
    script
}

fn call(setup: &str) -> Run {
    mvm_with(
        &Options {
            setup: Some(setup),
            testhost_timeout: Some(300),
            ..Options::default()
        },
        &["--version"],
    )
}

fn value<'a>(lines: &[&'a str], key: &str) -> &'a str {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {lines:#?}"))
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn a_shim_creates_starts_waits_for_and_deletes_a_container() {
    let nonce = format!("{:x}", std::process::id() as u64 * 104_729 + 3);
    let shim = shim();
    let rt = "/mvm/bin/mvm-oci";
    let script = "cat /etc/marker; cat /data/f; echo env=$FROM_BUNDLE; \
                  uname -r; cat /proc/sys/kernel/hostname; echo to-stderr >&2; exit 3";
    let killed = "trap 'echo got-term; exit 7' TERM; echo ready; while true; do sleep 1; done";
    let on_tty = "echo tty-main; stty size; [ -t 0 ] && [ -t 1 ] && echo main-on-tty; \
                  echo main-waits; read line; echo main-got-$line; exit 2";
    let mut tty: serde_json::Value = serde_json::from_str(&config(&["sh", "-c", on_tty])).unwrap();
    tty["process"]["terminal"] = true.into();
    let mut setup = make_bundles(
        &nonce,
        &[
            ("exit", config(&["sh", "-c", script])),
            ("kill", config(&["sh", "-c", killed])),
            ("crash", config(&["sh", "-c", killed])),
            ("tty", tty.to_string()),
        ],
    );
    setup.push_str(&format!(
        "{shim} {rt} /run/tmp/oci/root /run/tmp/oci/exit c-exit | sed 's/^/exit:/'\n\
         {shim} {rt} /run/tmp/oci/root /run/tmp/oci/kill c-kill TERM | sed 's/^/kill:/'\n\
         {shim} {rt} /run/tmp/oci/root /run/tmp/oci/crash c-crash KILL | sed 's/^/crash:/'\n\
         {shim} {rt} /run/tmp/oci/root /run/tmp/oci/tty c-tty tty | sed 's/^/tty:/'\n"
    ));
    let run = call(&setup);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines = run.setup_lines();
    let of = |prefix: &str| -> Vec<&str> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(prefix))
            .collect()
    };
    let exit = of("exit:");
    assert_eq!(value(&exit, "create"), "0", "{exit:#?}");
    assert_eq!(value(&exit, "state-before-start"), "created");
    assert_eq!(value(&exit, "state-pid-matches"), "true");
    assert_eq!(value(&exit, "start").trim(), "0");
    assert!(value(&exit, "start-again").starts_with("1 "), "{exit:#?}");
    assert_eq!(value(&exit, "state-after-start"), "running");
    let pid = value(&exit, "pid-file");
    assert_eq!(value(&exit, "ps"), format!("0 [{pid}]"));
    assert!(
        value(&exit, "exec-before-start").starts_with("1 mvm oci: container c-exit is not running"),
        "{exit:#?}"
    );
    // The output: the root's nonce, the bind mount, the bundle's env, the
    // guest kernel (not the test host's), the bundle's hostname.
    let release = std::fs::read_to_string(build_dir().join("share/mvm/kernel.release")).unwrap();
    let out: Vec<&str> = exit.iter().filter_map(|l| l.strip_prefix("out:")).collect();
    assert_eq!(
        out,
        [
            nonce.as_str(),
            &format!("data-{nonce}"),
            "env=yes",
            release.trim(),
            "oci-box"
        ],
        "{exit:#?}"
    );
    assert!(exit.contains(&"err:to-stderr"), "{exit:#?}");
    // The shim's wait: the container's status is the command's.
    assert_eq!(value(&exit, "waited"), "true");
    assert_eq!(value(&exit, "exit"), "3", "{exit:#?}");
    assert_eq!(value(&exit, "state-after-exit"), "stopped");
    assert_eq!(value(&exit, "delete").trim(), "0");
    assert!(value(&exit, "state-after-delete")
        .starts_with("1 mvm oci: container c-exit does not exist"));
    assert_eq!(value(&exit, "dir-after-delete"), "false");

    // exec --detach in the running container: the process runs in the
    // container's VM (the root's nonce, the process's own env, the
    // bundle's hostname), its stdout and stderr come apart through the
    // runtime's, and the pid-file's process ends with its status.
    let kill = of("kill:");
    assert_eq!(value(&kill, "exec"), "0", "{kill:#?}");
    let exec_out: Vec<&str> = kill
        .iter()
        .filter_map(|l| l.strip_prefix("exec-out:"))
        .collect();
    assert_eq!(
        exec_out,
        [nonce.as_str(), "exec-env=yes", "oci-box"],
        "{kill:#?}"
    );
    assert!(kill.contains(&"exec-err:exec-err"), "{kill:#?}");
    assert_eq!(value(&kill, "exec-waited"), "true", "{kill:#?}");
    assert_eq!(value(&kill, "exec-exit"), "6", "{kill:#?}");

    // kill reaches the command in the guest, whose trap decides the status.
    assert_eq!(value(&kill, "kill").trim(), "0", "{kill:#?}");
    assert!(kill.contains(&"out:got-term"), "{kill:#?}");
    assert_eq!(value(&kill, "exit"), "7", "{kill:#?}");
    assert_eq!(value(&kill, "delete").trim(), "0");

    // SIGKILL ends the VMM (as a crash of it would): the shim sees the
    // signal, and the state is stopped at once; the wrapper's leftover
    // check finds no virtiofsd or session directory behind it.
    let crash = of("crash:");
    assert_eq!(value(&crash, "kill").trim(), "0", "{crash:#?}");
    assert_eq!(value(&crash, "signal"), "9", "{crash:#?}");
    assert_eq!(value(&crash, "state-after-exit"), "stopped");
    assert_eq!(value(&crash, "delete").trim(), "0");

    // process.terminal: the pty's controlling end comes over the console
    // socket; the command in the guest is on a terminal (24x80: the shim
    // set no size), reads a line typed on that pty, and its status is the
    // container's. An exec --tty gets a pty of its own, with its
    // consoleSize.
    let tty = of("tty:");
    assert_eq!(value(&tty, "create"), "0", "{tty:#?}");
    assert_eq!(value(&tty, "start").trim(), "0", "{tty:#?}");
    for want in [
        "main:tty-main",
        "main:24 80",
        "main:main-on-tty",
        "main:main-got-typed",
    ] {
        assert!(tty.contains(&want), "no {want} in {tty:#?}");
    }
    assert_eq!(value(&tty, "exec").trim(), "0", "{tty:#?}");
    assert!(tty.contains(&"exec:30 100"), "{tty:#?}");
    assert!(tty.contains(&"exec:exec-on-tty"), "{tty:#?}");
    assert_eq!(value(&tty, "exec-waited"), "true", "{tty:#?}");
    assert_eq!(value(&tty, "exec-exit"), "5", "{tty:#?}");
    assert_eq!(value(&tty, "waited"), "true", "{tty:#?}");
    assert_eq!(value(&tty, "exit"), "2", "{tty:#?}");
    assert_eq!(value(&tty, "delete").trim(), "0", "{tty:#?}");
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn bad_bundles_and_a_forced_delete_leave_nothing() {
    let nonce = "bad";
    let mut missing_source: serde_json::Value = serde_json::from_str(&config(&["true"])).unwrap();
    missing_source["mounts"][2]["source"] = "absent".into();
    let mut version: serde_json::Value = serde_json::from_str(&config(&["true"])).unwrap();
    version["ociVersion"] = "9.9.9".into();
    let mut setup = make_bundles(
        nonce,
        &[
            ("norootfs", config(&["true"])),
            ("badjson", "{\"ociVersion\": ".into()),
            ("version", version.to_string()),
            ("mount", missing_source.to_string()),
            ("sleep", config(&["sleep", "1000"])),
        ],
    );
    let rt = "/mvm/bin/mvm-oci --root /run/tmp/oci/root";
    setup.push_str("rm -rf /run/tmp/oci/norootfs/rootfs\n");
    for name in ["norootfs", "badjson", "version", "mount"] {
        setup.push_str(&format!(
            "{rt} create --bundle /run/tmp/oci/{name} c-{name} 2>/run/tmp/oci/err; \
             echo \"{name}: status=$? lines=$(wc -l < /run/tmp/oci/err) left=$(ls /run/tmp/oci/root 2>/dev/null | wc -l) $(cat /run/tmp/oci/err)\"\n"
        ));
    }
    // A created container that is never started: delete refuses without
    // --force, and with it kills the waiting process.
    setup.push_str(&format!(
        "{rt} create --bundle /run/tmp/oci/sleep --pid-file /run/tmp/oci/sleep.pid c-sleep; echo \"create=$?\"\n\
         pid=$(cat /run/tmp/oci/sleep.pid)\n\
         {rt} delete c-sleep 2>&1; echo \"delete=$?\"\n\
         {rt} delete --force c-sleep; echo \"force=$?\"\n\
         kill -0 $pid 2>/dev/null && echo alive=yes || echo alive=no\n\
         {rt} state c-sleep 2>&1; echo \"state=$?\"\n\
         {rt} delete --force c-sleep; echo \"force-again=$?\"\n"
    ));
    let run = call(&setup);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines = run.setup_lines();
    let line = |name: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} in {lines:#?}"))
            .to_string()
    };
    for (name, says) in [
        (
            "norootfs",
            "root.path /run/tmp/oci/norootfs/rootfs is not a directory",
        ),
        ("badjson", "cannot read /run/tmp/oci/badjson/config.json"),
        ("version", "unsupported ociVersion \"9.9.9\""),
        (
            "mount",
            "mount at /data: source /run/tmp/oci/mount/absent does not exist",
        ),
    ] {
        let l = line(name);
        assert!(l.contains("status=1 lines=1 left=0 mvm oci: "), "{l}");
        assert!(l.contains(says), "{l}");
    }
    assert!(lines.contains(&"create=0"), "{lines:#?}");
    assert!(
        lines.contains(&"mvm oci: container c-sleep is created: kill it first, or delete --force"),
        "{lines:#?}"
    );
    assert!(lines.contains(&"delete=1"), "{lines:#?}");
    assert!(lines.contains(&"force=0"), "{lines:#?}");
    assert!(lines.contains(&"alive=no"), "{lines:#?}");
    assert!(
        lines.contains(&"mvm oci: container c-sleep does not exist"),
        "{lines:#?}"
    );
    assert!(lines.contains(&"state=1"), "{lines:#?}");
    assert!(lines.contains(&"force-again=0"), "{lines:#?}");
}
