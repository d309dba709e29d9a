#!/usr/bin/env python3
"""Workspace (virtio-fs) throughput next to the same on the host
(`make bench-fs`).

Each round boots the test host (or runs directly on hardware KVM), where a
setup script makes a 200 MB file and a 10,000-file tree (100 directories of
100 empty files) on the host's own tmpfs and times, on the host, `dd` of
the file to /dev/null and `find` over the tree. Then `mvm run` shares that
directory read-only and times the same two commands in the guest, through
virtio-fs, with a cold guest page cache, in two machines: one restored
from a template (the default path, whose guest bounces every virtio-fs
buffer through its DMA pool: docs/snapshots.md) and a cold
`--no-snapshot` one (no pool), in alternating order. Reports the medians
over the rounds and the ratios, with the host type. Standard library only.
"""

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import LAUNDER_MIB, LAUNDER_SH, ROOT, WRAPPER, host_type, write_result  # noqa: E402

DIR = "/run/tmp/mvm-bench-fs"
MB = 200

# The time before and after one command in microseconds, printed as "NAME
# START END": busybox's `adjtimex` (modes 0: read only, allowed to anyone)
# prints the clock's seconds and microseconds, where /proc/uptime has only
# 10 ms, coarser than some host figures. Reading the clock costs a fork or
# two; the "clock" line times nothing, and that cost is subtracted.
# (Braces quadrupled: the text goes through two str.format calls.)
NOW = "$(adjtimex | awk '/tv_sec/ {{{{ s = $2 }}}} /tv_usec/ {{{{ u = $2 }}}} END {{{{ printf \"%d.%06d\", s, u }}}}')"
TIMED = "t0=" + NOW + "; {cmd} >/dev/null; t1=" + NOW + '; echo "{name} $t0 $t1"'
CLOCK = TIMED.format(name="{p}clock", cmd=":")

# dd copies every byte through a userspace buffer (cat may sendfile to
# /dev/null and read nothing).
WORK = "; ".join([
    CLOCK,
    TIMED.format(name="{p}read", cmd="dd if={d}/big of=/dev/null bs=1M 2>/dev/null"),
    TIMED.format(name="{p}find", cmd="find {d}/tree"),
    "echo {p}files $(find {d}/tree -type f | wc -l)",
])

MAKE = f"""mkdir -p {{d}}/tree && head -c {MB * 1000 * 1000} /dev/zero >{{d}}/big && cd {{d}}/tree &&
for d in $(seq 100); do mkdir d$d; for f in $(seq 100); do : >d$d/f$f; done; done; cd /"""

HOST_SETUP = f"""set -e
echo "thp $(sed 's/.*\\[\\(.*\\)\\].*/\\1/' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo none)"
rm -rf {DIR}
{MAKE.format(d=DIR)}
{WORK.format(d=DIR, p="")}
"""

# In the guest: through the share, then the same on the guest's own tmpfs
# (what the guest's CPU and memory manage without virtio-fs).
GUEST = "; ".join([
    WORK.format(d=".", p=""),
    MAKE.format(d="/tmp/local"),
    WORK.format(d="/tmp/local", p="local-"),
])


def parse(lines):
    """{"read": ms, "find": ms, "files": count}"""
    got = {}
    for line in lines:
        m = re.match(r"^((?:local-)?(?:read|find|clock)) ([0-9.]+) ([0-9.]+)$", line)
        if m:
            got[m.group(1)] = (float(m.group(3)) - float(m.group(2))) * 1000
        m = re.match(r"^thp (\S+)$", line)
        if m:
            got["thp"] = m.group(1)
        m = re.match(r"^((?:local-)?files) (\d+)$", line)
        if m:
            got[m.group(1)] = int(m.group(2))
    # Less the cost of reading the clock, measured in the same place.
    for key in [k for k in got if k.endswith(("read", "find"))]:
        got[key] -= got.get(key[: -len("read" if key.endswith("read") else "find")] + "clock", 0)
    return got


# The machines each round times: in this order in even rounds, the other
# way round in odd ones. The template the restored one starts from is
# made first, by a run of the same machine (`-- true`).
MODES = [("restored", ""), ("cold", "--no-snapshot")]

# The rest of the test host's script, after HOST_SETUP: each machine runs
# GUEST (written into the shared directory) and its lines come back
# prefixed with its mode, with whether it was restored.
RUNS = """MVM=/mvm/bin/mvm; [ -x "$MVM" ] || MVM=build/bin/mvm
export MVM_NO_SNAPSHOT=0
cat >{d}/guest.sh <<'GUEST_END'
{guest}
GUEST_END
FLAGS='--image none --workspace {d} --memory 1G --print-stats'
$MVM run $FLAGS -- true 2>/run/tmp/fs-template.err || {{ echo "template failed"; tail -5 /run/tmp/fs-template.err; exit 1; }}
# Before each machine in the TCG test host: bench.py's `launder`, so
# that neither machine pays for the TCG translations on the pages the
# machine before freed (docs/benchmarks.md, "The run before").
LAUNDER={launder}
LAUNDER_FILE=/run/tmp/fs-launder
{launder_sh}
one() {{
  mode=$1; shift
  launder
  $MVM run $FLAGS "$@" -- sh ./guest.sh >/run/tmp/fs-$mode.out 2>/run/tmp/fs-$mode.err || {{ echo "$mode failed"; tail -5 /run/tmp/fs-$mode.err; exit 1; }}
  sed "s/^/$mode /" /run/tmp/fs-$mode.out
  echo "$mode restored $(grep -c 'restored from a template' /run/tmp/fs-$mode.err)"
}}
{runs}
"""


def one_round(i, hw):
    order = MODES if i % 2 == 0 else MODES[::-1]
    runs = "\n".join(f"one {mode} {flag}".rstrip() for mode, flag in order)
    script = HOST_SETUP + RUNS.format(d=DIR, guest=GUEST, runs=runs, launder=0 if hw else LAUNDER_MIB,
                                        launder_sh=LAUNDER_SH)
    env = dict(os.environ, MVM_TESTHOST_SETUP=script, MVM_TESTHOST_TIMEOUT="900")
    env.pop("MVM_TESTHOST_AFTER", None)
    out = subprocess.run(
        [WRAPPER, "--version"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1200,
    )
    lines = [l.split("setup: ", 1)[1] for l in out.stderr.splitlines()
             if l.startswith("mvm (test host): setup: ")]
    if out.returncode != 0 or any(l.endswith(" failed") for l in lines):
        sys.exit(f"bench-fs: a run failed ({out.returncode}):\n{out.stderr}")
    prefixes = tuple(mode + " " for mode, _ in MODES)
    host = parse(l for l in lines if not l.startswith(prefixes))
    guests = {}
    for mode, _ in MODES:
        mine = [l[len(mode) + 1:] for l in lines if l.startswith(mode + " ")]
        restored = "restored 1" in mine
        if restored != (mode == "restored"):
            sys.exit(f"bench-fs: the {mode} machine was{'' if restored else ' not'} restored:\n{out.stderr}")
        guest = parse(mine)
        if host.get("files") != 10000 or guest.get("files") != 10000 or guest.get("local-files") != 10000:
            sys.exit(f"bench-fs: expected 10000 files on both sides, got {host} / {mode} {guest}")
        timed = ["read", "find", "local-read", "local-find"]
        if any(host.get(k, 0) <= 0 for k in timed[:2]) or any(guest.get(k, 0) <= 0 for k in timed):
            sys.exit(f"bench-fs: a time did not read (no clock?): {host} / {mode} {guest}")
        guests[mode] = guest
    return host, guests


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="rounds (default 5)")
    args = ap.parse_args()
    kind, model, hw = host_type()
    rounds = []
    for i in range(args.n):
        rounds.append(one_round(i, hw))
        print(f"round {i + 1}/{args.n}: host {rounds[-1][0]}, guests {rounds[-1][1]}", file=sys.stderr)

    def median(values):
        return statistics.median(list(values))

    rows = []
    for name, label, size in [("read", f"read a {MB} MB file (dd bs=1M)", MB),
                              ("find", "find over 10,000 files", None)]:
        def cell(ms):
            return f"{ms:.0f} ms ({size / (ms / 1000):.0f} MB/s)" if size and ms else f"{ms:.0f} ms"
        h = median(r[0][name] for r in rounds)
        cells = [cell(h)]
        ratios = []
        for mode, _ in MODES:
            g = median(r[1][mode][name] for r in rounds)
            loc = median(r[1][mode]["local-" + name] for r in rounds)
            # Each machine's share against its own tmpfs, round by round.
            own = median(r[1][mode][name] / max(r[1][mode]["local-" + name], 1) for r in rounds)
            cells += [cell(g), cell(loc)]
            ratios += [f"{own:.1f}x", f"{g / max(h, 1):.1f}x"]
        rows.append(f"| {label} | " + " | ".join(cells + ratios) + " |")
    date = datetime.date.today().isoformat()
    report = "\n".join([
        f"# Workspace throughput, {date}",
        "",
        f"Host: {kind}; CPU: {model}. Median of {args.n} rounds; in each, two fresh VMs",
        "(cold guest page cache) share a directory on the host's tmpfs read-only",
        "through virtio-fs (virtiofsd, --cache=always, as for any read-only share of",
        "`mvm run`): one restored from a template made just before (the default path;",
        "its guest bounces every virtio-fs buffer through its DMA pool) and one booted",
        "cold with `--no-snapshot` (no pool), in alternating order. 'host' runs the same",
        "command on the machine mvm runs on; 'own tmpfs' the same on a copy in that",
        "guest's /tmp, which isolates the cost of virtio-fs from that of running",
        "in a VM at all; 'x tmpfs' is the median of each round's share / own tmpfs." + (
            "" if hw else " Under TCG every figure is emulated time, and the guest runs"
            " under nested KVM on top of it: read the ratios, not the times."
            " The test host's transparent huge pages: "
            f"{rounds[0][0].get('thp', '?')}. Before each machine the test host wrote and freed"
            f" {LAUNDER_MIB} MiB of its memory, so that neither pays for the TCG translations on"
            " the pages the machine before it freed (docs/benchmarks.md, \"The run before\")."),
        "Times come from the clock read by busybox `adjtimex` (microseconds), less the",
        "cost of reading it (timed around an empty command in the same place).",
        "",
        "| operation | host | restored: virtio-fs | restored: own tmpfs | cold: virtio-fs | cold: own tmpfs"
        " | restored x tmpfs | restored x host | cold x tmpfs | cold x host |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ])
    write_result("workspace", report, hw)


if __name__ == "__main__":
    main()
