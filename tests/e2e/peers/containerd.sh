#!/bin/sh
# Starts Debian's containerd in the test host for tests/e2e/containerd.rs
# and imports the suite's test image into it:
#
#   sh tests/e2e/peers/containerd.sh IMAGE_LAYOUT     (as root: a setup script)
#
# The binaries are build/containerd's (scripts/bundle-containerd.sh: the
# test host's /mvm/containerd; $MVM_BUILD/containerd on a hardware-KVM
# host), dynamically linked: in the test host, whose root (a tmpfs) has
# no libc, their loader and libraries go where the loader looks. cgroup2
# is mounted for runc and the shim where nothing is mounted there yet. containerd keeps
# everything under /run/tmp/ctd (its socket too) and uses the native
# snapshotter (plain copies: no overlay needed); the CRI plugin and the
# snapshotters the test host cannot run are off. IMAGE_LAYOUT (an OCI
# image layout directory) is imported as an OCI archive, under the name
# mvm-test/layers:TAG. Prints `containerd=ready` when it is done.
set -eu

layout=$1
c=${MVM_BUILD:-/mvm}/containerd
d=/run/tmp/ctd

if [ ! -e /lib64/ld-linux-x86-64.so.2 ]; then
    mkdir -p /lib64 /lib/x86_64-linux-gnu
    cp "$c/lib/ld-linux-x86-64.so.2" /lib64/
    cp "$c"/lib/*.so* /lib/x86_64-linux-gnu/
fi
if ! grep -q ' /sys/fs/cgroup ' /proc/mounts; then
    mkdir -p /sys/fs/cgroup
    mount -t cgroup2 none /sys/fs/cgroup
fi

rm -rf "$d"
mkdir -p "$d"
cat >"$d/config.toml" <<TOML
version = 2
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.overlayfs"]
[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
TOML
PATH=$c/bin:$PATH containerd --config "$d/config.toml" >"$d/containerd.log" 2>&1 &
echo $! >"$d/containerd.pid"
i=0
until [ -S "$d/containerd.sock" ]; do
    i=$((i + 1))
    [ $i -le 150 ] || { echo "containerd=failed: no socket after 30 s"; tail -5 "$d/containerd.log"; exit 1; }
    sleep 0.2
done
export CONTAINERD_ADDRESS="$d/containerd.sock" CONTAINERD_NAMESPACE=mvm
tar -C "$layout" -cf "$d/image.tar" .
"$c/bin/ctr" image import --snapshotter native --base-name mvm-test/layers "$d/image.tar" >/dev/null
echo containerd=ready
