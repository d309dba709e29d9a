#!/bin/sh
# The end of `make test`: what the tests noted in target/test-events/
# (tests/harness.rs `note_event`): skipped tests (only with
# MVM_ALLOW_SKIPS=1; without it a test that cannot run fails) and test-host
# calls retried because the test host itself hung. Always exits 0: the
# tests' own statuses decide the run.
dir=${1:-target/test-events}
count() { [ -f "$dir/$1.log" ] && wc -l <"$dir/$1.log" | tr -d ' ' || echo 0; }
skips=$(count skip)
retries=$(count retry)
echo "summary: $skips skipped, $retries test-host calls retried (the test host hung)"
for kind in skip retry; do
    [ -f "$dir/$kind.log" ] || continue
    sed "s/^/  $kind: /" "$dir/$kind.log"
done
exit 0
