#!/usr/bin/env bash
# Builds the test host's initramfs: a static busybox, its applet links and
# /init (tests/testhost/init.sh). The test host is the QEMU TCG machine that
# gives mvm a nested /dev/kvm where the real one cannot boot Linux (see
# tests/testhost/mvm).
#
#   tests/testhost/build-initramfs.sh OUT_CPIO
#
# Output: an uncompressed newc cpio (the kernel unpacks it directly; no
# decompressor needed in the tinyconfig kernel), every entry owned by 0:0 and
# dated 1970-01-01 so the archive depends only on its inputs. Written
# atomically: OUT_CPIO is either the old file or the complete new one.
#
# No /dev/console node is put in: creating one needs mknod (root), and init
# mounts devtmpfs first and reopens /dev/console itself. The kernel's
# "unable to open an initial console" warning is harmless (and hidden by
# `quiet`).
#
# BUSYBOX overrides which busybox is used; it must be statically linked
# (Debian: busybox-static) since the initramfs holds no libc.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_CPIO" >&2
    exit 2
fi
out=$1
here=$(cd "$(dirname "$0")" && pwd)

busybox=${BUSYBOX:-$(command -v busybox || true)}
if [ -z "$busybox" ] || [ ! -x "$busybox" ]; then
    echo "build-initramfs: busybox not found (install busybox-static)" >&2
    exit 1
fi
# A dynamically linked busybox would die at once in the test host with
# "not found" (no loader there): refuse it here, where the reason is clear.
# (ldd fails on a static binary; only its message matters.)
lddout=$(LC_ALL=C ldd "$busybox" 2>&1 || true)
if [[ $lddout != *"not a dynamic executable"* ]]; then
    echo "build-initramfs: $busybox is dynamically linked; install busybox-static or set BUSYBOX" >&2
    exit 1
fi

# Modes in the archive come from here: mvm runs as the caller's uid in the
# test host and must be able to enter bin/ and run busybox.
umask 022
tmp=$(mktemp -d)
partial=$out.tmp.$$
trap 'rm -rf "$tmp" "$partial"' EXIT
root=$tmp/root

# Mount points init.sh uses; /mvm and /io are the 9p shares.
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,dev,proc,sys,tmp,run,root,mvm,io}
cp "$busybox" "$root/bin/busybox"
chmod 0755 "$root/bin/busybox"
# --list-full names each applet with its usual directory (bin/sh,
# usr/bin/env, ...), so scripts find them where they expect.
"$busybox" --list-full | while read -r applet; do
    [ "$applet" = bin/busybox ] || ln -sf /bin/busybox "$root/$applet"
done
install -m 0755 "$here/init.sh" "$root/init"

# Fixed timestamps and sorted names: the same inputs give the same bytes.
find "$root" -exec touch -h -d @0 {} +
(cd "$root" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
    cpio -o -H newc -R 0:0 --reproducible --quiet) > "$tmp/initramfs.cpio"

mkdir -p "$(dirname "$out")"
cp "$tmp/initramfs.cpio" "$partial"
mv -f "$partial" "$out"
