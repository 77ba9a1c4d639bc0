#!/usr/bin/env bash
# Runs on the GPU machine, from a bundle made by scripts/gpu_bundle.sh: device time per CUDA kernel
# over one replayed decode window of the Qwen3-Next-80B shape at IQ2_XS (Nsight Compute's
# gpu__time_duration, clocks left alone), summed by kernel and launch shape, slowest first; and
# the plain bench's prefill/decode speed for reference. Writes bench.json, ncu.csv and ncu.err to
# $OUT (default BUNDLE/out).
#
#   BUNDLE/gpu_kernels.sh
#
# The window is found by launch count: a 16-token prompt (one eager window), one eager and one
# captured decode window, then replays; --launch-skip lands in the replays and --launch-count
# covers one window (KERNELS, default: the kernels per token the plain bench reports). MODEL names
# another model (the flagship: synthesize it first, and raise SKIP past its first windows' launches,
# e.g. SKIP=12000 GEN=16; defaults 6000 and 8). BENCH_ARGS adds arguments to both benches, e.g.
# BENCH_ARGS='--parallel 8' SKIP=20000 GEN=24 for a window of eight decode streams.
set -uo pipefail

bundle=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$bundle/out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
strata="$bundle/bin/strata"
model=${MODEL:-/tmp/next80b.gguf}

[[ -f $model ]] || "$strata" synth --arch qwen3next --preset qwen3-next-80b-a3b --expert-type iq2_xs \
  -o "$model" >"$out/synth.log" 2>&1 || { echo "synth failed"; tail -n 5 "$out/synth.log"; exit 1; }
"$strata" bench -m "$model" --device cuda --prompt-tokens 512 --gen-tokens 128 ${BENCH_ARGS:-} >"$out/bench.json" 2>/dev/null
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('prefill', j['prefill']['tok_per_s'], 'decode', j['decode']['tok_per_s'])" "$out/bench.json"
# One decode window's kernels, as the plain bench counted them (graph_kernels_per_token).
kernels=${KERNELS:-$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['decode']['backend']['graph_kernels_per_token']))" "$out/bench.json" 2>/dev/null || echo 1968)}
timeout 400 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip "${SKIP:-6000}" \
  --launch-count "$kernels" --csv "$strata" bench -m "$model" --device cuda --prompt-tokens 16 \
  --batch 16 --gen-tokens "${GEN:-8}" ${BENCH_ARGS:-} >"$out/ncu.csv" 2>"$out/ncu.err"
echo "ncu rc $?"
python3 - "$out/ncu.csv" <<'PY'
import collections, csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
if not rows:
    sys.exit("no ncu rows")
h = rows[0]
kernel, grid, block = h.index("Kernel Name"), h.index("Grid Size"), h.index("Block Size")
value, unit = h.index("Metric Value"), h.index("Metric Unit")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
total, count = collections.defaultdict(float), collections.Counter()
for r in rows[1:]:
    name = f"{r[kernel].split('(')[0]} {r[grid]}{r[block]}"
    total[name] += float(r[value].replace(",", "")) * scale[r[unit]]
    count[name] += 1
print(f"kernels {sum(count.values())}, {sum(total.values()):.0f} us")
for name, us in sorted(total.items(), key=lambda x: -x[1])[:30]:
    print(f"{us:9.1f} us {count[name]:5d} x {us / count[name]:7.2f} us  {name[:110]}")
PY
