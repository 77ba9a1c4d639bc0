// strata trace and strata replay end to end through the binary: JSON output, determinism, expert
// record bytes from a model or its pack, and a clear error for a missing trace.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "gguf_test_util.h"
#include "synth/synth.h"

namespace strata::route {
namespace {

using gguf::testing::TempDir;

struct Result {
  int status = -1;
  std::string out;
};

Result run(const std::string& args) {
  const std::string cmd = std::string(STRATA_BINARY) + " " + args + " 2>&1";
  Result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  r.status = ::pclose(p);
  return r;
}

// A tiny qwen3moe: experts Q4_K, 256 x 256 per matrix, 144 bytes per row of 256, so a record is
// 3 x 256 x 144 = 110,592 bytes, already a multiple of 4096.
constexpr uint64_t kTinyRecord = 110592;

std::string tiny_model(const TempDir& dir, bool pack) {
  synth::SynthOptions o;
  o.arch = "qwen3moe";
  o.preset = "tiny";
  o.output = dir.file(pack ? "packed.gguf" : "tiny.gguf");
  o.pack = pack;
  o.progress = false;
  synth::run_synth(o);
  return o.output;
}

TEST(RouteCli, SynthStatsAndReplay) {
  TempDir dir;
  const auto trace = dir.file("t.trace");
  ASSERT_EQ(run("trace synth --tokens 96 --top-m 16 -o " + trace).status, 0);
  const auto stats = run("trace stats --json " + trace);
  ASSERT_EQ(stats.status, 0) << stats.out;
  const auto s = nlohmann::json::parse(stats.out);
  EXPECT_EQ(s["rows"], 96);
  EXPECT_EQ(s["top_m"], 16);
  EXPECT_EQ(s["lru_hit_rates"].size(), 3u);

  const std::string args = "replay --json --slots 16,32 --warmup-rows 32 --route-m 12,16 --expert-bytes 1M " + trace;
  const auto a = run(args), b = run(args);
  ASSERT_EQ(a.status, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  const auto j = nlohmann::json::parse(a.out);
  EXPECT_EQ(j["measured_rows"], 64);
  EXPECT_EQ(j["expert_bytes"], 1048576);
  ASSERT_EQ(j["results"].size(), 10u);  // 2 budgets x (lru, pinned, blend, ccr M=12, ccr M=16)
  EXPECT_EQ(j["results"][4]["policy"], "ccr M=16");
  EXPECT_EQ(j["results"][4]["route_m"], 16);

  const auto table = run("replay --slots 32 " + trace);
  ASSERT_EQ(table.status, 0) << table.out;
  // By default only the ROUTE_M values the trace's 16 candidates allow.
  EXPECT_NE(table.out.find("ccr M=16"), std::string::npos);
  EXPECT_EQ(table.out.find("ccr M=24"), std::string::npos);
  const auto wide = run("replay --slots 32 --route-m 24 " + trace);
  EXPECT_NE(wide.out.find("ROUTE_M 24 is outside top_k 10..16"), std::string::npos) << wide.out;
}

TEST(RouteCli, SynthForAModelCutToFewerLayers) {
  TempDir dir;
  const auto trace = dir.file("cut.trace");
  ASSERT_EQ(run("trace synth --shape qwen3-next-80b-a3b --layers 12 --tokens 16 -o " + trace).status, 0);
  const auto stats = run("trace stats --json " + trace);
  ASSERT_EQ(stats.status, 0) << stats.out;
  EXPECT_EQ(nlohmann::json::parse(stats.out)["n_layers"], 12);
  const auto bad = run("trace synth --layers -3 -o " + dir.file("bad.trace"));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--layers: -3 is negative"), std::string::npos) << bad.out;
}

TEST(RouteCli, ExpertBytesFromModelOrPack) {
  TempDir dir;
  const auto trace = dir.file("t.trace");
  ASSERT_EQ(run("trace synth --tokens 16 --top-m 0 -o " + trace).status, 0);
  for (bool pack : {false, true}) {
    const auto model = tiny_model(dir, pack);
    const auto r = run("replay --json --slots 16 --warmup-rows 0 --model " + model + " " + trace);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out)["expert_bytes"], kTinyRecord) << (pack ? "pack" : "gguf");
  }
  // 1 GiB over 48 layers of 110,592-byte records: 202 slots per layer.
  const auto budget = run("replay --json --budget 1G --warmup-rows 0 --model " + dir.file("tiny.gguf") + " " + trace);
  ASSERT_EQ(budget.status, 0) << budget.out;
  EXPECT_EQ(nlohmann::json::parse(budget.out)["results"][0]["slots"], 202);
}

TEST(RouteCli, ClearErrors) {
  TempDir dir;
  const auto missing = run("replay " + dir.file("missing.trace"));
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.out.find("missing.trace: cannot open"), std::string::npos) << missing.out;
  const auto budget = run("replay --budget 8G " + dir.file("missing.trace"));
  EXPECT_NE(budget.out.find("needs --expert-bytes or --model"), std::string::npos) << budget.out;
  const auto size = run("replay --expert-bytes 12Q " + dir.file("missing.trace"));
  EXPECT_NE(size.out.find("unknown unit 'Q'"), std::string::npos) << size.out;
}

}  // namespace
}  // namespace strata::route
