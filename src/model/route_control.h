// What the forward pass does with the router besides exact top-k routing (docs/EXPERT_CACHE.md,
// "Routing controls"): record every window's routing to a trace (`--record-route`), replace the
// router by a trace (`--route-trace`, for benchmarking with realistic locality), cache-conditional
// routing against the expert cache's residency (`--ccr`), and feed the usage history and an
// expert profile. Model::forward hands each MoE layer's router logits to route(); without a
// RouteControl the router's exact top-k is used unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "experts/expert_source.h"
#include "model/config.h"
#include "route/ccr.h"
#include "route/profile.h"
#include "route/trace.h"
#include "route/usage_history.h"

namespace strata::model {

class Model;

struct RouteOptions {
  std::string record_path{};  // --record-route: write every window's routing here
  std::string trace_path{};   // --route-trace: route by this trace instead of the router
  route::CcrParams ccr{};     // --ccr, --ccr-m, --ccr-lambda, --ccr-rprot
  // Usage history file (MODEL.gguf.experts.history when streaming); empty: none kept.
  std::string history_path{};
  int64_t history_save_every = 64;  // windows between periodic saves
  double history_half_life = 4096;  // tokens, for a history created fresh
};

class RouteControl {
 public:
  // Opens the trace to replay (checked against the model's shape) and the trace to record.
  // Throws strata::Error naming the file and the mismatch.
  RouteControl(const ModelConfig& config, bool renormalize, const std::string& model_id, RouteOptions options);
  ~RouteControl();
  RouteControl(const RouteControl&) = delete;
  RouteControl& operator=(const RouteControl&) = delete;

  // The routing of layer `il` for the window's rows, given the router's logits [T, n_expert] and
  // its exact top-k (experts, weights [T, top_k], in backend memory).
  backend::Routing route(backend::Backend& be, experts::ExpertSource& source, int il, const backend::Tensor& logits,
                         const backend::Ids& experts, const backend::Tensor& weights);
  // The window's rows are done: the trace advances, the history ages and may be saved.
  void end_window(int64_t T);
  // The last window's final `rows` were rolled back (speculative decoding): a replayed trace
  // gives their positions' routes again to the rows that next take those positions.
  void rewind(int64_t rows) { row_ -= rows; }

  // Counts every routed expert into `profile` from now on (strata profile); nullptr stops.
  void set_profile(route::ExpertProfile* profile) { profile_ = profile; }
  route::UsageHistory* history() { return history_.get(); }
  // Writes the history (when dirty) and closes the recorded trace. Throws strata::Error.
  void finish();

  const route::CcrStats& ccr_stats() const { return ccr_stats_; }
  // "routing: cache-conditional (M 16, lambda 0.85, r_prot 3): 4.1% rows substituted, agreement
  // 99.2%, mean KL 0.0031" / "routing: replayed from T, rows 0..575 of 4096"; empty when exact.
  std::string summary() const;

 private:
  backend::Routing from_trace(int il, int64_t T, std::span<const uint8_t> resident);
  void observe(int il, const backend::Routing& routing);

  ModelConfig config_;
  bool renormalize_;
  RouteOptions options_;
  std::optional<route::TraceReader> trace_;
  std::unique_ptr<route::TraceWriter> writer_;
  std::unique_ptr<route::UsageHistory> history_;
  std::unique_ptr<route::PeriodicSaver> saver_;
  route::ExpertProfile* profile_ = nullptr;
  route::CcrStats ccr_stats_;
  int64_t row_ = 0;  // trace rows consumed by finished windows
  std::vector<float> host_logits_;
  std::vector<uint8_t> resident_;
};

// The identity recorded in traces and histories: "ARCH Lx E experts top-k".
std::string route_model_id(const ModelConfig& config);

// Start-up fill: pins into the streaming cache up to half its slots from
// route::blend(profile, history) (profile from `profile_path`, else PACK.profile when present),
// interleaving the layers rank by rank. Returns how many experts were pinned (0 when the source
// does not stream or there is nothing to rank). Throws strata::Error for an unreadable or
// mismatched profile.
size_t fill_from_profile(Model& model, const std::string& pack_path, const std::string& profile_path,
                         const route::UsageHistory* history);

}  // namespace strata::model
