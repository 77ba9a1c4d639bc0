#include "spec/gate_simulation.h"

#include <algorithm>
#include <cmath>

#include "spec/spec_gate.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::spec {

SimulatedSession simulate_session(const SimulatedCosts& c, std::optional<int> fixed, int64_t tokens,
                                  uint64_t seed) {
  const int depth = int(c.acceptance.size());
  if (depth < 1 || depth > kMaxDepth || c.ratio.size() != c.acceptance.size() + 1)
    fail("gate simulation: ", c.acceptance.size(), " acceptances need 1..", kMaxDepth, " and one more ratio, got ",
         c.ratio.size());
  SpecGate g({.max_depth = depth, .fixed_depth = fixed});
  Rng rng(seed);
  double time = 0, made = 0;
  int64_t windows = 0;
  while (made < double(tokens)) {
    const Pick p = g.pick(Source::Mtp, depth);
    int k = p.depth;
    std::vector<float> probs;
    if (k > 0) {
      time += c.draft_cost * k;
      g.drafted(Source::Mtp, k, c.draft_cost * k);
      probs.assign(size_t(k), 0.8f);
      if (!p.probe) k = std::min(k, g.trim(Source::Mtp, probs));
      probs.resize(size_t(k));
    }
    int accepted = 0;
    while (accepted < k && rng.uniform() < c.acceptance[size_t(accepted)]) ++accepted;
    const double seconds = c.ratio[size_t(k)] * std::exp(c.noise * double(rng.normal()));
    time += seconds;
    made += accepted + 1;
    ++windows;
    g.window_done(k + 1, seconds);
    if (k > 0) g.verified(Source::Mtp, std::min(k, accepted + 1), accepted, probs);
  }
  return {made / time, made / double(windows)};
}

}  // namespace strata::spec
