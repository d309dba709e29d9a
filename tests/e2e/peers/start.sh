#!/bin/sh
# Starts the suite's real servers on the test host's loopback, for the
# guest to reach through the egress proxy (tests/e2e/egress_peers.rs):
#
#   sh tests/e2e/peers/start.sh      (as root, in the repo root: a setup script)
#
# The test host is busybox only, so the servers run from a peer root: the
# default image's EROFS file (build/share/mvm/images/debian.erofs, the
# test host's /mvm/share/...), mounted read-only through a loop device and
# entered with chroot. They are Debian's python3, git (git http-backend)
# and openssl, the same programs a user would serve with.
#
# /run/tmp/peers (the chroot's /srv) receives the peer's files; the guest
# gets /run/tmp/peers/pub (the test CA, ca.pem) with --mount. Names:
# secure.test, git.test, pypi.test, api.test, plain.test and sink.test are
# 127.0.0.1 in the test host's /etc/hosts, where the host proxy resolves
# them.
set -eu

root=/run/peer
srv=/run/tmp/peers
image=/mvm/share/mvm/images/debian.erofs
here=$(cd "$(dirname "$0")" && pwd)

[ -f "$image" ] || { echo "peers: no $image: run 'make'" >&2; exit 1; }
mkdir -p "$root" "$srv/pub"
mount -t erofs -o loop,ro "$image" "$root"
mount -t proc proc "$root/proc"
mount -o bind /dev "$root/dev"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount -o bind "$srv" "$root/srv"
cp "$here/server.py" "$srv/server.py"

printf '127.0.0.1 secure.test git.test pypi.test api.test plain.test sink.test\n' >>/etc/hosts

# The servers run in the background; they say they listen by writing
# /srv/ready (or /srv/failed with why).
chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 \
    /usr/bin/python3 /srv/server.py /srv </dev/null >"$srv/server.log" 2>&1 &

i=0
until [ -f "$srv/ready" ]; do
    if [ -f "$srv/failed" ] || [ $i -ge 600 ]; then
        echo "peers: the servers did not start:" >&2
        cat "$srv/server.log" >&2
        exit 1
    fi
    sleep 0.1
    i=$((i + 1))
done
