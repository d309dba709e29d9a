#!/usr/bin/env python3
"""mvm's boot and overhead benchmark, side by side with QEMU -M microvm and
bubblewrap (`make bench`; docs/benchmarks.md).

Everything runs where mvm runs: directly on a hardware-KVM host, else inside
ONE call of the QEMU TCG test host (tests/testhost/mvm), from its
MVM_TESTHOST_SETUP script. That script copies mvm, the guest kernel and
initramfs and the peers bundled by scripts/bundle-peers.sh (build/peers:
QEMU and bwrap with their libraries and loader, the timer
benches/exectime.rs, the guest kernel as a bzImage for QEMU) onto the test
host's tmpfs and runs, after one warm-up each, N interleaved rounds of:

  mvm      `mvm run --no-snapshot --print-stats --console -- true` (a cold
           boot)
  template the same from a template (docs/snapshots.md: made by its
           warm-up run, restored by every other; a second warm-up
           records the pages its runs touch first)
  first    the same as a machine's first run, which makes its template
           (an empty template store each round)
  fresh    a cold boot in an empty template store too (`--no-snapshot`,
           no boot set recorded yet): what the first run's boot would
           cost without making a template
  QEMU     -M microvm -accel kvm, same guest kernel (as a bzImage) and
           initramfs, guest-init running `true` from mvm.cmd; once for
           times, once stopped at the command's exit for its memory
  bwrap    read-only root, no network, new namespaces, `true`
  each     `--version` (start-up of the binary alone)

Metrics (median, p90, min, max): boot to init, command end to end,
teardown, VMM memory overhead, peak RSS, binary start. (Memory with many
machines at once: benches/concurrent.py.) A figure that cannot
be measured for a peer is "n/a" with the reason; no figure is made up.
Writes benches/results/<date>-<kvm|tcg>-<host>.md and .svg (<host>-2 and
so on for a second result the same day) and prints the report. Standard
library only.
"""

import argparse
import datetime
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRAPPER = os.path.join(ROOT, "tests", "testhost", "mvm")
BUILD = os.path.join(ROOT, "build")
PEERS = os.path.join(BUILD, "peers")

STAT_LINE = re.compile(r"^mvm: ([a-z ]+): ([0-9.]+)")
SETUP_PREFIX = "mvm (test host): setup: "

GUEST_MIB = 512  # mvm's default --memory; QEMU gets the same
# mvm's own guest command line for `mvm run` is "panic=-1 oops=panic
# nomodules quiet mvm.agent=1" plus what its devices add (console=ttyS0
# 8250.nr_uarts=1 reboot=k virtio_mmio.device=..., and swiotlb=noforce, which
# changes nothing in a guest of 512 MiB: no DMA pool without it either, as
# in QEMU's). QEMU's microvm has no
# i8042, so the guest resets by triple fault (reboot=t), and the command
# comes from mvm.cmd (hex of "true") since QEMU has no exec agent.
QEMU_APPEND = ("panic=-1 oops=panic nomodules quiet console=ttyS0 8250.nr_uarts=1 reboot=t "
               "mvm.cmd=" + b"true".hex())
# As close to a hardened `docker run --read-only --network none --cap-drop
# ALL --security-opt no-new-privileges` as bubblewrap goes (it always sets
# no_new_privs; it has no seccomp profile or cgroup limits of its own).
BWRAP_BASE = ("--ro-bind / / --dev /dev --proc /proc --tmpfs /tmp "
              "--die-with-parent --new-session --cap-drop ALL")
BWRAP_NS_ALL = "--unshare-all"
BWRAP_NS_NO_IPC = "--unshare-user-try --unshare-pid --unshare-net --unshare-uts --unshare-cgroup-try"

MONITORS = [("mvm", "mvm"), ("tpl", "mvm, template"), ("qemu", "QEMU -M microvm"),
            ("bwrap", "bubblewrap")]
PEERS_OF_MVM = ["qemu", "bwrap"]

# (key, label, unit)
METRICS = [
    ("boot", "boot to init", "ms"),
    ("command", "command: `true`, end to end", "ms"),
    ("teardown", "teardown: command exit to process gone", "ms"),
    ("overhead", "VMM memory overhead: peak Pss of the process tree - guest RAM resident", "KiB"),
    ("own", "VMM memory overhead, the mvm process alone: its peak RSS - guest RAM resident", "KiB"),
    ("guest", "guest RAM resident at the end", "KiB"),
    ("rss", "peak Pss of the whole process tree (helpers included), guest RAM included", "KiB"),
    ("start", "binary start: `--version`, exec to exit", "ms"),
]

# What cannot be measured, and why (the same on every host).
NOT_APPLICABLE = {
    ("bwrap", "boot"): "no guest kernel or init to boot",
    ("bwrap", "teardown"): "no guest, so the command's exit is not visible apart from bwrap's own",
    ("bwrap", "overhead"): "no guest RAM to subtract (its whole footprint is the process-tree row)",
    ("bwrap", "guest"): "no guest",
    ("bwrap", "own"): "no guest RAM to subtract",
    ("qemu", "own"): "one process, so the same as the process tree's row (there by Pss, which shares its "
                     "libraries' pages with other processes)",
    ("tpl", "boot"): "no boot: the machine is restored where guest-init was ready",
    ("tpl", "start"): "the same binary as mvm's",
}


# What the test host writes and frees before each timed run (`launder`,
# below; benches/workspace.py runs it too).
LAUNDER_MIB = 256
# Before each timed run in the TCG test host: write LAUNDER MiB of its
# memory (to the file LAUNDER_FILE) and free it again. A VM's guest pages
# freed by the run before held code that TCG translated, and the first
# write to such a page costs the writer far more than to any other (QEMU
# drops the page's translations); a restored run, which copies its
# written pages first, took 1345-1418 ms right after a cold run and
# 560-597 ms after this (docs/benchmarks.md, "The run before"). Hardware
# has no such cost: LAUNDER=0 there. Put into the scripts by `format`, so
# its braces stay single.
LAUNDER_SH = ('launder() { [ "$LAUNDER" = 0 ] || { dd if=/dev/zero of="$LAUNDER_FILE" bs=1M '
              'count="$LAUNDER" 2>/dev/null; rm -f "$LAUNDER_FILE"; }; }')

SETUP = r"""
set -u
B={build}
N={runs}
QEMU={qemu}
BWRAP={bwrap}
LAUNDER={launder}
W=$(mktemp -d "${{TMPDIR:-/tmp}}/mvm-bench.XXXXXX") || exit 1
trap 'cd /; rm -rf "$W"' EXIT
# Everything on the local (tmpfs) file system: the test host sees build/
# through 9p, whose every read is a round trip to the outer host.
mkdir -p "$W/bin" "$W/share/mvm" "$W/libexec/mvm" "$W/ws" &&
    cp "$B/bin/mvm" "$W/bin/" &&
    cp "$B/share/mvm/vmlinux" "$B/share/mvm/initramfs.cpio" "$B/share/mvm/initramfs-image.cpio" "$W/share/mvm/" &&
    cp "$B/libexec/mvm/virtiofsd" "$W/libexec/mvm/" &&
    cp -R "$B/peers" "$W/peers" || exit 1
# The default image's root (374 MiB) stays where make put it, as in the
# e2e tests: the test host reads it over 9p, cold and restored runs alike.
ln -s "$B/share/mvm/images" "$W/share/mvm/images" || exit 1
P=$W/peers
X=$P/bin/exectime
LAUNDER_FILE=$W/launder
{launder_sh}
echo "info cpu $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "info kernel $(uname -r)"
echo "info thp $(sed 's/.*\[\(.*\)\].*/\1/' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo none)"
echo "info mvm-version $("$W/bin/mvm" --version)"
# mvm's workspace (the current directory, shared by default): an empty one.
cd "$W/ws" || exit 1

# --console: the guest console on mvm's stderr, line by line to exectime,
# as QEMU's serial console is (the teardown starts at a console line).
mvm_run() {{ "$X" --label "$1" --timeout 60 -- "$W/bin/mvm" run --no-snapshot --print-stats --console -- true; }}
# From a template kept on the same tmpfs: its warm-up run makes it.
export MVM_TEMPLATES="$W/tpl"
tpl_run() {{ "$X" --label "$1" --timeout 60 -- "$W/bin/mvm" run --print-stats --console -- true; }}
# The same two without --print-stats, whose report (the timeline, KVM's
# counters) costs mvm's end about 30 ms in the test host that QEMU does
# not spend (docs/benchmarks.md, "Teardown"): the command and teardown
# rows are timed on these, boot to init and the timeline on the others.
mvm_plain() {{ "$X" --label "$1" --timeout 60 -- "$W/bin/mvm" run --no-snapshot --console -- true; }}
tpl_plain() {{ "$X" --label "$1" --timeout 60 -- "$W/bin/mvm" run --console -- true; }}
tpl_mem() {{ "$X" --label "$1" --tree --timeout 60 -- "$W/bin/mvm" run --print-stats -- true; }}
# A machine's first run, which makes its template: a store of its own
# each time, removed after.
first_run() {{
    MVM_TEMPLATES="$W/first" "$X" --label "$1" --timeout 60 -- "$W/bin/mvm" run --print-stats --console -- true
    rm -rf "$W/first"
}}
# The same machine booted cold in an empty store: no template and no boot
# set to map ahead (docs/benchmarks.md), as the first run has none.
fresh_run() {{
    MVM_TEMPLATES="$W/fresh" "$X" --label "$1" --timeout 60 -- "$W/bin/mvm" run --no-snapshot --print-stats --console -- true
    rm -rf "$W/fresh"
}}
# Memory runs, apart from the timed ones (sampling /proc every 20 ms costs
# the test host's one CPU): the peak Pss of the whole process tree, mvm
# and virtiofsd (and its sandbox process) together.
mvm_mem() {{ "$X" --label "$1" --tree --timeout 60 -- "$W/bin/mvm" run --no-snapshot --print-stats -- true; }}
qemu() {{ "$P/lib/ld-linux-x86-64.so.2" --library-path "$P/lib" "$P/bin/qemu-system-x86_64" "$@"; }}
# fd 3: the boot marker (isa-debugcon on guest-init's port 0x440);
# fd 5: the serial console, line by line.
qemu_run() {{
    l=$1
    shift
    "$X" --label "$l" --marker 3 --lines 5 "$@" --timeout 60 -- \
        "$P/lib/ld-linux-x86-64.so.2" --library-path "$P/lib" "$P/bin/qemu-system-x86_64" \
        -M microvm,x-option-roms=off -accel kvm -cpu host -m {mib}M -smp 1 \
        -nodefaults -no-user-config -nographic -no-reboot \
        -L "$P/share/qemu" -kernel "$P/guest/bzImage" -initrd "$W/share/mvm/initramfs.cpio" \
        -serial file:/proc/self/fd/5 \
        -chardev file,id=boot,path=/proc/self/fd/3 -device isa-debugcon,iobase=0x440,chardev=boot \
        -append {append}
}}
bwrap_run() {{
    l=$1
    shift
    "$X" --label "$l" "$@" --timeout 60 -- \
        "$P/lib/ld-linux-x86-64.so.2" --library-path "$P/lib" "$P/bin/bwrap" $BWFLAGS true
}}
version() {{
    case $2 in
    mvm) "$X" --label "$1" --timeout 30 -- "$W/bin/mvm" --version ;;
    *) "$X" --label "$1" --timeout 30 -- "$P/lib/ld-linux-x86-64.so.2" --library-path "$P/lib" "$P/bin/$2" --version ;;
    esac
}}

# Warm-up, one of each; a peer whose warm-up fails is skipped (its output
# above says why) rather than failing N more times.
mvm_run mvm.run.warm || {{ echo "fail mvm"; exit 1; }}
version mvm.ver.warm mvm >/dev/null
# Makes the template (its save time is on this run's stderr).
tpl_run tpl.run.warm || {{ echo "fail tpl"; exit 1; }}
echo "info template-kib $(du -sk "$W/tpl" | cut -f1)"
# Its first restore records the pages its runs touch first, which the
# timed ones map ahead (docs/snapshots.md).
tpl_run tpl.run.warm2 || {{ echo "fail tpl"; exit 1; }}
if [ "$QEMU" = 1 ]; then
    echo "info qemu-version $(qemu --version | head -n 1)"
    qemu_run qemu.run.warm || {{ QEMU=0; echo "skip qemu"; }}
    version qemu.ver.warm qemu-system-x86_64 >/dev/null
fi
if [ "$BWRAP" = 1 ]; then
    echo "info bwrap-version $("$P/lib/ld-linux-x86-64.so.2" --library-path "$P/lib" "$P/bin/bwrap" --version)"
    BWFLAGS="{bw_all} {bw_base}"
    if ! bwrap_run bwrap.run.warm; then
        # Kernels without IPC namespaces (the test host's has no SysV IPC
        # at all) refuse --unshare-all.
        BWFLAGS="{bw_no_ipc} {bw_base}"
        bwrap_run bwrap.run.warm2 || {{ BWRAP=0; echo "skip bwrap"; }}
    fi
    echo "info bwrap-flags $BWFLAGS"
    version bwrap.ver.warm bwrap >/dev/null
fi

i=1
while [ $i -le $N ]; do
    launder; mvm_run mvm.run.$i
    launder; tpl_run tpl.run.$i
    launder; mvm_plain mvm.plain.$i
    launder; tpl_plain tpl.plain.$i
    launder; first_run first.run.$i
    launder; fresh_run fresh.run.$i
    [ "$QEMU" = 0 ] || {{ launder; qemu_run qemu.run.$i; }}
    [ "$BWRAP" = 0 ] || {{ launder; bwrap_run bwrap.run.$i; }}
    mvm_mem mvm.mem.$i
    tpl_mem tpl.mem.$i
    [ "$BWRAP" = 0 ] || bwrap_run bwrap.mem.$i --tree
    # Stopped at the command's exit line to read its guest RAM's Rss.
    [ "$QEMU" = 0 ] || qemu_run qemu.mem.$i --snapshot-at "mvm-init: exit status" --guest-kib {kib} --tree
    launder; version mvm.ver.$i mvm
    [ "$QEMU" = 0 ] || version qemu.ver.$i qemu-system-x86_64
    [ "$BWRAP" = 0 ] || version bwrap.ver.$i bwrap
    echo "round $i $(cut -d' ' -f1 /proc/uptime)"
    i=$((i + 1))
done

exit 0
"""


def host_type():
    with open("/proc/cpuinfo") as f:
        cpuinfo = f.read()
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    model = model.group(1) if model else platform.processor()
    hw = re.search(r"\b(vmx|svm)\b", cpuinfo) is not None and os.access("/dev/kvm", os.R_OK | os.W_OK)
    kind = "hardware KVM" if hw else "QEMU TCG test host (nested KVM on emulated AMD SVM)"
    return kind, model, hw


def one_run(flags=()):
    """`mvm run --print-stats FLAGS -- true`, one test host per call: its
    --print-stats figures (used by benches/confinement.py)."""
    out = subprocess.run(
        [WRAPPER, "run", "--print-stats", *flags, "--", "true"],
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
    )
    if out.returncode != 0:
        sys.exit(f"bench: mvm run failed ({out.returncode}):\n{out.stderr}")
    stats = {}
    for line in out.stderr.splitlines():
        m = STAT_LINE.match(line)
        if m:
            stats[m.group(1)] = float(m.group(2))
    return stats


def result_stem(where, name, hw):
    """ROOT/WHERE/<date>-<kvm|tcg>-NAME, made; a published result of the
    same day stays (the docs may cite it): a second one that day is
    NAME-2, and so on."""
    os.makedirs(os.path.join(ROOT, *where), exist_ok=True)
    stem = os.path.join(ROOT, *where,
                        f"{datetime.date.today().isoformat()}-{'kvm' if hw else 'tcg'}-{name}")
    serial, path = 1, stem
    while where[0] == "benches" and os.path.exists(path + ".md"):
        serial += 1
        path = f"{stem}-{serial}"
    return path


def write_result(name, report, hw):
    """benches/results/<date>-<kvm|tcg>-NAME.md, and the report printed.
    Published results come from a clean tree (the report names it): from a
    tree with uncommitted changes the report goes to target/bench/ instead,
    unless MVM_BENCH_DIRTY=1."""
    tree = git_version()
    report = report.rstrip("\n") + f"\n\nTree: {tree}.\n"
    where = ("benches", "results")
    if tree.endswith("-dirty") and os.environ.get("MVM_BENCH_DIRTY") != "1":
        where = ("target", "bench")
        print("bench: the tree has uncommitted changes, so this is not a publishable result: "
              "writing it under target/bench/ (MVM_BENCH_DIRTY=1 writes benches/results/ anyway)",
              file=sys.stderr)
    path = result_stem(where, name, hw) + ".md"
    with open(path, "w") as f:
        f.write(report)
    print(report)
    print(f"bench: wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)


def run_rounds(name, script, keys, optional=()):
    """Runs `script` as the setup of ONE test-host call (or directly on a
    hardware-KVM host), then reads its `LABEL exit MS STATUS ...` lines
    (exectime, labels FORM.ROUND) and `info KEY VALUE`, `fail ...` lines:
    (times by form, info, setup lines). Exits with the reasons when the call,
    a line or a form failed; a form in `optional` may have no rounds (the
    script found it cannot run there, and says why in an info line)."""
    env = dict(os.environ, MVM_TESTHOST_SETUP=script, MVM_TESTHOST_TIMEOUT="2400")
    env.pop("MVM_TESTHOST_AFTER", None)
    out = subprocess.run([WRAPPER, "--version"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=2500)
    setup = [line[len(SETUP_PREFIX):] for line in out.stderr.splitlines()
             if line.startswith(SETUP_PREFIX)]
    failed = [line for line in setup if line.startswith("fail")]
    info = dict(line.split(" ", 2)[1:] for line in setup if line.startswith("info "))
    times = {key: [] for key in keys}
    for line in setup:
        parts = line.split()
        if len(parts) >= 4 and parts[1] == "exit" and "." in parts[0]:
            form, rnd = parts[0].split(".", 1)
            if form in times and rnd.isdigit():
                if parts[3] == "0":
                    times[form].append(float(parts[2]))
                else:
                    failed.append(line)
    if out.returncode != 0 or failed or any(not v for k, v in times.items() if k not in optional):
        sys.exit(f"bench-{name}: the run failed ({out.returncode}): {failed}\n{out.stderr}")
    return times, info, setup


def summary(values):
    v = sorted(values)
    p90 = v[min(len(v) - 1, int(round(0.9 * (len(v) - 1))))]
    return statistics.median(v), p90, v[0], v[-1]


def read_lines(path):
    try:
        with open(path) as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Run:
    """One exectime run: its marks, lines, snapshot and exit."""

    def __init__(self):
        self.marks = []   # (fd, ms, byte)
        self.lines = []   # (fd, ms, text)
        self.snap = None  # (ms, {key: int}) or (ms, "why not")
        self.exit = None  # (ms, status, maxrss KiB)
        self.tree = None  # peak Pss of the process tree, KiB (--tree)

    def first_mark(self, fd, value):
        return next((at for f, at, b in self.marks if f == fd and b == value), None)

    def first_line(self, fd, prefix):
        return next(((at, t) for f, at, t in self.lines if f == fd and t.startswith(prefix)), None)

    def why_failed(self):
        """The run's own words when it failed, else None: its first and
        last stderr lines, less mvm's figures and the guest console."""
        if self.exit and self.exit[1] == 0:
            return None
        said = [t for f, _, t in self.lines if f == 2 and t and not STAT_LINE.match(t)
                and not t.startswith(("mvm: boot to init:", "mvm: phase:", "mvm-init:"))]
        if not self.exit:
            status = "no exit line"
        elif self.exit[1] == 137:
            status = "status 137 (SIGKILL: the run's timeout, or out of memory)"
        else:
            status = f"status {self.exit[1]}"
        if not said:
            return status
        return f"{status}: {said[0]}" + (f" ... {said[-1]}" if len(said) > 1 else "")


def parse_setup(lines):
    """exectime lines by label, plus the script's own info/skip lines."""
    runs, info, other = {}, {}, []
    for line in lines:
        words = line.split(" ", 3)
        if words[0] == "info" and len(words) >= 2:
            info[words[1]] = line.split(" ", 2)[2] if len(words) > 2 else ""
            continue
        m = re.match(r"^(\S+) (mark|line|snap|exit|tree) (.*)$", line)
        if not m or m.group(1).count(".") != 2:
            other.append(line)
            continue
        run = runs.setdefault(m.group(1), Run())
        kind, rest = m.group(2), m.group(3)
        if kind == "mark":
            fd, at, b = rest.split(" ")
            run.marks.append((int(fd), float(at), int(b)))
        elif kind == "line":
            fd, at, text = (rest.split(" ", 2) + [""])[:3]
            run.lines.append((int(fd), float(at), text))
        elif kind == "tree":
            run.tree = int(rest.split(" ")[0])
        elif kind == "snap":
            at, text = rest.split(" ", 1)
            kv = dict(w.split("=", 1) for w in text.split() if "=" in w)
            run.snap = (float(at), {k: int(v) for k, v in kv.items()} if kv else text)
        else:
            at, status, maxrss = rest.split(" ")
            run.exit = (float(at), int(status), int(maxrss))
    return runs, info, other


def measure_mvm(runs, i, m, values, failures):
    """Round i of mvm's runs labelled m (cold or from a template)."""
    r = runs.get(f"{m}.run.{i}")
    if r and r.why_failed() is None:
        stats = {}
        for fd, _, text in r.lines:
            mm = STAT_LINE.match(text)
            if fd == 2 and mm:
                stats[mm.group(1)] = float(mm.group(2))
        if "boot to init" in stats:
            values["boot"].append(stats["boot to init"])
    elif r:
        failures.append(f"run {i}: {r.why_failed()}")
    # The command and its teardown from the run without --print-stats.
    r = runs.get(f"{m}.plain.{i}")
    if r and r.why_failed() is None:
        end = r.exit[0]
        values["command"].append(end)
        done = r.first_line(2, "mvm-init: exit status ")
        if done and done[1] == "mvm-init: exit status 0":
            values["teardown"].append(end - done[0])
        else:
            failures.append(f"plain run {i}: no 'exit status 0' console line")
    elif r:
        failures.append(f"plain run {i}: {r.why_failed()}")
    r = runs.get(f"{m}.mem.{i}")
    if r and r.why_failed() is None and r.tree:
        stats = {}
        for fd, _, text in r.lines:
            mm = STAT_LINE.match(text)
            if fd == 2 and mm:
                stats[mm.group(1)] = float(mm.group(2))
        # A restored machine maps the template privately: mincore counts
        # the template's pages in the page cache, which this process has
        # not mapped, and the overhead would come out too low (below zero
        # once a run maps the pages its template's runs touch first
        # ahead). Only a restore that copied guest memory (a template
        # without a bounce pool) is counted right.
        copied = m != "tpl" or any(
            fd == 2 and text.endswith(" guest memory copied from the template")
            for fd, _, text in r.lines)
        if "guest resident" in stats and copied:
            values["overhead"].append(r.tree - stats["guest resident"])
            if "peak rss" in stats:
                values["own"].append(stats["peak rss"] - stats["guest resident"])
        elif "guest resident" in stats:
            for key in ("overhead", "own"):
                NOT_APPLICABLE[(m, key)] = (
                    "not measurable this way: the machine maps its template privately, and the guest "
                    "RAM resident figure (mincore) counts the template's cached pages, which the process "
                    "has not mapped")
        if "guest resident" in stats:
            values["guest"].append(stats["guest resident"])
        values["rss"].append(r.tree)
    elif r:
        failures.append(f"memory run {i}: {r.why_failed() or 'no tree figure'}")


def measure(runs, n):
    """{monitor: {metric: [values]}} and {monitor: {metric: why}} for
    figures that could not be taken, from the measured (not warm-up) runs."""
    values = {m: {k: [] for k, _, _ in METRICS} for m, _ in MONITORS}
    failures = {m: [] for m, _ in MONITORS}
    for i in range(1, n + 1):
        for m in ("mvm", "tpl"):
            measure_mvm(runs, i, m, values[m], failures[m])

        r = runs.get(f"qemu.run.{i}")
        if r and r.why_failed() is None:
            boot = r.first_mark(3, 1)
            done = r.first_line(5, "mvm-init: exit status ")
            if boot is None or done is None or done[1] != "mvm-init: exit status 0":
                failures["qemu"].append(f"run {i}: no boot marker or no 'exit status 0' line")
            else:
                values["qemu"]["boot"].append(boot)
                values["qemu"]["command"].append(r.exit[0])
                values["qemu"]["teardown"].append(r.exit[0] - done[0])
        elif r:
            failures["qemu"].append(f"run {i}: {r.why_failed()}")
        r = runs.get(f"qemu.mem.{i}")
        if r and r.why_failed() is None:
            if r.snap and isinstance(r.snap[1], dict) and r.tree:
                values["qemu"]["overhead"].append(r.tree - r.snap[1]["guest_rss_kib"])
                values["qemu"]["guest"].append(r.snap[1]["guest_rss_kib"])
                values["qemu"]["rss"].append(r.tree)
            else:
                failures["qemu"].append(f"memory run {i}: snapshot {r.snap[1] if r.snap else 'not taken'}, "
                                        f"tree {r.tree}")
        elif r:
            failures["qemu"].append(f"memory run {i}: {r.why_failed()}")

        r = runs.get(f"bwrap.run.{i}")
        if r and r.why_failed() is None:
            values["bwrap"]["command"].append(r.exit[0])
        elif r:
            failures["bwrap"].append(f"run {i}: {r.why_failed()}")
        r = runs.get(f"bwrap.mem.{i}")
        if r and r.why_failed() is None and r.tree:
            values["bwrap"]["rss"].append(r.tree)
        elif r:
            failures["bwrap"].append(f"memory run {i}: {r.why_failed() or 'no tree figure'}")

        for m, _ in MONITORS:
            r = runs.get(f"{m}.ver.{i}")
            if r and r.why_failed() is None:
                values[m]["start"].append(r.exit[0])
            elif r:
                failures[m].append(f"--version run {i}: {r.why_failed()}")
    return values, failures


PHASE_LINE = re.compile(r"^mvm: phase: \+([0-9.]+) ms (.*)$")


def phase_spans(runs, n, m):
    """[(phase, median span ms, median end ms)] over the timed runs labelled
    m, in the order of their median ends: each phase's span is from the
    phase before it in the same run (`--print-stats`' timeline; "guest:"
    phases by the guest's clock, from the request's arrival), with the
    process's start before mvm's clock and its exit after the last phase."""
    spans, ends = {}, {}
    for i in range(1, n + 1):
        r = runs.get(f"{m}.run.{i}")
        if not r or r.why_failed() is not None:
            continue
        # In mvm's own order: it prints them by time, moments taken
        # together in the order taken (a sort here would order ties by
        # name).
        marks = [(float(mm.group(1)), mm.group(2)) for fd, _, t in r.lines
                 if fd == 2 for mm in [PHASE_LINE.match(t)] if mm]
        before = 0.0
        for at, name in marks:
            spans.setdefault(name, []).append(at - before)
            ends.setdefault(name, []).append(at)
            before = at
        # exectime's clock starts at the fork, mvm's at its main; the
        # phase lines are printed as soon as "teardown done" is taken, so
        # the first one's arrival is that moment on exectime's clock:
        # what lies before mvm's clock and after its last phase.
        printed = r.first_line(2, "mvm: phase: ")
        if marks and r.exit and printed:
            start = printed[0] - marks[-1][0]
            spans.setdefault("process start (fork to main)", []).append(max(0.0, start))
            ends.setdefault("process start (fork to main)", []).append(-1.0)
            spans.setdefault("process exit (teardown done to reaped)", []).append(
                max(0.0, r.exit[0] - printed[0]))
            ends.setdefault("process exit (teardown done to reaped)", []).append(r.exit[0])
    rows = [(name, statistics.median(v), statistics.median(ends[name])) for name, v in spans.items()]
    return sorted(rows, key=lambda row: row[2])


def phase_table(runs, n):
    """Markdown: where the cold and the restored runs' time goes."""
    cold = {name: span for name, span, _ in phase_spans(runs, n, "mvm")}
    tpl = phase_spans(runs, n, "tpl")
    if not tpl:
        return []
    order = [name for name, _, _ in tpl] + [name for name in cold if name not in {t[0] for t in tpl}]
    tspan = {name: span for name, span, _ in tpl}
    out = [
        "",
        "Where the time goes (`--print-stats` timeline of the timed runs: each phase's median span "
        "from the phase before it, ms; \"guest:\" phases by the guest's clock from the request's "
        "arrival; rows in the template run's order, then the cold run's own):",
        "",
        "| phase (span up to it) | mvm, template | mvm |",
        "| --- | --- | --- |",
    ]
    for name in order:
        t = f"{tspan[name]:.1f}" if name in tspan else "-"
        c = f"{cold[name]:.1f}" if name in cold else "-"
        out.append(f"| {name} | {t} | {c} |")
    return out


SENT = "agent connected, command sent"
READY = "guest-init ready (waiting for its run)"
SAVE_LINE = re.compile(r"saved in ([0-9.]+) ms while the run went on \(the guest paused ([0-9.]+) ms")


def first_run_table(runs, n):
    """Markdown: a machine's first run (which makes its template) next to
    a cold one: when the command was sent, and what the template cost."""
    def moments(m):
        got = {"ready": [], "sent": [], "wait": [], "end": [], "paused": [], "saved": []}
        for i in range(1, n + 1):
            r = runs.get(f"{m}.run.{i}")
            if not r or r.why_failed() is not None:
                continue
            marks = {mm.group(2): float(mm.group(1)) for fd, _, t in r.lines
                     if fd == 2 for mm in [PHASE_LINE.match(t)] if mm}
            if SENT in marks and READY in marks:
                got["ready"].append(marks[READY])
                got["sent"].append(marks[SENT])
                got["wait"].append(marks[SENT] - marks[READY])
            got["end"].append(r.exit[0])
            for fd, _, t in r.lines:
                mm = SAVE_LINE.search(t) if fd == 2 else None
                if mm:
                    got["saved"].append(float(mm.group(1)))
                    got["paused"].append(float(mm.group(2)))
        return got
    cold, first, fresh = moments("mvm"), moments("first"), moments("fresh")
    if not first["sent"] or not cold["sent"]:
        return []

    def med(v):
        return f"{statistics.median(v):.0f}" if v else "-"
    return [
        "",
        "A machine's first run (which makes its template: copied while guest-init waits, written "
        "by a thread of its own while the run goes on) next to cold ones (`--no-snapshot`): in an empty "
        "template store, as the first run boots (no boot set to map ahead yet), and in the store whose "
        "set the warm-up recorded. Medians in ms from mvm's start "
        f"(`--print-stats`), of {len(first['sent'])} first runs, {len(fresh['sent'])} cold ones in an "
        f"empty store and {len(cold['sent'])} with the set ({n} rounds):",
        "",
        "| | first run | cold, empty store | cold, boot set mapped |",
        "| --- | --- | --- | --- |",
        f"| guest-init ready | {med(first['ready'])} | {med(fresh['ready'])} | {med(cold['ready'])} |",
        f"| ready to the command sent | {med(first['wait'])} | {med(fresh['wait'])} | {med(cold['wait'])} |",
        f"| the command sent | {med(first['sent'])} | {med(fresh['sent'])} | {med(cold['sent'])} |",
        f"| the run, fork to exit | {med(first['end'])} | {med(fresh['end'])} | {med(cold['end'])} |",
        f"| the guest paused for the copy | {med(first['paused'])} | | |",
        f"| the template written, beside the run | {med(first['saved'])} | | |",
    ]


def fmt(v, unit):
    return f"{v:.0f}" if unit == "KiB" or v >= 100 else f"{v:.1f}"


def svg(values, skipped, path):
    """Per metric, one strip per monitor on a shared scale from 0 (so that
    lengths compare as the ratios do): every run a dot, the median a bar
    and its value on the right."""
    colours = {"mvm": "#36c", "tpl": "#6ad", "qemu": "#d62", "bwrap": "#393"}
    names = dict(MONITORS)
    width, left, right, strip = 800, 130, 110, 22
    blocks = []
    for key, label, unit in METRICS:
        rows = [(m, values[m][key]) for m, _ in MONITORS if m not in skipped and values[m][key]]
        if rows:
            blocks.append((label, unit, rows))
    height = 30 + sum(24 + strip * len(rows) + 18 for _, _, rows in blocks)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             '<text x="5" y="16" font-weight="bold">Every run (dots) and the median (bar); '
             'one scale per metric, from 0</text>']
    y = 30
    for label, unit, rows in blocks:
        parts.append(f'<text x="5" y="{y + 14}" font-weight="bold">{escape(label)} ({unit})</text>')
        y += 24
        hi = max(max(v) for _, v in rows) or 1.0
        end = width - right

        def x(v):
            return left + v / hi * (end - left)
        for m, vals in rows:
            cy = y + strip // 2
            med = statistics.median(vals)
            parts.append(f'<text x="15" y="{cy + 4}">{names[m]}</text>')
            parts.append(f'<line x1="{left}" y1="{cy}" x2="{end}" y2="{cy}" stroke="#ddd"/>')
            for v in vals:
                parts.append(f'<circle cx="{x(v):.1f}" cy="{cy}" r="3" fill="{colours[m]}" fill-opacity="0.5"/>')
            parts.append(f'<line x1="{x(med):.1f}" y1="{cy - 8}" x2="{x(med):.1f}" y2="{cy + 8}" '
                         f'stroke="{colours[m]}" stroke-width="3"/>')
            parts.append(f'<text x="{end + 8}" y="{cy + 4}" fill="{colours[m]}">{fmt(med, unit)}</text>')
            y += strip
        parts.append(f'<text x="{left}" y="{y + 12}" fill="#666">0</text>')
        parts.append(f'<text x="{end}" y="{y + 12}" fill="#666" text-anchor="end">{fmt(hi, unit)}</text>')
        y += 18
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def git_version():
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--runs", type=int, default=20)
    args = ap.parse_args()
    if args.runs < 1:
        sys.exit("bench: -n must be at least 1")

    kind, model, hw = host_type()
    if not os.path.isfile(os.path.join(PEERS, ".bundled")):
        sys.exit("bench: build/peers is missing: run 'make bench' (scripts/bundle-peers.sh build/peers)")
    # Peers missing on this machine, with the reason bundle-peers.sh gave.
    skipped = {}
    for line in read_lines(os.path.join(PEERS, "missing")):
        name, why = line.split(": ", 1)
        skipped[name] = why

    script = SETUP.format(
        build=shlex.quote("/mvm" if not hw else BUILD), runs=args.runs,
        qemu=0 if "qemu" in skipped else 1, bwrap=0 if "bwrap" in skipped else 1,
        mib=GUEST_MIB, kib=GUEST_MIB * 1024, append=shlex.quote(QEMU_APPEND),
        bw_all=BWRAP_NS_ALL, bw_no_ipc=BWRAP_NS_NO_IPC, bw_base=BWRAP_BASE,
        launder=0 if hw else LAUNDER_MIB, launder_sh=LAUNDER_SH,
    )
    where = "directly" if hw else "inside one test host"
    print(f"bench: {kind}; CPU {model}; {args.runs} rounds after 1 warm-up, {where} "
          f"(a few minutes; the test host reports only at the end)", file=sys.stderr)
    env = dict(os.environ, MVM_TESTHOST_SETUP=script, MVM_TESTHOST_TIMEOUT="900")
    env.pop("MVM_TESTHOST_AFTER", None)
    started = datetime.datetime.now(datetime.timezone.utc)
    out = subprocess.run([WRAPPER, "--version"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=960)
    elapsed = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    setup = [line[len(SETUP_PREFIX):] for line in out.stderr.splitlines() if line.startswith(SETUP_PREFIX)]
    runs, info, other = parse_setup(setup)
    leftovers = [line for line in out.stderr.splitlines() if "left behind" in line]
    if out.returncode != 0 or "mvm.run.warm" not in runs:
        sys.exit(f"bench: the benchmark run failed ({out.returncode}):\n{out.stderr}")
    for line in setup:
        if line.startswith("skip "):
            name = line.split()[1]
            warm = runs.get(f"{name}.run.warm2") or runs.get(f"{name}.run.warm")
            skipped[name] = f"its warm-up run failed ({warm.why_failed() if warm else 'no output'})"

    values, failures = measure(runs, args.runs)
    med = {m: {k: statistics.median(v) for k, v in values[m].items() if v} for m, _ in MONITORS}

    def why_na(m, key):
        if m in skipped:
            return f"skipped: {skipped[m]}"
        if (m, key) in NOT_APPLICABLE:
            return NOT_APPLICABLE[(m, key)]
        if not values[m][key]:
            return "every run failed (below)"
        return None

    def cell(m, key, unit):
        why = why_na(m, key)
        if why:
            return "n/a"
        v = values[m][key]
        md, p90, lo, hi = summary(v)
        return f"**{fmt(md, unit)}** (p90 {fmt(p90, unit)}; {fmt(lo, unit)}-{fmt(hi, unit)})"

    def ratio(peer, key, of="mvm"):
        if key not in med[of] or why_na(of, key) or why_na(peer, key):
            return "n/a"
        return f"**{med[of][key] / med[peer][key]:.2f}**"

    names = dict(MONITORS)
    versions = {}
    for line in read_lines(os.path.join(PEERS, "versions")):
        name, v = line.split(" ", 1)
        versions[name] = v
    with open(os.path.join(BUILD, "share", "mvm", "kernel.release")) as f:
        guest_kernel = f.read().strip()
    lines = [
        f"# mvm benchmark, {started:%Y-%m-%d %H:%M} UTC",
        "",
        f"- host: **{kind}**; CPU: {model}; host kernel {platform.release()}",
    ]
    if not hw:
        lines += [
            f"- everything ran inside one test host (CPU as it sees it: {info.get('cpu', '?')}; "
            f"kernel {info.get('kernel', '?')}; 1 vCPU; transparent huge pages {info.get('thp', '?')}),"
            " mvm and both peers alike",
            "- **inside the TCG test host every millisecond is emulated time, and the guests run under "
            "nested KVM on top of it: read the ratios, measured side by side in the same test host; "
            "never compare these absolute figures with hardware ones**",
        ]
    lines += [
        f"- versions: {info.get('mvm-version', 'mvm ?')} ({git_version()}); "
        f"{info.get('qemu-version', versions.get('qemu', 'QEMU: not installed'))}; "
        f"{info.get('bwrap-version', versions.get('bwrap', 'bubblewrap: not installed'))}",
        f"- guest kernel {guest_kernel} for both VMMs: mvm boots build/share/mvm/vmlinux; QEMU the same "
        "source and config as a bzImage (LZ4; QEMU cannot load an ELF vmlinux without a PVH note); QEMU "
        "gets initramfs.cpio (guest-init and busybox, whose `true` it runs), mvm's default run, whose "
        "root is the image, initramfs-image.cpio (guest-init alone); "
        f"{GUEST_MIB} MiB, 1 vCPU",
        f"- {args.runs} interleaved rounds after 1 warm-up of each; {elapsed:.0f} s in all"
        + ("" if hw else f"; before each timed run the test host wrote and freed {LAUNDER_MIB} MiB of its "
           "memory, so that no run pays for the TCG translations of the guest pages the run before "
           "freed (docs/benchmarks.md, \"The run before\")"),
        "",
        "Ratios are mvm's median over the peer's: below 1, mvm is faster or smaller. Cells: "
        "**median** (p90; min-max).",
        "",
        "| metric | mvm / QEMU | mvm / bwrap | template / mvm | template / bwrap | mvm | mvm, template "
        "| QEMU -M microvm | bubblewrap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, label, unit in METRICS:
        lines.append(f"| {label} ({unit}) | {ratio('qemu', key)} | {ratio('bwrap', key)} | "
                     f"{ratio('mvm', key, of='tpl')} | {ratio('bwrap', key, of='tpl')} | "
                     + " | ".join(cell(m, key, unit) for m, _ in MONITORS) + " |")
    saved = next((t for f, _, t in runs["tpl.run.warm"].lines
                  if f == 2 and " saved in " in t), None) if "tpl.run.warm" in runs else None
    lines += [
        "",
        f"Template: {saved[len('mvm: '):] if saved else 'no save line from its warm-up run'}; "
        f"{int(info.get('template-kib', '0')) / 1024:.1f} MiB on disk (a sparse file of "
        f"{GUEST_MIB} MiB: the guest's data pages).",
    ]
    lines += phase_table(runs, args.runs)
    lines += first_run_table(runs, args.runs)
    na = [(m, key, label, why_na(m, key)) for key, label, _ in METRICS for m, _ in MONITORS
          if why_na(m, key)]
    if na:
        lines += ["", "n/a:", ""]
        seen_skip = set()
        for m, key, label, why in na:
            if m in skipped:
                if m not in seen_skip:
                    lines.append(f"- {names[m]}: {why}")
                    seen_skip.add(m)
                continue
            lines.append(f"- {names[m]}, \"{label}\": {why}")
    lines += [
        "",
        "How each figure is taken (docs/benchmarks.md):",
        "",
        "- what runs: mvm booting cold (`mvm run --no-snapshot --print-stats --console -- true`: its "
        "workspace, an empty directory, shared through virtiofsd; the default image as its root; the "
        "command over the vsock exec channel; seccomp and Landlock); mvm, template: the same without "
        "--no-snapshot, restoring the template its warm-up run saved (docs/snapshots.md); QEMU with no device but the serial port and the debugcon, guest-init running `true` "
        "from `mvm.cmd` on the kernel command line; so the ratios carry mvm's whole default cost.",
        "- boot to init: mvm from its own start (first thing in main) to guest-init's boot marker on "
        "port 0x440, timestamped by mvm; QEMU from the fork of its process to the same marker byte, "
        "written by an isa-debugcon device at 0x440 to a pipe that benches/exectime timestamps. QEMU's "
        "figure thus includes its exec and dynamic linking, mvm's does not (see the binary start row).",
        "- command: fork to the process reaped, by exectime, for all three; mvm's (and its teardown) "
        "from runs of their own without --print-stats, whose report costs about 30 ms that QEMU "
        "does not spend; boot to init and the timeline from the runs with it.",
        "- teardown: from guest-init's 'mvm-init: exit status 0' console line (printed once the command "
        "has exited, before the status write and the reset) to the process reaped, by exectime, for both "
        "VMMs (mvm with --console, so that its guest console reaches exectime on stderr as QEMU's serial "
        "console does through a pipe).",
        "- memory, in runs of their own (sampling costs CPU): the peak, over samples every 20 ms, of the "
        "sum of the Pss (/proc/PID/smaps_rollup) of the process and every process below it, by exectime "
        "--tree: for mvm that includes virtiofsd and its sandbox process, which wait4's ru_maxrss (one "
        "process, or the largest reaped child) would leave out; Pss counts a page shared by several "
        "(guest RAM that virtiofsd maps) once. VMM memory overhead: that peak minus the guest RAM "
        "resident at the end (mvm: mincore, `mvm: guest resident:`; QEMU: the Rss of its guest RAM "
        "mapping in /proc/PID/smaps, QEMU stopped at the guest's exit status line). The mvm process "
        "alone: its own peak RSS (`mvm: peak rss:`, getrusage) minus the same guest RAM resident, as "
        "the 2.4 MiB of 2026-11-30 was taken (virtiofsd left out).",
    ]
    if "bwrap" not in skipped:
        lines.append(f"- bubblewrap: `bwrap {info.get('bwrap-flags', '?')} true`")
        if "bwrap.run.warm2" in runs:
            lines.append(f"  (without --unshare-ipc: `--unshare-all` failed here, "
                         f"{runs['bwrap.run.warm'].why_failed()}; this kernel has no IPC namespaces)")
    problems = [f"- {names[m]}: {f}" for m, _ in MONITORS for f in failures[m]]
    problems += [f"- {kind} run {i}: {runs[f'{label}.run.{i}'].why_failed()}"
                 for label, kind in (("first", "first"), ("fresh", "cold, empty store"))
                 for i in range(1, args.runs + 1)
                 if f"{label}.run.{i}" in runs and runs[f"{label}.run.{i}"].why_failed() is not None]
    problems += [f"- {line}" for line in leftovers]
    problems += [f"- unexpected output: {line}" for line in other
                 if not line.startswith(("round ", "skip ", "fail "))]
    if problems:
        lines += ["", "Problems during the run (failed runs are left out of the figures):", ""]
        lines += problems
    report = "\n".join(lines) + "\n"

    stem = result_stem(("benches", "results"), platform.node() or "host", hw)
    with open(stem + ".md", "w") as f:
        f.write(report)
    svg(values, skipped, stem + ".svg")
    print(report)
    print(f"bench: wrote {os.path.relpath(stem, ROOT)}.md and .svg", file=sys.stderr)


if __name__ == "__main__":
    main()
