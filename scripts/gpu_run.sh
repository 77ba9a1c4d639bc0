#!/usr/bin/env bash
# Runs on the GPU machine, from a bundle made by scripts/gpu_bundle.sh (it is copied there as
# BUNDLE/gpu_run.sh): every CUDA test, the CUDA benchmarks, and compute-sanitizer memcheck and
# racecheck on the backend op suite. Writes logs and gpu_summary.json to $OUT (default
# BUNDLE/out): tests passed/failed/skipped, failing test names, sanitizer error counts, and the
# figures the tests and benchmarks print.
#
#   BUNDLE/gpu_run.sh [--quick]     (--quick: tests only, no benchmarks or sanitizers)
#
# Each sanitizer run stops after SANITIZER_TIMEOUT seconds (default 200), so the whole script fits
# one 10-minute device call; a run cut short counts as failed in the summary.
set -uo pipefail

bundle=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$bundle/out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STRATA_FIXTURES="$bundle/fixtures"
tests="$bundle/bin/strata_tests"
quick=0
[[ ${1:-} == --quick ]] && quick=1

# Every test that touches the GPU, and the op suite the sanitizers check.
cuda_tests='CudaDevice.*:CudaMatmulTiles.*:CudaLaunchGuard.*:CudaOpProfile.*:*CudaFormat.*:CudaConvert.*:CudaBackend.*:Backends/*.*/cuda:Archs/CudaModel.*:CudaStreaming.*:CudaActQuant.*:CudaMatvecQ*.*:*/CudaMatvecQ.*:Reference/Fixture.*_cuda:*/SpecDecode.*_cuda:*/MtpDecode.*_cuda:Batching.OnTheGpu*'
# (not the test that exhausts device memory on purpose: memcheck reports its failed allocation)
op_suite='Backends/*.*/cuda:CudaBackend.*:CudaMatmulTiles.*:-CudaBackend.ExhaustedMemory*'

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  ldd "$tests" | grep 'not found' || echo "all shared libraries found"
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

start=$(date +%s)
"$tests" --gtest_filter="$cuda_tests" --gtest_output="json:$out/tests.json" >"$out/tests.log" 2>&1
tests_rc=$?
echo "tests: rc $tests_rc, $(($(date +%s) - start)) s"
tail -n 3 "$out/tests.log"

bench_rc=-1 memcheck_rc=-1 racecheck_rc=-1
if ((!quick)); then
  start=$(date +%s)
  "$tests" --gtest_also_run_disabled_tests \
    --gtest_filter='CudaBandwidth.*:CudaMatvecQBandwidth.*:CudaModelBench.*' >"$out/bench.log" 2>&1
  bench_rc=$?
  echo "benchmarks: rc $bench_rc, $(($(date +%s) - start)) s"
  for tool in memcheck racecheck; do
    start=$(date +%s)
    timeout "${SANITIZER_TIMEOUT:-200}" compute-sanitizer --tool "$tool" --print-limit 20 "$tests" \
      --gtest_filter="$op_suite" >"$out/$tool.log" 2>&1
    rc=$?
    eval "${tool}_rc=$rc"
    echo "$tool: rc $rc, $(($(date +%s) - start)) s, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -n 1)"
  done
fi

python3 - "$out" "$tests_rc" "$bench_rc" "$memcheck_rc" "$racecheck_rc" <<'EOF'
import json, re, sys, pathlib
out = pathlib.Path(sys.argv[1])
rcs = dict(zip(["tests", "benchmarks", "memcheck", "racecheck"], map(int, sys.argv[2:])))
summary = {"exit_codes": rcs, "machine": (out / "machine.txt").read_text().strip()}
try:
    report = json.loads((out / "tests.json").read_text())
    cases = [t for s in report["testsuites"] for t in s["testsuite"]]
    skipped = [t for t in cases if t.get("result") == "SKIPPED"]
    failed = [f'{t["classname"]}.{t["name"]}' for t in cases if t.get("failures")]
    summary["tests"] = {"total": len(cases), "failed": len(failed), "skipped": len(skipped),
                        "passed": len(cases) - len(failed) - len(skipped),
                        "failed_names": failed}
except (OSError, ValueError, KeyError) as e:
    summary["tests"] = {"error": f"no test report: {e}"}
log = (out / "tests.log").read_text(errors="replace") if (out / "tests.log").exists() else ""
summary["figures"] = [l.strip() for l in log.splitlines()
                      if l.startswith(("[ cosine", "[ device", "[ graphs")) or "full window min cosine" in l]
bench = out / "bench.log"
if bench.exists():
    summary["benchmarks"] = [l.strip() for l in bench.read_text(errors="replace").splitlines()
                             if "GB/s" in l or l.lstrip().startswith("{")]
for tool in ["memcheck", "racecheck"]:
    f = out / f"{tool}.log"
    if not f.exists():
        continue
    text = f.read_text(errors="replace")
    m = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: (\d+) (?:error|hazard)", text)
    summary[tool] = {"errors": int(m[-1]) if m else None,
                     "tests_ok": "[  PASSED  ]" in text and "FAILED TEST" not in text}
(out / "gpu_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
EOF
