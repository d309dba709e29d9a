#!/usr/bin/env python3
"""mvm's boot and overhead benchmark (`make bench`).

Runs `mvm run --print-stats -- true` N times after a warm-up, through
tests/testhost/mvm (directly on hardware KVM, else inside the QEMU TCG test
host), and reports each metric as median, p90, min and max:

  boot to init    mvm start -> guest-init's boot marker (port 0x440,
                  timestamped by the VMM; docs/benchmarks.md)
  command         mvm start -> exit, as mvm measures its own wall time
  vmm overhead    peak RSS of mvm minus the guest RAM resident in it
  teardown        the command's exit status arriving -> mvm about to exit

Peers (QEMU -M microvm, bubblewrap) are listed with the reason they were
skipped; no figure is ever made up. Writes benches/results/<date>-<host>.md
and .svg, and prints the table. Standard library only.
"""

import argparse
import datetime
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRAPPER = os.path.join(ROOT, "tests", "testhost", "mvm")

METRICS = [
    # (name, unit, how to get it from the --print-stats lines)
    ("boot to init", "ms", lambda s: s.get("boot to init")),
    ("command (mvm run -- true)", "ms", lambda s: s["wall"] * 1000 if "wall" in s else None),
    ("vmm overhead (RSS - guest)", "KiB",
     lambda s: s["peak rss"] - s["guest resident"] if "peak rss" in s and "guest resident" in s else None),
    ("teardown", "ms", lambda s: s.get("teardown")),
]

STAT_LINE = re.compile(r"^mvm: ([a-z ]+): ([0-9.]+)")


def host_type():
    with open("/proc/cpuinfo") as f:
        cpuinfo = f.read()
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    model = model.group(1) if model else platform.processor()
    hw = re.search(r"\b(vmx|svm)\b", cpuinfo) is not None and os.access("/dev/kvm", os.R_OK | os.W_OK)
    kind = "hardware KVM" if hw else "QEMU TCG test host (nested KVM on emulated AMD SVM)"
    return kind, model, hw


def one_run(flags=()):
    """`mvm run --print-stats FLAGS -- true`: its --print-stats figures."""
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


def write_result(name, report, hw):
    """benches/results/<date>-<kvm|tcg>-NAME.md, and the report printed."""
    os.makedirs(os.path.join(ROOT, "benches", "results"), exist_ok=True)
    path = os.path.join(ROOT, "benches", "results",
                        f"{datetime.date.today().isoformat()}-{'kvm' if hw else 'tcg'}-{name}.md")
    with open(path, "w") as f:
        f.write(report)
    print(report)
    print(f"bench: wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)


def summary(values):
    v = sorted(values)
    p90 = v[min(len(v) - 1, int(round(0.9 * (len(v) - 1))))]
    return statistics.median(v), p90, v[0], v[-1]


def peers(hw):
    """Each peer with the reason it was skipped."""
    inside = "not runnable inside the TCG test host: its initramfs carries only busybox and mvm"
    reasons = []
    for name, binary in [("QEMU -M microvm", "qemu-system-x86_64"), ("bubblewrap", "bwrap")]:
        if not hw:
            reasons.append((name, inside))
        elif shutil.which(binary) is None:
            reasons.append((name, f"{binary} is not installed"))
        else:
            reasons.append((name, "not implemented in this harness yet"))
    return reasons


def svg(samples, path):
    """One strip per metric: every run as a dot, the median as a bar."""
    width, row, left = 720, 60, 230
    rows = [(name, unit, vals) for (name, unit, _), vals in zip(METRICS, samples) if vals]
    height = row * len(rows) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">']
    for i, (name, unit, vals) in enumerate(rows):
        y = 20 + i * row + row // 2
        lo, hi = min(vals), max(vals)
        span = (hi - lo) or 1.0
        x = lambda v: left + (v - lo) / span * (width - left - 20)
        parts.append(f'<text x="5" y="{y + 4}">{name} ({unit})</text>')
        parts.append(f'<line x1="{left}" y1="{y}" x2="{width - 20}" y2="{y}" stroke="#ccc"/>')
        for v in vals:
            parts.append(f'<circle cx="{x(v):.1f}" cy="{y}" r="3" fill="#36c" fill-opacity="0.6"/>')
        med = statistics.median(vals)
        parts.append(f'<line x1="{x(med):.1f}" y1="{y - 10}" x2="{x(med):.1f}" y2="{y + 10}" '
                     f'stroke="#c33" stroke-width="2"/>')
        parts.append(f'<text x="{left}" y="{y + 22}" fill="#666">{lo:g}</text>')
        parts.append(f'<text x="{width - 20}" y="{y + 22}" fill="#666" text-anchor="end">{hi:g}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--runs", type=int, default=20)
    args = ap.parse_args()

    kind, model, hw = host_type()
    print(f"bench: {kind}; CPU {model}; {args.runs} runs after 1 warm-up", file=sys.stderr)
    one_run()
    runs = [one_run() for _ in range(args.runs)]
    samples = [[v for v in (get(s) for s in runs) if v is not None] for _, _, get in METRICS]

    with open(os.path.join(ROOT, "build", "share", "mvm", "kernel.release")) as f:
        guest_kernel = f.read().strip()
    now = datetime.datetime.now(datetime.timezone.utc)
    lines = [
        f"# mvm benchmark, {now:%Y-%m-%d %H:%M} UTC",
        "",
        f"- host: **{kind}**; CPU: {model}; host kernel {platform.release()}",
        f"- guest kernel {guest_kernel}; {args.runs} runs of `mvm run -- true` after 1 warm-up",
    ]
    if not hw:
        lines.append("- inside the TCG test host every millisecond is emulated time: "
                     "compare ratios measured in the same test host, never these absolute "
                     "figures with hardware ones")
    lines += ["", "| metric | mvm median | p90 | min | max |", "| --- | --- | --- | --- | --- |"]
    for (name, unit, _), vals in zip(METRICS, samples):
        if vals:
            med, p90, lo, hi = summary(vals)
            lines.append(f"| {name} | {med:.1f} {unit} | {p90:.1f} | {lo:.1f} | {hi:.1f} |")
        else:
            lines.append(f"| {name} | no data | | | |")
    lines += ["", "Peers (no ratio without a measured peer):", ""]
    lines += [f"- {name}: skipped, {why}" for name, why in peers(hw)]
    report = "\n".join(lines) + "\n"

    stem = os.path.join(ROOT, "benches", "results",
                        f"{now:%Y-%m-%d}-{'kvm' if hw else 'tcg'}-{platform.node() or 'host'}")
    with open(stem + ".md", "w") as f:
        f.write(report)
    svg(samples, stem + ".svg")
    print(report)
    print(f"bench: wrote {os.path.relpath(stem, ROOT)}.md and .svg", file=sys.stderr)


if __name__ == "__main__":
    main()
