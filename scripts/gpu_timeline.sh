#!/usr/bin/env bash
# Runs on the GPU machine, from a bundle made by scripts/gpu_bundle.sh: where a replayed decode
# window's time goes, kernel by kernel, in place (not each kernel alone after a cache flush, as
# gpu_kernels.sh's Nsight Compute does). The bench runs with the bundle's CUPTI injection library
# (lib/libstrata_kernel_timeline.so), which writes every kernel's start and end; then, over the
# replays of the decode window's graph (the first two left out), per replay: the wall time from
# the first kernel's start to the last one's end, the time no kernel ran, the gap to the next
# replay (the kernels launched outside the graph in it, and the host's runtime calls and the
# copies in it: when the host learned the replay had ended, when it launched the next), and each
# kernel's share of the wall:
# the time from the previous kernel's end (in end order) to its own, which charges dependent
# launches' early starts and the side stream's overlap to whoever finishes last. Writes
# timeline.tsv and timeline.txt to $OUT (default BUNDLE/out).
#
#   BUNDLE/gpu_timeline.sh   MODEL (default /tmp/strata-models/next80b.gguf, synthesized if absent),
#                            BENCH_ARGS (added to the bench, e.g. '--parallel 8'), GEN (tokens, 24),
#                            PROMPT (prompt tokens before them, one window: 16)
set -uo pipefail

bundle=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$bundle/out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
strata="$bundle/bin/${STRATA_BIN:-strata}"
model=${MODEL:-/tmp/strata-models/next80b.gguf}
injection="$bundle/lib/libstrata_kernel_timeline.so"
[[ -f $injection ]] || { echo "gpu_timeline: $injection is missing (no CUPTI at build time)"; exit 1; }

if [[ ! -f $model ]]; then
  mkdir -p "$(dirname "$model")"
  "$strata" synth --arch qwen3next --preset qwen3-next-80b-a3b --expert-type iq2_xs -o "$model" \
    >"$out/synth.log" 2>&1 || { echo "synth failed"; tail -n 5 "$out/synth.log"; exit 1; }
fi
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
CUDA_INJECTION64_PATH=$injection STRATA_TIMELINE_OUT="$out/timeline.tsv" "$strata" bench -m "$model" \
  --device cuda --prompt-tokens "${PROMPT:-16}" --batch "${PROMPT:-16}" --gen-tokens "${GEN:-24}" ${BENCH_ARGS:-} \
  >"$out/bench.json" 2>"$out/bench.log"
echo "bench rc $?, $(grep -cv -E "^(api|copy|memset)\s" "$out/timeline.tsv") kernels recorded"
python3 - "$out/timeline.tsv" <<'PY' | tee "$out/timeline.txt"
import collections, statistics, sys

launches = collections.defaultdict(list)  # (graph, correlation) -> kernels
eager = []  # kernels launched outside graphs: (start, end, name)
api, copies = [], []  # host runtime calls (start, end, name); copies and memsets (start, end, what)
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if f[0] == "api" and len(f) >= 6:
        api.append((int(f[1]), int(f[2]), f[5]))
        continue
    if f[0] in ("copy", "memset") and len(f) >= 6:
        copies.append((int(f[1]), int(f[2]), f[0] + (" " + f[6] if len(f) > 6 else "") + (" graph" if f[4] != "0" else "")))
        continue
    if len(f) < 8:
        continue
    if f[3] == "0":
        eager.append((int(f[0]), int(f[1]), f[7]))
        continue
    launches[(f[3], f[4])].append((int(f[0]), int(f[1]), f[7]))
if not launches:
    sys.exit("no graph kernels recorded")
# The decode window's graph: the one launched most often; its replays in launch order.
by_graph = collections.Counter(g for g, _ in launches)
graph = by_graph.most_common(1)[0][0]
replays = sorted((k for (g, _), k in launches.items() if g == graph), key=lambda k: min(s for s, _, _ in k))
replays = replays[2:] or replays
walls, idles, shares, durations, counts = [], [], collections.defaultdict(float), collections.defaultdict(float), collections.Counter()
for kernels in replays:
    kernels.sort(key=lambda k: k[1])
    first = min(s for s, _, _ in kernels)
    walls.append(kernels[-1][1] - first)
    busy, reach = 0, first  # union of the kernels' intervals, in start order
    for s, e, _ in sorted(kernels):
        if e > reach:
            busy += e - max(s, reach)
            reach = e
    idles.append(walls[-1] - busy)
    previous = first
    for s, e, name in kernels:
        shares[name] += e - previous
        durations[name] += e - s
        counts[name] += 1
        previous = e
n = len(replays)
print(f"graph {graph}: {n} replays, {len(replays[0])} kernels each; wall median "
      f"{statistics.median(walls) / 1e3:.1f} us (min {min(walls) / 1e3:.1f}), no kernel running "
      f"{statistics.median(idles) / 1e3:.1f} us")
# Between replays: from one replay's last kernel end to the next one's first start, the GPU
# waits for the host (read-back, sampling, the next window's uploads and launch) and runs the
# kernels launched outside the graph.
bounds = [(min(s for s, _, _ in k), max(e for _, e, _ in k)) for k in replays]
gaps = [b[0] - a[1] for a, b in zip(bounds, bounds[1:])]
between = collections.Counter(name for a, b in zip(bounds, bounds[1:]) for s, e, name in eager if a[1] <= s < b[0])
if gaps:
    print(f"between replays: median {statistics.median(gaps) / 1e3:.1f} us (min {min(gaps) / 1e3:.1f}, "
          f"max {max(gaps) / 1e3:.1f}); kernels outside the graph a gap: "
          + (", ".join(f"{name} {c / len(gaps):.1f}" for name, c in between.most_common(6)) or "none"))
# What the host did in each gap, in us after the replay's last kernel: when its waiting call
# returned, when it called the next window's graph launch (and when that call returned), when the
# gap's first copy or memset started (the read-back of the window's choice or logits); and the
# time of each runtime call and copy inside the gap.
def after(t, a):
    return (t - a) / 1e3
if gaps and api:
    marks = collections.defaultdict(list)
    in_gap = collections.defaultdict(float)
    for a, b in zip(bounds, bounds[1:]):
        waits = [e for s, e, name in api if s < a[1] <= e]
        if waits:
            marks["host back (wait returns)"].append(after(min(waits), a[1]))
        launch = [(s, e) for s, e, name in api if name.startswith("cudaGraphLaunch") and a[1] - 2e6 < s < b[0]]
        if launch:
            marks["next graph launch called"].append(after(launch[-1][0], a[1]))
            marks["next graph launch returns"].append(after(launch[-1][1], a[1]))
        moves = [s for s, e, what in copies if a[1] <= s < b[0]]
        if moves:
            marks["first copy/memset starts"].append(after(min(moves), a[1]))
        marks["first kernel starts"].append(after(b[0], a[1]))
        for s, e, name in api:
            overlap = min(e, b[0]) - max(s, a[1])
            if overlap > 0:
                in_gap[name] += overlap
        for s, e, what in copies:
            overlap = min(e, b[0]) - max(s, a[1])
            if overlap > 0:
                in_gap["(device) " + what] += overlap
    for name, values in marks.items():
        print(f"  gap: {name:30s} median {statistics.median(values):8.1f} us ({len(values)} gaps)")
    for name, t in sorted(in_gap.items(), key=lambda x: -x[1])[:10]:
        print(f"  gap: {t / len(gaps) / 1e3:8.1f} us a gap in {name}")
print(f"{'share us':>9} {'calls':>6} {'share/call':>10} {'dur/call':>9}  kernel")
for name, t in sorted(shares.items(), key=lambda x: -x[1])[:40]:
    c = counts[name] / n
    print(f"{t / n / 1e3:9.1f} {c:6.1f} {t / n / 1e3 / c:10.2f} {durations[name] / n / 1e3 / c:9.2f}  {name[:100]}")
PY
