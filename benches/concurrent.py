#!/usr/bin/env python3
"""Memory per machine with many running at once, cold boots against runs
from a template (`make bench-concurrent`; docs/benchmarks.md,
docs/snapshots.md).

In ONE call of the test host (or directly on a hardware-KVM host), for
each layout (`default`: the default image and a workspace; `bare`:
`--no-workspace --image none`) and each N of 1 and 10: N `mvm run`s are
started at once, each running `echo up; sleep 600`; once every one has
printed `up` (its command runs), the Pss of every process of mvm's
binary and of virtiofsd is summed (a page several processes map, such as
a template's page in the page cache, is split between them), then all
are ended. Cold runs pass --no-snapshot; template runs restore the
template a run before made. Writes benches/results/<date>-<kvm|tcg>-
concurrent.md. Standard library only.
"""

import os
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import BUILD, ROOT, SETUP_PREFIX, WRAPPER, git_version, host_type, write_result  # noqa: E402

COUNTS = [1, 10]
LAYOUTS = [("default", ""), ("bare", "--no-workspace --image none")]
# Ten cold boots on the test host's one CPU take minutes.
WAIT_S = 900

SETUP = r"""
set -u
B={build}
W=$(mktemp -d "${{TMPDIR:-/tmp}}/mvm-conc.XXXXXX") || exit 1
trap 'cd /; rm -rf "$W"' EXIT
mkdir -p "$W/bin" "$W/share/mvm" "$W/libexec/mvm" "$W/ws" &&
    cp "$B/bin/mvm" "$W/bin/" &&
    cp "$B/share/mvm/vmlinux" "$B/share/mvm/initramfs.cpio" "$B/share/mvm/initramfs-image.cpio" "$W/share/mvm/" &&
    cp "$B/libexec/mvm/virtiofsd" "$W/libexec/mvm/" &&
    ln -s "$B/share/mvm/images" "$W/share/mvm/images" || exit 1
export MVM_TEMPLATES="$W/tpl"
cd "$W/ws" || exit 1
pss_sum() {{
    t=0
    for d in /proc/[0-9]*; do
        case $(readlink "$d/exe" 2>/dev/null) in
        "$W/bin/mvm" | "$W/libexec/mvm/virtiofsd")
            k=$(sed -n 's/^Pss: *\([0-9]*\) kB/\1/p' "$d/smaps_rollup" 2>/dev/null)
            t=$((t + ${{k:-0}})) ;;
        esac
    done
    echo $t
}}
together() {{
    label=$1; n=$2; shift 2
    rm -f "$W"/up.*
    start=$(cut -d' ' -f1 /proc/uptime)
    j=1
    while [ $j -le $n ]; do
        "$W/bin/mvm" run "$@" -- sh -c 'echo up; sleep 600' >"$W/up.$j" 2>&1 &
        j=$((j + 1))
    done
    # Whole seconds: the test host's busybox sleep takes no fractions.
    w=0
    while [ "$(cat "$W"/up.* 2>/dev/null | grep -c '^up$')" -lt "$n" ] && [ $w -lt {wait} ]; do
        sleep 1
        w=$((w + 1))
    done
    up=$(cat "$W"/up.* 2>/dev/null | grep -c '^up$')
    echo "together $label $n $up $(pss_sum) $start $(cut -d' ' -f1 /proc/uptime)"
    for f in "$W"/up.*; do
        grep -q '^up$' "$f" || echo "failed $label: $(head -c 300 "$f" | tr '\n' ' ')"
    done
    for d in /proc/[0-9]*; do
        [ "$(readlink "$d/exe" 2>/dev/null)" = "$W/bin/mvm" ] && kill -TERM "${{d#/proc/}}" 2>/dev/null
    done
    wait
}}
for layout in {layouts}; do
    name=${{layout%%:*}}
    flags=$(echo "${{layout#*:}}" | tr , ' ')
    "$W/bin/mvm" run $flags -- true >/dev/null 2>&1 || echo "failed template-$name: its template run"
    for n in {counts}; do
        together "cold-$name" $n --no-snapshot $flags
        together "template-$name" $n $flags
    done
done
exit 0
"""


def main():
    kind, model, hw = host_type()
    script = SETUP.format(
        build=shlex.quote("/mvm" if not hw else BUILD),
        layouts=" ".join(f"{name}:{','.join(flags.split())}" for name, flags in LAYOUTS),
        counts=" ".join(str(n) for n in COUNTS),
        wait=WAIT_S,
    )
    print(f"bench-concurrent: {kind}; CPU {model}; 1 and 10 machines at once, cold and from a "
          "template (ten minutes or more in the test host)", file=sys.stderr)
    env = dict(os.environ, MVM_TESTHOST_SETUP=script, MVM_TESTHOST_TIMEOUT="3000")
    env.pop("MVM_TESTHOST_AFTER", None)
    out = subprocess.run([WRAPPER, "--version"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=3100)
    setup = [line[len(SETUP_PREFIX):] for line in out.stderr.splitlines()
             if line.startswith(SETUP_PREFIX)]
    rows = [line.split() for line in setup if line.startswith("together ")]
    if out.returncode != 0 or not rows:
        sys.exit(f"bench-concurrent: the run failed ({out.returncode}):\n{out.stderr}")
    failed = [line for line in setup if line.startswith("failed ")]
    lines = [
        "# mvm: memory per machine, many at once",
        "",
        f"- host: **{kind}**; CPU: {model}; tree {git_version()}",
        "- in the TCG test host (1 vCPU, 2 GiB) every millisecond is emulated time: read the "
        "memory, and the times only as each other's ratio",
        "- each machine runs `echo up; sleep 600`; figures are taken when every one has printed "
        "`up`: the Pss of every mvm and virtiofsd process, summed (a page several map is split "
        "between them), and divided by the machines that came up",
        "- `default`: `mvm run` with the default image and the workspace (an empty directory); "
        "`bare`: `--no-workspace --image none`; cold: `--no-snapshot`; template: restored from "
        "the template a run just before saved",
        "",
        "| machines | N | up | until all were up (s) | Pss in all (MiB) | per machine (MiB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for _, label, n, up, pss, t0, t1 in rows:
        per = int(pss) / 1024 / max(int(up), 1)
        lines.append(f"| {label} | {n} | {up} | {float(t1) - float(t0):.0f} | "
                     f"{int(pss) / 1024:.1f} | {per:.1f} |")
    if failed:
        lines += ["", "Runs that did not come up:", ""] + [f"- {f}" for f in failed]
    write_result("concurrent", "\n".join(lines) + "\n", hw)


if __name__ == "__main__":
    main()
