#!/usr/bin/env bash
# Builds a kernel from Debian's linux-source-6.12 with a config fragment
# merged onto `make tinyconfig`, and caches the result.
#
#   guest-kernel/build.sh FRAGMENT TARGET OUT_DIR
#
# TARGET is `vmlinux` (the mvm guest: uncompressed ELF) or `bzImage` (the
# test host, booted by QEMU). The cache key is the fragment, the target, the
# source package version and RECIPE (bump it when a change to this script
# changes what gets built), so a second run is a copy. Concurrent runs are
# serialised with a lock in the cache directory.
# OUT_DIR receives the image plus kernel.release, source-version,
# source-sha256 and config.
set -euo pipefail

fragment=$1 target=$2 out=$3
cache=${MVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mvm}
jobs=${JOBS:-$(nproc)}
RECIPE=1
mkdir -p "$cache/src" "$cache/kernels" "$out"
exec 9>"$cache/build.lock"
flock 9

case $target in
vmlinux) image=vmlinux ;;
bzImage) image=arch/x86/boot/bzImage ;;
*) echo "build.sh: target must be vmlinux or bzImage, not '$target'" >&2; exit 2 ;;
esac

# The source package: fetched once, its version and sha256 recorded.
deb=$(ls "$cache"/src/linux-source-6.12_*_all.deb 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$deb" ]; then
    echo "kernel: fetching Debian's linux-source-6.12" >&2
    (cd "$cache/src" && apt-get download linux-source-6.12 >&2)
    deb=$(ls "$cache"/src/linux-source-6.12_*_all.deb | sort -V | tail -n 1)
fi
version=$(dpkg-deb -f "$deb" Version)
sha=$(sha256sum "$deb" | cut -d' ' -f1)

key=$( (cat "$fragment"; echo "$target $version recipe=$RECIPE") | sha256sum | cut -c1-16)
name=$(basename "$(dirname "$(realpath "$fragment")")")-$(basename "$fragment" .config)
built="$cache/kernels/$name-$key"

if [ ! -f "$built/$target" ]; then
    tree="$cache/src/linux-$version"
    if [ ! -f "$tree/Makefile" ]; then
        echo "kernel: unpacking linux-source $version" >&2
        rm -rf "$tree" "$tree.tmp" && mkdir -p "$tree.tmp"
        dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tree.tmp" --wildcards '*.tar.xz'
        tar -xJf "$tree.tmp"/usr/src/linux-source-6.12.tar.xz -C "$tree.tmp"
        mv "$tree.tmp"/linux-source-6.12 "$tree" && rm -rf "$tree.tmp"
    fi
    obj="$cache/build/$name"
    rm -rf "$obj" && mkdir -p "$obj"
    # Reproducible identity strings: the build host leaves no trace.
    export KBUILD_BUILD_USER=mvm KBUILD_BUILD_HOST=mvm KBUILD_BUILD_TIMESTAMP="1970-01-01 00:00:00 UTC"
    echo "kernel: building $name ($target) from linux-source $version with $jobs jobs" >&2
    start=$(date +%s)
    make -s -C "$tree" O="$obj" tinyconfig >&2
    "$tree/scripts/kconfig/merge_config.sh" -m -O "$obj" "$obj/.config" "$fragment" >/dev/null
    make -s -C "$tree" O="$obj" olddefconfig >&2
    # Every option the fragment asks for must have stuck: a silently dropped
    # dependency would give a kernel that boots differently than documented.
    missing=0
    while read -r line; do
        case $line in
        CONFIG_*=*) grep -qxF "$line" "$obj/.config" || { echo "kernel: $line did not stick" >&2; missing=1; } ;;
        "# CONFIG_"*" is not set") opt=${line#\# }; opt=${opt%% *}
            if grep -q "^$opt=" "$obj/.config"; then echo "kernel: $opt should be off" >&2; missing=1; fi ;;
        esac
    done < "$fragment"
    [ $missing = 0 ] || { echo "kernel: fix $fragment" >&2; exit 1; }
    make -s -C "$tree" O="$obj" -j"$jobs" "$target" >&2
    mkdir -p "$built.tmp"
    cp "$obj/$image" "$built.tmp/$target"
    cp "$obj/.config" "$built.tmp/config"
    make -s -C "$tree" O="$obj" kernelrelease > "$built.tmp/kernel.release"
    echo "$version" > "$built.tmp/source-version"
    echo "$sha  $(basename "$deb")" > "$built.tmp/source-sha256"
    echo "$(( $(date +%s) - start ))" > "$built.tmp/build-seconds"
    rm -rf "$built" && mv "$built.tmp" "$built"
    rm -rf "$obj"
    echo "kernel: $name built in $(cat "$built/build-seconds") s" >&2
fi
for f in "$target" config kernel.release source-version source-sha256 build-seconds; do
    cp "$built/$f" "$out/$f.tmp" && mv "$out/$f.tmp" "$out/$f"
done
echo "kernel: $name $(cat "$out/kernel.release") -> $out/$target" >&2
