#!/usr/bin/env bash
# Bundles Debian's containerd, its runc shim, ctr and runc (make deps
# installs them) with their libraries, for the e2e suite to run inside the
# QEMU TCG test host (tests/e2e/containerd.rs), whose initramfs has
# busybox and nothing else:
#
#   scripts/bundle-containerd.sh OUT_DIR        (make: build/containerd)
#
# OUT_DIR gets bin/{containerd,containerd-shim-runc-v2,ctr,runc}, lib/
# with every library ldd lists for them and the dynamic loader (the test
# puts them where the loader looks, in the test host's own root), and
# `versions`. Rebuilt into a temporary directory and moved into place.
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
mkdir -p "$tmp"
. "$root/scripts/ldd-closure.sh"

for name in containerd containerd-shim-runc-v2 ctr runc; do
    bin=$(command -v "$name") || {
        echo "bundle-containerd: $name not found: run 'make deps' (Debian packages containerd and runc)" >&2
        exit 1
    }
    bundle_binary "$bin" "$tmp"
done
{
    echo "containerd $(containerd --version)"
    echo "runc $(runc --version | head -n 1)"
} >"$tmp/versions"

rm -rf "$out"
mv "$tmp" "$out"
echo "bundle-containerd: $(tr '\n' ';' <"$out/versions") $(du -sh "$out" | cut -f1) in $out" >&2
