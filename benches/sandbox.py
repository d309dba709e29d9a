#!/usr/bin/env python3
"""A command in a named sandbox against a fresh machine and bubblewrap
(`make bench-sandbox`; docs/benchmarks.md, docs/sandboxes.md).

In ONE call of the test host (or directly on a hardware-KVM host), with
the default image and a workspace (an empty directory) for every mvm
form: a warm-up of each, then ROUNDS rounds, each timing (exectime: fork
to reaped) in turn

  cold     `mvm run --no-snapshot -- true`
  template `mvm run -- true` (restored from the template the warm-up made)
  exec     `mvm exec sb -- true` in a sandbox created before the rounds
  bwrap    bubblewrap with a read-only root, no network, new namespaces

so that drift in the host hits all four alike. Then the idle sandbox's
memory: the Pss of its supervisor and virtiofsd, and the guest RAM
resident in the supervisor, after a pause with nothing running. Writes
benches/results/<date>-<kvm|tcg>-sandbox.md. Standard library only.
"""

import os
import shlex
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import (BUILD, BWRAP_BASE, BWRAP_NS_ALL, BWRAP_NS_NO_IPC, PEERS,  # noqa: E402
                   git_version, host_type, run_rounds, write_result)

ROUNDS = 10
FORMS = [("exec", "mvm exec in a running sandbox"), ("template", "mvm run, from a template"),
         ("cold", "mvm run, booting"), ("bwrap", "bubblewrap")]

SETUP = r"""
set -u
B={build}
W=$(mktemp -d "${{TMPDIR:-/tmp}}/mvm-sbx.XXXXXX") || exit 1
trap 'cd /; "$W/bin/mvm" rm -f sb >/dev/null 2>&1; rm -rf "$W"' EXIT
# Everything on the local (tmpfs) file system, as in bench.py; the image
# root stays where make put it, as in the e2e tests.
mkdir -p "$W/bin" "$W/share/mvm" "$W/libexec/mvm" "$W/ws" "$W/peers/bin" "$W/xdg" &&
    chmod 700 "$W/xdg" &&
    cp "$B/bin/mvm" "$W/bin/" &&
    cp "$B/share/mvm/vmlinux" "$B/share/mvm/initramfs.cpio" "$B/share/mvm/initramfs-image.cpio" "$W/share/mvm/" &&
    cp "$B/libexec/mvm/virtiofsd" "$W/libexec/mvm/" &&
    cp "$B/peers/bin/bwrap" "$B/peers/bin/exectime" "$W/peers/bin/" &&
    cp -R "$B/peers/lib" "$W/peers/lib" &&
    ln -s "$B/share/mvm/images" "$W/share/mvm/images" || exit 1
export MVM_TEMPLATES="$W/tpl" MVM_SANDBOXES="$W/sbx" XDG_RUNTIME_DIR="$W/xdg" MVM_NO_SNAPSHOT=0
M=$W/bin/mvm
P=$W/peers
X=$P/bin/exectime
echo "info cpu $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "info vcpus $(grep -c '^processor' /proc/cpuinfo)"
echo "info mvm-version $("$M" --version)"
cd "$W/ws" || exit 1
bw() {{ "$X" --label "$1" --timeout 60 -- "$P/lib/ld-linux-x86-64.so.2" --library-path "$P/lib" "$P/bin/bwrap" $BWFLAGS true; }}
BWFLAGS="{bw_all} {bw_base}"
bw bwrap.try >/dev/null || BWFLAGS="{bw_no_ipc} {bw_base}"
echo "info bwrap-flags $BWFLAGS"
form() {{
    case $1 in
    cold) "$X" --label "$2" --timeout 120 -- "$M" run --no-snapshot -- true ;;
    template) "$X" --label "$2" --timeout 120 -- "$M" run -- true ;;
    exec) "$X" --label "$2" --timeout 120 -- "$M" exec sb -- true ;;
    bwrap) bw "$2" ;;
    esac
}}
"$M" run -- true >/dev/null 2>&1 || echo "fail the template's run"
"$M" create sb 2>"$W/create.err" || {{ echo "fail create: $(tr '\n' ' ' <"$W/create.err")"; exit 1; }}
for f in cold template exec bwrap; do form $f "warm.$f" >/dev/null; done
i=1
while [ $i -le {rounds} ]; do
    for f in exec template cold bwrap; do form $f "$f.$i"; done
    i=$((i + 1))
done
# Idle: nothing runs in the sandbox; its supervisor and virtiofsd.
sleep 5
sup=$(cat "$W/xdg/mvm/sandboxes/sb/pid")
pss=0
for d in /proc/[0-9]*; do
    case $(readlink "$d/exe" 2>/dev/null) in
    "$M" | "$W/libexec/mvm/virtiofsd")
        k=$(sed -n 's/^Pss: *\([0-9]*\) kB/\1/p' "$d/smaps_rollup" 2>/dev/null)
        pss=$((pss + ${{k:-0}})) ;;
    esac
done
rss=$(awk '/^VmRSS:/ {{ print $2 }}' /proc/$sup/status)
echo "idle pss_kib=$pss supervisor_rss_kib=$rss"
"$M" stop sb >/dev/null 2>&1 || echo "fail stop"
exit 0
"""


def main():
    kind, model, hw = host_type()
    if not os.path.isfile(os.path.join(PEERS, "bin", "bwrap")):
        sys.exit("bench-sandbox: build/peers has no bwrap (build/peers/missing says why)")
    script = SETUP.format(build=shlex.quote("/mvm" if not hw else BUILD), rounds=ROUNDS,
                          bw_all=BWRAP_NS_ALL, bw_no_ipc=BWRAP_NS_NO_IPC, bw_base=BWRAP_BASE)
    print(f"bench-sandbox: {kind}; CPU {model}; {ROUNDS} rounds of exec, template, cold, bwrap",
          file=sys.stderr)
    times, info, setup = run_rounds("sandbox", script, [key for key, _ in FORMS])
    idle = next((line for line in setup if line.startswith("idle ")), None)
    if not idle or any(not kv.split("=")[1].isdigit() for kv in idle.split()[1:]):
        sys.exit(f"bench-sandbox: unreadable idle figures: {idle}")
    med = {key: statistics.median(v) for key, v in times.items()}
    fields = dict(kv.split("=") for kv in idle.split()[1:])
    lines = [
        "# mvm: a command in a named sandbox",
        "",
        f"- host: **{kind}**; CPU: {model}; {info.get('vcpus', '?')} vCPU(s); tree {git_version()}",
        f"- {info.get('mvm-version', 'mvm ?')}; bubblewrap flags `{info.get('bwrap-flags', '?')}`",
        "- in the TCG test host every millisecond is emulated time: read the times as each "
        "other's ratio, measured side by side in one run",
        f"- `true` each way, {ROUNDS} rounds after a warm-up of each, the four in turn within a "
        "round; exectime's fork-to-reaped time; the default image and a workspace (an empty "
        "directory) for every mvm form",
        "",
        "| form | median (ms) | min | max | median / bubblewrap | median / exec |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, label in FORMS:
        v = times[key]
        lines.append(f"| {label} | {med[key]:.0f} | {min(v):.0f} | {max(v):.0f} | "
                     f"{med[key] / med['bwrap']:.1f} | {med[key] / med['exec']:.1f} |")
    lines += [
        "",
        f"Idle sandbox, 5 s after its last command: Pss of its supervisor and virtiofsd "
        f"{int(fields['pss_kib']) / 1024:.1f} MiB; the supervisor's resident set (guest RAM the "
        f"guest has touched, and the VMM) {int(fields['supervisor_rss_kib']) / 1024:.1f} MiB "
        "(of 512 MiB of guest memory).",
    ]
    write_result("sandbox", "\n".join(lines) + "\n", hw)


if __name__ == "__main__":
    main()
