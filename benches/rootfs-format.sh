#!/usr/bin/env bash
# EROFS (mvm's own writer) next to squashfs (Debian's mksquashfs) for the
# default image's root, on this machine's kernel: build time, size on
# disk, and cold-cache reads of the mounted filesystem (the guest reads its
# root the same way, through the page cache, from a block device).
#
#   sudo benches/rootfs-format.sh [ROUNDS]     (after `make`; needs root:
#                                               loop mounts, drop_caches)
#
# Both filesystems hold the same files: the default image's one layer,
# unpacked as root (owners kept) for mksquashfs, converted straight from
# the tarball for EROFS. squashfs is measured twice: with its default
# compression (gzip) and uncompressed (-noI -noD -noF -noX), which is how
# mvm writes EROFS. Prints a Markdown table on stdout. Medians of ROUNDS
# (default 3). Not part of `make test`: it is the measurement behind the
# format choice in docs/images.md.
set -euo pipefail
rounds=${1:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
layout=$here/build/share/mvm/images/debian
mvm=$here/build/bin/mvm
[ "$(id -u)" = 0 ] || { echo "rootfs-format: needs root (loop mounts, drop_caches)" >&2; exit 1; }
command -v mksquashfs >/dev/null || { echo "rootfs-format: needs mksquashfs (squashfs-tools)" >&2; exit 1; }
[ -d "$layout" ] || { echo "rootfs-format: run make first ($layout missing)" >&2; exit 1; }

work=$(mktemp -d)
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() { umount "$mnt" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

manifest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"][7:])' "$layout/index.json")
layer=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layers"][0]["digest"][7:])' "$layout/blobs/sha256/$manifest")
mkdir -p "$work/root"
tar -xzf "$layout/blobs/sha256/$layer" -C "$work/root" --numeric-owner

now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

build() { # NAME -> prints seconds, writes $work/NAME.img
    local start end
    start=$(now)
    case $1 in
    erofs) MVM_IMAGES=$work/store "$mvm" image export-root "oci:$layout:debian-bookworm" "$work/erofs.img" >/dev/null 2>&1 ;;
    squashfs-gzip) mksquashfs "$work/root" "$work/squashfs-gzip.img" -noappend -quiet -no-progress >/dev/null ;;
    squashfs-none) mksquashfs "$work/root" "$work/squashfs-none.img" -noappend -quiet -no-progress -noI -noD -noF -noX >/dev/null ;;
    esac
    end=$(now)
    echo "$end - $start" | bc
}

cold() { # IMG FSTYPE CMD... -> seconds of CMD on a fresh cold mount
    local img=$1 fs=$2 start end
    shift 2
    mount -o loop,ro -t "$fs" "$img" "$mnt"
    sync; echo 3 >/proc/sys/vm/drop_caches
    start=$(now)
    "$@" >/dev/null 2>&1
    end=$(now)
    umount "$mnt"
    echo "$end - $start" | bc
}

echo "| format | build s | size MiB | find s | read all s | python3 import s |"
echo "| --- | --- | --- | --- | --- | --- |"
for f in erofs squashfs-gzip squashfs-none; do
    b=$(for _ in $(seq "$rounds"); do rm -rf "$work/store"; build $f; done | median)
    fs=${f%%-*}
    size=$(( $(stat -c %s "$work/$f.img") >> 20 ))
    fnd=$(for _ in $(seq "$rounds"); do cold "$work/$f.img" "$fs" find "$mnt"; done | median)
    all=$(for _ in $(seq "$rounds"); do cold "$work/$f.img" "$fs" tar -C "$mnt" -cf /dev/null .; done | median)
    py=$(for _ in $(seq "$rounds"); do cold "$work/$f.img" "$fs" chroot "$mnt" python3 -c 'import json, email, asyncio, http.client'; done | median)
    printf '| %s | %.2f | %d | %.3f | %.3f | %.3f |\n' "$f" "$b" "$size" "$fnd" "$all" "$py"
done
echo
echo "host: $(uname -srm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); rounds: $rounds (medians)"
