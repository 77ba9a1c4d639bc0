#!/usr/bin/env bash
# Runs on the GPU machine from a bundle made by scripts/gpu_bundle.sh (copied there as
# BUNDLE/gpu_models.sh): synthesizes the benchmark models at real shapes on the machine's disk and
# runs `strata bench --device cuda` on each, everything in HBM (docs/PERFORMANCE.md, "GPU").
# Writes each bench's JSON and a summary to $OUT (default BUNDLE/out).
#
#   BUNDLE/gpu_models.sh [MODEL...]   MODEL: next80b (default), flagship, next80b-cpu, and
#                                     next80b-profile / flagship-profile (time per op on the device,
#                                     STRATA_CUDA_PROFILE=1: windows run op by op, so tok/s is not
#                                     the graph's)
set -uo pipefail

bundle=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$bundle/out}
work=${STRATA_GPU_WORK:-/tmp/strata-models}
mkdir -p "$out" "$work"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
strata="$bundle/bin/strata"
models=("$@")
((${#models[@]})) || models=(next80b)

synth() {  # name arch preset
  local file="$work/$1.gguf"
  if [[ ! -f $file ]]; then
    rm -f "$work"/*.gguf  # the machine's disk holds one of these at a time
    local start=$(date +%s)
    "$strata" synth --arch "$2" --preset "$3" --expert-type iq2_xs -o "$file" >"$out/synth-$1.log" 2>&1 ||
      { echo "synth $1 failed:"; tail -n 5 "$out/synth-$1.log"; return 1; }
    echo "synth $1: $(du -h "$file" | cut -f1) in $(($(date +%s) - start)) s"
  fi
}

bench() {  # name device extra-args...
  local name=$1 device=$2 tag=$1-$2${STRATA_CUDA_PROFILE:+-profile}
  shift 2
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
for phase in ("prefill", "decode"):
    p = j[phase]
    extra = p.get("backend", {})
    profile = extra.pop("op_profile", None)
    print(f"  {phase}: {p['tokens']} tokens, {p['tok_per_s']:.1f} tok/s", json.dumps(extra))
    for name, t in list((profile or {}).items())[:16]:
        print(f"    {name:24s} {t['us_per_token']:9.1f} us/token {t['calls_per_token']:7.1f} calls {t['us_per_call']:8.2f} us/call")
print("  device:", j.get("device"))
PY
}

for m in "${models[@]}"; do
  case $m in
    next80b) synth next80b qwen3next qwen3-next-80b-a3b && bench next80b cuda --prompt-tokens 512 --gen-tokens 128 ;;
    next80b-cpu) synth next80b qwen3next qwen3-next-80b-a3b && bench next80b cpu --prompt-tokens 16 --gen-tokens 8 --batch 16 ;;
    next80b-profile) synth next80b qwen3next qwen3-next-80b-a3b &&
      STRATA_CUDA_PROFILE=1 bench next80b cuda --prompt-tokens 512 --gen-tokens 16 ;;
    flagship-profile) synth flagship qwen4exp flagship &&
      STRATA_CUDA_PROFILE=1 bench flagship cuda --prompt-tokens 512 --gen-tokens 16 ;;
    flagship) synth flagship qwen4exp flagship && bench flagship cuda --prompt-tokens 512 --gen-tokens 64 ;;
    *) echo "gpu_models: unknown model '$m'"; exit 2 ;;
  esac
done
