// The routing controls wired into the forward pass (model/route_control.h): exact routing stays
// bitwise unchanged, a recorded trace replays to the same output, a replayed trace's experts are
// the ones routed, shape mismatches and a trace that runs out are clear errors, cache-conditional
// routing reports its telemetry, the usage history round-trips through runs, and the start-up fill
// from a profile makes the first window hit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "experts/pack.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "model/route_control.h"
#include "route/profile.h"
#include "route/trace.h"
#include "route/usage_history.h"
#include "route_test_util.h"
#include "synth/synth.h"
#include "test_util.h"

using strata::testing::bitwise_equal;

namespace strata::model {
namespace {

using gguf::testing::TempDir;
using route::testing::error_of;

// A tiny qwen3moe (8 experts top-2 unless told) with its pack.
struct Tiny {
  std::string gguf, pack;
  uint64_t slot_bytes = 0;
};

Tiny make_tiny(const TempDir& dir, uint64_t seed) {
  synth::SynthOptions o;
  o.arch = "qwen3moe";
  o.preset = "tiny";
  o.expert_type = "q4_k";
  o.output = dir.file("tiny-" + std::to_string(seed) + ".gguf");
  o.progress = false;
  o.seed = seed;
  synth::run_synth(o);
  experts::write_pack(*gguf::Reader::open(o.output), o.output + ".experts");
  const auto pack = experts::Pack::open(o.output + ".experts");
  return {o.output, o.output + ".experts", (pack->max_record_bytes() + 4095) / 4096 * 4096};
}

std::unique_ptr<Model> load(const Tiny& t, backend::Backend& be, int slots) {
  experts::SourceOptions o;
  o.budget_bytes = uint64_t(slots) * t.slot_bytes;
  return Model::load(t.gguf, be, o);
}

void install(Model& m, RouteOptions o) {
  m.set_route_control(std::make_unique<RouteControl>(m.config(), m.renormalize_topk(), route_model_id(m.config()),
                                                     std::move(o)));
}

std::vector<int32_t> tokens_for(const Model& m, int64_t n) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(int32_t((i * 7919 + 13) % m.config().n_vocab));
  return t;
}

// A 16-row prefill window then `steps` one-row windows of fixed tokens; every logit.
std::vector<float> run(Model& m, int64_t steps) {
  State st = m.new_state(64);
  const auto t = tokens_for(m, 16 + steps);
  std::vector<float> out = m.forward(std::span(t).first(16), st, LogitsMode::All);
  for (int64_t i = 16; i < 16 + steps; ++i) {
    const auto l = m.forward(std::span(t).subspan(size_t(i), 1), st, LogitsMode::Last);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}


TEST(RouteWiring, ExactRoutingThroughTheControlIsBitwiseUnchanged) {
  TempDir dir;
  const Tiny t = make_tiny(dir, 21);
  backend::CpuBackend be(1);
  auto plain = load(t, be, 4);
  const auto want = run(*plain, 4);
  auto controlled = load(t, be, 4);
  install(*controlled, {.record_path = dir.file("r.trace"), .history_path = dir.file("h.history")});
  EXPECT_TRUE(bitwise_equal(run(*controlled, 4), want));
  controlled->route_control()->finish();
  EXPECT_EQ(route::TraceReader::open(dir.file("r.trace")).rows(), 20);
}

TEST(RouteWiring, ARecordedTraceReplaysToTheSameOutputAndItsExpertsAreRouted) {
  TempDir dir;
  const Tiny t = make_tiny(dir, 22);
  backend::CpuBackend be(1);
  auto rec = load(t, be, 4);
  install(*rec, {.record_path = dir.file("a.trace")});
  const auto want = run(*rec, 5);
  rec->route_control()->finish();

  auto replay = load(t, be, 4);
  install(*replay, {.record_path = dir.file("b.trace"), .trace_path = dir.file("a.trace")});
  EXPECT_TRUE(bitwise_equal(run(*replay, 5), want));
  replay->route_control()->finish();

  // Another model's trace of the same shape drives this model: what it routes is the trace.
  const Tiny other = make_tiny(dir, 23);
  auto driven = load(other, be, 4);
  install(*driven, {.record_path = dir.file("c.trace"), .trace_path = dir.file("a.trace")});
  run(*driven, 5);
  driven->route_control()->finish();
  const auto a = route::TraceReader::open(dir.file("a.trace"));
  const auto c = route::TraceReader::open(dir.file("c.trace"));
  ASSERT_EQ(a.rows(), c.rows());
  for (int64_t r = 0; r < a.rows(); ++r)
    for (int l = 0; l < a.header().n_layers; ++l) {
      const auto ea = a.experts(r, l), ec = c.experts(r, l);
      EXPECT_TRUE(std::equal(ea.begin(), ea.end(), ec.begin(), ec.end())) << "row " << r << " layer " << l;
    }
}

TEST(RouteWiring, AMismatchedOrExhaustedTraceIsAClearError) {
  TempDir dir;
  const Tiny t = make_tiny(dir, 24);
  backend::CpuBackend be(1);
  auto m = load(t, be, 4);
  const ModelConfig& c = m->config();
  {
    route::TraceWriter w(dir.file("wide.trace"), {.n_layers = int(c.n_layer), .n_experts = int(c.n_expert) + 1,
                                                  .top_k = int(c.n_expert_used), .top_m = 0, .model = "x"});
    w.close();
  }
  const std::string wide = error_of([&] { install(*m, {.trace_path = dir.file("wide.trace")}); });
  EXPECT_NE(wide.find("but the model has"), std::string::npos) << wide;

  install(*m, {.record_path = dir.file("short.trace")});
  run(*m, 0);  // 16 rows
  m->route_control()->finish();
  install(*m, {.trace_path = dir.file("short.trace")});
  const std::string out = error_of([&] { run(*m, 2); });
  EXPECT_NE(out.find("ran out: it has 16 rows"), std::string::npos) << out;
}

TEST(RouteWiring, CacheConditionalRoutingReportsItsTelemetry) {
  TempDir dir;
  const Tiny t = make_tiny(dir, 25);
  backend::CpuBackend be(1);
  // Enough slots that a layer finds some of its own experts still resident when it routes.
  auto m = load(t, be, 12);
  const ModelConfig& c = m->config();
  RouteOptions o;
  o.ccr = {.enabled = true, .r_prot = 1, .lambda = 4.0f, .m = int(c.n_expert)};
  install(*m, o);
  run(*m, 6);
  const route::CcrStats& s = m->route_control()->ccr_stats();
  EXPECT_EQ(s.rows, 22 * c.n_layer);
  // r_prot = 1 keeps every row's best expert: agreement never falls below 1 / top_k.
  EXPECT_GE(s.agreement(), 1.0 / double(c.n_expert_used));
  EXPECT_GT(s.substituted, 0) << "a large bonus substitutes somewhere";
  EXPECT_NE(m->route_control()->summary().find("rows substituted"), std::string::npos);

  RouteOptions bad;
  bad.ccr = {.enabled = true, .m = int(c.n_expert) + 1};
  EXPECT_NE(error_of([&] { install(*m, bad); }).find("--ccr-m"), std::string::npos);
}

TEST(RouteWiring, TheUsageHistoryRoundTripsThroughRuns) {
  TempDir dir;
  const Tiny t = make_tiny(dir, 26);
  const std::string path = t.pack + ".history";
  backend::CpuBackend be(1);
  for (int pass = 1; pass <= 2; ++pass) {
    auto m = load(t, be, 4);
    install(*m, {.history_path = path});
    run(*m, 4);
    m->route_control()->finish();
    const auto h = route::UsageHistory::load(path);
    EXPECT_EQ(h.tokens(), 20 * pass);
    double total = 0;
    for (int l = 0; l < h.n_layers(); ++l)
      for (double v : h.layer_counts(l)) total += v;
    EXPECT_GT(total, 0.0);
  }
  std::filesystem::resize_file(path, 10);
  auto m = load(t, be, 4);
  EXPECT_NE(error_of([&] { install(*m, {.history_path = path}); }).find("delete"), std::string::npos);
}

TEST(RouteWiring, TheStartUpFillMakesTheFirstWindowHit) {
  TempDir dir;
  const Tiny t = make_tiny(dir, 27);
  backend::CpuBackend be(1);
  // The profile of exactly the window that follows.
  {
    auto m = load(t, be, 64);
    const std::string id = route_model_id(m->config());
    route::ExpertProfile profile(int(m->config().n_layer), int(m->config().n_expert), id);
    install(*m, {});
    m->route_control()->set_profile(&profile);
    run(*m, 0);
    profile.save(dir.file("p.profile"));
  }
  auto first_window_hits = [&](const std::string& profile) {
    auto m = load(t, be, 8);
    const size_t pinned = fill_from_profile(*m, t.pack, profile, nullptr);
    if (profile.empty()) EXPECT_EQ(pinned, 0u);
    else EXPECT_EQ(pinned, 4u) << "half of the 8 slots";
    const auto before = *m->expert_stats();
    run(*m, 0);
    return m->expert_stats()->since(before).hits;
  };
  EXPECT_GT(first_window_hits(dir.file("p.profile")), 0u);
  EXPECT_EQ(first_window_hits(""), 0u);
}

}  // namespace
}  // namespace strata::model
