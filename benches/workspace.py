#!/usr/bin/env python3
"""Workspace (virtio-fs) throughput next to the same on the host
(`make bench-fs`).

Each round boots the test host (or runs directly on hardware KVM), where a
setup script makes a 200 MB file and a 10,000-file tree (100 directories of
100 empty files) on the host's own tmpfs and times, on the host, `cat` of
the file to /dev/null and `find` over the tree. Then `mvm run` shares that
directory read-only and times the same two commands in the guest, through
virtio-fs, with a cold guest page cache (a fresh VM per round). Reports the
median over the rounds and the guest/host ratio, with the host type.
Standard library only.
"""

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import ROOT, WRAPPER, host_type, write_result  # noqa: E402

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

SETUP = f"""set -e
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


def one_round():
    env = dict(os.environ, MVM_TESTHOST_SETUP=SETUP, MVM_TESTHOST_TIMEOUT="600")
    env.pop("MVM_TESTHOST_AFTER", None)
    out = subprocess.run(
        # The busybox guest: its `adjtimex` is the clock GUEST reads (the
        # default image has none, and its times would all read 0).
        [WRAPPER, "run", "--image", "none", "--workspace", DIR, "--memory", "1G", "--", "sh", "-c", GUEST],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900,
    )
    if out.returncode != 0:
        sys.exit(f"bench-fs: mvm run failed ({out.returncode}):\n{out.stderr}")
    host = parse(l.split("setup: ", 1)[1] for l in out.stderr.splitlines()
                 if l.startswith("mvm (test host): setup: "))
    guest = parse(out.stdout.splitlines())
    if host.get("files") != 10000 or guest.get("files") != 10000 or guest.get("local-files") != 10000:
        sys.exit(f"bench-fs: expected 10000 files on both sides, got {host} / {guest}")
    timed = ["read", "find", "local-read", "local-find"]
    if any(host.get(k, 0) <= 0 for k in timed[:2]) or any(guest.get(k, 0) <= 0 for k in timed):
        sys.exit(f"bench-fs: a time did not read (no clock?): {host} / {guest}")
    return host, guest


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="rounds (default 5)")
    args = ap.parse_args()
    kind, model, hw = host_type()
    rounds = []
    for i in range(args.n):
        rounds.append(one_round())
        print(f"round {i + 1}/{args.n}: host {rounds[-1][0]}, guest {rounds[-1][1]}", file=sys.stderr)
    rows = []
    for name, label, size in [("read", f"read a {MB} MB file (dd bs=1M)", MB),
                              ("find", "find over 10,000 files", None)]:
        h = statistics.median(r[0][name] for r in rounds)
        g = statistics.median(r[1][name] for r in rounds)
        loc = statistics.median(r[1]["local-" + name] for r in rounds)

        def cell(ms):
            return f"{ms:.0f} ms ({size / (ms / 1000):.0f} MB/s)" if size and ms else f"{ms:.0f} ms"
        rows.append(f"| {label} | {cell(h)} | {cell(g)} | {cell(loc)} | {g / max(h, 1):.1f}x | {g / max(loc, 1):.1f}x |")
    date = datetime.date.today().isoformat()
    report = "\n".join([
        f"# Workspace throughput, {date}",
        "",
        f"Host: {kind}; CPU: {model}. Median of {args.n} rounds; each round a fresh VM",
        "(cold guest page cache) sharing a directory on the host's tmpfs read-only",
        "through virtio-fs (virtiofsd, --cache=always, as for any read-only share of",
        "`mvm run`). 'host' runs the same command",
        "on the machine mvm runs on; 'guest, own tmpfs' the same on a copy in the",
        "guest's /tmp, which isolates the cost of virtio-fs from that of running",
        "in a VM at all." + ("" if hw else " Under TCG every figure is emulated time, and the guest runs"
                            " under nested KVM on top of it: read the ratios, not the times."
                            " The test host's transparent huge pages: "
                            f"{rounds[0][0].get('thp', '?')}."),
        "Times come from the clock read by busybox `adjtimex` (microseconds), less the",
        "cost of reading it (timed around an empty command in the same place).",
        "",
        "| operation | host | guest, virtio-fs | guest, own tmpfs | virtio-fs / host | virtio-fs / guest tmpfs |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ])
    write_result("workspace", report, hw)


if __name__ == "__main__":
    main()
