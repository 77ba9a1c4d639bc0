#!/usr/bin/env bash
# A long fuzz campaign (issue 14; docs/RELIABILITY.md): each libFuzzer target of the ASan+UBSan
# build in turn, one at a time at nice 19 (one core; the other stays free), SECONDS each, from
# its committed corpus. Afterwards the new inputs that add coverage are merged into
# fuzz/corpus/<target> (libFuzzer -merge=1: the committed seeds stay, only inputs with new
# features join), so CI's 60-second runs start from them. Prints one line per target:
# executions, edges (cov), features (ft), corpus growth, findings.
#
# Usage: scripts/fuzz_campaign.sh SECONDS [target...]   (default: every fuzz_* in build-san)
# STRATA_FUZZ_NICE (default 19) and STRATA_FUZZ_TIMEOUT (seconds one input may take, default 30):
# at nice 19 beside compiles a 0.4-second input has taken 37 s of wall time, so a campaign on a
# busy box may want a lower nice or a longer timeout to tell a stall from a slow path.
# Build first: bash scripts/test.sh (or configure build-san as it does and build the fuzz_ targets).
# A finding stops that target; its reproducer is left in build-san/fuzz-campaign/, and the script
# goes on with the next target and exits 1 at the end.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
san="${STRATA_SAN_DIR:-$root/build-san}"
seconds="${1:?usage: fuzz_campaign.sh SECONDS [target...]}"
shift
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in "$san"/fuzz_*; do [[ -x "$f" ]] && targets+=("$(basename "${f#"$san"/fuzz_}")"); done
fi
out="$san/fuzz-campaign"
mkdir -p "$out"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
niceness="${STRATA_FUZZ_NICE:-19}"
unit_timeout="${STRATA_FUZZ_TIMEOUT:-30}"
failed=0
for t in "${targets[@]}"; do
  fuzzer="$san/fuzz_$t"
  corpus="$root/fuzz/corpus/$t"
  work="$out/corpus-$t"
  log="$out/$t.log"
  mkdir -p "$corpus" "$work"
  before="$(ls "$corpus" | wc -l)"
  nice -n "$niceness" "$fuzzer" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 \
    -timeout="$unit_timeout" \
    -print_final_stats=1 -artifact_prefix="$out/$t-" "$work" "$corpus" >"$log" 2>&1
  rc=$?
  last="$(grep -E '^#[0-9]+' "$log" | tail -n 1)"
  execs="$(grep -oE 'number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')"
  cov="$(grep -oE 'cov: [0-9]+ ft: [0-9]+' <<<"$last")"
  finding=none
  if ((rc != 0)); then
    failed=1
    finding="$(grep -m1 -E 'ERROR: |runtime error:|deadly signal|Timeout|out-of-memory' "$log")"
    execs="$(grep -oE '^#[0-9]+' <<<"$last" | tr -d '#')"
  else
    nice -n "$niceness" "$fuzzer" -merge=1 -max_len=65536 -rss_limit_mb=2048 -timeout="$unit_timeout" \
      "$corpus" "$work" >"$out/$t.merge.log" 2>&1
  fi
  echo "fuzz $t: ${seconds}s rc=$rc executions=${execs:-?} $cov corpus $before -> $(ls "$corpus" | wc -l) files ($(( $(du -sb "$corpus" | cut -f1) / 1024 )) KiB) finding: $finding"
done
exit "$failed"
