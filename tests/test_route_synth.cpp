// The synthetic trace generator: its published knobs reproduce the calibration targets (a per-layer
// LRU of 32/64/128 slots hits about 55/79/90% on the flagship shape), calibrate() finds such knobs,
// and written traces are deterministic, valid and self-consistent.
#include <gtest/gtest.h>

#include "gguf_test_util.h"
#include "route/ccr.h"
#include "route/replay.h"
#include "route/trace.h"
#include "route/trace_synth.h"
#include "util/error.h"

namespace strata::route {
namespace {

using gguf::testing::TempDir;
using gguf::testing::read_bytes;

constexpr int kSlots[] = {32, 64, 128};
constexpr double kTargets[] = {0.55, 0.79, 0.90};

TEST(RouteSynth, CalibratedKnobsHitTheTargets) {
  for (const char* shape : {"flagship", "qwen3-next-80b-a3b"}) {
    const auto rates = lru_hit_rates(trace_shape(shape), calibrated_knobs(), 3, 3, 8, 2000, kSlots);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(rates[size_t(i)], kTargets[i], 0.03) << shape << " LRU " << kSlots[i];
  }
}

TEST(RouteSynth, CalibrateFitsTheTargets) {
  const auto c = calibrate(trace_shape("flagship"), kSlots, kTargets, 4.0, 0.35, 2, 800, 9);
  ASSERT_EQ(c.achieved.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(c.achieved[size_t(i)], kTargets[i], 0.03) << "LRU " << kSlots[i];
  EXPECT_GT(c.knobs.zipf, 0.0);
  EXPECT_GT(c.knobs.reuse, 0.0);
  EXPECT_NEAR(c.logit_scale, kCalibratedLogitScale, 0.02);
}

TEST(RouteSynth, WrittenTracesAreDeterministicValidAndConsistent) {
  TempDir dir;
  SynthTraceOptions o;
  o.shape = trace_shape("flagship");
  o.tokens = 300;
  o.top_m = 24;
  o.window_rows = 128;
  write_synthetic_trace(o, dir.file("a"));
  write_synthetic_trace(o, dir.file("b"));
  EXPECT_EQ(read_bytes(dir.file("a")), read_bytes(dir.file("b")));
  o.seed = 2;
  write_synthetic_trace(o, dir.file("c"));
  EXPECT_NE(read_bytes(dir.file("a")), read_bytes(dir.file("c")));

  const auto t = TraceReader::open(dir.file("a"));  // validated on load
  EXPECT_EQ(t.rows(), 300);
  EXPECT_EQ(t.header().n_layers, 48);
  EXPECT_EQ(t.header().top_m, 24);
  EXPECT_NE(t.header().model.find("synthetic flagship"), std::string::npos);
  for (int64_t r = 0; r < t.rows(); r += 37)
    for (int l = 0; l < 48; l += 11) {
      // The recorded routing is what routing the candidates with CCR off gives, in rank order.
      const auto off = route_row_top_m(t.candidates(r, l), t.logits(r, l), t.lse(r, l), 10, true, CcrParams{}, {});
      EXPECT_EQ(std::vector<int32_t>(t.experts(r, l).begin(), t.experts(r, l).end()), off.experts);
      double sum = 0;
      for (float w : t.weights(r, l)) sum += w;
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  // A cold LRU over the written trace sees the calibrated locality.
  const auto rates = trace_lru_hit_rates(t, {32, 128});
  EXPECT_GT(rates[0], 0.45);
  EXPECT_GT(rates[1], rates[0]);
}

TEST(RouteSynth, RejectsBadOptions) {
  TempDir dir;
  SynthTraceOptions o;
  o.shape = trace_shape("flagship");
  o.top_m = 65;
  try {
    write_synthetic_trace(o, dir.file("x"));
    FAIL() << "top_m 65 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_m 65"), std::string::npos);
  }
  try {
    trace_shape("gpt");
    FAIL() << "unknown shape accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flagship"), std::string::npos);
  }
}

}  // namespace
}  // namespace strata::route
