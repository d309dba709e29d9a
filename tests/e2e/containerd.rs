//! containerd for real: Debian's containerd, its runc shim and ctr
//! (build/containerd, scripts/bundle-containerd.sh) started in the test
//! host by tests/e2e/peers/containerd.sh, the suite's two-layer test image
//! and then the project's default image (Debian, an OCI layout that `make`
//! builds) imported with `ctr image import`, then `ctr run --runc-binary
//! mvm-oci` runs commands in mvm microVMs through the shim, the way a cluster's
//! RuntimeClass would (docs/kubernetes.md). The control for "it ran in
//! mvm's guest" is the test host's own kernel command line, read by the
//! same script: it has no `mvm.agent`. (runc cannot be the control here:
//! the test-host kernel lacks the namespaces, cgroup controllers and BPF
//! it needs, and adding them made the guest of battery check 5 through a
//! sandbox thrash instead of meeting its OOM killer; docs/testing.md.)

use mvm_e2e::{build_dir, mvm_with, repo_root, Options};

/// ctr with the test's containerd, the image and the runtime `rt`.
const CTR: &str = "/mvm/containerd/bin/ctr";
const IMAGE: &str = "mvm-test/layers:layers";

/// The project's default image (`make`'s Debian, an OCI layout under
/// build/), imported as an OCI archive under this name.
const DEFAULT_IMAGE: &str = "mvm/default:debian-bookworm";

fn run_cmd(rt: &str, id: &str, extra: &str, script: &str) -> String {
    run_image(rt, id, extra, IMAGE, script)
}

fn run_image(rt: &str, id: &str, extra: &str, image: &str, script: &str) -> String {
    format!(
        "{CTR} run --rm --snapshotter native --runc-binary {rt} {extra} {image} {id} sh -c '{script}'"
    )
}

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn ctr_runs_kills_and_removes_containers_in_mvm_microvms() {
    // The suite's two-layer test image, made here (its own directory: the
    // image suite remakes its own).
    let dir = repo_root().join("target/e2e-containerd");
    let _ = std::fs::remove_dir_all(&dir);
    let status =
        std::process::Command::new(repo_root().join("tests/e2e/images/make-test-image.sh"))
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run make-test-image.sh");
    assert!(status.success(), "make-test-image.sh failed");
    let layout = dir.join("oci");
    let mvm = "/mvm/bin/mvm-oci";
    // What tells the runtimes apart: mvm's guest kernel has mvm's own
    // command line; /keep/new is the image's second layer.
    let probe =
        "cat /keep/new; uname -r; grep -c mvm.agent /proc/cmdline; echo to-stderr >&2; exit 3";
    let trap =
        "trap \"echo got-term; exit 9\" TERM; touch /share/ready; while true; do sleep 1; done";
    let share = "--mount type=bind,src=/run/tmp/ctd/share,dst=/share,options=rbind:rw";
    // Processes joined to the running container: one that says where it
    // runs and exits, one that waits for its signal.
    let exec_probe =
        "cat /keep/new; uname -r; grep -c mvm.agent /proc/cmdline; echo exec-to-stderr >&2; exit 5";
    let exec_trap =
        "trap \"echo exec-got-term; exit 4\" TERM; touch /share/e2; while true; do sleep 1; done";
    // The default image: Debian's own files and tools, in mvm's guest.
    let default_probe =
        "cat /etc/debian_version; python3 --version; git --version; grep -c mvm.agent /proc/cmdline";
    let script = format!(
        "set -u\n\
         mount -o remount,size=2600M /run\n\
         sh tests/e2e/peers/containerd.sh {layout} || exit 1\n\
         export CONTAINERD_ADDRESS=/run/tmp/ctd/containerd.sock CONTAINERD_NAMESPACE=mvm\n\
         mkdir -p /run/tmp/ctd/share\n\
         {run_mvm} >/run/tmp/ctd/out 2>/run/tmp/ctd/err; echo \"mvm-status=$?\"\n\
         sed 's/^/mvm-out:/' /run/tmp/ctd/out; sed 's/^/mvm-err:/' /run/tmp/ctd/err\n\
         echo \"host-cmdline-mvm-agent=$(grep -c mvm.agent /proc/cmdline)\"\n\
         {CTR} run -d --snapshotter native --runc-binary {mvm} {share} {IMAGE} c-kill sh -c '{trap}'\n\
         i=0; while [ ! -e /run/tmp/ctd/share/ready ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n\
         echo \"ready=$(test -e /run/tmp/ctd/share/ready && echo yes || echo no)\"\n\
         {CTR} task ls | grep c-kill | sed 's/^/task-before:/'\n\
         {CTR} task exec --exec-id e1 c-kill sh -c '{exec_probe}' >/run/tmp/ctd/eout 2>/run/tmp/ctd/eerr; echo \"exec-status=$?\"\n\
         sed 's/^/exec-out:/' /run/tmp/ctd/eout; sed 's/^/exec-err:/' /run/tmp/ctd/eerr\n\
         {CTR} task exec --exec-id e2 c-kill sh -c '{exec_trap}' >/run/tmp/ctd/e2out 2>&1 & e2=$!\n\
         i=0; while [ ! -e /run/tmp/ctd/share/e2 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n\
         {CTR} task kill --exec-id e2 c-kill; echo \"exec-kill=$?\"\n\
         wait $e2; echo \"e2-status=$?\"; sed 's/^/e2-out:/' /run/tmp/ctd/e2out\n\
         {CTR} task kill c-kill; echo \"kill=$?\"\n\
         i=0; until {CTR} task ls | grep -q 'c-kill.*STOPPED' || [ $i -ge 300 ]; do sleep 0.1; i=$((i+1)); done\n\
         {CTR} task ls | grep c-kill | sed 's/^/task-after:/'\n\
         {CTR} task rm c-kill 2>&1 | sed 's/^/task-rm:/'\n\
         {CTR} container rm c-kill; echo \"container-rm=$?\"\n\
         echo \"tasks=$({CTR} task ls -q | wc -l) containers=$({CTR} container ls -q | wc -l)\"\n\
         tar -C ${{MVM_BUILD:-/mvm}}/share/mvm/images/debian -cf /run/tmp/ctd/default.tar . \
           && {CTR} image import --snapshotter native --base-name mvm/default /run/tmp/ctd/default.tar >/dev/null\n\
         echo \"default-import=$?\"; rm -f /run/tmp/ctd/default.tar\n\
         {run_default} >/run/tmp/ctd/dout 2>&1; echo \"default-status=$?\"\n\
         sed 's/^/default-out:/' /run/tmp/ctd/dout\n\
         kill $(cat /run/tmp/ctd/containerd.pid)\n",
        layout = layout.display(),
        run_mvm = run_cmd(mvm, "c-mvm", "", probe),
        run_default = run_image(mvm, "c-default", "", DEFAULT_IMAGE, default_probe),
    );
    let run = mvm_with(
        &Options {
            setup: Some(&script),
            testhost_timeout: Some(700),
            // The default image unpacked twice by the native snapshotter
            // (the image's snapshot and the container's copy of it, 490
            // MiB each) and its archive: more than 2 GiB's tmpfs holds.
            env: &[("MVM_TESTHOST_MEMORY", "3072")],
            ..Options::default()
        },
        &["--version"],
    );
    // --version ran, and nothing of mvm's was left behind by the setup's
    // containers (the wrapper's leftover check).
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines = run.setup_lines();
    let has = |l: &str| lines.contains(&l);
    assert!(has("containerd=ready"), "{lines:#?}");
    let release = std::fs::read_to_string(build_dir().join("share/mvm/kernel.release")).unwrap();
    // In mvm's VM: the image's file, the guest kernel and its command
    // line, the command's stderr apart, its exit status through ctr.
    assert!(has("mvm-status=3"), "{lines:#?}");
    for want in [
        "mvm-out:new",
        &format!("mvm-out:{}", release.trim()),
        "mvm-out:1",
        "mvm-err:to-stderr",
    ] {
        assert!(has(want), "no {want} in {lines:#?}");
    }
    // The control: the same grep on the test host's own command line
    // finds none, so the 1 above is the guest's.
    assert!(has("host-cmdline-mvm-agent=0"), "{lines:#?}");
    // A detached container: running, processes exec'd into it, killed
    // (its trap's status), removed, nothing left.
    assert!(has("ready=yes"), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("task-before:c-kill") && l.ends_with("RUNNING")),
        "{lines:#?}"
    );
    // `ctr task exec`: in the container's VM (the image's file, the guest
    // kernel and its command line), stderr apart, its own exit status.
    assert!(has("exec-status=5"), "{lines:#?}");
    for want in [
        "exec-out:new",
        &format!("exec-out:{}", release.trim()),
        "exec-out:1",
        "exec-err:exec-to-stderr",
    ] {
        assert!(has(want), "no {want} in {lines:#?}");
    }
    // `ctr task kill --exec-id`: SIGTERM reaches the exec'd process, whose
    // trap decides its status, while the container runs on.
    assert!(has("exec-kill=0"), "{lines:#?}");
    assert!(has("e2-out:exec-got-term"), "{lines:#?}");
    assert!(has("e2-status=4"), "{lines:#?}");
    assert!(has("kill=0"), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("task-after:c-kill") && l.ends_with("STOPPED")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("task-rm:") && l.contains("exit code 9")),
        "{lines:#?}"
    );
    assert!(has("container-rm=0"), "{lines:#?}");
    assert!(has("tasks=0 containers=0"), "{lines:#?}");
    // The project's default image, imported as an OCI archive, runs in
    // mvm's guest (its command line; the control above).
    assert!(has("default-import=0"), "{lines:#?}");
    assert!(has("default-status=0"), "{lines:#?}");
    let default_out: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("default-out:"))
        .collect();
    assert!(
        matches!(
            default_out[..],
            [debian, python, git, "1"]
                if debian.starts_with("12.")
                    && python.starts_with("Python 3.")
                    && git.starts_with("git version")
        ),
        "{lines:#?}"
    );
}
