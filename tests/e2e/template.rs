//! Templates in `mvm run` end to end (docs/snapshots.md): the first run of
//! a machine copies it when guest-init is ready and writes it while its
//! command runs (which does not wait for the writes), later runs restore it,
//! with the default image and the workspace mounted after the restore,
//! and find guest-init listening (their first connection is taken). A
//! host connection left waiting in a template is reset by the restore,
//! and a command that joins a machine before its own run is refused.
//! Two restored runs are not twins; a damaged or truncated template is
//! dropped with a warning and the run boots cold (so is one whose memory
//! file was changed in place after it was verified); two runs that both
//! create the same template leave one whole template; `mvm snapshot ls`
//! and `rm` see and remove it. A restored run shares only the DMA bounce
//! pool and the rings with virtiofsd, and a read walks its vCPU's area of
//! the pool, not the whole; a template without a pool copies. A machine
//! that is never saved has no pool.
//! All in one test host (its tmpfs holds the templates).

use mvm_e2e::{build_peer, mvm_with, repo_root, Options};
use mvm_protocol::{ExecRequest, Hello, Message};

/// What a restored run prints: boot id, 16 random bytes, the guest's
/// clock, a line of the workspace, the image's Debian version, and the
/// boot id read again (the control: it is the boot's, not the read's).
const PROBE: &str = "cat /proc/sys/kernel/random/boot_id; head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s; head -1 /workspace/Cargo.toml; cat /etc/debian_version; cat /proc/sys/kernel/random/boot_id";

const AFTER: &str = r#"
PROBE=$PROBE
MVM=/mvm/bin/mvm; [ -x "$MVM" ] || MVM=build/bin/mvm
export MVM_NO_SNAPSHOT=0 MVM_TEMPLATES=/run/tmp/e2e-templates
T=$MVM_TEMPLATES
keys() { ls "$T" | grep -E '^[0-9a-f]{32}$'; }
key=$(keys | head -1)
echo "templates: $(keys | wc -l)"
echo "modes: $(stat -c %a "$T" "$T/$key" "$T/$key/memory" | tr '\n' ' ')"
for i in 1 2; do
  before=$(date +%s)
  $MVM run --print-stats -- sh -c "$PROBE" >/run/tmp/r$i.out 2>/run/tmp/r$i.err
  s=$?; after=$(date +%s)
  echo "run $i: status $s"
  echo "host clock $i: $before $after"
  sed "s/^/r$i: /" /run/tmp/r$i.out
  grep -h 'boot to init\|warning\|agent connection\|phase: .*\(guest\|template\|kvm opened\)' /run/tmp/r$i.err | sed "s/^/r$i err: /"
done
POOL='grep -o "swiotlb=[^ ]*" /proc/cmdline || echo none; dmesg | grep -c "software IO TLB: mapped"; grep MemTotal /proc/meminfo | tr -s " " | cut -d" " -f2'
$MVM run --root --no-snapshot --print-stats -- sh -c "$POOL" >/run/tmp/cold.out 2>/run/tmp/cold.err; echo "cold: status $? $(grep 'agent connection' /run/tmp/cold.err)"
echo "pool cold: $(tr '\n' ' ' </run/tmp/cold.out)"
echo "pool restored: $($MVM run --root --print-stats -- sh -c "$POOL" 2>/run/tmp/pr.err | tr '\n' ' ')restored $(grep -c 'restored from a template' /run/tmp/pr.err)"
echo "pool 4G: $($MVM run --root --no-snapshot --memory 4G -- sh -c "$POOL" | tr '\n' ' ')"
B=/run/tmp/bounce; mkdir -p "$B"; dd if=/dev/urandom of="$B/big" bs=1M count=6 2>/dev/null
echo "bounce host: $(sha256sum "$B/big" | cut -c1-64)"
$MVM run --root --print-stats --workspace "$B" -- sh -c 'for i in 1 2 3 4; do sha256sum big & done; wait; echo "pool errors $(dmesg | grep -c -e "buffer is full" -e "enqueue_req")"' 2>/run/tmp/b.err | sed 's/^/bounce guest: /'
echo "bounce: $(grep -c 'warning' /run/tmp/b.err) warning(s) restored $(grep -c 'restored from a template' /run/tmp/b.err)"

dd if=/dev/zero of="$B/big2" bs=1M count=10 2>/dev/null
vf_procs() {
  for p in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null <$p/cmdline | grep -q '^/[^ ]*virtiofsd' && echo $p
  done
}
pool_kib() {
  for p in $(vf_procs); do
    t=$(awk '/^[0-9a-f]+-[0-9a-f]+ /{m=/memfd:/} m&&/^Rss:/{t+=$2} END{print t+0}' $p/smaps 2>/dev/null)
    [ $t -gt 0 ] && echo $t
  done
}
walk() {
  s=$1; shift
  MVM_TEMPLATES=$s $MVM run --root --print-stats --workspace "$B" "$@" -- sh -c 'cat big big2 >/dev/null; dmesg | grep -o "area num [0-9]*" | tail -1; sleep 8' >$s.out 2>$s.err & p=$!
  i=0; until grep -q area $s.out 2>/dev/null || [ $i -ge 900 ]; do sleep 0.1; i=$((i+1)); done
  r=$(pool_kib); wait $p
  echo "$(cat $s.out), virtiofsd resident $r KiB, restored $(grep -c 'restored from a template' $s.err)"
}
echo "walk: $(walk "$T")"
A=/run/tmp/onearea; mkdir -p -m 700 "$A"
MVM_TEMPLATES=$A/t $MVM run --cmdline swiotlb=4096,1,force -- true 2>/dev/null
echo "one area: $(walk "$A/t" --cmdline swiotlb=4096,1,force)"
printf x | dd of="$T/$key/state.json" bs=1 seek=100 conv=notrunc 2>/dev/null
$MVM run -- true 2>/run/tmp/d.err; echo "damaged state: status $? $(grep -c 'unusable' /run/tmp/d.err) warning(s); again: $(keys | wc -l)"
truncate -s 4096 "$T/$key/memory"
$MVM run -- true 2>/run/tmp/t.err; echo "truncated memory: status $? $(grep -c 'unusable' /run/tmp/t.err) warning(s); again: $(keys | wc -l)"
$MVM run -- true 2>/run/tmp/u.err; echo "after the new one: status $? $(grep -c 'warning' /run/tmp/u.err) warning(s)"
printf x | dd of="$T/$key/memory" bs=1 seek=16777216 conv=notrunc 2>/dev/null
$MVM run -- true 2>/run/tmp/m.err; echo "altered memory: status $? $(grep -c 'memory does not match its checksum' /run/tmp/m.err) warning(s)"
rm -rf "$T"
$MVM run -- sh -c 'echo a' >/run/tmp/c1.out 2>&1 & p1=$!
$MVM run -- sh -c 'echo b' >/run/tmp/c2.out 2>&1 & p2=$!
wait $p1; s1=$?; wait $p2; s2=$?
echo "concurrent: $s1 $s2 $(cat /run/tmp/c1.out /run/tmp/c2.out | tr '\n' ' ')templates $(keys | wc -l) temporaries $(ls -a "$T" | grep -c tmp)"
$MVM run -- true; echo "restore after concurrent: status $?"
echo "ls: $($MVM snapshot ls | grep -c -E '^[0-9a-f]{32} ')"
$MVM snapshot rm --all >/dev/null; echo "rm: status $? left $(keys | wc -l)"

H=/run/tmp/hold; mkdir -p -m 700 "$H" "$H/xdg"
D="--cmdline mvm.ready_delay_ms=3000"
XDG_RUNTIME_DIR=$H/xdg MVM_TEMPLATES=$H/t $MVM run $D --console -- true 2>$H/first.err & p=$!
$PEER $H/xdg/mvm 1024 60 hold $H/t >$H/hold.out 2>&1; echo "hold: status $? $(tr '\n' ' ' <$H/hold.out)"
wait $p; echo "held first run: status $? $(grep -c 'ended before the host.s hello' $H/first.err)"
MVM_TEMPLATES=$H/t $MVM run $D --console --timeout 60 --print-stats -- echo after-hold >$H/r.out 2>$H/r.err
echo "held restore: status $? $(cat $H/r.out) restored $(grep -c 'boot to init: none' $H/r.err) stale $(grep -c 'ended before the host.s hello' $H/r.err)"

vf_kib() {
  for p in $(vf_procs); do
    t=0; for r in $(grep memfd: $p/maps 2>/dev/null | cut -d' ' -f1); do t=$((t + (0x${r#*-} - 0x${r%-*}) / 1024)); done
    [ $t -gt 0 ] && echo $t
  done
}
V=/run/tmp/view; mkdir -p -m 700 "$V"
MVM_TEMPLATES=$V/t $MVM run -- true 2>/dev/null
MVM_TEMPLATES=$V/t $MVM run -- sleep 5 & p=$!; sleep 3; r=$(vf_kib); wait $p
MVM_TEMPLATES=$V/t $MVM run --no-snapshot -- sleep 8 & p=$!; sleep 6; c=$(vf_kib); wait $p
echo "virtiofsd maps KiB: restored ${r:-none} cold ${c:-none}"
N=/run/tmp/nopool; mkdir -p -m 700 "$N"
MVM_TEMPLATES=$N/t $MVM run --cmdline swiotlb=noforce --console -- true 2>$N/first.err
MVM_TEMPLATES=$N/t $MVM run --cmdline swiotlb=noforce --print-stats -- head -1 /workspace/Cargo.toml >$N/out 2>$N/err
echo "no pool: status $? $(cat $N/out) guest $(grep -c 'logged no DMA bounce pool' $N/first.err) copied $(grep -c 'phase: .*guest memory copied from the template' $N/err) warned $(grep -c 'copied for virtiofsd' $N/err)"

E=/run/tmp/early; mkdir -p -m 700 "$E" "$E/xdg"
XDG_RUNTIME_DIR=$E/xdg MVM_TEMPLATES=$E/t $MVM run $D -- echo own-command >$E/out 2>$E/err & p=$!
$PEER $E/xdg/mvm 1024 60 send $FRAMES >$E/peer.out 2>&1; echo "early peer: status $? $(tr '\n' ' ' <$E/peer.out)"
wait $p; echo "early run: status $? $(cat $E/out)"
"#;

#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn runs_restore_the_template_the_first_run_saved_and_are_not_twins() {
    let after = AFTER
        .replacen("$PROBE", &format!("'{}'", PROBE.replace('\'', "'\\''")), 1)
        .replace("$PEER", &build_peer("vsock_peer.rs").display().to_string())
        .replace("$FRAMES", &early_exec_frames());
    let run = mvm_with(
        &Options {
            after: Some(&after),
            testhost_timeout: Some(400),
            env: &[
                ("MVM_NO_SNAPSHOT", "0"),
                ("MVM_TEMPLATES", "/run/tmp/e2e-templates"),
            ],
            ..Options::default()
        },
        &["run", "--print-stats", "--", "true"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("mvm: template "), "{}", run.stderr);
    assert!(run.stderr.contains(" saved in "), "{}", run.stderr);
    // The first run's command does not wait for the template's writes:
    // the guest is copied at its ready point, the command is sent, and a
    // thread of mvm's writes the copy meanwhile (it may finish before or
    // after the command: only its start after the copy is certain).
    let first: Vec<&str> = run
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("mvm: phase: "))
        .filter_map(|l| l.split_once(" ms ").map(|(_, name)| name))
        .collect();
    let at = |name: &str| first.iter().position(|p| *p == name);
    let (copied, sent, saved) = (
        at("template copied"),
        at("agent connected, command sent"),
        at("template saved"),
    );
    assert!(
        copied.is_some() && sent.is_some() && saved.is_some(),
        "the first run's timeline: {}",
        run.stderr
    );
    assert!(
        copied < sent && copied < saved,
        "the first run's timeline: {}",
        run.stderr
    );
    // Its boot mapped the loaded kernel and initramfs into the VM before
    // the vCPUs ran (the test host's KVM, Linux 6.12 with nested paging,
    // has KVM_PRE_FAULT_MEMORY).
    assert!(
        matches!(
            (at("vcpus configured"), at("guest memory pre-faulted")),
            (Some(configured), Some(mapped)) if configured < mapped
        ),
        "the first run's timeline: {}",
        run.stderr
    );
    // It mapped the bounce pool ahead where the guest's kernel put it
    // (vmm/src/machine/fs.rs, `expected_bounce_pool`: a guess from the
    // kernel's allocations, which another kernel or config can move; the
    // first run then pays for the pool's pages again).
    assert!(
        run.stderr
            .lines()
            .any(|l| l.starts_with("mvm: bounce pool mapped ahead at 0x")
                && l.ends_with(", where the guest put it")),
        "the first run's pool: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains("while the run went on"),
        "{}",
        run.stderr
    );
    let after = run.after_lines();
    let text = after.join("\n");
    let line = |prefix: &str| prefixed(&after, prefix);
    assert!(text.contains("templates: 1"), "{text}");
    assert!(text.contains("modes: 700 700 600"), "{text}");
    for i in 1..=2 {
        assert!(text.contains(&format!("run {i}: status 0")), "{text}");
        assert!(
            text.contains(&format!(
                "r{i} err: mvm: boot to init: none (restored from a template)"
            )),
            "run {i} was not restored: {text}"
        );
    }
    // The template holds guest-init listening (it listens before its
    // ready marker), so a restored run's first connection is taken. The
    // control: a cold run's first tries come before the agent listens
    // and are refused, and the count shows them.
    for i in 1..=2 {
        assert!(
            text.contains(&format!("r{i} err: mvm: agent connection: 1 try")),
            "run {i}'s connection: {text}"
        );
    }
    let cold_tries: u32 = line("cold: status 0 mvm: agent connection: ")
        .first()
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the cold run's connection: {text}"));
    assert!(cold_tries > 1, "the cold run's connection: {text}");
    // Only a machine that may become a template bounces its virtio-fs
    // buffers through a DMA pool: a cold run's kernel was told to make
    // none, logged none and has the pool's 8 MiB more RAM. The control,
    // a restored run (its kernel is the template's), shows that each of
    // the three is seen where it is. A cold guest of 4 GiB, whose RAM
    // reaches above 4 GiB, would get the kernel's default pool of 64 MiB
    // (and log it) if it were not told to make none.
    let pool = |which: &str| -> (String, u32, u64, String) {
        let l = line(&format!("pool {which}: "));
        let l = l.first().unwrap_or_else(|| panic!("pool {which}: {text}"));
        let f: Vec<&str> = l.split_whitespace().collect();
        assert!(f.len() >= 3, "pool {which}: {text}");
        let logged = f[1].parse().unwrap_or_else(|_| panic!("{text}"));
        let kib = f[2].parse().unwrap_or_else(|_| panic!("{text}"));
        (f[0].to_string(), logged, kib, f[3..].join(" "))
    };
    let (cold_param, cold_logged, cold_kib, _) = pool("cold");
    let (restored_param, restored_logged, restored_kib, restored) = pool("restored");
    let (big_param, big_logged, big_kib, _) = pool("4G");
    use mvm_protocol::boot::{BOUNCE_PARAM, NO_BOUNCE_PARAM};
    assert_eq!(
        (cold_param.as_str(), cold_logged),
        (NO_BOUNCE_PARAM, 0),
        "{text}"
    );
    assert_eq!(restored, "restored 1", "{text}");
    assert_eq!(
        (restored_param.as_str(), restored_logged),
        (BOUNCE_PARAM, 1),
        "{text}"
    );
    assert!(cold_kib >= restored_kib + (7 << 10), "{text}");
    assert_eq!(
        (big_param.as_str(), big_logged),
        (NO_BOUNCE_PARAM, 0),
        "{text}"
    );
    assert!(big_kib > 3 << 20, "{text}");
    // Where a restored run's time goes: the memory mapped, with the part
    // virtiofsd is given (a workspace is shared) shared, before the VM is
    // made (also where the test host's clock is too coarse to tell them
    // apart), then the guest's own steps in order, from its Exit.
    for i in 1..=2 {
        let phases: Vec<&str> = line(&format!("r{i} err: mvm: phase: "))
            .into_iter()
            .filter_map(|l| l.split_once(" ms ").map(|(_, name)| name))
            .collect();
        let order = [
            "template found",
            "guest memory mapped from the template, its virtio-fs windows shared",
            "kvm opened",
            "guest: clock set, entropy added and reseeded",
            "guest: image root mounted (overlay entered)",
            "guest: shares mounted",
            "guest: command started",
            "guest: command exited",
            "guest: status announced, file systems synced",
        ];
        let seen: Vec<&str> = phases
            .iter()
            .copied()
            .filter(|p| order.contains(p))
            .collect();
        assert_eq!(seen, order, "run {i}'s timeline: {text}");
        assert!(
            !text.contains(&format!("r{i} err: mvm: warning")),
            "run {i} warned: {text}"
        );
    }
    // What virtiofsd maps of guest memory: in a restored run the bounce
    // pool (8 MiB) and the rings, at most a few pages more; the control,
    // a cold run, where it maps all 512 MiB, shows the count sees it all.
    let view = line("virtiofsd maps KiB: restored ");
    let kib: Vec<u64> = view
        .first()
        .map(|l| {
            l.split(" cold ")
                .filter_map(|n| n.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        matches!(kib[..], [restored, 524288] if (8192..8192 + 256).contains(&restored)),
        "{text}"
    );
    // A template whose guest reported no bounce pool (booted with the
    // pool turned off, `swiotlb=noforce` after mvm's own parameter):
    // guest-init says so, the restore copies guest memory for virtiofsd
    // as it must, with a warning, and the workspace works.
    assert!(
        text.contains("no pool: status 0 [workspace] guest 1 copied 1 warned 1"),
        "{text}"
    );
    let (r1, r2) = (line("r1: "), line("r2: "));
    assert_eq!(r1.len(), 6, "{text}");
    assert_eq!(r2.len(), 6, "{text}");
    // The control for the boot ids: read twice in one run, the same one
    // (a file that changed on every read would tell two runs apart
    // whether or not they were twins).
    for r in [&r1, &r2] {
        assert_eq!(r[0], r[5], "a boot id that changes within a run: {text}");
    }
    assert_ne!(r1[0], r2[0], "the same boot id twice: {text}");
    assert_ne!(r1[1], r2[1], "the same random bytes twice: {text}");
    assert_eq!(r1[1].len(), 32, "{text}");
    // The guests' clocks are the host's, not the template's: each read
    // between the host's clock before its run and after it (a second's
    // slack either way for the reads' rounding).
    for (i, r) in [(1, &r1), (2, &r2)] {
        let guest: i64 = r[2].parse().unwrap();
        let host: Vec<i64> = line(&format!("host clock {i}: "))
            .iter()
            .flat_map(|l| l.split_whitespace().map(|v| v.parse().unwrap()))
            .collect();
        assert!(
            host[0] - 1 <= guest && guest <= host[1] + 1,
            "guest clock {guest}, host {host:?} around run {i}: {text}"
        );
        // The workspace and the image, both mounted after the restore.
        assert_eq!(r[3], "[workspace]", "{text}");
        assert!(r[4].starts_with("12."), "{text}");
    }
    // File data through the bounce pool in a restored machine, four
    // readers at once: every one reads the host's bytes, and the guest
    // kernel logged no full pool or failed request.
    let host = line("bounce host: ");
    let sums = line("bounce guest: ");
    assert_eq!(host.len(), 1, "{text}");
    let readers: Vec<&&str> = sums.iter().filter(|l| l.ends_with("  big")).collect();
    assert_eq!(readers.len(), 4, "{text}");
    assert!(readers.iter().all(|l| l.starts_with(host[0])), "{text}");
    assert!(text.contains("bounce guest: pool errors 0"), "{text}");
    assert!(text.contains("bounce: 0 warning(s) restored 1"), "{text}");
    // A 16 MiB read walks the 2 MiB area of the pool that belongs to the
    // machine's one vCPU, not all 8 MiB: virtiofsd, which writes the
    // file's data into the pool, has little more than 2 MiB of its
    // windows resident. The control, one area (`,1,`: what the kernel's
    // default gives one vCPU), shows the count sees the whole pool.
    let resident = |prefix: &str| -> (String, u64) {
        let l = line(prefix);
        let l = l.first().unwrap_or_else(|| panic!("{prefix}: {text}"));
        assert!(l.ends_with(" KiB, restored 1"), "{text}");
        let (areas, rest) = l.split_once(", virtiofsd resident ").unwrap();
        let kib = rest.split_whitespace().next().unwrap().parse().unwrap();
        (areas.to_string(), kib)
    };
    let (areas, walked) = resident("walk: ");
    assert_eq!(areas, "area num 4", "{text}");
    assert!(walked <= 3 << 10, "{text}");
    let (areas, control) = resident("one area: ");
    assert_eq!(areas, "area num 1", "{text}");
    assert!(control >= 7 << 10, "{text}");
    assert!(
        text.contains("damaged state: status 0 1 warning(s); again: 1"),
        "{text}"
    );
    assert!(
        text.contains("truncated memory: status 0 1 warning(s); again: 1"),
        "{text}"
    );
    assert!(
        text.contains("after the new one: status 0 0 warning(s)"),
        "{text}"
    );
    assert!(
        text.contains("concurrent: 0 0 a b templates 1 temporaries 0"),
        "{text}"
    );
    assert!(
        text.contains("restore after concurrent: status 0"),
        "{text}"
    );
    assert!(text.contains("ls: 1"), "{text}");
    assert!(text.contains("rm: status 0 left 0"), "{text}");
    // A host connection the guest had taken (not yet accepted) when its
    // template was taken: the first run's agent finds it first, and goes
    // on to the session's when the holder lets go after the template is
    // written; a restore resets it (the transport reset) and the agent
    // takes the session's next. Without the reset the restored agent
    // waits on it until --timeout (status 124). The control that the
    // stale connection was there: the restored agent says it skipped it.
    assert!(text.contains("hold: status 0 held: OK "), "{text}");
    assert!(text.contains("held first run: status 0 1"), "{text}");
    assert!(
        text.contains("held restore: status 0 after-hold restored 1 stale 1"),
        "{text}"
    );
    // A command that joins the machine (a hello and an `Exec` without
    // the machine's setup, as `mvm oci exec` sends) and reaches the agent
    // before the run's own request (a first run's session connects only
    // once the template is copied, after the delay the peer connects in)
    // is refused, and the run's own command runs. Without the refusal it
    // was the machine's one command.
    let peer = line("early peer: status 0 held: OK ");
    assert!(
        peer.first().is_some_and(
            |l| l.contains("this machine is not set up yet") && !l.contains("joined early")
        ),
        "{text}"
    );
    assert!(text.contains("early run: status 0 own-command"), "{text}");
}

/// What runs from one template do after their first run, in one test
/// host (docs/snapshots.md, "The pages a run touches first").
const AHEAD: &str = r#"
MVM=/mvm/bin/mvm; [ -x "$MVM" ] || MVM=build/bin/mvm
export MVM_NO_SNAPSHOT=0 MVM_TEMPLATES=/run/tmp/e2e-ahead
T=$MVM_TEMPLATES
key=$(ls "$T" | grep -E '^[0-9a-f]{32}$' | head -1)
P="$T/$key/pages"
echo "before: $([ -e "$P" ] && echo file || echo none)"
echo "boot sets after the template's run: $(ls "$T/boot-pages" 2>/dev/null | wc -l)"
$MVM run --print-stats -- true 2>/run/tmp/a0.err
echo "recording run: status $? recorded $(grep -c 'phase: .* pages touched so far recorded' /run/tmp/a0.err) mapped $(grep -c 'mapped ahead' /run/tmp/a0.err)"
echo "pages: mode $(stat -c %a "$P") $(grep -o '"written":\[[^]]*\]' "$P" | grep -o start | wc -l) written $(grep -o '"mapped":\[[^]]*\]' "$P" | grep -o start | wc -l) mapped"
cp "$P" /run/tmp/full
printf '{"mem_size":%s,"written":[],"mapped":[]}' "$(sed 's/.*"mem_size":\([0-9]*\).*/\1/' "$P")" >/run/tmp/empty
faults() { sed -n 's/^mvm: kvm vcpu0 page faults: \([0-9]*\).*/\1/p' "$1"; }
for i in 1 2; do
  cp /run/tmp/full "$P"
  $MVM run --print-stats -- true 2>/run/tmp/f$i.err; s=$?
  cp /run/tmp/empty "$P"
  $MVM run --print-stats -- true 2>/run/tmp/e$i.err; t=$?
  echo "pair $i: status $s $t faults $(faults /run/tmp/f$i.err) $(faults /run/tmp/e$i.err) ahead $(grep -h 'mapped ahead' /run/tmp/f$i.err /run/tmp/e$i.err | cut -d' ' -f4 | tr '\n' ' ')"
done
printf '{"mem_size":' >"$P"
$MVM run -- true 2>/run/tmp/h.err
echo "half-written: status $? $(grep -c warning /run/tmp/h.err) warning(s) $([ -e "$P" ] && echo kept || echo removed)"
$MVM run --print-stats -- true 2>/run/tmp/h2.err
echo "recorded again: status $? $(grep -c 'pages touched so far recorded' /run/tmp/h2.err) $(grep -c '"written"' "$P")"
echo "boot sets after restored runs: $(ls "$T/boot-pages" 2>/dev/null | wc -l)"
"#;

/// The first run from a template records the pages its set-up touched
/// (up to the agent's marker), owner-only beside the template; later runs
/// map them ahead, so the guest takes far fewer nested page faults. The
/// control, the same runs with an empty set in its place, shows the
/// counter sees the faults. A set that nobody finished (one that does not
/// parse, no run holding it) is removed without a word, and the next run
/// records it again.
#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn the_pages_runs_touch_first_are_recorded_once_and_mapped_ahead() {
    let run = mvm_with(
        &Options {
            after: Some(AHEAD),
            testhost_timeout: Some(200),
            env: &[
                ("MVM_NO_SNAPSHOT", "0"),
                ("MVM_TEMPLATES", "/run/tmp/e2e-ahead"),
            ],
            ..Options::default()
        },
        &["run", "--", "true"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let after = run.after_lines();
    let text = after.join("\n");
    // The template's first run boots, so it records nothing: neither a
    // template's set nor a cold boot's (its guest has the bounce pool).
    assert!(text.contains("before: none"), "{text}");
    assert!(
        text.contains("boot sets after the template's run: 0"),
        "{text}"
    );
    assert!(
        text.contains("recording run: status 0 recorded 1 mapped 0"),
        "{text}"
    );
    let counts = numbers_after(&after, "pages: mode 600 ");
    assert!(
        matches!(counts[..], [written, mapped] if written > 0 && mapped > 0),
        "{text}"
    );
    assert_pairs_map_ahead(&after);
    assert!(
        text.contains("half-written: status 0 0 warning(s) removed"),
        "{text}"
    );
    assert!(text.contains("recorded again: status 0 1 1"), "{text}");
    assert!(text.contains("boot sets after restored runs: 0"), "{text}");
}

const BOOT_AHEAD: &str = r#"
MVM=/mvm/bin/mvm; [ -x "$MVM" ] || MVM=build/bin/mvm
export MVM_NO_SNAPSHOT=1 MVM_TEMPLATES=/run/tmp/e2e-boot-ahead
D=$MVM_TEMPLATES/boot-pages
echo "before: $(ls "$D" 2>/dev/null | wc -l) set(s)"
$MVM run --print-stats -- true 2>/run/tmp/b0.err
echo "next boot: status $? recorded $(grep -c 'phase: .* pages touched so far recorded' /run/tmp/b0.err) mapped $(grep -c 'mapped ahead' /run/tmp/b0.err)"
P=$(ls -d "$D"/* | head -1)
echo "sets: $(ls "$D" | wc -l) mode $(stat -c %a "$P") dir $(stat -c %a "$D") $(grep -o '"mapped":\[[^]]*\]' "$P" | grep -o start | wc -l) mapped"
cp "$P" /run/tmp/bfull
printf '{"mem_size":%s,"written":[],"mapped":[]}' "$(sed 's/.*"mem_size":\([0-9]*\).*/\1/' "$P")" >/run/tmp/bempty
faults() { sed -n 's/^mvm: kvm vcpu0 page faults: \([0-9]*\).*/\1/p' "$1"; }
for i in 1 2; do
  cp /run/tmp/bfull "$P"
  $MVM run --print-stats -- true 2>/run/tmp/bf$i.err; s=$?
  cp /run/tmp/bempty "$P"
  $MVM run --print-stats -- true 2>/run/tmp/be$i.err; t=$?
  echo "pair $i: status $s $t faults $(faults /run/tmp/bf$i.err) $(faults /run/tmp/be$i.err) ahead $(grep -h 'mapped ahead' /run/tmp/bf$i.err /run/tmp/be$i.err | cut -d' ' -f4 | tr '\n' ' ')"
done
cp /run/tmp/bfull "$P"
$MVM run --no-workspace --image none -- true 2>/dev/null
$MVM run --no-workspace --image none --print-stats -- true 2>/run/tmp/bn.err
echo "anonymous: status $? sets $(ls "$D" | wc -l) allocated $(sed -n 's/^mvm: mapped ahead: .*(\([0-9]*\) KiB of them allocated)$/\1/p' /run/tmp/bn.err) faults $(faults /run/tmp/bn.err)"
G=mvm.cmd=74727565
$MVM boot --timeout 60 --print-stats --cmdline $G >/dev/null 2>/run/tmp/g0.err; s=$?
$MVM boot --timeout 60 --print-stats --cmdline $G >/dev/null 2>/run/tmp/g1.err; t=$?
echo "mvm boot: status $s $t sets $(ls "$D" | wc -l) recorded $(grep -c 'phase: .* pages touched so far recorded' /run/tmp/g0.err) faults $(faults /run/tmp/g0.err) $(faults /run/tmp/g1.err) allocated $(sed -n 's/^mvm: mapped ahead: .*(\([0-9]*\) KiB of them allocated)$/\1/p' /run/tmp/g1.err)"
$MVM boot --timeout 60 --cmdline "$G quiet" --snapshot-at-ready /run/tmp/e2e-saved >/dev/null 2>&1; s=$?
echo "saved boot: status $s snapshot $(ls /run/tmp/e2e-saved | wc -l) sets $(ls "$D" | wc -l)"
$MVM snapshot prune | grep boots
echo "pruned: $(ls "$D" | wc -l) left"
"#;

/// A cold boot (`--no-snapshot`) records the pages its guest touched up
/// to the agent's marker, owner-only under the template store's
/// `boot-pages`, keyed as the machine's template would be; later boots
/// of the same machine map them ahead and take far fewer nested page
/// faults. The control, the same runs with an empty set in its place,
/// shows the counter sees the faults. A machine without shares (its RAM
/// anonymous memory) gets its own set, allocated ahead, and so does a
/// machine of `mvm boot`; `mvm snapshot prune` removes the sets.
#[test]
#[ignore = "end-to-end: needs `make`; run by `make e2e`"]
fn the_pages_a_cold_boot_touches_are_recorded_once_and_mapped_ahead() {
    let run = mvm_with(
        &Options {
            after: Some(BOOT_AHEAD),
            testhost_timeout: Some(200),
            env: &[
                ("MVM_NO_SNAPSHOT", "1"),
                ("MVM_TEMPLATES", "/run/tmp/e2e-boot-ahead"),
            ],
            ..Options::default()
        },
        &["run", "--print-stats", "--", "true"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let after = run.after_lines();
    let text = after.join("\n");
    // mvm's own run (the wrapper's), the machine's first boot, recorded
    // the set, and the next boot maps it ahead.
    assert!(
        run.stderr.contains("pages touched so far recorded")
            && !run.stderr.contains("mapped ahead"),
        "{}",
        run.stderr
    );
    assert!(text.contains("before: 1 set(s)"), "{text}");
    assert!(
        text.contains("next boot: status 0 recorded 0 mapped 1"),
        "{text}"
    );
    let mapped = numbers_after(&after, "sets: 1 mode 600 dir 700 ");
    assert!(matches!(mapped[..], [n] if n > 0), "{text}");
    assert_pairs_map_ahead(&after);
    let anonymous = numbers_after(&after, "anonymous: status 0 sets 2 allocated ");
    assert!(matches!(anonymous[..], [kib, _faults] if kib > 0), "{text}");
    // `mvm boot` keeps its own set, recorded at guest-init's ready
    // marker: its next boot takes under half the faults of the one that
    // recorded it (the control) and allocates the set ahead.
    let boot = numbers_after(&after, "mvm boot: status 0 0 sets 3 recorded 1 faults ");
    assert!(
        matches!(boot[..], [without, with, kib] if with * 2 < without && kib > 0),
        "{text}"
    );
    // One that saves itself records none (a boot of a new command line
    // records one, as the first `mvm boot` above did).
    let saved = numbers_after(&after, "saved boot: status 0 snapshot ");
    assert!(matches!(saved[..], [files, 3] if files > 0), "{text}");
    assert!(
        text.contains("removed the pages 3 machines' boots touch first"),
        "{text}"
    );
    assert!(text.contains("pruned: 0 left"), "{text}");
}

/// The rest of each of `lines` that starts with `prefix`.
fn prefixed<'a>(lines: &[&'a str], prefix: &str) -> Vec<&'a str> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(prefix))
        .collect()
}

/// The numbers on the first of `lines` that starts with `prefix` (the
/// test fails, showing `lines`, if there is none).
fn numbers_after(lines: &[&str], prefix: &str) -> Vec<u64> {
    prefixed(lines, prefix)
        .first()
        .unwrap_or_else(|| panic!("no line `{prefix}`: {}", lines.join("\n")))
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// Each `pair N: status 0 0 faults WITH WITHOUT ahead KIB 0` line of the
/// AHEAD scripts' two pairs: with the set, the guest takes under half
/// the faults it takes with an empty set (the control), and maps ahead
/// more than nothing.
fn assert_pairs_map_ahead(lines: &[&str]) {
    for i in 1..=2 {
        let f = numbers_after(lines, &format!("pair {i}: status 0 0 faults "));
        assert!(
            matches!(f[..], [with, without, kib, 0] if with * 2 < without && kib > 0),
            "pair {i}: {}",
            lines.join("\n")
        );
    }
}

/// The frames of a command that joins a machine: the hello and an `Exec`
/// without setup, written where the test host reads them.
fn early_exec_frames() -> String {
    let request = ExecRequest::new(vec!["echo".into(), "joined early".into()]);
    let mut frames = Message::Hello(Hello::current()).to_frame().unwrap();
    frames.extend(Message::Exec(request).to_frame().unwrap());
    let path = repo_root().join("target/e2e-peers/early-exec.frames");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, frames).unwrap();
    path.display().to_string()
}
