#!/bin/sh
# Builds the fuzz targets (fuzz/, libFuzzer through libfuzzer-sys) and runs
# each for a bounded time: `make fuzz`, part of `make test`
# (docs/testing.md, "Fuzzing").
#
#   scripts/fuzz.sh [TARGET...]     default: every target in fuzz/Cargo.toml
#
# MVM_FUZZ_SECONDS  seconds per target (default 30)
# MVM_FUZZ_CORPUS   where each target's growing corpus is kept across runs
#                   (default $MVM_CACHE/fuzz/corpus); fuzz/corpus/TARGET
#                   holds the seeds committed with the code
#
# The stable toolchain does it: coverage comes from LLVM's sanitizer
# coverage passes (-C flags, as cargo fuzz passes them), not from a
# sanitizer, which would need a nightly compiler. Safe Rust needs no
# AddressSanitizer to be checked; a panic, an abort, an input that runs
# past 10 s or needs more than 2 GiB is the finding. A finding fails the
# run and leaves the input in target/fuzz/artifacts/TARGET/, with the line
# that replays it. The last line per target says how long it ran, how many
# inputs, the coverage reached and the corpus size
# (target/fuzz/summary.txt).
set -eu

seconds=${MVM_FUZZ_SECONDS:-30}
cache=${MVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mvm}
corpus_root=${MVM_FUZZ_CORPUS:-$cache/fuzz/corpus}
triple=$(rustc -vV | sed -n 's/^host: //p')
out=target/fuzz
bin=$out/$triple/release

targets=$*
if [ -z "$targets" ]; then
    targets=$(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^mvm-fuzz$')
fi

# --target keeps the instrumentation off build scripts and proc macros.
echo "fuzz: building $(echo "$targets" | wc -w) targets"
(
    cd fuzz
    RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module \
        -Cllvm-args=-sanitizer-coverage-level=4 \
        -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
        -Cllvm-args=-sanitizer-coverage-pc-table \
        -Cllvm-args=-sanitizer-coverage-trace-compares \
        -Cdebug-assertions -Coverflow-checks" \
        CARGO_TARGET_DIR=../$out cargo build --locked --release --target "$triple"
)

: >"$out/summary.txt"
status=0
# A target's own files (the vsock target's served socket lives as long as
# its process, which exits without unwinding) go to a directory of this
# run's, removed however the run ends.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/mvm-fuzz-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
trap 'exit 130' INT TERM
for t in $targets; do
    corpus=$corpus_root/$t
    artifacts=$out/artifacts/$t
    log=$out/$t.log
    rm -rf "$artifacts"
    mkdir -p "$corpus" "$artifacts"
    seeds=fuzz/corpus/$t
    [ -d "$seeds" ] || seeds=
    echo "fuzz: $t for $seconds s (log: $log)"
    # New inputs go to the first directory, the cached corpus; the
    # committed seeds are only read.
    if TMPDIR=$scratch "$bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" \
        "$corpus" $seeds >"$log" 2>&1; then
        result=ok
    else
        result=FOUND
        status=1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
    cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | sed -n 's/.* cov: \([0-9]*\) .*/\1/p')
    files=$(find "$corpus" -type f | wc -l | tr -d ' ')
    line="$t: $result, ${runs:-?} inputs in ${secs:-?} s, coverage ${cov:-?} edges, corpus $files inputs"
    echo "fuzz: $line"
    echo "$line" >>"$out/summary.txt"
    if [ "$result" = FOUND ]; then
        grep -m1 -A12 -E 'panicked|ERROR: libFuzzer|SUMMARY' "$log" | sed 's/^/  /' || true
        for a in "$artifacts"/*; do
            [ -f "$a" ] && echo "  replay: $bin/$t $a"
        done
    fi
done
exit $status
