#!/usr/bin/env python3
"""Start-up cost of the VMM's confinement (`make bench-confine`).

Alternates `mvm run --print-stats -- true` with confinement on (the
default) and off (`--no-seccomp --no-landlock`), N times each, through
tests/testhost/mvm, and reports the median, min and max of mvm's own wall
time and of boot-to-init for both, and the difference of the medians.
Writes benches/results/<date>-<kvm|tcg>-confinement.md. Standard library
only.
"""

import argparse
import datetime
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import host_type, write_result  # noqa: E402
from bench import one_run as bench_run  # noqa: E402

MODES = [("on (default)", []), ("off (--no-seccomp --no-landlock)", ["--no-seccomp", "--no-landlock"])]


def one_run(flags):
    stats = bench_run(flags)
    return stats["wall"] * 1000, stats["boot to init"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20, help="runs per mode (default 20)")
    args = ap.parse_args()
    kind, model, hw = host_type()
    one_run([])  # warm-up
    samples = {name: [] for name, _ in MODES}
    for i in range(args.n):
        for name, flags in MODES:
            samples[name].append(one_run(flags))
        print(f"run {i + 1}/{args.n}", file=sys.stderr)
    rows = []
    med = {}
    for name, _ in MODES:
        wall = [s[0] for s in samples[name]]
        boot = [s[1] for s in samples[name]]
        med[name] = statistics.median(wall)
        rows.append(f"| {name} | {med[name]:.1f} ({min(wall):.1f}-{max(wall):.1f}) "
                    f"| {statistics.median(boot):.1f} ({min(boot):.1f}-{max(boot):.1f}) |")
    on, off = (med[name] for name, _ in MODES)
    # A difference of the medians smaller than the runs' own spread (the
    # wider of the two modes' min-max ranges) is not a measured cost.
    spread = max(max(s[0] for s in samples[name]) - min(s[0] for s in samples[name])
                 for name, _ in MODES)
    diff = f"{on - off:+.1f} ms ({(on - off) / off * 100:+.1f} %)"
    if abs(on - off) < spread:
        verdict = (f"No measurable difference: the command medians differ by {diff}, "
                   f"inside the runs' spread of {spread:.1f} ms.")
    else:
        verdict = (f"Difference of the command medians: {diff}, more than the runs' "
                   f"spread of {spread:.1f} ms.")
    date = datetime.date.today().isoformat()
    report = "\n".join([
        f"# Confinement start-up cost, {date}",
        "",
        f"Host: {kind}; CPU: {model}. `mvm run --print-stats -- true`, {args.n} runs per mode,",
        "alternating; median (min-max) in ms. 'command' is mvm's own wall time, start to exit.",
        "" if hw else "Under TCG every figure is emulated time: compare the two rows, not with hardware.",
        "",
        "| confinement | command (ms) | boot to init (ms) |",
        "| --- | --- | --- |",
        *rows,
        "",
        verdict,
        "",
    ])
    write_result("confinement", report, hw)


if __name__ == "__main__":
    main()
