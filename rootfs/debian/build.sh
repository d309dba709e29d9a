#!/usr/bin/env bash
# Builds mvm's default guest image, a Debian bookworm root filesystem made
# from Debian's packages by mmdebstrap, and writes it as an OCI image
# layout, cached under $MVM_CACHE like the kernels.
#
#   rootfs/debian/build.sh OUT_DIR
#
# OUT_DIR receives oci-layout, index.json (one manifest, tagged
# debian-bookworm through org.opencontainers.image.ref.name) and
# blobs/sha256/: the manifest, the image config and one gzip'd layer.
# `skopeo inspect oci:OUT_DIR:debian-bookworm` reads it.
#
# What goes in: rootfs/debian/packages (one package a line) on top of
# mmdebstrap's `apt` variant (Essential: yes packages plus apt), without
# Recommends, docs, man pages or translations.
#
# Cache: the key is the package names of rootfs/debian/packages (comments
# and order do not count), RECIPE, the release and the architecture. It does
# not include the package versions, which are only known after fetching:
# a cached image does not pick up Debian's point releases or security
# updates by itself. Bump RECIPE when a change to this script changes what
# gets built; MVM_REBUILD_IMAGE=1 rebuilds the cached image from the
# current archive (the cache entry records when it was built and which
# versions went in, and a cache hit prints its build date).
#
# Mode: as root mmdebstrap runs in --mode=root; otherwise --mode=unshare,
# which needs unprivileged user namespaces, newuidmap/newgidmap (Debian's
# uidmap package) and ranges for the user in /etc/subuid and /etc/subgid.
# The mirror is whatever the host's apt sources say (no mirror argument).
#
# Reproducible for the same inputs and the same archive contents:
# SOURCE_DATE_EPOCH is fixed here, gzip -n, JSON with sorted keys, and the
# host's /etc/hostname and /etc/resolv.conf are replaced.
#
# Output is atomic: the image is built in a temporary directory inside the
# cache and renamed into place, then copied to a temporary directory next
# to OUT_DIR and renamed; temporary files go on any exit. Prints one summary
# line on stderr; mmdebstrap's own progress only when stderr is a terminal.
set -euo pipefail

RECIPE=2
RELEASE=bookworm
ARCH=amd64
TAG=debian-$RELEASE
# 2025-05-20T00:00:00Z (Debian 12.11). Fixed so that the same inputs give
# the same bytes; it is every generated file's mtime and the config's
# `created`, not the build date (the cache entry has that).
EPOCH=1747699200

if [ $# -ne 1 ]; then
    echo "usage: rootfs/debian/build.sh OUT_DIR" >&2
    exit 2
fi
out=${1%/}
here=$(cd "$(dirname "$0")" && pwd)
list=$here/packages
cache=${MVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mvm}

command -v mmdebstrap >/dev/null || { echo "image: mmdebstrap not found; run 'make deps' (Debian package mmdebstrap)" >&2; exit 1; }
[ "$(dpkg --print-architecture)" = "$ARCH" ] || { echo "image: only $ARCH hosts build the $ARCH image" >&2; exit 1; }

# Package names only: comments, blank lines, order and duplicates do not
# change the image, so they do not change the cache key either.
packages=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$list" | grep . | LC_ALL=C sort -u)
[ -n "$packages" ] || { echo "image: no packages in $list" >&2; exit 1; }
key=$( (echo "$packages"; echo "release=$RELEASE arch=$ARCH variant=apt recipe=$RECIPE") | sha256sum | cut -c1-16)
built=$cache/images/$TAG-$key

umask 022
mkdir -p "$cache/images"
# One build at a time per cache (a second `make` waits, then copies).
exec 9>"$cache/images/build.lock"
flock 9

# scrub DIR: removes DIR and never what is mounted inside it. A root-mode
# mmdebstrap that was killed can leave the chroot's /proc, /sys, /dev/pts
# and /dev/shm mounted in its scratch directory: those are unmounted
# first (deepest first), and rm stays on DIR's file system regardless.
scrub() {
    local m
    awk -v p="$1/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null || true; done
    rm -rf --one-file-system "$1"
}
# Whatever was half-made goes, on success, failure or interruption (the
# INT and TERM traps turn a signal into an exit, which runs the EXIT trap;
# bash takes them once mmdebstrap, which gets a terminal's ^C itself, is
# done).
tmp=
staged=
old=
cleanup() {
    local d
    for d in ${tmp:+"$tmp"} ${staged:+"$staged"} ${old:+"$old"}; do scrub "$d"; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# What a run killed outright (SIGKILL, a crash) left behind; the lock says
# no other run is using it.
for d in "$cache"/images/.build.* "$(dirname "$out")/.$(basename "$out")".*; do
    if [ -d "$d" ]; then scrub "$d"; fi
done

if [ ! -f "$built/layout/index.json" ] || [ "${MVM_REBUILD_IMAGE:-0}" = 1 ]; then
    start=$(date +%s)
    tmp=$(mktemp -d "$cache/images/.build.XXXXXX")
    chmod 0755 "$tmp"
    if [ "$(id -u)" = 0 ]; then mode=root; else mode=unshare; fi
    echo "image: building $TAG ($(echo "$packages" | wc -l) packages listed, --mode=$mode; about a minute with a fast mirror)" >&2
    quiet=(--quiet)
    [ -t 2 ] && quiet=()
    # The dpkg path filters keep docs (but the copyright files), man pages,
    # info pages and translations out, now and for anything installed in the
    # guest later (they stay in /etc/dpkg/dpkg.cfg.d/99mmdebstrap).
    # Hooks: mmdebstrap copies the host's /etc/hostname and
    # /etc/resolv.conf in; the image gets a fixed hostname and no resolver
    # (the host's would mean nothing in a guest, and would make the bytes
    # depend on the build host). /etc/apt/sources.list stays: it is the
    # host's apt sources, which apt in the guest then uses. /etc/passwd and
    # /etc/group come from base-passwd; no user is added (mvm adds the
    # caller's entry at run time), and a missing one is an error here, not
    # in the guest.
    # As root, mmdebstrap's own scratch directory goes inside $tmp, so that
    # nothing outlives a killed build; unshare mode needs a TMPDIR that the
    # unshared (sub)uid can enter, so it keeps the default /tmp.
    tmpdir=${TMPDIR:-/tmp}
    [ $mode = root ] && tmpdir=$tmp
    SOURCE_DATE_EPOCH=$EPOCH TMPDIR=$tmpdir mmdebstrap "${quiet[@]}" \
        --mode="$mode" --variant=apt --architectures="$ARCH" \
        --include="$(echo "$packages" | paste -sd, -)" \
        --aptopt='Apt::Install-Recommends "false"' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/lintian/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old' \
        --customize-hook='echo mvm > "$1/etc/hostname"' \
        --customize-hook='printf "127.0.0.1\tlocalhost\n127.0.1.1\tmvm.localdomain mvm\n::1\tlocalhost ip6-localhost ip6-loopback\n" > "$1/etc/hosts"' \
        --customize-hook='rm -f "$1/etc/resolv.conf"' \
        --customize-hook='test -s "$1/etc/passwd" && test -s "$1/etc/group"' \
        "$RELEASE" "$tmp/rootfs.tar"

    # Device nodes out: the guest mounts devtmpfs on /dev, and an importer
    # that is not root could not create them anyway. /dev itself stays.
    mmtarfilter --path-exclude='/dev/*' < "$tmp/rootfs.tar" > "$tmp/layer.tar"
    rm "$tmp/rootfs.tar"
    # What went in, for the record (the cache key cannot know it).
    tar -xOf "$tmp/layer.tar" ./var/lib/dpkg/status |
        awk '/^Package:/ { p = $2 } /^Version:/ { print p, $2 }' | LC_ALL=C sort > "$tmp/versions"
    files=$(tar -tf "$tmp/layer.tar" | wc -l)
    raw=$(stat -c %s "$tmp/layer.tar")
    diff_id=sha256:$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)
    # gzip -n: no name or timestamp in the header, so same tar, same blob.
    # Level 6 (the default) is within a few per cent of -9 and faster.
    gzip -n -6 < "$tmp/layer.tar" > "$tmp/layer.tar.gz"
    rm "$tmp/layer.tar"

    layout=$tmp/layout
    mkdir -p "$layout/blobs/sha256"
    # blob FILE: moves FILE into the layout under its digest; prints
    # "DIGEST SIZE".
    blob() {
        local d s
        d=$(sha256sum "$1" | cut -d' ' -f1)
        s=$(stat -c %s "$1")
        mv "$1" "$layout/blobs/sha256/$d"
        echo "sha256:$d $s"
    }
    read -r layer_digest layer_size < <(blob "$tmp/layer.tar.gz")
    # JSON by Python, with sorted keys and no trailing newline, so each
    # document has one byte form and the digests are stable.
    python3 - "$tmp" "$EPOCH" "$ARCH" "$diff_id" "$RELEASE" <<'EOF'
import json, sys, datetime
tmp, epoch, arch, diff_id, release = sys.argv[1:]
created = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
config = {
    "architecture": arch,
    "os": "linux",
    "created": created,
    "config": {
        "Env": [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG=C.UTF-8",
        ],
        "Cmd": ["/bin/bash"],
        "Labels": {"org.opencontainers.image.description":
                   f"mvm default guest image: Debian {release} from Debian's packages"},
    },
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    "history": [{"created": created, "created_by": "mvm rootfs/debian/build.sh (mmdebstrap)"}],
}
with open(f"{tmp}/config.json", "w") as f:
    json.dump(config, f, sort_keys=True, separators=(",", ":"))
EOF
    read -r config_digest config_size < <(blob "$tmp/config.json")
    python3 - "$tmp" "$config_digest" "$config_size" "$layer_digest" "$layer_size" <<'EOF'
import json, sys
tmp, cd, cs, ld, ls = sys.argv[1:]
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": int(cs)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": ld, "size": int(ls)}],
}
with open(f"{tmp}/manifest.json", "w") as f:
    json.dump(manifest, f, sort_keys=True, separators=(",", ":"))
EOF
    read -r manifest_digest manifest_size < <(blob "$tmp/manifest.json")
    python3 - "$layout" "$manifest_digest" "$manifest_size" "$TAG" "$ARCH" <<'EOF'
import json, sys
layout, md, ms, tag, arch = sys.argv[1:]
index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": md, "size": int(ms),
        "platform": {"architecture": arch, "os": "linux"},
        "annotations": {"org.opencontainers.image.ref.name": tag},
    }],
}
with open(f"{layout}/index.json", "w") as f:
    json.dump(index, f, sort_keys=True, separators=(",", ":"))
with open(f"{layout}/oci-layout", "w") as f:
    json.dump({"imageLayoutVersion": "1.0.0"}, f, sort_keys=True, separators=(",", ":"))
EOF
    secs=$(( $(date +%s) - start ))
    {
        echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "seconds=$secs"
        echo "files=$files"
        echo "layer_tar_bytes=$raw"
        echo "layer_gz_bytes=$layer_size"
        echo "layout_bytes=$(du -sb "$layout" | cut -f1)"
        echo "manifest=$manifest_digest"
    } > "$tmp/summary"
    rm -rf "$built" && mv "$tmp" "$built"
    tmp=
    how="built in ${secs} s"
else
    how="cached, built $(sed -n 's/^built_at=//p' "$built/summary")"
fi

# The copy: into a temporary directory next to OUT_DIR, then renamed over
# it (the old one moved aside first: a directory cannot be renamed over a
# non-empty one). Touched so that make sees it newer than its inputs.
mkdir -p "$(dirname "$out")"
staged=$(mktemp -d "$(dirname "$out")/.$(basename "$out").XXXXXX")
cp -R "$built/layout/." "$staged/"
chmod 0755 "$staged"
if [ -e "$out" ]; then
    old=$(mktemp -d "$(dirname "$out")/.$(basename "$out").old.XXXXXX")
    mv "$out" "$old/"
fi
mv "$staged" "$out"
staged=
touch "$out"

. "$built/summary"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "image: $TAG $how: layer $(mib "$layer_gz_bytes") gzip / $(mib "$layer_tar_bytes") tar, $files files -> $out" >&2
