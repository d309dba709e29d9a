#!/usr/bin/env bash
# Installs the Debian packages the build and the test suite need, only if
# one is missing (so a warm machine does not touch apt at all).
#   flex bison bc libelf-dev libssl-dev: building the guest kernel
#   busybox-static cpio: the guest and test-host initramfs
#   qemu-system-x86: the TCG test host (tests/testhost/)
#   libseccomp-dev libcap-ng-dev: building virtiofsd (static, scripts/build-virtiofsd.sh)
#   bubblewrap: the container baseline `make bench` measures next to mvm
#     (benches/bench.py; QEMU, its other peer, is qemu-system-x86 above)
#   skopeo: the e2e suite's docker-archive of its test image is written by
#     a real peer tool, not by mvm (tests/e2e/images/make-test-image.sh)
#   erofs-utils: fsck.erofs checks the images the image crate writes
#   mmdebstrap: the default guest image from Debian's packages
#     (rootfs/debian/build.sh; it also brings mmtarfilter); uidmap: its
#     newuidmap/newgidmap, for --mode=unshare when the image is built by a
#     user who is not root
#   docker-registry: the distribution registry the e2e suite pulls from
#     (tests/e2e/registry.rs starts its own on 127.0.0.1)
#   g++: libFuzzer, which libfuzzer-sys compiles for the fuzz targets
#     (scripts/fuzz.sh)
#   containerd runc: containerd (with its runc shim and ctr) runs
#     containers through mvm's OCI runtime in the e2e suite
#     (tests/e2e/containerd.rs, scripts/bundle-containerd.sh); runc is the
#     baseline `make bench-containerd` measures where it can run
set -euo pipefail
packages=(flex bison bc libelf-dev libssl-dev busybox-static cpio qemu-system-x86 xz-utils
    libseccomp-dev libcap-ng-dev bubblewrap skopeo erofs-utils mmdebstrap uidmap docker-registry g++
    containerd runc)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}" >&2
if [ "$(id -u)" != 0 ]; then
    echo "deps: missing Debian packages ${missing[*]}: run 'sudo make deps' or install them" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
