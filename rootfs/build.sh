#!/usr/bin/env bash
# Builds the guest initramfs: mvm-init as /init plus a static busybox.
#
#   rootfs/build.sh [--init-only] INIT_BINARY OUT_CPIO
#
# --init-only leaves busybox out: the initramfs of runs whose root is an
# image (initramfs-image.cpio), where nothing runs from the initramfs but
# guest-init, and half the archive less is unpacked at every boot
# (docs/benchmarks.md). A sandbox's machine keeps busybox: its mke2fs
# formats the sandbox's disk before the switch to the image root.
#
# The archive is uncompressed newc: the kernel unpacks it directly, which
# boots faster than decompressing. Entries are root-owned, sorted and dated
# at the epoch, so the same inputs give the same bytes, whoever builds it.
# Needs the Debian packages busybox-static and cpio (the Makefile installs
# them). Prints only a one-line summary, on stderr.
set -euo pipefail

with_busybox=1
if [ "${1:-}" = --init-only ]; then
    with_busybox=0
    shift
fi
if [ $# -ne 2 ]; then
    echo "usage: rootfs/build.sh [--init-only] INIT_BINARY OUT_CPIO" >&2
    exit 2
fi
init=$1 out=$2
busybox=/bin/busybox

[ -f "$init" ] || { echo "rootfs: no init binary at '$init'" >&2; exit 1; }
command -v cpio >/dev/null || { echo "rootfs: cpio not found; install the cpio package" >&2; exit 1; }
# The plain `busybox` package also ships /bin/busybox, but dynamically
# linked, which cannot run in a guest without a libc; insist on the static one.
if [ "$(dpkg-query -W -f '${db:Status-Status}' busybox-static 2>/dev/null)" != installed ] || [ ! -x "$busybox" ]; then
    echo "rootfs: $busybox missing; install the busybox-static package" >&2
    exit 1
fi

umask 022
tmp=$(mktemp -d)
partial=
trap 'rm -rf "$tmp" ${partial:+"$partial"}' EXIT

root=$tmp/root
mkdir -p "$root"/{bin,dev,proc,sys,tmp,run,root,etc,usr/bin,usr/sbin,sbin}
chmod 1777 "$root/tmp"
chmod 0700 "$root/root"
# Stripped: its symbols are a sixth of the binary, and every byte of the
# archive is unpacked at every boot (panics print no backtrace anyway).
install -m 0755 -s "$init" "$root/init"
if [ "$with_busybox" = 1 ]; then
    install -m 0755 "$busybox" "$root/bin/busybox"
    # One symlink per applet; init and linuxrc are skipped so that nothing
    # can be mistaken for (or run instead of) our /init.
    for applet in $("$busybox" --list); do
        case $applet in
        init | linuxrc | busybox) continue ;;
        esac
        ln -s busybox "$root/bin/$applet"
    done
fi

cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
nobody:x:65534:
GROUP

# Fixed mtimes (-h: the links themselves, not their target) and a sorted
# list make the archive reproducible; -R 0:0 makes it root-owned even when
# built by a normal user.
find "$root" -mindepth 1 -exec touch -h -d @0 {} +
mkdir -p "$(dirname "$out")"
partial=$(mktemp "$(dirname "$out")/.$(basename "$out").XXXXXX")
(cd "$root" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
    cpio --quiet -o -H newc -R 0:0 --reproducible) >"$partial"
chmod 0644 "$partial"
mv -f "$partial" "$out"
partial=

entries=$(find "$root" -mindepth 1 | wc -l)
echo "rootfs: $out ($entries entries, $(stat -c %s "$out") bytes)" >&2
