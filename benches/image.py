#!/usr/bin/env python3
"""The default guest image's costs (`make bench-image`; docs/benchmarks.md).

Four measurements of `mvm run --image default` (the Debian image `make`
builds, booted as a read-only EROFS root under a tmpfs overlay):

  1. its cost over the busybox guest: `mvm run --no-workspace -- true`
     without and with --image default (end to end, boot to init, peak RSS);
  2. Python start-up, `python3 -c 'import json, email, asyncio,
     http.client'`, in that guest and in bubblewrap on the same root
     unpacked onto the host's tmpfs;
  3. `git status` in a 10,000-file repository, shared read-only with the
     guest (virtio-fs) and bound read-only into bubblewrap;
  4. the image's conversion to EROFS on import, and its size, on this
     machine (no VM needed).

1-3 run where mvm runs (directly on hardware KVM, else inside ONE call of
the QEMU TCG test host), from its MVM_TESTHOST_SETUP script, as
benches/bench.py does: N interleaved rounds after one warm-up of each,
medians reported with the ratios. Standard library only.
"""

import argparse
import datetime
import gzip
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import (  # noqa: E402
    BUILD, LAUNDER_MIB, LAUNDER_SH, PEERS, ROOT, SETUP_PREFIX, STAT_LINE, WRAPPER, host_type,
    parse_setup, write_result,
)

LAYOUT = os.path.join(BUILD, "share", "mvm", "images", "debian")
TAG = "debian-bookworm"  # the default image's tag, and its name in the store
WORK = os.path.join(ROOT, "target", "bench-image")  # visible in the test host at the same path

PY = "python3 -c 'import json, email, asyncio, http.client'"
GIT = "git --no-optional-locks status --porcelain"
# The image config's Env, and the HOME guest-init gives root: bubblewrap's
# command then sees what the guest's does.
IMAGE_ENV = ("--clearenv --setenv PATH /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
             "--setenv LANG C.UTF-8 --setenv HOME /root")
# bench.py's bubblewrap (a hardened `docker run --read-only`), on the
# image's root instead of the host's.
BWRAP_BASE = ("--ro-bind $R / --dev /dev --proc /proc --tmpfs /tmp "
              "--die-with-parent --new-session --cap-drop ALL " + IMAGE_ENV)
BWRAP_NS_ALL = "--unshare-all"
BWRAP_NS_NO_IPC = "--unshare-user-try --unshare-pid --unshare-net --unshare-uts --unshare-cgroup-try"

# Run in the guest and in bubblewrap alike, by the image's bash: each
# command timed from inside with $EPOCHREALTIME (microseconds, no fork to
# read the clock), twice: the first run is what a fresh sandbox gives it
# (in a fresh VM the guest's page cache is cold and every file comes
# through virtio-blk or virtio-fs), the second the same with warm caches.
# The "clock" line times nothing; its cost is subtracted. Times go to
# stderr, which exectime timestamps (it sends stdout to /dev/null).
TIMED = 't0=$EPOCHREALTIME; {cmd} >{out}; s=$?; t1=$EPOCHREALTIME; echo "T {name} $t0 $t1 $s{extra}" >&2'
CLOCK = TIMED.format(name="clock", cmd=":", out="/dev/null", extra="")
PY_SCRIPT = "; ".join([CLOCK] + [TIMED.format(name=f"py{k}", cmd=PY, out="/dev/null", extra="")
                                 for k in (1, 2)])
GIT_SCRIPT = "; ".join(
    [CLOCK]
    + [TIMED.format(name=f"git{k}", cmd=GIT, out="/tmp/st", extra=" $(wc -l </tmp/st)") for k in (1, 2)]
    # What git compares with its index, as this sandbox sees it: the same
    # in both, or git would re-read every file in one of them.
    + ["echo \"T stat $(stat -c '%i %s %.9Y %.9Z %u %g' d1/f1)\" >&2",
       "echo \"T files $(git ls-files | wc -l)\" >&2"])

SETUP = r"""
set -u
# Everything said goes to a file on the share this machine sees as it is
# written, rather than back through the wrapper at the end: a test host
# that hangs late in the run (seen once, in the fourth round) leaves the
# rounds it finished readable.
exec >>@LOG@ 2>&1
B=@BUILD@
STORE=@STORE@
N=@N@
W=$(mktemp -d "${TMPDIR:-/tmp}/bench-image.XXXXXX") || exit 1
# bubblewrap's root (about 390 MiB) on another tmpfs than the store's
# EROFS file (about 375 MiB): in the test host each tmpfs may hold half its
# RAM (1 GiB), and the two with the repository would come close to that.
R=$(mktemp -d /tmp/bench-image-root.XXXXXX) || exit 1
trap 'cd /; rm -rf "$W" "$R"' EXIT
up() { cut -d' ' -f1 /proc/uptime; }
# Everything on the local (tmpfs) file system, as in bench.py: on the test
# host's 9p share every read is a round trip to the outer host. The store
# goes without the layer blob (a converted image never reads it again),
# and with the layout's index.json beside the binary, so that --image
# default finds the stored image as it does after `make` (same digest).
mkdir -p "$W/bin" "$W/share/mvm/images/debian" "$W/libexec/mvm" "$W/peers/bin" \
    "$W/store/blobs/sha256" "$W/store/rootfs" "$W/repo" &&
    cp "$B/bin/mvm" "$W/bin/" &&
    cp "$B/share/mvm/vmlinux" "$B/share/mvm/initramfs.cpio" "$B/share/mvm/initramfs-image.cpio" "$W/share/mvm/" &&
    cp "$B/share/mvm/images/debian/index.json" "$W/share/mvm/images/debian/" &&
    cp "$B/libexec/mvm/virtiofsd" "$W/libexec/mvm/" &&
    cp "$B/peers/bin/bwrap" "$B/peers/bin/exectime" "$W/peers/bin/" &&
    cp -R "$B/peers/lib" "$W/peers/lib" &&
    cp "$STORE/names.json" "$W/store/" &&
    cp "$STORE/blobs/sha256/@MANIFEST@" "$STORE/blobs/sha256/@CONFIG@" "$W/store/blobs/sha256/" &&
    cp "$STORE/rootfs/"*.erofs "$W/store/rootfs/" || exit 1
export MVM_IMAGES=$W/store
M=$W/bin/mvm
P=$W/peers
X=$P/bin/exectime
# Before each timed run: bench.py's `launder` (docs/benchmarks.md, "The
# run before"), so that no run pays for the pages the run before freed.
LAUNDER=@LAUNDER@
LAUNDER_FILE=$W/launder
@LAUNDER_SH@
echo "info cpu $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "info kernel $(uname -r)"
echo "info mem $(awk '/^MemTotal/ { print $2 }' /proc/meminfo)"
echo "info vcpus $(grep -c '^processor' /proc/cpuinfo)"
echo "info mvm-version $("$M" --version)"
echo "info bwrap-version $("$P/lib/ld-linux-x86-64.so.2" --library-path "$P/lib" "$P/bin/bwrap" --version)"

# bubblewrap's root: the image's one layer, unpacked once. /workspace is
# made here because bubblewrap cannot make a mount point in a read-only
# root (the guest's overlay has one from guest-init).
t0=$(up)
gzip -dc "$B/share/mvm/images/debian/blobs/sha256/@LAYER@" | tar -xf - -C "$R" || exit 1
mkdir -p "$R/workspace" || exit 1
echo "info unpack $t0 $(up)"
echo "info root-du $(du -sk "$R" | cut -f1)"
echo "info df $(df -k /tmp /run | awk 'NR > 1 { printf "%s %s/%s KiB; ", $6, $3, $2 }')"

bw() {
    l=$1
    shift
    launder
    "$X" --label "$l" --timeout 300 -- \
        "$P/lib/ld-linux-x86-64.so.2" --library-path "$P/lib" "$P/bin/bwrap" $BWFLAGS "$@"
}
BWFLAGS="@BW_ALL@ @BW_BASE@"
if ! bw bwrap.try.1 true; then
    # Kernels without IPC namespaces (the test host's has no SysV IPC at
    # all) refuse --unshare-all.
    BWFLAGS="@BW_NO_IPC@ @BW_BASE@"
    bw bwrap.try.2 true || { echo "fail bwrap"; exit 1; }
fi
echo "info bwrap-flags $BWFLAGS"

# The repository: 100 directories of 100 small files on the host's tmpfs,
# committed once by the image's git in bubblewrap (the test host has no git
# of its own; bubblewrap writes to the tmpfs directly, where the guest
# would write every object through virtio-fs, minutes under TCG). A second,
# writable `git status` after a second refreshes the index, so that no
# entry is "racily clean" (re-read on every status) in the timed runs.
t0=$(up)
cd "$W/repo" && for d in $(seq 100); do
    mkdir d$d && for f in $(seq 100); do echo "$d $f" >d$d/f$f; done
done && cd / || exit 1
bw repo.make.1 --bind "$W/repo" /workspace --chdir /workspace bash -c \
    'git init -q && git add -A && git -c user.email=b@b -c user.name=b commit -qm init && sleep 1 && git status --porcelain >/dev/null' ||
    { echo "fail repo"; exit 1; }
echo "info repo $t0 $(up)"
echo "info repo-du $(du -sk "$W/repo" | cut -f1)"

PY=$(cat <<'EOF'
@PY_SCRIPT@
EOF
)
GIT=$(cat <<'EOF'
@GIT_SCRIPT@
EOF
)
mvm() {
    l=$1
    shift
    launder
    "$X" --label "$l" --timeout 300 -- "$M" run --print-stats "$@"
}
one() {
    r=$1
    mvm bb.run.$r --no-workspace -- true
    mvm img.run.$r --image default --no-workspace -- true
    # --root: the guest command as root, as bubblewrap's runs. mvm gives a
    # root caller uid 1000 in the guest otherwise, and the share shows
    # that uid as the files' owner: the index (written with uid 0) then
    # disagrees with every file, and git re-reads all 10,000 through
    # virtio-fs on each status (seen: about 60 s under TCG, not what a
    # caller whose uid the guest keeps would see).
    mvm pym.run.$r --root --image default --no-workspace -- bash -c "$PY"
    bw pyb.run.$r bash -c "$PY"
    mvm gitm.run.$r --root --image default --workspace "$W/repo" -- bash -c "$GIT"
    bw gitb.run.$r --ro-bind "$W/repo" /workspace --chdir /workspace bash -c "$GIT"
}
# The warm-up: a run that fails here says why in its lines, and the
# measured rounds would only repeat it.
one warm
i=1
while [ $i -le $N ]; do
    one $i
    echo "round $i $(up)"
    i=$((i + 1))
done
exit 0
"""

# (label prefix, what it is)
KINDS = {
    "bb": "busybox guest, `true`",
    "img": "default image, `true`",
    "pym": "default image, python",
    "pyb": "bubblewrap, python",
    "gitm": "default image, git status",
    "gitb": "bubblewrap, git status",
}


def blob(digest):
    return os.path.join(LAYOUT, "blobs", "sha256", digest.split(":", 1)[1])


def layout():
    """(manifest digest, config digest, layer digest, layer size) of the
    default image: index.json -> its tag's manifest -> layers[0]."""
    with open(os.path.join(LAYOUT, "index.json")) as f:
        index = json.load(f)
    m = next(m for m in index["manifests"]
             if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == TAG)
    with open(blob(m["digest"])) as f:
        manifest = json.load(f)
    if len(manifest["layers"]) != 1:
        sys.exit(f"bench-image: the default image has {len(manifest['layers'])} layers, expected 1")
    layer = manifest["layers"][0]
    return m["digest"], manifest["config"]["digest"], layer["digest"], layer["size"]


def conversions(runs):
    """Imports the default image into a fresh store RUNS times, on this
    machine; the last store is kept for the test host. Per import: the
    conversion time mvm prints, the whole import's wall time, the EROFS
    file's size and its disk use, and the entries."""
    shutil.rmtree(WORK, ignore_errors=True)
    got = []
    for k in range(1, runs + 1):
        store = os.path.join(WORK, f"store{k}")
        os.makedirs(store)
        started = time.monotonic()
        out = subprocess.run(
            [os.path.join(BUILD, "bin", "mvm"), "image", "import", f"oci:{LAYOUT}:{TAG}", "--name", TAG],
            env=dict(os.environ, MVM_IMAGES=store), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=600,
        )
        wall = time.monotonic() - started
        m = re.search(r"^mvm: converted \S+ to its root filesystem in ([0-9.]+) s \((\d+) entries",
                      out.stderr, re.M)
        if out.returncode != 0 or not m:
            sys.exit(f"bench-image: mvm image import failed ({out.returncode}):\n{out.stderr}")
        erofs = [os.path.join(store, "rootfs", n) for n in os.listdir(os.path.join(store, "rootfs"))]
        st = os.stat(erofs[0])
        got.append({"convert": float(m.group(1)), "import": wall, "entries": int(m.group(2)),
                    "bytes": st.st_size, "du": st.st_blocks * 512})
        if k < runs:
            shutil.rmtree(store)
        print(f"bench-image: import {k}/{runs}: {got[-1]}", file=sys.stderr)
    return got, os.path.join(WORK, f"store{runs}")


def uncompressed(path):
    n = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
    return n


def stats_of(run):
    """mvm's --print-stats figures in a run's stderr lines."""
    got = {}
    for fd, _, text in run.lines:
        m = STAT_LINE.match(text)
        if fd == 2 and m:
            got[m.group(1)] = float(m.group(2))
    return got


def inside(run):
    """{name: ms} of the T lines (less the clock's cost), plus their
    statuses and extras: {"py1": ms, ...}, {"py1": (status, extra)}."""
    raw, extra = {}, {}
    for fd, _, text in run.lines:
        if fd != 2 or not text.startswith("T "):
            continue
        words = text.split(" ")
        if words[1] in ("stat", "files"):
            extra[words[1]] = " ".join(words[2:])
            continue
        try:
            raw[words[1]] = (float(words[3]) - float(words[2])) * 1000
        except (IndexError, ValueError):
            continue
        extra[words[1]] = words[4:]
    clock = raw.pop("clock", 0.0)
    return {k: v - clock for k, v in raw.items()}, extra, clock


def med(values):
    return statistics.median(values) if values else None


def cell(values, unit="ms"):
    if not values:
        return "n/a"
    v = sorted(values)
    f = (lambda x: f"{x:.0f}") if unit == "KiB" or v[-1] >= 100 else (lambda x: f"{x:.1f}")
    return f"**{f(statistics.median(v))}** ({f(v[0])}-{f(v[-1])})"


def ratio(a, b):
    if not a or not b:
        return "n/a"
    return f"**{statistics.median(a) / statistics.median(b):.2f}**"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="rounds (default 5)")
    args = ap.parse_args()
    if args.n < 1:
        sys.exit("bench-image: -n must be at least 1")
    kind, model, hw = host_type()
    if not os.path.isfile(os.path.join(LAYOUT, "index.json")):
        sys.exit("bench-image: the default image is not built: run 'make'")
    if not os.path.isfile(os.path.join(PEERS, ".bundled")):
        sys.exit("bench-image: build/peers is missing: run 'make bench-image' (scripts/bundle-peers.sh build/peers)")
    if not os.path.isfile(os.path.join(PEERS, "bin", "bwrap")):
        sys.exit("bench-image: build/peers has no bwrap (build/peers/missing says why); bubblewrap is a `make deps` package")
    manifest, config, layer, layer_size = layout()

    # 4, here, first: its last store is the one the test host boots from.
    imports, store = conversions(3)
    tar_bytes = uncompressed(blob(layer))

    rel = lambda p: shlex.quote("/mvm" + p[len(BUILD):] if not hw else p)  # noqa: E731
    script = SETUP
    for key, value in {
        "@BUILD@": rel(BUILD), "@STORE@": shlex.quote(store), "@N@": str(args.n),
        "@MANIFEST@": manifest.split(":", 1)[1], "@CONFIG@": config.split(":", 1)[1],
        "@LAYER@": layer.split(":", 1)[1],
        "@BW_ALL@": BWRAP_NS_ALL, "@BW_NO_IPC@": BWRAP_NS_NO_IPC, "@BW_BASE@": BWRAP_BASE,
        "@PY_SCRIPT@": PY_SCRIPT, "@GIT_SCRIPT@": GIT_SCRIPT,
        "@LAUNDER@": "0" if hw else str(LAUNDER_MIB), "@LAUNDER_SH@": LAUNDER_SH,
    }.items():
        script = script.replace(key, value)
    where = "directly" if hw else "inside one test host"
    print(f"bench-image: {kind}; CPU {model}; {args.n} rounds after 1 warm-up, {where} "
          f"(several minutes; the test host reports only at the end)", file=sys.stderr)
    log = os.path.join(WORK, "setup.log")
    if os.path.exists(log):
        os.remove(log)
    script = script.replace("@LOG@", shlex.quote(log))
    # A stall of the heartbeat longer than the default 30 s while QEMU
    # stays busy was seen once in a run this long; give it longer before
    # calling the test host hung.
    env = dict(os.environ, MVM_TESTHOST_SETUP=script, MVM_TESTHOST_TIMEOUT="2400",
               MVM_TESTHOST_STALL="90")
    env.pop("MVM_TESTHOST_AFTER", None)
    started = datetime.datetime.now(datetime.timezone.utc)
    out = subprocess.run([WRAPPER, "--version"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=2500)
    elapsed = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    with open(log) if os.path.exists(log) else open(os.devnull) as f:
        setup = [line.rstrip("\n") for line in f if line.strip()]
    runs, info, other = parse_setup(setup)
    done = sum(1 for line in setup if line.startswith("round "))
    problems = []
    if out.returncode != 0:
        if done == 0:
            sys.exit(f"bench-image: the benchmark run failed ({out.returncode}):\n{out.stderr}\n"
                     + "\n".join(setup[-40:]))
        # The rounds finished before the failure are kept, and said.
        said = [line for line in out.stderr.splitlines() if line.startswith("mvm (test host): ")]
        problems.append(f"the test host call failed ({out.returncode}) after {done} of {args.n} rounds: "
                        + next((w for w in said if "hung" in w or "did not" in w), said[-1] if said else "no words")[:300] + "; the report has those rounds")
        args.n = done
    leftovers = [line for line in out.stderr.splitlines() if "left behind" in line]

    # Per kind: end to end, --print-stats, inside times; problems.
    e2e = {k: [] for k in KINDS}
    stat = {k: {} for k in KINDS}
    ins = {k: {} for k in KINDS}
    clocks = []
    views = {}
    for label in ["warm"] + [str(i) for i in range(1, args.n + 1)]:
        for k, what in KINDS.items():
            r = runs.get(f"{k}.run.{label}")
            if r is None:
                problems.append(f"{what}, run {label}: no output")
                continue
            why = r.why_failed()
            t, extra, clock = inside(r)
            if label == "warm":
                if why:
                    problems.append(f"{what}, warm-up: {why}")
                if "stat" in extra:
                    views[k] = extra["stat"]
                continue
            if why:
                problems.append(f"{what}, run {label}: {why}")
                continue
            bad = [n for n, e in extra.items() if n not in ("stat", "files") and e and e[0] != "0"]
            if k.startswith("git") and (extra.get("files") != "10000"
                                        or any(e[1:] != ["0"] for n, e in extra.items() if n.startswith("git"))):
                bad.append(f"files {extra.get('files')}, status lines "
                           f"{[e[1:] for n, e in extra.items() if n.startswith('git')]}")
            if bad:
                problems.append(f"{what}, run {label}: unexpected {bad}")
                continue
            e2e[k].append(r.exit[0])
            for name, v in stats_of(r).items():
                stat[k].setdefault(name, []).append(v)
            for name, v in t.items():
                ins[k].setdefault(name, []).append(v)
            clocks.append(clock)

    flags = re.sub(r"\S*/bench-image-root\.\w+", "ROOT", info.get("bwrap-flags", "?"))
    date = f"{started:%Y-%m-%d %H:%M} UTC"
    conv = [i["convert"] for i in imports]
    imp = [i["import"] for i in imports]
    last = imports[-1]
    tcg = "" if hw else (
        " Under TCG every figure is emulated time, and the guest runs under nested KVM on top of it: "
        "read the ratios, measured side by side in the same test host, not the times.")
    lines = [
        f"# The default image, {date}",
        "",
        f"- host: **{kind}**; CPU: {model}",
    ]
    if not hw:
        lines.append(f"- test host: {info.get('vcpus', '?')} vCPU, {int(info.get('mem', 0)) // 1024} MiB "
                     f"(MemTotal), kernel {info.get('kernel', '?')}, CPU as it sees it: {info.get('cpu', '?')}; "
                     "everything in 1-3 ran inside this one test host")
    lines += [
        f"- {info.get('mvm-version', 'mvm ?')}; {info.get('bwrap-version', 'bubblewrap ?')}; "
        f"guest: 1 vCPU, 512 MiB (mvm's defaults)",
        f"- {args.n} interleaved rounds after 1 warm-up of each; {elapsed:.0f} s in all (test host boot and "
        "set-up included). Cells: **median** (min-max) over the rounds; ratios are of medians."
        + ("" if hw else f" Before each timed run the test host wrote and freed {LAUNDER_MIB} MiB of its memory "
           "(docs/benchmarks.md, \"The run before\")."),
        "",
        "## 1. The default image over the busybox guest",
        "",
        "`mvm run --print-stats --no-workspace -- true`, without and with `--image default`.",
        "",
        "| | busybox initramfs | --image default | image / busybox |",
        "| --- | --- | --- | --- |",
    ]
    for name, label, unit, src in [
        ("e2e", "end to end, fork to reap (ms)", "ms", None),
        ("boot to init", "boot to init (ms)", "ms", "stat"),
        ("peak rss", "peak RSS of the mvm process, guest RAM included (KiB)", "KiB", "stat"),
        ("guest resident", "guest RAM resident at the end (KiB)", "KiB", "stat"),
    ]:
        a = e2e["bb"] if src is None else stat["bb"].get(name, [])
        b = e2e["img"] if src is None else stat["img"].get(name, [])
        lines.append(f"| {label} | {cell(a, unit)} | {cell(b, unit)} | {ratio(b, a)} |")
    for title, m, b, what in [
        ("## 2. Python start-up", "pym", "pyb", f"`{PY}`"),
        ("## 3. `git status` in a 10,000-file repository", "gitm", "gitb", f"`{GIT}`"),
    ]:
        n1, n2 = ("py1", "py2") if m == "pym" else ("git1", "git2")
        lines += [
            "",
            title,
            "",
            f"{what}, timed inside the sandbox (the command alone) and end to end (the whole `mvm run` "
            "or `bwrap`, fork to reap).",
            "",
            "| | mvm --image default | bubblewrap, same root | mvm / bubblewrap |",
            "| --- | --- | --- | --- |",
            f"| inside, first run (ms) | {cell(ins[m].get(n1))} | {cell(ins[b].get(n1))} | "
            f"{ratio(ins[m].get(n1), ins[b].get(n1))} |",
            f"| inside, second run in the same sandbox (ms) | {cell(ins[m].get(n2))} | {cell(ins[b].get(n2))} | "
            f"{ratio(ins[m].get(n2), ins[b].get(n2))} |",
            f"| end to end, both runs (ms) | {cell(e2e[m])} | {cell(e2e[b])} | {ratio(e2e[m], e2e[b])} |",
        ]
    lines += [
        "",
        "## 4. Conversion and size (on this machine, no VM)",
        "",
        "`mvm image import oci:build/share/mvm/images/debian:debian-bookworm` into a fresh store, 3 times.",
        "",
        "| | |",
        "| --- | --- |",
        f"| conversion to EROFS, as mvm prints it (s) | **{statistics.median(conv):.1f}** "
        f"({min(conv):.1f}-{max(conv):.1f}) |",
        f"| whole import: copy, digest checks, conversion (s) | **{statistics.median(imp):.1f}** "
        f"({min(imp):.1f}-{max(imp):.1f}) |",
        f"| entries | {last['entries']:,} |",
        f"| EROFS file | {last['bytes']:,} bytes ({last['bytes'] / 2**20:.1f} MiB); "
        f"on disk (du) {last['du']:,} bytes ({last['du'] / 2**20:.1f} MiB) |",
        f"| layer, gzip | {layer_size:,} bytes ({layer_size / 2**20:.1f} MiB) |",
        f"| layer, uncompressed tar | {tar_bytes:,} bytes ({tar_bytes / 2**20:.1f} MiB) |",
        "",
        "## How",
        "",
        "- Everything in 1-3 ran from files on the test host's own tmpfs: mvm, its kernel and initramfs, "
        "virtiofsd, bubblewrap, and the image store (the EROFS root, converted here beforehand). "
        "bubblewrap's root is the image's one layer unpacked there once (by busybox tar); the "
        "repository is 100 directories of 100 small files there, committed once.",
        "- Inside times: bash's `$EPOCHREALTIME` around the command in the same bash script in both "
        "sandboxes (the image's bash, PATH and LANG), less the cost of an empty command timed the same "
        f"way (median {statistics.median(clocks) if clocks else 0:.2f} ms). The first run is the command in "
        "a fresh sandbox: in a fresh VM the guest's page cache is cold, so every file the command opens "
        "comes through virtio-blk (the EROFS root) or virtio-fs (the workspace); in bubblewrap the "
        "files are in the host's page cache already. The second run repeats it in the same sandbox.",
        f"- bubblewrap: `bwrap {flags} ...`; for git also "
        "`--ro-bind REPO /workspace --chdir /workspace` (read-only, as mvm shares the workspace by default).",
        "- mvm runs python and git with `--root`, as bubblewrap's command runs as the test host's root: "
        "without it mvm gives a root caller uid 1000 in the guest, the workspace's files show that "
        "owner, every index entry then disagrees with its file, and git re-reads all 10,000 files on "
        "each status.",
        "- git: `--no-optional-locks`, so that `status` neither takes `.git/index.lock` nor rewrites the "
        "index on a read-only share; the index was refreshed once after the commit, and every timed run "
        "checked 10,000 tracked files and an empty status. What git compares with its index, as each "
        "side sees d1/f1 (inode, size, mtime, ctime, uid, gid): "
        + ("the same in both" if views.get("gitm") and views.get("gitm") == views.get("gitb")
           else f"mvm `{views.get('gitm')}`, bubblewrap `{views.get('gitb')}`")
        + ".",
        "- end to end: fork to reap by benches/exectime (bench.py's timer); boot to init, peak RSS and "
        "guest resident from `--print-stats` (peak RSS is the mvm process's own ru_maxrss, which holds "
        "the guest RAM it touched; virtiofsd is not in it).",
        f"- set-up in the test host: unpacking the layer {float(info['unpack'].split()[1]) - float(info['unpack'].split()[0]):.0f} s, "
        f"making and committing the repository {float(info['repo'].split()[1]) - float(info['repo'].split()[0]):.0f} s "
        f"(emulated); root {int(info.get('root-du', 0)) // 1024} MiB, repository {int(info.get('repo-du', 0)) // 1024} MiB on tmpfs."
        if "unpack" in info and "repo" in info else "- set-up: no timings came back",
        "",
        "What the ratios mean: 1 is what the Debian root costs a VM over the busybox initramfs, the whole "
        "`mvm run` included. 2 and 3 compare the same command on the same files in two sandboxes: the "
        "inside ratio is what the sandbox costs the command itself (a VM's cold guest page cache and "
        "its virtio devices against bubblewrap's direct access to the host's files), the end-to-end "
        "ratio what a caller waits for (for mvm a whole VM's boot and teardown)." + tcg,
    ]
    problems += [f"{line}" for line in leftovers]
    problems += [f"unexpected output: {line}" for line in other
                 if not line.startswith(("round ",))]
    if problems:
        lines += ["", "Problems during the run (failed runs are left out of the figures):", ""]
        lines += [f"- {p}" for p in problems]
    write_result("image", "\n".join(lines) + "\n", hw)


if __name__ == "__main__":
    main()
