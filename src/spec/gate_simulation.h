// Decode sessions simulated against SpecGate, for its tests and the simulation benchmark
// (bench/bench_spec_gate.cpp): what tokens per unit of time the gate's online choices give on a
// known cost curve and acceptance, against every fixed depth, learning included.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace strata::spec {

// A machine and a drafter: a window of n rows costs ratio[n - 1] T(1) times lognormal noise of
// `noise` sigma; drafting costs `draft_cost` T(1) a draft; draft j is accepted with
// acceptance[j - 1] given the ones before it stood (so ratio has one more entry than acceptance).
struct SimulatedCosts {
  std::vector<double> ratio, acceptance;
  double draft_cost = 0;
  double noise = 0.1;
};

struct SimulatedSession {
  double tokens_per_time = 0;  // in tokens per T(1)
  double tokens_per_window = 0;
};

// One session of at least `tokens` tokens through a SpecGate of max depth acceptance.size() (a
// fixed depth: --spec-depth), the drafter offering every depth with its probability 0.8, the
// random draws from `seed`.
SimulatedSession simulate_session(const SimulatedCosts& costs, std::optional<int> fixed, int64_t tokens,
                                  uint64_t seed);

}  // namespace strata::spec
