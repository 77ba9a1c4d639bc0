#!/usr/bin/env bash
# Builds strata and runs the main job on an embedded default: small synthetic models, synthesized
# once into models/ and reused after. The flagship architecture (qwen4exp) is synthesized and
# inspected; the generation runs on its Qwen3.5-MoE sibling until the qwen4exp forward pass lands
# (docs/MODELS.md). The weights are random, so the text is too: the point is the pipeline and the
# telemetry line.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh" --target strata
strata="${STRATA_BUILD_DIR:-$root/build}/strata"
mkdir -p "$root/models"

flagship="$root/models/demo-qwen4exp-tiny.gguf"
[[ -f "$flagship" ]] || "$strata" synth --arch qwen4exp --preset tiny --seed 1 -o "$flagship"
"$strata" inspect "$flagship" | sed -n '1,4p'

model="$root/models/demo-qwen35moe-tiny.gguf"
[[ -f "$model" ]] || "$strata" synth --arch qwen35moe --preset tiny --seed 1 -o "$model"
"$strata" run -m "$model" -p "Why do MoE experts stream well from an SSD?" --max-tokens 48 --seed 1
