#!/bin/sh
# Runs every libFuzzer harness of a MOEJIT_FUZZ build for a bounded time
# (`make fuzz`, docs/RELIABILITY.md).
#   tests/fuzz/run_fuzz.sh BUILD_DIR SECONDS_PER_HARNESS [HARNESS...]
# Each harness starts from the checked-in corpus tests/fuzz/corpus/<h>/ and a
# working corpus kept in BUILD_DIR/fuzz-corpus/<h>/ between runs. libFuzzer
# runs in fork mode and carries on after a crash; every crashing input is
# written to tests/fuzz/corpus/<h>/crash-<sha1> (a regression case the CTest
# replay runs from then on). Exit status 1 when any harness crashed.
set -u
build=$1
seconds=$2
shift 2
harnesses=${*:-formats capi tiles}
src=$(cd "$(dirname "$0")" && pwd)
status=0
summary=""
for h in $harnesses; do
  exe=$build/tests/fuzz/fuzz_$h
  [ -x "$exe" ] || { echo "run_fuzz: $exe is missing (configure with -DMOEJIT_FUZZ=ON)"; exit 2; }
  work=$build/fuzz-corpus/$h
  mkdir -p "$work" "$src/corpus/$h"
  log=$build/fuzz-$h.log
  before=$(ls "$src/corpus/$h" | grep -c '^crash-')
  echo "== fuzz_$h: ${seconds}s, corpus $src/corpus/$h + $work, log $log"
  # halt_on_error + abort: a report is a crash libFuzzer records; leaks are checked at exit of each job.
  ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1} \
  MOEJIT_MAX_ISA= \
    "$exe" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -max_total_time="$seconds" \
    -timeout=30 -rss_limit_mb=4096 -max_len=4096 -artifact_prefix="$src/corpus/$h/" \
    "$work" "$src/corpus/$h" >"$log" 2>&1
  rc=$?
  after=$(ls "$src/corpus/$h" | grep -c '^crash-')
  last=$(grep -E '^#[0-9]+: cov:' "$log" | tail -1)
  execs=$(echo "$last" | sed -n 's/^#\([0-9]*\):.*/\1/p')
  cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
  corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
  crashes=$(echo "$last" | sed -n 's|.*oom/timeout/crash: [0-9]*/[0-9]*/\([0-9]*\).*|\1|p')
  crashes=${crashes:-0}
  line="fuzz_$h: ${execs:-?} executions in ${seconds}s, coverage ${cov:-?}, corpus ${corp:-?}, crashes $crashes, new crash inputs $((after - before))"
  echo "$line"
  summary="$summary$line
"
  if [ "$crashes" -gt 0 ] || [ "$after" -gt "$before" ]; then
    status=1
    grep -E 'ERROR: [A-Z]|runtime error|check failed' "$log" | grep -v 'deadly signal' |
      sed 's/==[0-9]*==//; s/0x[0-9a-f]*/0x.../g' | sort | uniq -c | sort -rn | head -10
    # Replay each new crashing input once (without fuzzing) for its first report line;
    # inputs whose failure depends on timing may not fail again.
    replay=$build/tests/fuzz/fuzz_${h}_replay
    for f in $(ls -t "$src/corpus/$h" | grep '^crash-' | head -$((after - before))); do
      why=$("$replay" "$src/corpus/$h/$f" 2>&1 | grep -m1 -E 'SUMMARY|runtime error|check failed' | sed 's/==[0-9]*==//')
      echo "  $f: ${why:-did not fail when replayed}"
    done | sort -t: -k2 | uniq -c -f1 | head -20
  fi
done
echo "== summary"
printf "%s" "$summary"
exit $status
