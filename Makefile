# mvm: `make demo` builds everything and runs a command in a microVM;
# `make test` runs the whole test suite. See README.md.
#
# Expensive outputs (the kernel source, the two kernel builds, virtiofsd and
# the default image) are cached under $(MVM_CACHE) and reused across clean
# clones; everything else lands in build/ (ignored by git):
#   build/bin/mvm                  the VMM (static)
#   build/bin/mvm-oci              a link to it: the OCI runtime command line
#   build/libexec/mvm/virtiofsd    virtio-fs backend mvm spawns (static,
#                                  virtiofsd/: the virtiofsd crate behind
#                                  mvm's guard, scripts/build-virtiofsd.sh)
#   build/libexec/mvm/mvm-egress   the host-side egress proxy (static,
#                                  egress/, docs/network.md)
#   build/libexec/mvm/mvm-pull     the registry client `mvm image pull`
#                                  runs (static, image/, docs/images.md)
#   build/share/mvm/vmlinux        guest kernel (+ kernel.release, source-*)
#   build/share/mvm/initramfs.cpio guest initramfs: guest-init + busybox
#   build/share/mvm/initramfs-image.cpio  guest-init alone, for runs whose
#                                  root is an image (docs/images.md)
#   build/share/mvm/images/debian  the default guest image: Debian bookworm
#                                  as an OCI image layout, tag debian-bookworm
#                                  (rootfs/debian/build.sh, docs/images.md)
#   build/share/mvm/images/debian.erofs  its root filesystem, converted by
#                                  mvm (+ .json: its run config), which
#                                  `mvm run --image default` boots
#   build/testhost/                test-host kernel and initramfs
#   build/containerd/              Debian's containerd, runc shim, ctr and runc
#                                  with their libraries, for the e2e suite

export MVM_CACHE ?= $(HOME)/.cache/mvm
TARGET   := x86_64-unknown-linux-gnu
# Static binaries: mvm runs inside the test host's bare initramfs and
# guest-init is PID 1 of a guest with no libc. --target keeps crt-static
# off build scripts and proc macros. Relative relocations packed (RELR),
# where the C library's static start applies them (glibc 2.36; an older
# one links such a binary without a word and it crashes at start): the
# self-relocating static-pie start then reads 3 KiB of them instead of
# 393 (docs/benchmarks.md).
RELR     := $(shell getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ split($$2, v, "."); if (v[1] > 2 || (v[1] == 2 && v[2] >= 36)) print "-C link-arg=-Wl,-z,pack-relative-relocs" }')
STATIC   := RUSTFLAGS="-C target-feature=+crt-static $(RELR)"
RELEASE  := target/$(TARGET)/release
CARGO_SRCS := Cargo.toml Cargo.lock $(shell find vmm devices guest-init protocol egress image -name '*.rs' -o -name Cargo.toml)

SHARE    := build/share/mvm
MVM      := build/bin/mvm
MVM_OCI  := build/bin/mvm-oci
VIRTIOFSD := build/libexec/mvm/virtiofsd
EGRESS   := build/libexec/mvm/mvm-egress
PULL     := build/libexec/mvm/mvm-pull
KERNEL   := $(SHARE)/vmlinux
INITRAMFS := $(SHARE)/initramfs.cpio
INITRAMFS_IMAGE := $(SHARE)/initramfs-image.cpio
IMAGE    := $(SHARE)/images/debian
# Debian's containerd, runc shim, ctr and runc with their libraries, for
# the e2e suite's containerd test in the test host.
CONTAINERD := build/containerd/versions
IMAGE_ROOT := $(SHARE)/images/debian.erofs
TH_KERNEL := build/testhost/bzImage
TH_INITRAMFS := build/testhost/initramfs.cpio

.PHONY: all deps demo test unit e2e battery battery-red battery-doc lint fuzz bench bench-fs bench-image bench-egress bench-concurrent bench-sandbox bench-confine bench-containerd clean
all: $(MVM) $(MVM_OCI) $(VIRTIOFSD) $(EGRESS) $(PULL) $(KERNEL) $(INITRAMFS) $(INITRAMFS_IMAGE) $(IMAGE) $(IMAGE_ROOT) $(TH_KERNEL) $(TH_INITRAMFS) $(CONTAINERD)

deps: build/.deps
build/.deps: scripts/install-deps.sh
	scripts/install-deps.sh
	@mkdir -p build && touch $@

# The kernel builds are cached by guest-kernel/build.sh itself (keyed on the
# config fragment and source version); this rule only copies the result.
$(KERNEL): guest-kernel/guest.config guest-kernel/build.sh build/.deps
	guest-kernel/build.sh guest-kernel/guest.config vmlinux $(SHARE)

$(TH_KERNEL): tests/testhost/kernel.config guest-kernel/build.sh build/.deps
	guest-kernel/build.sh tests/testhost/kernel.config bzImage build/testhost

$(RELEASE)/mvm $(RELEASE)/mvm-init $(RELEASE)/mvm-egress $(RELEASE)/mvm-pull: $(CARGO_SRCS)
	$(STATIC) cargo build --release --locked --target $(TARGET) -p mvm -p mvm-guest-init -p mvm-egress -p mvm-image

$(MVM): $(RELEASE)/mvm
	@mkdir -p $(dir $@)
	$< --version >/dev/null || { echo "$<: the binary does not start (its static start and the C library disagree?)" >&2; exit 1; }
	cp $< $@

# The OCI runtime's name for containerd's shim (docs/kubernetes.md).
$(MVM_OCI): | $(MVM)
	ln -sf mvm $@

$(CONTAINERD): scripts/bundle-containerd.sh scripts/ldd-closure.sh build/.deps
	scripts/bundle-containerd.sh build/containerd

$(EGRESS): $(RELEASE)/mvm-egress
	@mkdir -p $(dir $@)
	cp $< $@

$(PULL): $(RELEASE)/mvm-pull
	@mkdir -p $(dir $@)
	cp $< $@

# mvm's virtiofsd (virtiofsd/: the virtiofsd crate behind mvm's guard).
# Cached by the script itself (keyed on virtiofsd's version, the script's
# RECIPE and virtiofsd/'s sources); needs libseccomp-dev and libcap-ng-dev
# from `make deps`.
$(VIRTIOFSD): scripts/build-virtiofsd.sh build/.deps virtiofsd/Cargo.toml virtiofsd/Cargo.lock $(wildcard virtiofsd/src/*.rs virtiofsd/src/*/*.rs)
	scripts/build-virtiofsd.sh $@

$(INITRAMFS): $(RELEASE)/mvm-init rootfs/build.sh build/.deps
	rootfs/build.sh $(RELEASE)/mvm-init $@

$(INITRAMFS_IMAGE): $(RELEASE)/mvm-init rootfs/build.sh build/.deps
	rootfs/build.sh --init-only $(RELEASE)/mvm-init $@

# The default guest image, an OCI image layout (a directory). Cached by the
# script itself (keyed on the package names and its RECIPE): warm, this is
# a copy. The script touches the directory, so make sees it up to date.
$(IMAGE): rootfs/debian/build.sh rootfs/debian/packages build/.deps
	rootfs/debian/build.sh $@

# Its root filesystem, converted by mvm itself through a throwaway store
# (a few seconds), so that no run converts it and none needs a store.
$(IMAGE_ROOT): $(IMAGE) $(MVM)
	@store=$$(mktemp -d) && \
	    MVM_IMAGES=$$store $(MVM) image export-root oci:$(IMAGE):debian-bookworm $@ >/dev/null; \
	    status=$$?; rm -rf "$$store"; exit $$status

$(TH_INITRAMFS): tests/testhost/build-initramfs.sh tests/testhost/init.sh build/.deps
	tests/testhost/build-initramfs.sh $@

# First README command: build everything, then run a command in a microVM
# (through the test host where /dev/kvm cannot boot Linux).
demo: all
	tests/testhost/mvm run -- uname -a

# The second clippy is mvm alone, so that mvm-image comes without its
# registry client (in the workspace build mvm-pull turns it on for both):
# mvm must not call it (docs/images.md, "Who pulls").
lint: build/.deps
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	cargo clippy -p mvm --locked -- -D warnings
	cd fuzz && cargo fmt -- --check
	cd fuzz && CARGO_TARGET_DIR=../target/fuzz-lint cargo clippy --locked --all-targets -- -D warnings
	cd virtiofsd && cargo fmt -- --check
	cd virtiofsd && CARGO_TARGET_DIR=../target/virtiofsd cargo clippy --locked --all-targets -- -D warnings
	python3 tests/containment/report.py --check-ids tests/containment

# Unit tests (no KVM) and the tiny-guest tests (this machine's /dev/kvm);
# virtiofsd/'s guard against a real passthrough file system in a scratch
# directory.
unit: build/.deps
	cargo test --workspace --locked
	cd virtiofsd && CARGO_TARGET_DIR=../target/virtiofsd cargo test --locked

# Fuzzing: each target in fuzz/ (a hostile guest driver against the
# virtio-mmio transport, the block and the vsock device; hostile bytes
# against the exec channel's decoders and guest-init's command line) for
# MVM_FUZZ_SECONDS (30) on the stable toolchain, its corpus growing under
# $(MVM_CACHE)/fuzz across runs (docs/testing.md, "Fuzzing").
fuzz: build/.deps
	scripts/fuzz.sh

# End-to-end: the real binary, kernel and initramfs, through the test host.
# Every suite boots cold; then the exec suite runs again through
# templates (MVM_E2E_TEMPLATES=1: kept in target/e2e-templates
# across test-host calls, so each machine layout's first call saves one
# and every later call restores it; docs/testing.md). First, the hostile
# driver against mvm's built virtiofsd (this machine's /dev/kvm, a tiny
# guest: vmm/tests/hostile_driver.rs).
e2e: all
	cargo test --locked -p mvm --test hostile_driver -- --ignored
	cargo test --locked -p mvm-e2e -- --ignored --test-threads=1
	rm -rf target/e2e-templates
	MVM_E2E_TEMPLATES=1 cargo test --locked -p mvm-e2e --test exec -- --ignored --test-threads=1

# Boot and overhead figures next to QEMU -M microvm and bubblewrap
# (docs/benchmarks.md); not part of `make test`. The peers are bundled
# with their libraries into build/peers on every run (a copy, and a
# cached kernel build the first time), so an upgraded or newly installed
# peer is picked up.
bench: all
	scripts/bundle-peers.sh build/peers
	python3 benches/bench.py

# Workspace (virtio-fs) throughput next to the host's (docs/benchmarks.md).
bench-fs: all
	python3 benches/workspace.py

# The default image's costs: over the busybox guest, and python and git
# status next to bubblewrap on the same root (docs/benchmarks.md). Its
# bubblewrap comes from build/peers, bundled as for `make bench`.
bench-image: all
	scripts/bundle-peers.sh build/peers
	python3 benches/image.py

# Egress through the host proxy next to the host's own fetch
# (docs/benchmarks.md).
bench-egress: all
	python3 benches/egress.py

# Memory per machine with 1 and 10 running at once, cold and from a
# template (docs/benchmarks.md).
bench-concurrent: all
	python3 benches/concurrent.py

# `mvm exec` in a named sandbox next to `mvm run` (cold and from a
# template) and bubblewrap, and an idle sandbox's memory
# (docs/benchmarks.md). Its bubblewrap comes from build/peers.
bench-sandbox: all
	scripts/bundle-peers.sh build/peers
	python3 benches/sandbox.py

# containerd's `ctr run` with mvm's OCI runtime next to runc
# (docs/benchmarks.md, docs/kubernetes.md). Its timer comes from
# build/peers.
bench-containerd: all
	scripts/bundle-peers.sh build/peers
	python3 benches/containerd.py

# Start-up cost of the VMM's confinement (docs/benchmarks.md).
bench-confine: all
	python3 benches/confinement.py

# The containment battery (docs/containment.md): attacks from inside the
# guest, each checked on the host, one report row each. Its test target
# is left out of `cargo test` and `clippy --all-targets` (so that `make
# e2e` does not run it too), hence the clippy line. The report is
# written to target/containment/report.md whether or not every check
# held; a failed, missing or (without MVM_ALLOW_SKIPS=1) skipped check
# still fails the target. The tracked docs/containment.md is written only
# by `make battery-doc`. A second pass runs the checks report.py lists
# through a named sandbox (mvm create, the attack by mvm exec, mvm rm -f:
# tests/containment/via.rs), after the harness's own unit tests.
BATTERY_DIR := target/containment
BATTERY_ROWS := $(BATTERY_DIR)/rows.jsonl
BATTERY_RED := $(BATTERY_DIR)/red.jsonl
battery: all
	cargo clippy --locked -p mvm-e2e --test containment -- -D warnings
	cargo test --locked -q -p mvm-e2e --test containment
	rm -f $(BATTERY_ROWS)
	MVM_BATTERY_ROWS=$(CURDIR)/$(BATTERY_ROWS) \
	    cargo test --locked -p mvm-e2e --test containment -- --ignored --test-threads=1; \
	    status=$$?; \
	    MVM_BATTERY_ROWS=$(CURDIR)/$(BATTERY_ROWS) MVM_BATTERY_VIA=sandbox \
	    cargo test --locked -p mvm-e2e --test containment -- --ignored --test-threads=1 \
	        $$(python3 tests/containment/report.py --sandbox-tests) || status=1; \
	    python3 tests/containment/report.py $(BATTERY_ROWS) $(BATTERY_DIR)/report.md || status=1; \
	    exit $$status

# Attacks rerun with a protection removed (tests/containment/red.txt):
# their rows, which must be red, go to $(BATTERY_RED); the tests' own
# failures are the point here, and report.py judges the rows.
battery-red: all
	rm -f $(BATTERY_RED)
	grep -v '^#' tests/containment/red.txt | while IFS='|' read -r via flags test _; do \
	    echo "battery-red: $$test with $$flags (by $$via)"; \
	    MVM_BATTERY_ROWS=$(CURDIR)/$(BATTERY_RED) MVM_BATTERY_EXTRA_ARGS="$$flags" \
	        MVM_BATTERY_VIA="$$via" \
	        cargo test --locked -q -p mvm-e2e --test containment -- \
	        --ignored --test-threads=1 "$$test" >/dev/null 2>&1 || true; \
	done

# Deliberately regenerates the tracked docs/containment.md: the whole
# battery and the red runs, from a clean tree (the report names the tree).
battery-doc: battery battery-red
	python3 tests/containment/report.py $(BATTERY_ROWS) docs/containment.md $(BATTERY_RED) tests/containment/red.txt

# Second README command: everything, then a summary of what the tests
# noted (skips, which fail unless MVM_ALLOW_SKIPS=1, and retried
# test-host calls). The end-to-end suites and the battery run side by
# side (tests/lanes.sh: each test-host call keeps one core busy, and CI
# has two), their lines prefixed [e2e] and [battery].
EVENTS := target/test-events
test:
	rm -rf $(EVENTS)
	$(MAKE) lint unit fuzz all && tests/lanes.sh e2e battery; status=$$?; tests/summary.sh $(EVENTS); exit $$status

clean:
	rm -rf build target
