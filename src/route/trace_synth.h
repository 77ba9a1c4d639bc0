// Synthetic routing traces with realistic reuse. Random-weight models route with no temporal
// locality; real ones reuse experts heavily (docs/DESIGN.md: a per-layer LRU of 32/64/128 slots serves
// about 55/79/90% of a real model's decode routes). This generator reproduces that locality so
// benchmarks and replays have something realistic to run on.
//
// Per layer, each of a token's top_k distinct experts is drawn from a mixture:
//   - with probability `reuse`, recency: the expert at depth d of the layer's LRU stack (d = 0 is
//     the most recently routed), d from a Lomax law truncated to n_experts:
//     P(D > d) = (1 + (d + 1) / depth_scale)^-depth_beta;
//   - otherwise popularity: a Zipf law over a per-layer random order of the experts,
//     P(rank i) proportional to (i + 1)^-zipf.
// The per-layer popularity orders come from model_seed and the draws from seed, so traces with the
// same model_seed and different seeds are different sessions of the same "model" (a profile made
// from one applies to the other). Every layer has its own random stream: the result does not
// depend on the order in which layers are generated.
//
// Router logits: per (row, layer), n_experts Gumbel(0, logit_scale) values sorted descending; the
// largest top_k go to the routed experts (in draw order), the next top_m - top_k to runners-up
// drawn from the same mixture (without touching recency), the log-sum-exp over all n. The weights
// are the renormalized (or plain) softmax of the routed logits, exactly what routing the
// candidates with cache-conditional routing off gives.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "route/trace.h"
#include "util/rng.h"

namespace strata::route {

struct TraceShape {
  std::string name;
  int n_layers = 0;
  int n_experts = 0;
  int top_k = 0;
};

// "flagship" (Qwen3.8-Flash-Next: 48 layers, 512 experts, top-10) and "qwen3-next-80b-a3b"
// (48 layers, 512 experts, top-10). Throws strata::Error naming the known shapes otherwise.
TraceShape trace_shape(const std::string& name);

struct LocalityKnobs {
  double zipf = 1.0;          // popularity exponent
  double reuse = 0.5;         // probability of a recency draw
  double depth_scale = 10.0;  // recency depth law: P(D > d) = (1 + (d + 1) / depth_scale)^-depth_beta
  double depth_beta = 1.0;
};

// The knobs fitted by calibrate() to 55/79/90% (docs/ROUTING.md has the table), and the logit scale
// fitted to a median top-1 minus top-3 logit gap of 0.35.
LocalityKnobs calibrated_knobs();
constexpr double kCalibratedLogitScale = 0.2837;

class RouteSampler {
 public:
  RouteSampler(const TraceShape& shape, const LocalityKnobs& knobs, uint64_t model_seed, uint64_t seed);

  // The next token's top_k distinct experts of `layer`, in draw order; they become the most
  // recently used of that layer's stack.
  void next(int layer, std::span<int32_t> out);
  // out.size() further distinct experts, none in `taken`, drawn from the same mixture without
  // changing the stack.
  void runners_up(int layer, std::span<const int32_t> taken, std::span<int32_t> out);

 private:
  struct Layer {
    std::vector<int32_t> popular;  // expert ids, most popular first
    std::vector<int32_t> stack;    // expert ids, most recently used first
    Rng rng{0};
  };
  int32_t draw(Layer& layer, std::span<const int32_t> taken);

  TraceShape shape_;
  LocalityKnobs knobs_;
  std::vector<double> zipf_cdf_, depth_cdf_;
  std::vector<Layer> layers_;
};

struct SynthTraceOptions {
  TraceShape shape;
  int64_t tokens = 4096;
  int top_m = 32;  // 0 = no router candidates
  uint64_t model_seed = 1;
  uint64_t seed = 1;
  LocalityKnobs knobs = calibrated_knobs();
  double logit_scale = kCalibratedLogitScale;
  bool renormalize = true;
  int window_rows = 64;  // rows per trace window (file chunk)
};

// Writes a synthetic trace to `path`; the model identity names the shape, knobs and seeds.
void write_synthetic_trace(const SynthTraceOptions& options, const std::string& path);

// Mean per-layer LRU hit rate at each slot count over `tokens` tokens of `layers` layers (after a
// warm-up of 256 tokens that is not counted).
std::vector<double> lru_hit_rates(const TraceShape& shape, const LocalityKnobs& knobs, uint64_t model_seed,
                                  uint64_t seed, int layers, int64_t tokens, std::span<const int> slots);

struct Calibration {
  LocalityKnobs knobs;
  std::vector<double> achieved;  // per target
  double logit_scale = 0.0;
  int evaluations = 0;
};

// Fits zipf, reuse and depth_scale (depth_beta fixed) so the per-layer LRU hit rates at `slots`
// match `targets` (least squares, Nelder-Mead from a fixed start, the same random draws for every
// evaluation: deterministic), and the logit scale to a median top-1 minus top-3 gap of target_gap.
Calibration calibrate(const TraceShape& shape, std::span<const int> slots, std::span<const double> targets,
                      double depth_beta, double target_gap, int layers, int64_t tokens, uint64_t seed);

}  // namespace strata::route
