#include "model/route_control.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "experts/streaming_source.h"
#include "model/arch.h"
#include "model/model.h"
#include "util/error.h"

namespace strata::model {

namespace {

// Candidates recorded per (row, layer): enough for a replay to try ROUTE_M up to 32.
int recorded_top_m(const ModelConfig& c) {
  const int most = int(std::min<int64_t>(c.n_expert, route::kMaxTopM));
  return int(std::clamp<int64_t>(32, c.n_expert_used, most));
}

}  // namespace

std::string route_model_id(const ModelConfig& c) {
  return cat(arch_name(c.arch), " ", c.n_layer, "L ", c.n_expert, " experts top-", c.n_expert_used);
}

RouteControl::RouteControl(const ModelConfig& config, bool renormalize, const std::string& model_id,
                           RouteOptions options)
    : config_(config), renormalize_(renormalize), options_(std::move(options)) {
  const auto& o = options_;
  if (o.ccr.enabled) {
    if (o.ccr.m < config.n_expert_used || o.ccr.m > config.n_expert)
      fail("--ccr-m ", o.ccr.m, " must be between top_k ", config.n_expert_used, " and the expert count ",
           config.n_expert);
    if (o.ccr.r_prot < 0 || o.ccr.r_prot > config.n_expert_used)
      fail("--ccr-rprot ", o.ccr.r_prot, " must be between 0 and top_k ", config.n_expert_used);
  }
  if (!o.trace_path.empty()) {
    trace_ = route::TraceReader::open(o.trace_path);
    const route::TraceHeader& h = trace_->header();
    if (h.n_layers != config.n_layer || h.n_experts != config.n_expert || h.top_k != config.n_expert_used)
      fail("--route-trace ", o.trace_path, ": the trace is for ", h.n_layers, " layers x ", h.n_experts,
           " experts top-", h.top_k, " but the model has ", config.n_layer, " x ", config.n_expert, " top-",
           config.n_expert_used);
    if (o.ccr.enabled && h.top_m < o.ccr.m)
      fail("--route-trace ", o.trace_path, " with --ccr needs router candidates for --ccr-m ", o.ccr.m,
           "; the trace carries ", h.top_m);
  }
  if (!o.record_path.empty()) {
    route::TraceHeader h{.n_layers = int(config.n_layer),
                         .n_experts = int(config.n_expert),
                         .top_k = int(config.n_expert_used),
                         // A replayed routing need not be among the router's candidates.
                         .top_m = trace_ ? 0 : recorded_top_m(config),
                         .renormalized = renormalize,
                         .model = model_id};
    writer_ = std::make_unique<route::TraceWriter>(o.record_path, h);
  }
  if (!o.history_path.empty()) {
    if (std::filesystem::exists(o.history_path)) {
      try {
        history_ = std::make_unique<route::UsageHistory>(route::UsageHistory::load(o.history_path));
        history_->expect_shape(int(config.n_layer), int(config.n_expert), o.history_path);
      } catch (const Error& e) {
        fail("usage history: ", e.what(), " (delete ", o.history_path, " to start a new one)");
      }
    } else {
      history_ = std::make_unique<route::UsageHistory>(int(config.n_layer), int(config.n_expert),
                                                       o.history_half_life, model_id);
    }
    saver_ = std::make_unique<route::PeriodicSaver>(o.history_path, o.history_save_every);
  }
}

RouteControl::~RouteControl() = default;

backend::Routing RouteControl::from_trace(int il, int64_t T, std::span<const uint8_t> resident) {
  const int64_t rows = trace_->rows();
  if (row_ + T > rows)
    fail("--route-trace ", options_.trace_path, " ran out: it has ", rows, " rows and this window needs rows ",
         row_, "..", row_ + T - 1, "; record or generate a longer trace");
  if (!options_.ccr.enabled) return trace_->routing(row_, T, il);
  backend::Routing out;
  out.top_k = config_.n_expert_used;
  for (int64_t r = row_; r < row_ + T; ++r) {
    const route::RowRouting row =
        route::route_row_top_m(trace_->candidates(r, il), trace_->logits(r, il), trace_->lse(r, il),
                               out.top_k, renormalize_, options_.ccr, resident);
    out.experts.insert(out.experts.end(), row.experts.begin(), row.experts.end());
    out.weights.insert(out.weights.end(), row.weights.begin(), row.weights.end());
    ccr_stats_.add(row);
  }
  return out;
}

backend::Routing RouteControl::route(backend::Backend& be, experts::ExpertSource& source, int il,
                                     const backend::Tensor& logits, const backend::Ids& experts,
                                     const backend::Tensor& weights) {
  const int64_t n = config_.n_expert, T = logits.rows;
  const bool need_logits = !trace_ && (options_.ccr.enabled || writer_);
  if (need_logits) {
    host_logits_.resize(size_t(T * n));
    be.download(logits, host_logits_.data());
  }
  if (options_.ccr.enabled) {
    resident_.assign(size_t(n), 0);
    // A source without a cache has every expert at hand: no bonus changes anything then.
    if (!source.residency(il, resident_)) resident_.assign(size_t(n), 1);
  }
  backend::Routing routing;
  if (trace_)
    routing = from_trace(il, T, resident_);
  else if (options_.ccr.enabled)
    routing = route::route_window(host_logits_.data(), T, n, n, int(config_.n_expert_used), renormalize_,
                                  options_.ccr, resident_, &ccr_stats_);
  else
    routing = backend::download_routing(be, experts, weights);
  if (writer_) {
    if (trace_) {
      writer_->append(il, routing);
    } else {
      const route::RouterTopM top = route::router_top_m(host_logits_.data(), T, n, n, recorded_top_m(config_));
      writer_->append(il, routing, &top);
    }
  }
  observe(il, routing);
  return routing;
}

void RouteControl::observe(int il, const backend::Routing& routing) {
  if (history_) history_->observe(il, routing.experts);
  if (profile_) profile_->observe(il, routing.experts);
}

void RouteControl::end_window(int64_t T) {
  row_ += T;
  if (profile_) profile_->add_tokens(T);
  if (history_) {
    history_->advance(T);
    saver_->tick(*history_);
  }
}

void RouteControl::finish() {
  if (history_ && history_->dirty()) history_->save(options_.history_path);
  if (writer_) {
    writer_->close();
    writer_.reset();
  }
}

std::string RouteControl::summary() const {
  std::string s;
  if (trace_)
    s = cat("routing: replayed from ", options_.trace_path, ", rows 0..", row_ - 1, " of ", trace_->rows());
  if (options_.ccr.enabled) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "cache-conditional (M %d, lambda %.2f, r_prot %d): %.1f%% rows substituted, agreement "
                  "%.1f%%, mean KL %.4f",
                  options_.ccr.m, double(options_.ccr.lambda), options_.ccr.r_prot,
                  100.0 * ccr_stats_.substitution_rate(), 100.0 * ccr_stats_.agreement(), ccr_stats_.mean_kl());
    s = s.empty() ? cat("routing: ", buf) : cat(s, "; ", buf);
  }
  return s;
}

size_t fill_from_profile(Model& model, const std::string& pack_path, const std::string& profile_path,
                         const route::UsageHistory* history) {
  auto* streaming = dynamic_cast<experts::StreamingSource*>(&model.expert_source());
  if (!streaming) return 0;
  const ModelConfig& c = model.config();
  std::string path = profile_path;
  if (path.empty() && std::filesystem::exists(pack_path + ".profile")) path = pack_path + ".profile";
  const int layers = int(c.n_layer), n = int(c.n_expert);
  std::optional<route::ExpertProfile> profile;
  if (!path.empty()) {
    profile = route::ExpertProfile::load(path);
    profile->expect_shape(layers, n, path);
  }
  const bool history_has_tokens = history && history->tokens() > 0;
  if (!profile && !history_has_tokens) return 0;
  // An empty profile or history of the right shape stands in for the missing side.
  if (!profile) profile.emplace(layers, n, history->model());
  const route::UsageHistory empty(layers, n, 1.0, profile->model());
  const route::UsageHistory& h = history_has_tokens ? *history : empty;
  const auto order = route::blend(*profile, h, h.tokens());
  // Only experts that some run routed to are worth a slot: rank by rank across the layers, so
  // every layer gets its hottest experts before any layer gets its colder ones.
  std::vector<experts::ExpertKey> ranked;
  for (int rank = 0; rank < n; ++rank)
    for (int l = 0; l < layers; ++l) {
      const int32_t e = order[size_t(l)][size_t(rank)];
      if (profile->layer_counts(l)[size_t(e)] > 0 || h.count(l, e) > 0) ranked.push_back({l, e});
    }
  return streaming->pin(ranked, streaming->arena().n_slots() / 2);
}

}  // namespace strata::model
