#!/usr/bin/env bash
# Bundles what `make bench` runs next to mvm (benches/bench.py,
# docs/benchmarks.md) so that it runs wherever mvm runs: directly on a
# hardware-KVM host, or inside the QEMU TCG test host, whose initramfs has
# busybox and nothing else (no loader, no libc, no firmware).
#
#   scripts/bundle-peers.sh OUT_DIR        (make: build/peers)
#
# OUT_DIR gets:
#   bin/exectime              the timer (benches/exectime.rs), static
#   bin/qemu-system-x86_64    Debian's QEMU and bubblewrap, copied as they
#   bin/bwrap                 are, plus in lib/ every library `ldd` lists for
#                             them and the dynamic loader; run them as
#                             lib/ld-linux-x86-64.so.2 --library-path lib bin/X
#   share/qemu/               the firmware QEMU -M microvm loads
#   guest/bzImage             the guest kernel for QEMU: built from the same
#                             source and config as build/share/mvm/vmlinux
#                             (guest-kernel/guest.config), as a bzImage since
#                             QEMU cannot boot an ELF vmlinux without a PVH
#                             note; LZ4-packed, the fastest decompressor the
#                             kernel offers (the only config difference).
#                             Cached by guest-kernel/build.sh.
#   versions                  "qemu VERSION" and "bwrap VERSION" lines
#   missing                   one line per peer that is not installed, with
#                             the reason (bench.py prints it and skips that
#                             peer)
# Everything is rebuilt into a temporary directory and moved into place.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
tmp=$out.tmp.$$
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp"/{bin,lib,share/qemu,guest}
: >"$tmp/versions"
: >"$tmp/missing"

# The timer: std only, linked statically like mvm (no cargo, no crates).
rustc --edition 2021 -O -C strip=symbols --target x86_64-unknown-linux-gnu \
    -C target-feature=+crt-static --crate-name exectime \
    "$root/benches/exectime.rs" -o "$tmp/bin/exectime"

# bundle_binary: a binary and its whole ldd closure.
. "$root/scripts/ldd-closure.sh"
bundle() { bundle_binary "$1" "$tmp"; }

if qemu=$(command -v qemu-system-x86_64); then
    bundle "$qemu"
    # -M microvm's firmware (qboot); the kernel is loaded through fw_cfg.
    fw=
    for d in /usr/share/qemu /usr/share/seabios; do
        [ -f "$d/bios-microvm.bin" ] && { fw=$d/bios-microvm.bin; break; }
    done
    if [ -z "$fw" ]; then
        echo "qemu: no bios-microvm.bin in /usr/share/qemu or /usr/share/seabios" >>"$tmp/missing"
        rm -f "$tmp/bin/qemu-system-x86_64"
    else
        cp -L "$fw" "$tmp/share/qemu/"
        echo "qemu $("$qemu" --version | head -n 1)" >>"$tmp/versions"
    fi
else
    echo "qemu: qemu-system-x86_64 is not installed (Debian: qemu-system-x86)" >>"$tmp/missing"
fi

if bwrap=$(command -v bwrap); then
    bundle "$bwrap"
    echo "bwrap $("$bwrap" --version | head -n 1)" >>"$tmp/versions"
else
    echo "bwrap: bwrap is not installed (Debian: bubblewrap; make deps)" >>"$tmp/missing"
fi

# The guest kernel as a bzImage: guest.config plus the compression choice.
if [ -f "$tmp/bin/qemu-system-x86_64" ]; then
    # build.sh names its cache entry after the fragment's directory and
    # file name ("peers-qemu-guest") and keys it on the contents.
    frag=$tmp/kconfig/peers/qemu-guest.config
    mkdir -p "$(dirname "$frag")"
    {
        cat "$root/guest-kernel/guest.config"
        echo
        echo "# benches: the same kernel as a bzImage for QEMU -M microvm, LZ4-packed"
        echo "CONFIG_KERNEL_LZ4=y"
        echo "# CONFIG_KERNEL_XZ is not set"
    } >"$frag"
    "$root/guest-kernel/build.sh" "$frag" bzImage "$tmp/guest"
    rm -rf "$tmp/kconfig"
fi

rm -rf "$out"
mv "$tmp" "$out"
touch "$out/.bundled"
echo "bundle-peers: $(cat "$out/versions" | tr '\n' ';') $(du -sh "$out" | cut -f1) in $out" >&2
