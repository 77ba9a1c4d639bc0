// strata bench through the binary: each phase's expert-cache figures cover that phase alone. (The
// prefill phase once reported the cache's counters at the end of the run, decode included.)
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "gguf_test_util.h"
#include "synth/synth.h"

namespace strata::cli {
namespace {

using gguf::testing::TempDir;

nlohmann::json bench(const std::string& args) {
  const std::string cmd = std::string(STRATA_BINARY) + " bench " + args + " 2>/dev/null";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd << "\n" << out;
  return nlohmann::json::parse(out);
}

uint64_t lookups(const nlohmann::json& phase) {
  return phase["hits"].get<uint64_t>() + phase["misses"].get<uint64_t>();
}

TEST(BenchPhases, EachPhaseCountsItsOwnExpertLookups) {
  TempDir dir;
  synth::SynthOptions o;
  o.arch = "qwen3moe";
  o.preset = "tiny";
  o.output = dir.file("packed.gguf");
  o.pack = true;
  o.progress = false;
  synth::run_synth(o);
  // A budget of a few slots, read-ahead off: every lookup is a routed expert of a window.
  const std::string common = "-m " + o.output + " --batch 1 --expert-budget 1M --read-ahead off ";
  const nlohmann::json alone = bench(common + "--prompt-tokens 3 --gen-tokens 0");
  const nlohmann::json with_decode = bench(common + "--prompt-tokens 3 --gen-tokens 4");
  ASSERT_GT(lookups(alone["prefill"]), 0u);
  EXPECT_EQ(lookups(with_decode["prefill"]), lookups(alone["prefill"]))
      << "the same prompt looks up the same experts, whatever is decoded after it";
  EXPECT_EQ(lookups(alone["decode"]), 0u);
  // Each one-token window looks up its distinct routed experts: as many as a prompt token's.
  EXPECT_EQ(lookups(with_decode["decode"]) * 3, lookups(alone["prefill"]) * 4);
}

}  // namespace
}  // namespace strata::cli
