#!/usr/bin/env python3
"""`ctr run` with mvm's OCI runtime next to `ctr run` with runc
(`make bench-containerd`; docs/benchmarks.md, docs/kubernetes.md).

In ONE call of the test host (or directly on a hardware-KVM host):
Debian's containerd started by tests/e2e/peers/containerd.sh with the
suite's busybox test image imported, a warm-up of each form, then ROUNDS
rounds, each timing (exectime: fork to reaped) in turn

  mvm   `ctr run --rm --runc-binary mvm-oci IMAGE ID true` (mvm run
        restores the template the warm-up saved: what a runtime gets by
        default; the runtime's environment is containerd's, so a form
        that boots cold would need a containerd of its own)
  runc  the same with --runc-binary runc

so that drift in the host hits all three alike. The whole container life
is in each figure: ctr, containerd, the shim, create, start, the
command, the wait, delete. Writes
benches/results/<date>-<kvm|tcg>-containerd.md. Standard library only.
"""

import os
import shlex
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import (BUILD, PEERS, ROOT, git_version, host_type, run_rounds,  # noqa: E402
                   write_result)

ROUNDS = 10
FORMS = [("runc", "runc"), ("mvm", "mvm-oci (mvm run from a template)")]

SETUP = r"""
set -u
B={build}
W=$(mktemp -d /run/tmp/mvm-ctd.XXXXXX) && chmod 700 "$W" || exit 1
# containerd's environment is the runtime's: templates on, in a store of
# this run's own.
export MVM_BUILD=$B MVM_TEMPLATES="$W/tpl" MVM_NO_SNAPSHOT=0
sh {root}/tests/e2e/peers/containerd.sh {layout} >/run/tmp/ctd-start.log 2>&1 ||
    {{ echo "fail containerd: $(tr '\n' ' ' </run/tmp/ctd-start.log)"; exit 1; }}
export CONTAINERD_ADDRESS=/run/tmp/ctd/containerd.sock CONTAINERD_NAMESPACE=mvm
X=$B/peers/bin/exectime
C=$B/containerd/bin
echo "info cpu $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "info vcpus $(grep -c '^processor' /proc/cpuinfo)"
echo "info versions $(tr '\n' ';' <$B/containerd/versions) $($B/bin/mvm --version)"
form() {{
    case $1 in
    mvm) "$X" --label "$2" --timeout 300 -- "$C/ctr" run --rm --snapshotter native --runc-binary "$B/bin/mvm-oci" {image} "c-$2" true ;;
    runc) "$X" --label "$2" --timeout 300 -- "$C/ctr" run --rm --snapshotter native --runc-binary "$C/runc" {image} "c-$2" true ;;
    esac
}}
forms="runc mvm"
form mvm warm.mvm >/dev/null
# runc needs namespaces, cgroup controllers and BPF that the test-host
# kernel does not have (docs/testing.md): without them, mvm alone.
if ! form runc warm.runc >/run/tmp/ctd-runc.out 2>&1; then
    echo "info runc-missing $(grep -o 'runc create failed.*' /run/tmp/ctd-runc.out | head -n 1)"
    forms=mvm
fi
i=1
while [ $i -le {rounds} ]; do
    for f in $forms; do form $f "$f.$i"; done
    i=$((i + 1))
done
kill "$(cat /run/tmp/ctd/containerd.pid)"
rm -rf "$W"
exit 0
"""


def main():
    kind, model, hw = host_type()
    if not os.path.isfile(os.path.join(PEERS, "bin", "exectime")):
        sys.exit("bench-containerd: build/peers has no exectime (make bench-containerd bundles it)")
    work = os.path.join(ROOT, "target", "bench-containerd")
    subprocess.run(["rm", "-rf", work], check=True)
    subprocess.run([os.path.join(ROOT, "tests", "e2e", "images", "make-test-image.sh"), work],
                   check=True, stdout=subprocess.DEVNULL)
    script = SETUP.format(build=shlex.quote("/mvm" if not hw else BUILD), root=shlex.quote(ROOT),
                          layout=shlex.quote(os.path.join(work, "oci")),
                          image="mvm-test/layers:layers", rounds=ROUNDS)
    print(f"bench-containerd: {kind}; CPU {model}; {ROUNDS} rounds of runc and mvm",
          file=sys.stderr)
    times, info, _ = run_rounds("containerd", script, [key for key, _ in FORMS],
                                optional=("runc",))
    forms = [(key, label) for key, label in FORMS if times[key]]
    med = {key: statistics.median(v) for key, v in times.items() if v}
    lines = [
        "# mvm: containerd's `ctr run` with mvm's OCI runtime next to runc",
        "",
        f"- host: **{kind}**; CPU: {model}; {info.get('vcpus', '?')} vCPU(s); tree {git_version()}",
        f"- {info.get('versions', '?')}",
        "- in the TCG test host every millisecond is emulated time: read the times as each "
        "other's ratio, measured side by side in one run",
        f"- `ctr run --rm --snapshotter native --runc-binary RUNTIME IMAGE ID true`, {ROUNDS} "
        "rounds after a warm-up of each, in turn within a round; exectime's "
        "fork-to-reaped time of ctr; the suite's busybox test image",
        "",
        "| form | median (ms) | min | max | median / runc |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, label in forms:
        v = times[key]
        ratio = f"{med[key] / med['runc']:.1f}" if "runc" in med else "n/a"
        lines.append(f"| {label} | {med[key]:.0f} | {min(v):.0f} | {max(v):.0f} | {ratio} |")
    if "runc-missing" in info:
        lines += ["", f"runc could not run in this host: {info['runc-missing']} (docs/testing.md)."]
    write_result("containerd", "\n".join(lines) + "\n", hw)


if __name__ == "__main__":
    main()
