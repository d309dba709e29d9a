#!/usr/bin/env python3
"""Controlled egress throughput and set-up latency next to the same on the
host (`make bench-egress`; docs/benchmarks.md).

Each round is one test-host call (or a direct run on hardware KVM). Its
setup script starts busybox httpd on the host's 127.0.0.1:8080 serving a
200 MB file and a small one, names it web.test in the host's /etc/hosts,
and times on the host busybox `wget` of the big file and 20 sequential
fetches of the small one. Then `mvm run --image none --allow web.test:8080
--allow 127.0.0.1:8080` times the same busybox `wget` commands in the
guest, where they go through guest-init's forwarder, a vsock stream each
and the host proxy (mvm-egress). Same client both sides (busybox wget,
which honours http_proxy), so the ratio is what the path costs. Reports
medians over the rounds and the guest/host ratios, with the host type.
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

MB = 200
SMALL = 20
DIR = "/run/tmp/bench-egress-www"

# The clock as busybox `adjtimex` prints it (microseconds), as
# benches/workspace.py reads it; braces doubled for str.format.
NOW = "$(adjtimex | awk '/tv_sec/ {{ s = $2 }} /tv_usec/ {{ u = $2 }} END {{ printf \"%d.%06d\", s, u }}')"


def timed(name, cmd):
    return f't0={NOW}; {cmd}; t1={NOW}; echo "{name} $t0 $t1"'


def work(url):
    return "; ".join([
        timed("clock", ":"),
        timed("big", f"wget -q -O /dev/null {url}/big"),
        timed("small", f"i=0; while [ $i -lt {SMALL} ]; do wget -q -O /dev/null {url}/small; i=$((i+1)); done"),
        f"echo size $(wget -q -O - {url}/big | wc -c)",
    ])


SETUP = f"""set -e
rm -rf {DIR} && mkdir -p {DIR}
head -c {MB * 1000 * 1000} /dev/zero > {DIR}/big
echo small > {DIR}/small
busybox httpd -p 127.0.0.1:8080 -h {DIR}
echo "127.0.0.1 web.test" >> /etc/hosts
{work("http://127.0.0.1:8080")}
"""

GUEST = work("http://web.test:8080")


def parse(lines):
    got = {}
    for line in lines:
        m = re.match(r"^(clock|big|small) ([0-9.]+) ([0-9.]+)$", line)
        if m:
            got[m.group(1)] = (float(m.group(3)) - float(m.group(2))) * 1000
        m = re.match(r"^size (\d+)$", line)
        if m:
            got["size"] = int(m.group(1))
    for key in ("big", "small"):
        if key in got:
            got[key] -= got.get("clock", 0)
    return got


def one_round():
    env = dict(os.environ, MVM_TESTHOST_SETUP=SETUP, MVM_TESTHOST_TIMEOUT="900")
    env.pop("MVM_TESTHOST_AFTER", None)
    out = subprocess.run(
        [WRAPPER, "run", "--image", "none", "--no-workspace", "--memory", "512M",
         "--allow", "web.test:8080", "--allow", "127.0.0.1:8080",
         "--", "sh", "-c", GUEST],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1200,
    )
    if out.returncode != 0:
        sys.exit(f"bench-egress: mvm run failed ({out.returncode}):\n{out.stderr}")
    host = parse(l.split("setup: ", 1)[1] for l in out.stderr.splitlines()
                 if l.startswith("mvm (test host): setup: "))
    guest = parse(out.stdout.splitlines())
    want = MB * 1000 * 1000
    if host.get("size") != want or guest.get("size") != want:
        sys.exit(f"bench-egress: expected {want} bytes on both sides, got {host} / {guest}\n{out.stderr}")
    return host, guest


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=3, help="rounds (default 3)")
    args = ap.parse_args()
    kind, model, hw = host_type()
    rounds = []
    for i in range(args.n):
        rounds.append(one_round())
        print(f"round {i + 1}/{args.n}: host {rounds[-1][0]}, guest {rounds[-1][1]}", file=sys.stderr)
    h_big = statistics.median(r[0]["big"] for r in rounds)
    g_big = statistics.median(r[1]["big"] for r in rounds)
    h_small = statistics.median(r[0]["small"] for r in rounds) / SMALL
    g_small = statistics.median(r[1]["small"] for r in rounds) / SMALL
    date = datetime.date.today().isoformat()
    report = "\n".join([
        f"# Egress through the host proxy, {date}",
        "",
        f"Host: {kind}; CPU: {model}. Median of {args.n} rounds, each one call of the test host",
        "(or a direct run): busybox httpd on the host's 127.0.0.1:8080, fetched by busybox",
        "wget on the host directly and in the guest through the whole egress path",
        "(forwarder, vsock, mvm-egress). Times from busybox `adjtimex`, less its own cost."
        + ("" if hw else " Under TCG every figure is emulated time: read the ratios."),
        "",
        "| what | host | guest, through the proxy | guest / host |",
        "| --- | --- | --- | --- |",
        f"| {MB} MB download | {h_big:.0f} ms ({MB / (h_big / 1000):.0f} MB/s) | {g_big:.0f} ms ({MB / (g_big / 1000):.0f} MB/s) | {g_big / max(h_big, 1):.1f}x |",
        f"| one small request (connection set-up and answer), mean of {SMALL} | {h_small:.1f} ms | {g_small:.1f} ms | {g_small / max(h_small, 0.001):.1f}x |",
        "",
    ])
    write_result("egress", report, hw)


if __name__ == "__main__":
    main()
