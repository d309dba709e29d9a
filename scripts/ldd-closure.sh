# Sourced by scripts/bundle-peers.sh and scripts/bundle-containerd.sh:
# copies a dynamically linked binary and its whole ldd closure (the
# loader under its usual name included) so that it runs in the QEMU TCG
# test host, whose initramfs has busybox and no libc.
#
#   bundle_binary BIN OUT_DIR     BIN to OUT_DIR/bin, its libraries to OUT_DIR/lib

bundle_binary() {
    local bin=$1 out=$2 libs lib
    libs=$(LC_ALL=C ldd "$bin")
    # A library ldd could not find would fail at run time, far from here.
    if [[ $libs == *"not found"* ]]; then
        echo "bundle: $bin has unresolved libraries:" >&2
        grep 'not found' <<<"$libs" >&2
        exit 1
    fi
    if [[ $libs != *ld-linux-x86-64.so.2* ]]; then
        echo "bundle: $bin does not use ld-linux-x86-64.so.2" >&2
        exit 1
    fi
    mkdir -p "$out/bin" "$out/lib"
    cp -L "$bin" "$out/bin/"
    awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$libs" |
        while read -r lib; do
            cp -L "$lib" "$out/lib/"
        done
}
