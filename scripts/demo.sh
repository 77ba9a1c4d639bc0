#!/usr/bin/env bash
# Builds strata and runs the main job on an embedded default: a small synthetic model of the
# flagship architecture (qwen4exp: hyper-connections, PLE n-gram tables, QSA, Gated DeltaNet,
# 512-expert-style MoE at toy size), synthesized once into models/ and reused after as a trunk
# GGUF plus its .experts pack, then a short generation that streams the routed experts through an
# expert cache smaller than they are (2 MiB of 4.2 MiB), ending with the telemetry line (speed,
# cache hit rate, read rate, stall). The weights are random, so the text is noise: the point is
# the pipeline.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh" --target strata
strata="${STRATA_BUILD_DIR:-$root/build}/strata"
model="$root/models/demo-qwen4exp-tiny-trunk.gguf"
if [[ ! -f "$model" ]]; then
  mkdir -p "$root/models"
  "$strata" synth --arch qwen4exp --preset tiny --seed 1 --pack -o "$model"
fi
"$strata" inspect "$model" | sed -n '1,4p'
"$strata" run -m "$model" -p "Why do MoE experts stream well from an SSD?" --max-tokens 48 --seed 1 \
  --expert-budget 2M
