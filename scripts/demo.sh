#!/usr/bin/env bash
# Builds strata and runs the main job on an embedded default: a small synthetic model of the
# flagship architecture (qwen4exp), synthesized once into models/ and reused after.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh" --target strata
strata="${STRATA_BUILD_DIR:-$root/build}/strata"
model="$root/models/demo-qwen4exp-tiny.gguf"
if [[ ! -f "$model" ]]; then
  mkdir -p "$root/models"
  "$strata" synth --arch qwen4exp --preset tiny --seed 1 -o "$model"
fi
"$strata" inspect "$model"
