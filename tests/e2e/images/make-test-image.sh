#!/usr/bin/env bash
# Builds the e2e suite's own two-layer image from static busybox (not
# Debian: a different builder, a different shape), as an OCI image layout
# and, converted by Debian's skopeo (a real peer, not our code), as a
# docker-archive:
#
#   tests/e2e/images/make-test-image.sh OUT_DIR
#
# OUT_DIR/oci (tag "layers"), OUT_DIR/image.tar (docker-archive, tag
# "mvm-test/layers:1"). The layers are made by GNU tar, so the importer
# reads what a real tool writes:
#   layer 1: busybox and its applets, /etc/passwd and /etc/group, /gone,
#            /opq/{a,b}, /keep/old, /setuid (prints its euid; mode 4755)
#   layer 2: /.wh.gone (a whiteout), /opq/.wh..wh..opq (opaque) with
#            /opq/c, /keep/new, and /links/x with /links/y a hard link to it
# Expected after flattening: no /gone; /opq holds only c; /keep holds old
# and new; /links/x and /links/y share an inode.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
out=$1
command -v skopeo >/dev/null || { echo "make-test-image: skopeo not found (make deps installs it)" >&2; exit 1; }
busybox=/bin/busybox

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
umask 022

# Layer 1.
l1=$tmp/l1
mkdir -p "$l1"/{bin,etc,opq,keep,tmp,root}
cp "$busybox" "$l1/bin/busybox"
for applet in $("$busybox" --list); do
    case $applet in busybox | init | linuxrc) continue ;; esac
    ln -s busybox "$l1/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$l1/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\n' >"$l1/etc/group"
echo gone >"$l1/gone"
echo a >"$l1/opq/a"
echo b >"$l1/opq/b"
echo old >"$l1/keep/old"
# A setuid-root probe that prints its effective uid (busybox would drop
# the privilege itself, which would make the check vacuous).
printf '#include <stdio.h>\n#include <unistd.h>\nint main(void){printf("%%d\\n",(int)geteuid());return 0;}\n' >"$tmp/euid.c"
"${CC:-cc}" -static -O2 -o "$l1/setuid" "$tmp/euid.c"
chmod 4755 "$l1/setuid"
chmod 1777 "$l1/tmp"
chmod 0700 "$l1/root"

# Layer 2: the whiteouts are plain empty files with the OCI names.
l2=$tmp/l2
mkdir -p "$l2"/{opq,keep,links}
: >"$l2/.wh.gone"
: >"$l2/opq/.wh..wh..opq"
echo c >"$l2/opq/c"
echo new >"$l2/keep/new"
echo linked >"$l2/links/x"
ln "$l2/links/x" "$l2/links/y"

blobs=$tmp/oci/blobs/sha256
mkdir -p "$blobs"
# blob FILE -> prints "DIGEST SIZE" and stores FILE under its digest.
blob() {
    local sum size
    sum=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    cp "$1" "$blobs/$sum"
    echo "$sum $size"
}
layer() {
    # Owned by root, fixed times, sorted: the same bytes every time.
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
        -C "$1" -cf "$tmp/$2.tar" .
    gzip -n -c "$tmp/$2.tar" >"$tmp/$2.tar.gz"
}
layer "$l1" l1
layer "$l2" l2
read -r d1 s1 < <(blob "$tmp/l1.tar.gz")
read -r d2 s2 < <(blob "$tmp/l2.tar.gz")
u1=$(sha256sum "$tmp/l1.tar" | cut -d' ' -f1)
u2=$(sha256sum "$tmp/l2.tar" | cut -d' ' -f1)

cat >"$tmp/config.json" <<JSON
{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=/bin","MVM_TEST_IMAGE=layers"],"WorkingDir":"/keep","Cmd":["sh","-c","echo default-cmd"]},"rootfs":{"type":"layers","diff_ids":["sha256:$u1","sha256:$u2"]}}
JSON
read -r dc sc < <(blob "$tmp/config.json")
cat >"$tmp/manifest.json" <<JSON
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$dc","size":$sc},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:$d1","size":$s1},{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:$d2","size":$s2}]}
JSON
read -r dm sm < <(blob "$tmp/manifest.json")
echo '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci/oci-layout"
cat >"$tmp/oci/index.json" <<JSON
{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$dm","size":$sm,"annotations":{"org.opencontainers.image.ref.name":"layers"}}]}
JSON

skopeo copy --quiet "oci:$tmp/oci:layers" "docker-archive:$tmp/image.tar:mvm-test/layers:1" >&2

rm -rf "$out.new" && mkdir -p "$out.new"
mv "$tmp/oci" "$out.new/oci"
mv "$tmp/image.tar" "$out.new/image.tar"
rm -rf "$out" && mv "$out.new" "$out"
echo "sha256:$dm"
