// strata trace: make and inspect routing traces (see docs/ROUTING.md).
//   synth      write a synthetic trace with calibrated reuse
//   calibrate  fit the generator's knobs to target LRU hit rates
//   stats      header, rows and LRU hit rates of a trace
//   profile    an expert profile from a trace's rows
//   history    a usage history from a trace's rows
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "route/profile.h"
#include "route/replay.h"
#include "route/trace.h"
#include "route/trace_synth.h"
#include "route/usage_history.h"
#include "util/error.h"

namespace strata::cli {

namespace {

struct SynthArgs {
  std::string shape = "flagship";
  route::SynthTraceOptions o;
  std::string output;
  bool plain_softmax = false;
  int layers = 0;  // 0: the shape's
};

void add_synth(CLI::App& parent) {
  auto a = std::make_shared<SynthArgs>();
  CLI::App* cmd = parent.add_subcommand("synth", "Write a synthetic routing trace with calibrated reuse");
  cmd->add_option("--shape", a->shape, "flagship or qwen3-next-80b-a3b")->capture_default_str();
  cmd->add_option("--tokens", a->o.tokens, "Rows (tokens) to generate")->capture_default_str();
  cmd->add_option("--layers", a->layers, "Layers (default: the shape's), for a model cut to fewer layers");
  cmd->add_option("--top-m", a->o.top_m, "Router candidates per row and layer (0 = none, else top_k..64)")
      ->capture_default_str();
  cmd->add_option("--seed", a->o.seed, "Session seed: the draws")->capture_default_str();
  cmd->add_option("--model-seed", a->o.model_seed, "Model seed: the per-layer popularity orders")->capture_default_str();
  cmd->add_option("--zipf", a->o.knobs.zipf, "Popularity exponent")->capture_default_str();
  cmd->add_option("--reuse", a->o.knobs.reuse, "Probability of a recency draw")->capture_default_str();
  cmd->add_option("--depth-scale", a->o.knobs.depth_scale, "Recency depth law scale")->capture_default_str();
  cmd->add_option("--depth-beta", a->o.knobs.depth_beta, "Recency depth law exponent")->capture_default_str();
  cmd->add_option("--logit-scale", a->o.logit_scale, "Scale of the synthetic Gumbel router logits")->capture_default_str();
  cmd->add_option("--window", a->o.window_rows, "Rows per file window")->capture_default_str();
  cmd->add_flag("--plain-softmax", a->plain_softmax, "Weights are the plain softmax, not renormalized over the top-k");
  cmd->add_option("-o,--output", a->output, "Output trace file")->required();
  cmd->callback([a] {
    a->o.shape = route::trace_shape(a->shape);
    if (a->layers < 0) fail("--layers: ", a->layers, " is negative");
    if (a->layers > 0) a->o.shape.n_layers = a->layers;
    a->o.renormalize = !a->plain_softmax;
    route::write_synthetic_trace(a->o, a->output);
    std::fprintf(stderr, "%s: %lld rows of %d layers x %d experts, top-%d, top-M %d\n", a->output.c_str(),
                 (long long)a->o.tokens, a->o.shape.n_layers, a->o.shape.n_experts, a->o.shape.top_k, a->o.top_m);
  });
}

struct CalibrateArgs {
  std::string shape = "flagship";
  std::vector<int> slots = {32, 64, 128};
  std::vector<double> targets = {0.55, 0.79, 0.90};
  double depth_beta = 4.0;
  double gap = 0.35;
  int layers = 8;
  int64_t tokens = 3000;
  uint64_t seed = 1;
  bool json = false;
};

void add_calibrate(CLI::App& parent) {
  auto a = std::make_shared<CalibrateArgs>();
  CLI::App* cmd = parent.add_subcommand("calibrate", "Fit the synthetic generator's knobs to target LRU hit rates");
  cmd->add_option("--shape", a->shape, "flagship or qwen3-next-80b-a3b")->capture_default_str();
  cmd->add_option("--slots", a->slots, "LRU slots per layer, one per target")->delimiter(',')->capture_default_str();
  cmd->add_option("--targets", a->targets, "Target hit rates (0..1)")->delimiter(',')->capture_default_str();
  cmd->add_option("--depth-beta", a->depth_beta, "Recency depth law exponent (held fixed)")->capture_default_str();
  cmd->add_option("--gap", a->gap, "Target median top-1 minus top-3 router logit gap")->capture_default_str();
  cmd->add_option("--layers", a->layers, "Layers simulated per evaluation")->capture_default_str();
  cmd->add_option("--tokens", a->tokens, "Tokens simulated per evaluation")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed (model and session)")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] {
    const auto shape = route::trace_shape(a->shape);
    const auto c = route::calibrate(shape, a->slots, a->targets, a->depth_beta, a->gap, a->layers, a->tokens, a->seed);
    if (a->json) {
      nlohmann::json j{{"shape", shape.name},
                       {"zipf", c.knobs.zipf},
                       {"reuse", c.knobs.reuse},
                       {"depth_scale", c.knobs.depth_scale},
                       {"depth_beta", c.knobs.depth_beta},
                       {"logit_scale", c.logit_scale},
                       {"evaluations", c.evaluations},
                       {"slots", a->slots},
                       {"targets", a->targets},
                       {"achieved", c.achieved}};
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("%s: zipf %.4f, reuse %.4f, depth_scale %.3f, depth_beta %.2f, logit_scale %.4f (%d evaluations)\n",
                shape.name.c_str(), c.knobs.zipf, c.knobs.reuse, c.knobs.depth_scale, c.knobs.depth_beta,
                c.logit_scale, c.evaluations);
    for (size_t i = 0; i < a->slots.size(); ++i)
      std::printf("  LRU %4d slots: target %5.1f%%, achieved %5.1f%%\n", a->slots[i], 100 * a->targets[i],
                  100 * c.achieved[i]);
  });
}

struct StatsArgs {
  std::string path;
  std::vector<int> slots = {32, 64, 128};
  bool json = false;
};

void add_stats(CLI::App& parent) {
  auto a = std::make_shared<StatsArgs>();
  CLI::App* cmd = parent.add_subcommand("stats", "Header, rows and per-layer LRU hit rates of a trace");
  cmd->add_option("trace", a->path, "Routing trace")->required();
  cmd->add_option("--slots", a->slots, "LRU slots per layer")->delimiter(',')->capture_default_str();
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a] {
    const auto t = route::TraceReader::open(a->path);
    const auto& h = t.header();
    const auto rates = route::trace_lru_hit_rates(t, a->slots);
    if (a->json) {
      nlohmann::json j{{"model", h.model},       {"n_layers", h.n_layers}, {"n_experts", h.n_experts},
                       {"top_k", h.top_k},       {"top_m", h.top_m},       {"renormalized", h.renormalized},
                       {"rows", t.rows()},       {"slots", a->slots},      {"lru_hit_rates", rates}};
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("%s\n  model: %s\n  %d layers x %d experts, top-%d, router candidates top-%d, %s weights\n"
                "  %lld rows\n",
                a->path.c_str(), h.model.c_str(), h.n_layers, h.n_experts, h.top_k, h.top_m,
                h.renormalized ? "renormalized" : "plain softmax", (long long)t.rows());
    for (size_t i = 0; i < a->slots.size(); ++i)
      std::printf("  LRU %4d slots per layer (cold): %5.1f%% hits\n", a->slots[i], 100 * rates[i]);
  });
}

struct FromTraceArgs {
  std::string path, output;
  int64_t first_row = 0;
  int64_t rows = -1;
  double half_life = 4096.0;
};

void add_row_range(CLI::App& cmd, FromTraceArgs& a) {
  cmd.add_option("trace", a.path, "Routing trace")->required();
  cmd.add_option("--first-row", a.first_row, "First row used")->capture_default_str();
  cmd.add_option("--rows", a.rows, "Rows used (-1 = to the end)")->capture_default_str();
}

// The rows the arguments name; throws unless they lie inside the trace.
int64_t row_count(const route::TraceReader& t, const FromTraceArgs& a) {
  const int64_t rows = a.rows < 0 ? t.rows() - a.first_row : a.rows;
  if (a.first_row < 0 || rows < 0 || a.first_row + rows > t.rows())
    fail("trace ", a.path, ": rows ", a.first_row, "..", a.first_row + rows, " are outside its ", t.rows(), " rows");
  return rows;
}

void add_profile(CLI::App& parent) {
  auto a = std::make_shared<FromTraceArgs>();
  CLI::App* cmd = parent.add_subcommand("profile", "Write an expert profile from a trace's routes");
  add_row_range(*cmd, *a);
  cmd->add_option("-o,--output", a->output, "Output profile file")->required();
  cmd->callback([a] {
    const auto t = route::TraceReader::open(a->path);
    const int64_t rows = row_count(t, *a);
    route::ExpertProfile::from_trace(t, a->first_row, rows).save(a->output);
    std::fprintf(stderr, "%s: profile of %lld tokens\n", a->output.c_str(), (long long)rows);
  });
}

void add_history(CLI::App& parent) {
  auto a = std::make_shared<FromTraceArgs>();
  CLI::App* cmd = parent.add_subcommand("history", "Write a usage history from a trace's routes");
  add_row_range(*cmd, *a);
  cmd->add_option("--half-life", a->half_life, "Decay half-life in tokens")->capture_default_str();
  cmd->add_option("-o,--output", a->output, "Output history file")->required();
  cmd->callback([a] {
    const auto t = route::TraceReader::open(a->path);
    const auto& h = t.header();
    const int64_t rows = row_count(t, *a);
    route::UsageHistory history(h.n_layers, h.n_experts, a->half_life, h.model);
    for (int64_t r = a->first_row; r < a->first_row + rows; ++r) {
      for (int l = 0; l < h.n_layers; ++l) history.observe(l, t.experts(r, l));
      history.advance(1);
    }
    history.save(a->output);
    std::fprintf(stderr, "%s: history of %lld tokens\n", a->output.c_str(), (long long)rows);
  });
}

}  // namespace

void add_trace_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("trace", "Routing traces: synthesize, calibrate, inspect, profile");
  cmd->require_subcommand(1);
  add_synth(*cmd);
  add_calibrate(*cmd);
  add_stats(*cmd);
  add_profile(*cmd);
  add_history(*cmd);
}

}  // namespace strata::cli
