#!/usr/bin/env bash
# Builds mvm's statically linked virtiofsd (the virtio-fs backend mvm
# spawns as a helper process: virtiofsd/ in this repository, the published
# virtiofsd crate as a library behind mvm's guard for files the host runs
# later), and caches the result.
#
#   scripts/build-virtiofsd.sh OUT_PATH
#
# Static because it must also run inside the test host's bare busybox
# initramfs (tests/testhost/), which has no libc and no loader; there the
# build dir is shared at /mvm, so `make`'s build/libexec/mvm/virtiofsd is
# /mvm/libexec/mvm/virtiofsd. libseccomp and libcap-ng are linked in from
# their Debian -dev packages' static archives (scripts/install-deps.sh).
#
# The cache key is VERSION, RECIPE (bump it when a change to this script
# changes what gets built) and a hash of virtiofsd/'s sources: the binary
# lives in $MVM_CACHE/virtiofsd-VERSION-static/rRECIPE-HASH/, so a second
# run is a copy.
# Concurrent runs are serialised with a lock in that directory. The build
# uses its own CARGO_TARGET_DIR there (never the repo's target/), removed
# once the binary is in the cache. The result is checked before it is
# cached: statically linked, and `--version` runs and names VERSION.
# OUT_PATH is written atomically: the old file or the complete new one.
set -euo pipefail

VERSION=1.14.0
RECIPE=2
TARGET=x86_64-unknown-linux-gnu
src=$(cd "$(dirname "$0")/../virtiofsd" && pwd)

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_PATH" >&2
    exit 2
fi
out=$1
cache=${MVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mvm}
dir=$cache/virtiofsd-$VERSION-static
sources=$(cd "$src" && find Cargo.toml Cargo.lock src -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
built=$dir/r$RECIPE-$sources
mkdir -p "$dir"
exec 9>"$dir/build.lock"
flock 9

# Statically linked, and it runs: the two things the test host needs.
# (ldd fails on a static binary; only its message matters.)
verify() {
    local bin=$1 lddout said
    lddout=$(LC_ALL=C ldd "$bin" 2>&1 || true)
    case $lddout in
    *"not a dynamic executable"* | *"statically linked"*) ;;
    *)
        echo "virtiofsd: $bin is dynamically linked:" >&2
        printf '%s\n' "$lddout" >&2
        return 1
        ;;
    esac
    if ! said=$("$bin" --version 2>&1); then
        echo "virtiofsd: $bin --version failed: $said" >&2
        return 1
    fi
    case $said in
    *"$VERSION"*) ;;
    *) echo "virtiofsd: $bin --version says '$said', not $VERSION" >&2; return 1 ;;
    esac
}

if [ ! -f "$built/virtiofsd" ]; then
    # The static archives the -sys crates link: wherever this system's
    # compiler finds them (Debian: /usr/lib/x86_64-linux-gnu).
    libdir() {
        local a
        a=$(gcc -print-file-name="$1")
        if [ "$a" = "$1" ] || [ ! -f "$a" ]; then
            echo "virtiofsd: $1 not found: install libseccomp-dev and libcap-ng-dev ('make deps')" >&2
            return 1
        fi
        dirname "$(readlink -f "$a")"
    }
    seccomp_dir=$(libdir libseccomp.a)
    capng_dir=$(libdir libcap-ng.a)

    root=$dir/root.tmp
    rm -rf "$root" "$built.tmp"
    echo "virtiofsd: building $VERSION (static, $TARGET)" >&2
    start=$(date +%s)
    # --locked: virtiofsd/Cargo.lock. --target keeps crt-static off build
    # scripts and proc macros. Run from the cache dir so nothing of the
    # caller's directory (a toolchain file, cargo config) applies.
    (
        cd "$dir"
        export CARGO_TARGET_DIR=$dir/target
        export LIBSECCOMP_LINK_TYPE=static LIBSECCOMP_LIB_PATH=$seccomp_dir
        export LIBCAPNG_LINK_TYPE=static LIBCAPNG_LIB_PATH=$capng_dir
        export RUSTFLAGS="-C target-feature=+crt-static"
        cargo install --locked --quiet --path "$src" --target "$TARGET" --root "$root" >&2
    )
    verify "$root/bin/virtiofsd"
    mkdir -p "$built.tmp"
    cp "$root/bin/virtiofsd" "$built.tmp/virtiofsd"
    echo "$VERSION" >"$built.tmp/version"
    (cd "$built.tmp" && sha256sum virtiofsd >sha256)
    echo "$(($(date +%s) - start))" >"$built.tmp/build-seconds"
    rm -rf "$built" && mv "$built.tmp" "$built"
    rm -rf "$root" "$dir/target"
    # Builds of earlier sources are not used again.
    find "$dir" -mindepth 1 -maxdepth 1 -name 'r[0-9]*' ! -name "r$RECIPE-$sources" -exec rm -rf {} +
    echo "virtiofsd: built in $(cat "$built/build-seconds") s" >&2
fi

# The cached copy is what it was when it was checked.
if ! (cd "$built" && sha256sum --quiet -c sha256); then
    echo "virtiofsd: $built/virtiofsd does not match its recorded sha256; remove $built to rebuild" >&2
    exit 1
fi
mkdir -p "$(dirname "$out")"
partial=$out.tmp.$$
trap 'rm -f "$partial"' EXIT
cp "$built/virtiofsd" "$partial"
chmod 0755 "$partial"
mv -f "$partial" "$out"
echo "virtiofsd: $VERSION (static) -> $out" >&2
