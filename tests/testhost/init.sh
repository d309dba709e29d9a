#!/bin/sh
# PID 1 of the test host (busybox sh). The test host is a QEMU TCG machine
# with emulated AMD SVM, so its kernel (KVM_AMD built in) offers a working
# /dev/kvm; it runs exactly one mvm command for tests/testhost/mvm and then
# powers off.
#
# The wrapper hands everything over through 9p shares:
#   mvmbuild  -> /mvm   the repo's build/ dir (read-only): bin/mvm, share/mvm/,
#                       libexec/mvm/virtiofsd
#   mvmio     -> /io    per-call dir: argv (NUL-separated), env (NUL-separated
#                       NAME=VALUE), cwd, uid, gid, stdin, signal and, if
#                       given, setup, teardown and after (shell scripts); we write
#                       heartbeat (every second), mvm.started, stdout,
#                       stderr, signal.at and exit.at (uptimes), leftovers,
#                       setup.out/setup.status, teardown.out/teardown.status,
#                       after.out/after.status and,
#                       last, status
#   workspace -> the caller's cwd, mounted at the same absolute path so the
#                paths mvm is given mean the same thing here
# /io/stdout and /io/stderr get only mvm's own output: everything this script
# says goes to the test host console (the wrapper's console.log).

export PATH=/bin:/sbin:/usr/bin:/usr/sbin

# The kernel could not open /dev/console for us (the initramfs has no /dev
# nodes), so mount devtmpfs first and then take the console as stdio.
mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1

log() { echo "testhost: $*"; }

# Any failure before mvm ran: say why on the console and power off. With no
# /io/status the wrapper reports "stopped without a result" and shows this.
die() {
    log "error: $*"
    sync
    reboot -f
    sleep 60 # reboot -f does not return; never fall off the end as PID 1
}

# Leave the initramfs first. Its root (rootfs) is the one mount with no
# parent, and pivot_root(2) refuses to move away from it (EINVAL), which is
# what virtiofsd's namespace sandbox does into the shared directory
# ("Error entering sandbox: PivotRoot(... Invalid argument)"). So copy the
# small initramfs into a tmpfs and switch_root there (busybox: frees the
# initramfs, moves the tmpfs to /, chroots, execs); this script then runs
# again as the same PID 1 with the argument "switched".
if [ "${1:-}" != switched ]; then
    mkdir -p /newroot && mount -t tmpfs -o mode=0755 tmpfs /newroot || die "mount a tmpfs for the root"
    for d in /*; do
        case $d in
        /newroot | /dev) ;;
        *) cp -a "$d" /newroot/ || die "copy $d to the tmpfs root" ;;
        esac
    done
    mkdir -p /newroot/dev || die "mkdir /newroot/dev"
    exec switch_root /newroot /init switched
    die "switch_root to the tmpfs root failed"
fi

mount -t proc proc /proc || die "mount /proc"
mount -t sysfs sysfs /sys || die "mount /sys"
mount -t tmpfs -o mode=1777 tmpfs /tmp || die "mount /tmp"
mount -t tmpfs -o mode=0755 tmpfs /run || die "mount /run"
# Ptys, as on any Linux machine: `mvm oci` opens one for a container with a
# terminal (/dev/ptmx finds its instance at /dev/pts).
mkdir -p /dev/pts && mount -t devpts -o ptmxmode=0666 devpts /dev/pts || die "mount /dev/pts"
# The test host's loopback, as on any Linux machine: tests put servers on
# 127.0.0.1 here (e.g. containment check 3's listener, which the guest's
# own loopback must not reach). QEMU's network device is not configured.
ip link set lo up || die "bring up lo"

# 9p over virtio-pci. msize 512000 is the most the virtio transport accepts
# (PAGE_SIZE * (VIRTQUEUE_NUM - 3)); QEMU warns about slow small msizes.
# cache=mmap: no caching of data or metadata (the host sees every write at
# once, and we see the host's), but mmap works, which the static mvm binary
# and anything mvm maps from the workspace may need.
# /io gets cache=none: nothing maps its files, and it is the one share where
# a file is read (the @MARKER watcher's grep of /io/stdout) while another
# process writes it. With cache=mmap (write-through, read-cached folios
# since 9p moved to netfs) that once left the host a stdout whose first
# line ("ready") was six garbage bytes: the marker was never seen and the
# test that waited for it failed. cache=none reads and writes straight
# through to QEMU, with no folio in between.
p9opts=trans=virtio,version=9p2000.L,msize=512000,cache=mmap
mount -t 9p -o "${p9opts%,cache=mmap},cache=none" mvmio /io || die "mount the mvmio share at /io"
mount -t 9p -o "$p9opts,ro" mvmbuild /mvm || die "mount the mvmbuild share at /mvm"

cwd=$(cat /io/cwd) || die "no /io/cwd"
uid=$(cat /io/uid) || die "no /io/uid"
gid=$(cat /io/gid) || die "no /io/gid"
case $cwd in
/?*) ;;
*) die "cwd '$cwd' is not an absolute path below /" ;;
esac
mkdir -p "$cwd" || die "mkdir $cwd"
mount -t 9p -o "$p9opts" workspace "$cwd" || die "mount the workspace share at $cwd"

# Huge pages for what asks for them (kernel.config): anonymous memory as
# the wrapper's MVM_TESTHOST_THP says (transparent_hugepage=, never by
# default) and, unless that is never, a memfd under MADV_HUGEPAGE too, as
# mvm's guest RAM with shares is. Never compact memory to make one, in a
# fault or in khugepaged: under TCG that stalled the test host past the
# wrapper's heartbeat (docs/benchmarks.md).
thp=/sys/kernel/mm/transparent_hugepage
echo never >$thp/defrag || die "set $thp/defrag"
echo 0 >$thp/khugepaged/defrag || die "set $thp/khugepaged/defrag"
if ! grep -q '\[never\]' $thp/enabled; then
    echo advise >$thp/shmem_enabled || die "set $thp/shmem_enabled"
fi
log "transparent huge pages: $(cat $thp/enabled), shmem $(cat $thp/shmem_enabled)"

# KVM_AMD is built in, so /dev/kvm normally exists before init runs; wait a
# little anyway in case devtmpfs is late.
i=0
while [ ! -c /dev/kvm ]; do
    i=$((i + 1))
    [ $i -le 100 ] || die "/dev/kvm did not appear (no SVM? check -cpu)"
    sleep 0.1
done
log "/dev/kvm ready at $(cut -d' ' -f1 /proc/uptime) s uptime"

# A heartbeat for the wrapper: this machine's uptime, rewritten every
# second. A test host that hangs (QEMU gone idle, seen under nested KVM)
# stops it, and the wrapper, watching it from outside, says so at once
# instead of waiting out its timeout; one that is merely slow keeps it going.
(while :; do cut -d' ' -f1 /proc/uptime >/io/heartbeat; sleep 1; done) </dev/null >/dev/null 2>&1 &

# argv: one NUL-terminated argument each, kept byte for byte (spaces,
# newlines, quotes, empty arguments).
set --
while IFS= read -r -d '' a; do set -- "$@" "$a"; done </io/argv
# Environment the wrapper forwards (MVM_*, RUST_LOG, RUST_BACKTRACE).
if [ -f /io/env ]; then
    while IFS= read -r -d '' kv; do export "$kv"; done </io/env
fi
# HOME and TMPDIR on the test host's own tmpfs, not on /tmp: the workspace
# may be mounted over /tmp (a caller running in /tmp), and 9p cannot hold
# what mvm may put in TMPDIR (unix sockets, for one).
mkdir -p /run/home /run/tmp && chmod 1777 /run/tmp || die "mkdir /run/home /run/tmp"
chown "$uid:$gid" /run/home || die "chown /run/home"
export HOME=/run/home TMPDIR=/run/tmp

# Run as the caller's uid/gid, like mvm would run on the host. busybox has
# no setpriv --reuid or chpst, but its nsenter with no namespace options
# just sets gid (clearing supplementary groups) and uid, then execs.
# /dev/kvm is created root-only, so hand it to the caller.
if [ "$uid" != 0 ] || [ "$gid" != 0 ]; then
    chown "$uid:$gid" /dev/kvm || die "chown /dev/kvm"
    set -- nsenter -F -G "$gid" -S "$uid" -- /mvm/bin/mvm "$@"
    as_caller() { nsenter -F -G "$gid" -S "$uid" -- "$@"; }
else
    set -- /mvm/bin/mvm "$@"
    as_caller() { "$@"; }
fi

cd "$cwd" || die "cd $cwd"

# MVM_TESTHOST_SETUP: a script to run as the caller, in the cwd, before
# mvm; if it fails, mvm does not run (the wrapper exits 125 with its output).
if [ -f /io/setup ]; then
    log "running the setup script"
    as_caller sh -c "$(cat /io/setup)" </dev/null >/io/setup.out 2>&1
    setup_status=$?
    echo "$setup_status" >/io/setup.status
    if [ "$setup_status" != 0 ]; then
        log "the setup script failed with status $setup_status; not running mvm"
        cd /
        echo 125 >/io/status.tmp && mv /io/status.tmp /io/status || log "error: could not write /io/status"
        sync
        reboot -f
        sleep 60
    fi
fi

log "running mvm ($# words, uid $uid gid $gid) in $cwd"
: >/io/mvm.started
"$@" </io/stdin >/io/stdout 2>/io/stderr &
mvm_pid=$!
# A signal, as a user or supervisor would send one (MVM_TESTHOST_SIGNAL in
# the wrapper: "SIG WHEN [virtiofsd]"). WHEN is a number of seconds after
# mvm started, or @MARKER: as soon as a line MARKER is in mvm's stdout, so
# that a test waits for its command to be ready rather than for a time
# (given up after 300 s or when mvm is gone). The target is mvm, or every
# virtiofsd process. The uptime it went at is kept for the wrapper.
if [ -s /io/signal ]; then
    read -r sig when target </io/signal
    (
        case $when in
        @*)
            i=0
            until grep -qxF -e "${when#@}" /io/stdout 2>/dev/null; do
                kill -0 "$mvm_pid" 2>/dev/null && [ $i -lt 3000 ] || exit 0
                sleep 0.1
                i=$((i + 1))
            done
            ;;
        *) sleep "$when" ;;
        esac
        cut -d' ' -f1 /proc/uptime >/io/signal.at
        if [ "$target" = virtiofsd ]; then
            killall -"$sig" virtiofsd
        else
            kill -"$sig" "$mvm_pid"
        fi
    ) </dev/null >/dev/null 2>&1 &
fi
wait "$mvm_pid"
status=$?
cut -d' ' -f1 /proc/uptime >/io/exit.at
log "mvm exited with status $status at $(cat /io/exit.at) s uptime"

# MVM_TESTHOST_TEARDOWN: a script to run as the caller right after mvm and
# before the leftover check (e.g. `mvm rm -f NAME` for a sandbox the setup
# script created): what it does not stop is left behind.
if [ -f /io/teardown ]; then
    log "running the teardown script"
    as_caller sh -c "$(cat /io/teardown)" </dev/null >/io/teardown.out 2>&1
    echo $? >/io/teardown.status
fi

# Whatever mvm left behind is a bug: session directories (with their
# sockets) under the runtime base, or live (not zombie: those are orphans
# waiting for this PID 1 to reap them) mvm or virtiofsd processes. Checked
# before the after script runs, so that cannot hide or add any.
# mvm's helpers see the VMM's end of their socket close when it dies and
# exit on their own; give them a moment (SIGKILL of mvm, for one) before
# calling them left behind.
helpers_alive() {
    for p in /proc/[0-9]*; do
        case $(cat "$p/comm" 2>/dev/null) in
        mvm | virtiofsd)
            state=$(cut -d')' -f2 "$p/stat" 2>/dev/null | cut -d' ' -f2)
            [ -n "$state" ] && [ "$state" != Z ] && return 0
            ;;
        esac
    done
    return 1
}
i=0
while helpers_alive && [ $i -lt 20 ]; do
    sleep 0.1
    i=$((i + 1))
done
{
    ls -d /run/tmp/mvm-*/* 2>/dev/null
    for p in /proc/[0-9]*; do
        comm=$(cat "$p/comm" 2>/dev/null) || continue
        case $comm in
        mvm | virtiofsd) ;;
        *) continue ;;
        esac
        # /proc/PID/stat: "PID (COMM) STATE ..."; comm has no ')' here.
        state=$(cut -d')' -f2 "$p/stat" 2>/dev/null | cut -d' ' -f2)
        [ -n "$state" ] && [ "$state" != Z ] && echo "$comm process ${p#/proc/}"
    done
} >/io/leftovers

# MVM_TESTHOST_AFTER: a script to run as the caller, in the cwd, after mvm,
# with MVM_STATUS set; its output goes back to the wrapper.
if [ -f /io/after ]; then
    log "running the after script"
    export MVM_STATUS="$status"
    as_caller sh -c "$(cat /io/after)" </dev/null >/io/after.out 2>&1
    echo $? >/io/after.status
fi

# status last, and atomically: its presence means stdout/stderr are complete.
cd /
echo "$status" >/io/status.tmp && mv /io/status.tmp /io/status || log "error: could not write /io/status"
sync
# QEMU runs with -no-reboot, so this reset ends it.
reboot -f
sleep 60
