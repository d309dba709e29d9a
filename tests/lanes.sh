#!/usr/bin/env bash
# Runs make targets side by side, each line of their output prefixed with
# its target's name, and fails if any of them fails. `make test` runs the
# end-to-end suites and the battery this way: each test-host call keeps
# one core busy with QEMU's TCG and little else, so on CI's two cores two
# lanes take about the time of the longer one instead of their sum. The
# targets' prerequisites must already be built (`make all`), or both
# lanes would build them at once.
set -u
if [ $# -eq 0 ]; then
    echo "usage: tests/lanes.sh TARGET..." >&2
    exit 2
fi
pids=()
for target in "$@"; do
    (
        set -o pipefail
        start=$(date +%s)
        make --no-print-directory "$target" 2>&1 | sed -u "s/^/[$target] /"
        status=$?
        echo "[$target] lane ended with status $status after $(($(date +%s) - start)) s"
        exit $status
    ) &
    pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
exit $status
