#!/usr/bin/env bash
# Runs on the GPU machine from a bundle made by scripts/gpu_bundle.sh (copied there as
# BUNDLE/gpu_models.sh): synthesizes the benchmark models at real shapes on the machine's disk and
# runs `strata bench --device cuda` on each, everything in HBM (docs/PERFORMANCE.md, "GPU").
# Writes each bench's JSON and a summary to $OUT (default BUNDLE/out). STRATA_BIN=strata-base runs
# the bundle's second build (gpu_bundle.sh --base) instead, for A/B runs in one call (set BENCH_TAG
# or OUT apart so the two do not overwrite each other's files).
#
#   BUNDLE/gpu_models.sh [MODEL...]   MODEL: next80b (default), flagship, next80b-cpu,
#                                     next80b-stream (all in HBM against experts streamed from the
#                                     pack into an HBM cache of 25% of the experts' bytes, with and
#                                     without a pinned host tier holding the rest), flagship-stream
#                                     (the flagship with a 24 GiB HBM cache: host tier, then none), and
#                                     next80b-profile / flagship-profile (time per op on the device,
#                                     STRATA_CUDA_PROFILE=1: windows run op by op, so tok/s is not
#                                     the graph's), next80b-parallel (--parallel 1, 2, 4, 8: N decode
#                                     streams in one window) and next80b-parallel-profile (1 and 8,
#                                     time per op)
set -uo pipefail

bundle=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$bundle/out}
work=${STRATA_GPU_WORK:-/tmp/strata-models}
mkdir -p "$out" "$work"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
strata="$bundle/bin/${STRATA_BIN:-strata}"  # STRATA_BIN=strata-base: a bundle's second build
models=("$@")
((${#models[@]})) || models=(next80b)

synth() {  # name arch preset
  local file="$work/$1.gguf"
  if [[ ! -f $file ]]; then
    rm -f "$work"/*.gguf "$work"/*.gguf.experts*  # the machine's disk holds one of these at a time
    local start=$(date +%s)
    "$strata" synth --arch "$2" --preset "$3" --expert-type iq2_xs -o "$file" >"$out/synth-$1.log" 2>&1 ||
      { echo "synth $1 failed:"; tail -n 5 "$out/synth-$1.log"; return 1; }
    echo "synth $1: $(du -h "$file" | cut -f1) in $(($(date +%s) - start)) s"
  fi
}

bench() {  # name device extra-args...   (BENCH_TAG names the output files when set)
  local name=$1 device=$2
  shift 2
  local tag=${BENCH_TAG:-$name-$device${STRATA_CUDA_PROFILE:+-profile}}
  local start=$(date +%s)
  "$strata" bench -m "$work/$name.gguf" --device "$device" "$@" >"$out/bench-$tag.json" \
    2>"$out/bench-$tag.log"
  echo "bench $tag: rc $?, $(($(date +%s) - start)) s"
  python3 - "$out/bench-$tag.json" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except ValueError as e:
    print("  no JSON:", e); sys.exit()
keys = ("hit_rate", "stall_ms_per_token", "h2d_gb_per_s", "gb_per_s_read", "bytes_read_per_token",
        "read_ahead_accuracy", "host_hit_rate", "handshake_us")
for phase in ("prefill", "decode"):
    p = j[phase]
    extra = p.get("backend", {})
    profile = extra.pop("op_profile", None)
    cache = {k: round(p[k], 4) for k in keys if k in p}
    print(f"  {phase}: {p['tokens']} tokens, {p['tok_per_s']:.1f} tok/s", json.dumps(extra),
          json.dumps(cache) if cache else "")
    for name, t in list((profile or {}).items())[:16]:
        print(f"    {name:24s} {t['us_per_token']:9.1f} us/token {t['calls_per_token']:7.1f} calls {t['us_per_call']:8.2f} us/call")
print("  device:", j.get("device"))
PY
}

# The 80B shape all in HBM against its experts streamed from the pack (O_DIRECT from this disk)
# into an HBM cache of 25% of the experts' bytes, with the model's own router and with a
# calibrated synthetic trace (read-ahead off: it guesses from the router, not the trace).
stream80b() {
  synth next80b qwen3next qwen3-next-80b-a3b || return 1
  local model="$work/next80b.gguf" pack="$work/next80b.gguf.experts"
  if [[ ! -f $pack ]]; then
    local start=$(date +%s)
    "$strata" pack "$model" --no-progress >"$out/pack-next80b.log" 2>&1 ||
      { echo "pack failed:"; tail -n 5 "$out/pack-next80b.log"; return 1; }
    echo "pack next80b: $(du -h "$pack" | cut -f1) in $(($(date +%s) - start)) s"
  fi
  "$strata" pack --bench-reads 4 "$pack" >"$out/reads-next80b.json" 2>&1
  echo "O_DIRECT reads: $(tail -n 1 "$out/reads-next80b.json")"
  "$strata" trace synth --shape qwen3-next-80b-a3b --model-seed 7 --seed 3 --tokens 256 \
    -o "$work/q3n.trace" >/dev/null 2>&1
  local budget=$(($(stat -c %s "$pack") / 4))
  local args=(--prompt-tokens 16 --batch 16 --gen-tokens ${STREAM_GEN_TOKENS:-48})
  BENCH_TAG=next80b-resident bench next80b cuda "${args[@]}"
  BENCH_TAG=next80b-stream25 bench next80b cuda "${args[@]}" --expert-budget "$budget" --host-budget 0
  BENCH_TAG=next80b-stream25-trace bench next80b cuda "${args[@]}" --expert-budget "$budget" \
    --host-budget 0 --route-trace "$work/q3n.trace" --read-ahead off
  # The rest of the experts in a pinned host tier (the whole pack, read at start-up).
  BENCH_TAG=next80b-stream25-tier bench next80b cuda "${args[@]}" --expert-budget "$budget" \
    --host-budget "$(stat -c %s "$pack")"
  BENCH_TAG=next80b-stream25-tier-trace bench next80b cuda "${args[@]}" --expert-budget "$budget" \
    --host-budget "$(stat -c %s "$pack")" --route-trace "$work/q3n.trace" --read-ahead off
}

# The flagship with a 24 GiB HBM expert cache (the seed machine's whole memory): misses from a
# pinned host tier holding the whole pack, then from the pack on this disk (no host tier).
streamflagship() {
  local model="$work/flagship-stream.gguf" pack="$work/flagship-stream.gguf.experts"
  if [[ ! -f $pack ]]; then
    rm -f "$work"/*.gguf "$work"/*.gguf.experts*
    local start=$(date +%s)
    "$strata" synth --arch qwen4exp --preset flagship --expert-type iq2_xs --pack -o "$model" \
      --no-progress >"$out/synth-flagship-stream.log" 2>&1 ||
      { echo "synth flagship --pack failed:"; tail -n 5 "$out/synth-flagship-stream.log"; return 1; }
    echo "synth flagship --pack: $(du -h "$model" | cut -f1) trunk, $(du -h "$pack" | cut -f1) pack in $(($(date +%s) - start)) s"
  fi
  "$strata" trace synth --shape flagship --model-seed 7 --seed 3 --tokens 256 -o "$work/flagship.trace" \
    >/dev/null 2>&1
  local args=(--prompt-tokens 16 --batch 16 --gen-tokens ${STREAM_GEN_TOKENS:-48} --expert-budget 24G)
  BENCH_TAG=flagship-24g-tier-trace bench flagship-stream cuda "${args[@]}" \
    --host-budget "$(stat -c %s "$pack")" --route-trace "$work/flagship.trace" --read-ahead off
  BENCH_TAG=flagship-24g-tier bench flagship-stream cuda "${args[@]}" --host-budget "$(stat -c %s "$pack")"
  BENCH_TAG=flagship-24g-trace bench flagship-stream cuda "${args[@]}" --host-budget 0 \
    --route-trace "$work/flagship.trace" --read-ahead off
}

for m in "${models[@]}"; do
  case $m in
    next80b) synth next80b qwen3next qwen3-next-80b-a3b && bench next80b cuda --prompt-tokens 512 --gen-tokens 128 ;;
    next80b-cpu) synth next80b qwen3next qwen3-next-80b-a3b && bench next80b cpu --prompt-tokens 16 --gen-tokens 8 --batch 16 ;;
    next80b-profile) synth next80b qwen3next qwen3-next-80b-a3b &&
      STRATA_CUDA_PROFILE=1 bench next80b cuda --prompt-tokens 512 --gen-tokens 16 ;;
    next80b-parallel) synth next80b qwen3next qwen3-next-80b-a3b &&
      for n in 1 2 4 8; do
        BENCH_TAG=next80b-parallel$n bench next80b cuda --prompt-tokens 16 --batch 16 --gen-tokens 32 --parallel $n
      done ;;
    next80b-parallel-profile) synth next80b qwen3next qwen3-next-80b-a3b &&
      for n in 1 8; do
        STRATA_CUDA_PROFILE=1 BENCH_TAG=next80b-parallel$n-profile bench next80b cuda --prompt-tokens 16 --batch 16 \
          --gen-tokens 16 --parallel $n
      done ;;
    flagship-profile) synth flagship qwen4exp flagship &&
      STRATA_CUDA_PROFILE=1 bench flagship cuda --prompt-tokens 512 --gen-tokens 16 ;;
    flagship) synth flagship qwen4exp flagship && bench flagship cuda --prompt-tokens 512 --gen-tokens 64 ;;
    next80b-stream) stream80b ;;
    flagship-stream) streamflagship ;;
    *) echo "gpu_models: unknown model '$m'"; exit 2 ;;
  esac
done
