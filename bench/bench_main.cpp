// strata_bench: every microbenchmark in bench/, driven by the standard Google Benchmark flags
// (--benchmark_filter, --benchmark_format=json, --benchmark_counters_tabular, ...).
#include <benchmark/benchmark.h>

#include "bench.h"
#include "util/cpu.h"

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("strata_isa", strata::cpu_features().describe());
  strata::bench::register_matvec_benchmarks();
  strata::bench::register_dot_rows_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
