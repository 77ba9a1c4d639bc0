#include "route/trace_synth.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <numeric>

#include "route/cache_policy.h"
#include "route/ccr.h"
#include "util/error.h"

namespace strata::route {

namespace {

// Uniform in (0, 1) with 53 bits.
double unit(Rng& rng) { return (double(rng.next() >> 11) + 0.5) * 0x1p-53; }

// P(D <= d) for a Lomax (shifted Pareto) depth law with scale d0 and exponent beta, truncated to n.
std::vector<double> lomax_cdf(int n, double d0, double beta) {
  std::vector<double> cdf(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) cdf[size_t(d)] = 1.0 - std::pow(1.0 + double(d + 1) / d0, -beta);
  for (double& c : cdf) c /= cdf.back();
  return cdf;
}

std::vector<double> power_cdf(int n, double exponent) {
  std::vector<double> cdf(static_cast<size_t>(n));
  double sum = 0.0;
  for (int i = 0; i < n; ++i) cdf[size_t(i)] = sum += std::pow(double(i + 1), -exponent);
  for (double& c : cdf) c /= sum;
  return cdf;
}

int sample(const std::vector<double>& cdf, double u) {
  const auto it = std::lower_bound(cdf.begin(), cdf.end(), u);
  return it == cdf.end() ? int(cdf.size()) - 1 : int(it - cdf.begin());
}

bool contains(std::span<const int32_t> ids, int32_t e) { return std::find(ids.begin(), ids.end(), e) != ids.end(); }

uint64_t mix(uint64_t seed, uint64_t stream, uint64_t index) {
  return seed ^ (0x9e3779b97f4a7c15ull * (stream + 1)) ^ (0xc2b2ae3d27d4eb4full * (index + 1));
}

void check_knobs(const LocalityKnobs& k) {
  if (!(k.zipf >= 0.0 && k.zipf <= 8.0)) fail("synthetic trace: zipf exponent ", k.zipf, " is outside 0..8");
  if (!(k.reuse >= 0.0 && k.reuse <= 1.0)) fail("synthetic trace: reuse ", k.reuse, " is outside 0..1");
  if (!(k.depth_scale >= 0.1 && k.depth_scale <= 1e4))
    fail("synthetic trace: depth scale ", k.depth_scale, " is outside 0.1..10000");
  if (!(k.depth_beta >= 0.01 && k.depth_beta <= 100.0))
    fail("synthetic trace: depth exponent ", k.depth_beta, " is outside 0.01..100");
}

// `count` descending Gumbel(0, scale) values out of n, and the log-sum-exp of all n.
float gumbel_top(Rng& rng, int n, int count, float scale, std::vector<float>& all, std::span<float> top) {
  all.resize(size_t(n));
  for (int i = 0; i < n; ++i) all[size_t(i)] = scale * float(-std::log(-std::log(unit(rng))));
  std::partial_sort(all.begin(), all.begin() + count, all.end(), std::greater<float>());
  std::copy(all.begin(), all.begin() + count, top.begin());
  const float mx = all[0];
  float sum = 0.0f;
  for (float v : all) sum += std::exp(v - mx);
  return mx + std::log(sum);
}

}  // namespace

TraceShape trace_shape(const std::string& name) {
  if (name == "flagship") return {"flagship", 48, 512, 10};
  if (name == "qwen3-next-80b-a3b") return {"qwen3-next-80b-a3b", 48, 512, 10};
  fail("trace shape '", name, "': known shapes are flagship and qwen3-next-80b-a3b");
}

LocalityKnobs calibrated_knobs() { return {1.1111, 0.7761, 106.945, 4.0}; }

RouteSampler::RouteSampler(const TraceShape& shape, const LocalityKnobs& knobs, uint64_t model_seed, uint64_t seed)
    : shape_(shape), knobs_(knobs) {
  check_knobs(knobs);
  if (shape.n_layers < 1 || shape.n_experts < 1 || shape.top_k < 1 || shape.top_k * 2 > shape.n_experts)
    fail("synthetic trace: shape ", shape.n_layers, " layers x ", shape.n_experts, " experts top-", shape.top_k,
         " (needs top_k <= n_experts / 2)");
  zipf_cdf_ = power_cdf(shape.n_experts, knobs.zipf);
  depth_cdf_ = lomax_cdf(shape.n_experts, knobs.depth_scale, knobs.depth_beta);
  layers_.resize(size_t(shape.n_layers));
  for (int l = 0; l < shape.n_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    Rng order(mix(model_seed, 1, uint64_t(l)));
    L.popular.resize(size_t(shape.n_experts));
    std::iota(L.popular.begin(), L.popular.end(), 0);
    for (int i = shape.n_experts - 1; i > 0; --i) std::swap(L.popular[size_t(i)], L.popular[order.below(uint32_t(i + 1))]);
    L.stack = L.popular;
    L.rng = Rng(mix(seed, 2, uint64_t(l)));
  }
}

int32_t RouteSampler::draw(Layer& L, std::span<const int32_t> taken) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const bool recent = unit(L.rng) < knobs_.reuse;
    const double u = unit(L.rng);
    const int32_t e = recent ? L.stack[size_t(sample(depth_cdf_, u))] : L.popular[size_t(sample(zipf_cdf_, u))];
    if (!contains(taken, e)) return e;
  }
  for (int32_t e : L.popular)
    if (!contains(taken, e)) return e;
  fail("synthetic trace: no expert left to draw");
}

void RouteSampler::next(int layer, std::span<int32_t> out) {
  Layer& L = layers_[size_t(layer)];
  for (size_t j = 0; j < out.size(); ++j) out[j] = draw(L, out.first(j));
  for (size_t j = out.size(); j-- > 0;) {
    const auto it = std::find(L.stack.begin(), L.stack.end(), out[j]);
    std::rotate(L.stack.begin(), it, it + 1);
  }
}

void RouteSampler::runners_up(int layer, std::span<const int32_t> taken, std::span<int32_t> out) {
  Layer& L = layers_[size_t(layer)];
  std::vector<int32_t> all(taken.begin(), taken.end());
  for (int32_t& e : out) {
    e = draw(L, all);
    all.push_back(e);
  }
}

void write_synthetic_trace(const SynthTraceOptions& o, const std::string& path) {
  const TraceShape& s = o.shape;
  if (o.tokens < 1) fail("synthetic trace: ", o.tokens, " tokens");
  if (o.window_rows < 1) fail("synthetic trace: window of ", o.window_rows, " rows");
  if (!(o.logit_scale > 0.0 && o.logit_scale < 100.0)) fail("synthetic trace: logit scale ", o.logit_scale);
  TraceHeader h;
  h.n_layers = s.n_layers;
  h.n_experts = s.n_experts;
  h.top_k = s.top_k;
  h.top_m = o.top_m;
  h.renormalized = o.renormalize;
  h.model = cat("synthetic ", s.name, " (", s.n_layers, " layers, ", s.n_experts, " experts, top-", s.top_k,
                "); zipf ", o.knobs.zipf, ", reuse ", o.knobs.reuse, ", depth_scale ", o.knobs.depth_scale, ", depth_beta ", o.knobs.depth_beta,
                ", logit_scale ", o.logit_scale, ", model_seed ", o.model_seed, ", seed ", o.seed);
  TraceWriter writer(path, h);
  RouteSampler sampler(s, o.knobs, o.model_seed, o.seed);
  std::vector<Rng> logit_rng;
  for (int l = 0; l < s.n_layers; ++l) logit_rng.emplace_back(mix(o.seed, 3, uint64_t(l)));

  const int k = s.top_k;
  const int m = std::max(o.top_m, k);
  std::vector<int32_t> ids(static_cast<size_t>(m));
  std::vector<float> logits(static_cast<size_t>(m)), scratch;
  const CcrParams off;
  for (int64_t first = 0; first < o.tokens; first += o.window_rows) {
    const int64_t rows = std::min<int64_t>(o.window_rows, o.tokens - first);
    for (int l = 0; l < s.n_layers; ++l) {
      backend::Routing routing;
      routing.top_k = k;
      RouterTopM top;
      top.m = o.top_m;
      for (int64_t r = 0; r < rows; ++r) {
        sampler.next(l, std::span(ids).first(size_t(k)));
        sampler.runners_up(l, std::span(ids).first(static_cast<size_t>(k)), std::span(ids).subspan(size_t(k)));
        const float lse = gumbel_top(logit_rng[size_t(l)], s.n_experts, m, float(o.logit_scale), scratch, logits);
        const RowRouting row = route_row_top_m(ids, logits, lse, k, o.renormalize, off, {});
        routing.experts.insert(routing.experts.end(), row.experts.begin(), row.experts.end());
        routing.weights.insert(routing.weights.end(), row.weights.begin(), row.weights.end());
        if (o.top_m > 0) {
          top.ids.insert(top.ids.end(), ids.begin(), ids.end());
          top.logits.insert(top.logits.end(), logits.begin(), logits.end());
          top.lse.push_back(lse);
        }
      }
      writer.append(l, routing, o.top_m > 0 ? &top : nullptr);
    }
  }
  writer.close();
}

std::vector<double> lru_hit_rates(const TraceShape& shape, const LocalityKnobs& knobs, uint64_t model_seed,
                                  uint64_t seed, int layers, int64_t tokens, std::span<const int> slots) {
  constexpr int64_t kWarmup = 256;
  TraceShape part = shape;
  part.n_layers = std::min(layers, shape.n_layers);
  RouteSampler sampler(part, knobs, model_seed, seed);
  std::vector<std::vector<LayerCache>> caches(slots.size());
  for (size_t i = 0; i < slots.size(); ++i)
    for (int l = 0; l < part.n_layers; ++l) caches[i].emplace_back(part.n_experts, slots[i]);
  std::vector<int64_t> hits(slots.size(), 0);
  std::vector<int32_t> ids(static_cast<size_t>(part.top_k));
  for (int64_t t = 0; t < kWarmup + tokens; ++t)
    for (int l = 0; l < part.n_layers; ++l) {
      sampler.next(l, ids);
      for (size_t i = 0; i < slots.size(); ++i) {
        const int h = caches[i][size_t(l)].access(ids);
        if (t >= kWarmup) hits[i] += h;
      }
    }
  std::vector<double> rates;
  for (int64_t h : hits) rates.push_back(double(h) / double(tokens * part.n_layers * part.top_k));
  return rates;
}

Calibration calibrate(const TraceShape& shape, std::span<const int> slots, std::span<const double> targets,
                      double depth_beta, double target_gap, int layers, int64_t tokens, uint64_t seed) {
  if (slots.size() != targets.size() || slots.empty())
    fail("calibrate: ", slots.size(), " slot counts but ", targets.size(), " target hit rates");
  Calibration out;
  // The search runs over (zipf, reuse, ln depth_scale) inside a box.
  using Point = std::array<double, 3>;
  const Point lo{0.0, 0.0, std::log(0.5)}, hi{3.0, 1.0, std::log(1000.0)};
  const auto clamp = [&](Point p) {
    for (size_t i = 0; i < 3; ++i) p[i] = std::clamp(p[i], lo[i], hi[i]);
    return p;
  };
  const auto knobs = [&](const Point& p) { return LocalityKnobs{p[0], p[1], std::exp(p[2]), depth_beta}; };
  const auto loss = [&](const Point& p) {
    ++out.evaluations;
    const auto rates = lru_hit_rates(shape, knobs(p), seed, seed, layers, tokens, slots);
    double sum = 0.0;
    for (size_t i = 0; i < rates.size(); ++i) sum += (rates[i] - targets[i]) * (rates[i] - targets[i]);
    return sum;
  };
  // Nelder-Mead from a fixed start.
  const double d0 = std::log(60.0);
  std::array<Point, 4> simplex{Point{1.2, 0.6, d0}, Point{1.5, 0.6, d0}, Point{1.2, 0.8, d0}, Point{1.2, 0.6, d0 + 0.5}};
  std::array<double, 4> f{};
  for (size_t i = 0; i < 4; ++i) f[i] = loss(simplex[i]);
  for (int iter = 0; iter < 100; ++iter) {
    std::array<size_t, 4> order{0, 1, 2, 3};
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return f[a] < f[b]; });
    const size_t best = order[0], second = order[2], worst = order[3];
    if (f[best] < 1e-6 || f[worst] - f[best] < 1e-8) break;
    Point centroid{0, 0, 0};
    for (size_t i : {order[0], order[1], order[2]})
      for (size_t d = 0; d < 3; ++d) centroid[d] += simplex[i][d] / 3.0;
    const auto along = [&](double t) {
      Point p;
      for (size_t d = 0; d < 3; ++d) p[d] = centroid[d] + t * (simplex[worst][d] - centroid[d]);
      return clamp(p);
    };
    const Point reflected = along(-1.0);
    const double fr = loss(reflected);
    if (fr < f[best]) {
      const Point expanded = along(-2.0);
      const double fe = loss(expanded);
      simplex[worst] = fe < fr ? expanded : reflected;
      f[worst] = std::min(fe, fr);
    } else if (fr < f[second]) {
      simplex[worst] = reflected;
      f[worst] = fr;
    } else {
      const Point contracted = along(0.5);
      const double fc = loss(contracted);
      if (fc < f[worst]) {
        simplex[worst] = contracted;
        f[worst] = fc;
      } else {
        for (size_t i : {order[1], order[2], order[3]}) {
          for (size_t d = 0; d < 3; ++d) simplex[i][d] = 0.5 * (simplex[i][d] + simplex[best][d]);
          f[i] = loss(simplex[i]);
        }
      }
    }
  }
  const size_t best = size_t(std::min_element(f.begin(), f.end()) - f.begin());
  out.knobs = knobs(simplex[best]);
  out.achieved = lru_hit_rates(shape, out.knobs, seed, seed, layers, tokens, slots);

  // The top-1 minus top-3 gap of n Gumbel(0, 1) values scales linearly with the scale.
  Rng rng(mix(seed, 4, 0));
  std::vector<float> scratch, top(3);
  std::vector<float> gaps;
  for (int i = 0; i < 2001; ++i) {
    gumbel_top(rng, shape.n_experts, 3, 1.0f, scratch, top);
    gaps.push_back(top[0] - top[2]);
  }
  std::nth_element(gaps.begin(), gaps.begin() + 1000, gaps.end());
  out.logit_scale = target_gap / double(gaps[1000]);
  return out;
}

}  // namespace strata::route
