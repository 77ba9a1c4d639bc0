// `strata bench` through the built binary on a tiny synthetic model: its JSON reports the CPU
// threads the backend really runs (not 0 when --threads is left out) and the SIMD level the
// kernels were chosen at, a bad STRATA_ISA is a clear error, --continue-from runs, and decode
// windows choose on the backend or read their logits back (--choose) after untimed warm-up windows.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "gguf_test_util.h"
#include "synth/synth.h"
#include "util/cpu.h"

namespace strata {
namespace {

using gguf::testing::TempDir;

struct Output {
  int rc = -1;
  std::string out, err;
};

class BenchCommand : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    synth::SynthOptions o;
    o.arch = "qwen3moe";
    o.preset = "tiny";
    o.output = dir_->file("tiny.gguf");
    o.progress = false;
    o.seed = 5;
    synth::run_synth(o);
    o.output = dir_->file("packed.gguf");  // the same model, its experts in a pack
    o.pack = true;
    synth::run_synth(o);
    o.arch = "qwen4exp";  // PLE: two n-gram tables of two heads each
    o.output = dir_->file("qwen4exp.gguf");
    o.pack = false;
    synth::run_synth(o);
  }
  static void TearDownTestSuite() { delete dir_; }

  // Runs `ENV strata bench -m tiny.gguf --device cpu --prompt-tokens 3 --gen-tokens 2 ARGS`.
  static Output bench(const std::string& args, const std::string& env = "") {
    return run("tiny.gguf", "--prompt-tokens 3 --gen-tokens 2 " + args, env);
  }

  // Runs `ENV strata bench -m MODEL --device cpu ARGS`; stdout and stderr apart.
  static Output run(const std::string& model, const std::string& args, const std::string& env = "") {
    const std::string err = dir_->file("stderr.txt");
    const std::string cmd = env + " " + STRATA_BINARY + " bench -m " + dir_->file(model) +
                            " --device cpu " + args + " 2> " + err;
    Output o;
    FILE* p = ::popen(cmd.c_str(), "r");
    EXPECT_NE(p, nullptr);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) o.out.append(buf, n);
    const int status = ::pclose(p);
    o.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::stringstream e;
    e << std::ifstream(err).rdbuf();
    o.err = e.str();
    return o;
  }

  static inline TempDir* dir_ = nullptr;
};

TEST_F(BenchCommand, ReportsTheThreadsUsedWithoutTheFlag) {
  const Output o = bench("");
  ASSERT_EQ(o.rc, 0) << o.err;
  const auto j = nlohmann::json::parse(o.out);
  const int hardware = int(std::thread::hardware_concurrency());
  EXPECT_EQ(j.at("threads").get<int>(), hardware > 0 ? hardware : 1);
  EXPECT_EQ(j.at("isa").get<std::string>(), isa_name(hardware_features().level()));
}

TEST_F(BenchCommand, ReportsTheThreadsAsked) {
  const Output o = bench("--threads 1");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(nlohmann::json::parse(o.out).at("threads").get<int>(), 1);
}

// llama-bench's short flags mean the same here: -p prompt tokens, -n generated tokens, -t threads.
TEST_F(BenchCommand, TakesLlamaBenchShortFlags) {
  const Output o = run("tiny.gguf", "-p 3 -n 2 -t 1");
  ASSERT_EQ(o.rc, 0) << o.err;
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j.at("threads").get<int>(), 1);
  EXPECT_EQ(j.at("prefill").at("tokens").get<int>(), 3) << o.out;
  EXPECT_EQ(j.at("decode").at("tokens").get<int>(), 2) << o.out;
}

TEST_F(BenchCommand, ReportsEachForcedIsaLevel) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (isa > hardware_features().level()) continue;
    SCOPED_TRACE(isa_name(isa));
    const Output o = bench("--threads 1", std::string("STRATA_ISA=") + isa_name(isa));
    ASSERT_EQ(o.rc, 0) << o.err;
    EXPECT_EQ(nlohmann::json::parse(o.out).at("isa").get<std::string>(), isa_name(isa));
  }
}

TEST_F(BenchCommand, BadIsaIsAnError) {
  const Output o = bench("--threads 1", "STRATA_ISA=sse9");
  EXPECT_EQ(o.rc, 1);
  EXPECT_NE(o.err.find("STRATA_ISA='sse9' is not scalar, avx2 or avx512"), std::string::npos)
      << o.err;
  if (hardware_features().level() < Isa::Avx512) {
    const Output above = bench("--threads 1", "STRATA_ISA=avx512");
    EXPECT_EQ(above.rc, 1);
    EXPECT_NE(above.err.find("this CPU offers"), std::string::npos) << above.err;
  }
}

// Forced continuation (docs/SPECULATION.md): the text's tokens are the prompt and the output, on
// the device asked for, with speculation drafting from them; a text too short or unreadable is a
// clear error.
TEST_F(BenchCommand, ContinuesFromAText) {
  const std::string text = dir_->file("text.txt");
  {
    std::ofstream out(text);
    for (int i = 0; i < 20; ++i) out << "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n";
  }
  for (const std::string spec : {"off", "suffix --spec-depth 2"}) {
    SCOPED_TRACE(spec);
    const Output o = run("tiny.gguf", "--prompt-tokens 40 --gen-tokens 30 --threads 1 --continue-from " + text +
                                          " --spec " + spec);
    ASSERT_EQ(o.rc, 0) << o.err;
    const auto j = nlohmann::json::parse(o.out);
    EXPECT_EQ(j.at("continue_from").get<std::string>(), text);
    EXPECT_TRUE(j.at("device").get<std::string>().starts_with("cpu")) << j.at("device");
    EXPECT_GE(j.at("text_tokens").get<int64_t>(), 70);
    EXPECT_EQ(j.at("prefill").at("tokens").get<int64_t>(), 40);
    EXPECT_EQ(j.at("decode").at("tokens").get<int64_t>(), 29) << "the first token comes from the prefill";
    EXPECT_EQ(j.at("threads").get<int>(), 1);
    if (spec == "off") {
      EXPECT_EQ(j.at("decode").at("windows").get<int64_t>(), 29);
      EXPECT_EQ(j.at("spec").at("mode").get<std::string>(), "off");
    } else {
      // The prompt holds a whole line of the text, which repeats: the suffix drafter's drafts
      // are the forced tokens, so windows keep more than one token.
      EXPECT_LT(j.at("decode").at("windows").get<int64_t>(), 20);
      // The gate's own estimates: the suffix source's, at the depth limit's positions, are high
      // after drafts that all stood; a fixed depth probes nothing.
      const auto& gate = j.at("spec").at("gate");
      EXPECT_EQ(gate.at("probes").get<int64_t>(), 0);
      const auto& suffix = gate.at("acceptance_estimate").at("suffix");
      ASSERT_EQ(suffix.size(), 4u) << gate;
      EXPECT_GT(suffix.at(0).get<double>(), 0.8) << gate;
      EXPECT_TRUE(gate.at("best_value").contains("mtp")) << gate;
    }
  }
  const Output short_text = run("tiny.gguf", "--prompt-tokens 40 --gen-tokens 1000 --continue-from " + text);
  EXPECT_EQ(short_text.rc, 1);
  EXPECT_NE(short_text.err.find("--continue-from: " + text + " has "), std::string::npos) << short_text.err;
  EXPECT_NE(short_text.err.find("fewer than --prompt-tokens + --gen-tokens (1040)"), std::string::npos)
      << short_text.err;
  // Past the model's context: the flags it comes from are named, not run's --ctx.
  const Output long_run = run("tiny.gguf", "--prompt-tokens 40 --gen-tokens 100000 --continue-from " + text);
  EXPECT_EQ(long_run.rc, 1);
  EXPECT_NE(long_run.err.find("--prompt-tokens + --gen-tokens + the deepest draft: 100049 exceeds the model's "
                              "context of "),
            std::string::npos)
      << long_run.err;
  const Output missing = run("tiny.gguf", "--continue-from " + dir_->file("absent.txt"));
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("--continue-from: cannot read " + dir_->file("absent.txt")), std::string::npos)
      << missing.err;
}

uint64_t lookups(const nlohmann::json& phase) {
  return phase["hits"].get<uint64_t>() + phase["misses"].get<uint64_t>();
}

// Each phase's expert-cache figures cover that phase alone (the prefill's once ran to the end of
// the run, decode included).
TEST_F(BenchCommand, EachPhaseCountsItsOwnExpertLookups) {
  // A budget of a few slots, read-ahead off: every lookup is a routed expert of a window.
  const std::string common = "--batch 1 --expert-budget 1M --read-ahead off --prompt-tokens 3 ";
  const Output alone_out = run("packed.gguf", common + "--gen-tokens 0");
  const Output with_out = run("packed.gguf", common + "--gen-tokens 4");
  ASSERT_EQ(alone_out.rc, 0) << alone_out.err;
  ASSERT_EQ(with_out.rc, 0) << with_out.err;
  const auto alone = nlohmann::json::parse(alone_out.out), with_decode = nlohmann::json::parse(with_out.out);
  ASSERT_GT(lookups(alone["prefill"]), 0u);
  EXPECT_EQ(lookups(with_decode["prefill"]), lookups(alone["prefill"]))
      << "the same prompt looks up the same experts, whatever is decoded after it";
  EXPECT_EQ(lookups(alone["decode"]), 0u);
  // Each one-token window looks up its distinct routed experts: as many as a prompt token's.
  EXPECT_EQ(lookups(with_decode["decode"]) * 3, lookups(alone["prefill"]) * 4);
}

// Decode windows choose their greedy token on the backend by default, as generation does;
// --choose logits reads the rows back instead. Either way the same windows route to the same
// experts, one sequence or several; another value is an error naming the flag.
TEST_F(BenchCommand, DecodeWindowsChooseOnTheBackendOrReadTheirLogits) {
  const std::string common = "--batch 1 --expert-budget 1M --read-ahead off --prompt-tokens 3 --gen-tokens 4 ";
  for (const std::string parallel : {"", "--parallel 2 "}) {
    SCOPED_TRACE(parallel);
    const Output device = run("packed.gguf", common + parallel);
    const Output logits = run("packed.gguf", common + parallel + "--choose logits");
    ASSERT_EQ(device.rc, 0) << device.err;
    ASSERT_EQ(logits.rc, 0) << logits.err;
    const auto d = nlohmann::json::parse(device.out), l = nlohmann::json::parse(logits.out);
    EXPECT_EQ(d.at("decode").at("choose"), "device");
    EXPECT_EQ(l.at("decode").at("choose"), "logits");
    EXPECT_EQ(d.at("decode").at("tokens"), l.at("decode").at("tokens"));
    ASSERT_GT(lookups(d["decode"]), 0u);
    EXPECT_EQ(lookups(d["decode"]), lookups(l["decode"]));
  }
  const Output bad = bench("--choose argmax");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--choose"), std::string::npos) << bad.err;
}

// Decode windows before the timed ones (--warmup, default 2) are reported apart and their expert
// lookups are not the decode phase's: with or without them the timed one-row windows look up as
// many; none run without decode tokens; a count out of range names the flag.
TEST_F(BenchCommand, WarmUpWindowsAreNotTimed) {
  const std::string common = "--batch 1 --expert-budget 1M --read-ahead off --prompt-tokens 3 ";
  for (const std::string parallel : {"", "--parallel 2 "}) {
    SCOPED_TRACE(parallel);
    const Output warm = run("packed.gguf", common + parallel + "--gen-tokens 3");
    const Output cold = run("packed.gguf", common + parallel + "--gen-tokens 3 --warmup 0");
    const Output none = run("packed.gguf", common + parallel + "--gen-tokens 0");
    ASSERT_EQ(warm.rc, 0) << warm.err;
    ASSERT_EQ(cold.rc, 0) << cold.err;
    ASSERT_EQ(none.rc, 0) << none.err;
    const auto w = nlohmann::json::parse(warm.out), c = nlohmann::json::parse(cold.out),
               n = nlohmann::json::parse(none.out);
    EXPECT_EQ(w.at("decode").at("warmup").at("windows"), 2);
    EXPECT_GT(w.at("decode").at("warmup").at("seconds").get<double>(), 0.0);
    EXPECT_EQ(c.at("decode").at("warmup").at("windows"), 0);
    EXPECT_EQ(n.at("decode").at("warmup").at("windows"), 0);
    EXPECT_EQ(lookups(w["prefill"]), lookups(c["prefill"]));
    ASSERT_GT(lookups(w["decode"]), 0u);
    // A one-row window looks up as many experts whatever its token (two sequences' windows look
    // up the union of theirs, which depends on the tokens, and the warm-up shifts them).
    if (parallel.empty()) EXPECT_EQ(lookups(w["decode"]), lookups(c["decode"]));
  }
  const Output bad = bench("--warmup -1");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--warmup"), std::string::npos) << bad.err;
}

// The PLE row reads per phase (docs/PERFORMANCE.md, "PLE rows issued early"), with the early
// issue on and off, from a cold page cache.
TEST_F(BenchCommand, ReportsThePleRowReads) {
  for (const std::string prefetch : {"on", "off"}) {
    SCOPED_TRACE(prefetch);
    const Output o = run("qwen4exp.gguf", "--prompt-tokens 3 --gen-tokens 2 --threads 1 --ple-cold --ple-prefetch " + prefetch);
    ASSERT_EQ(o.rc, 0) << o.err;
    const auto j = nlohmann::json::parse(o.out);
    for (const char* phase : {"prefill", "decode"}) {
      const auto& ple = j.at(phase).at("ple");
      EXPECT_EQ(ple.at("prefetch").get<std::string>(), prefetch);
      EXPECT_TRUE(ple.at("cold").get<bool>());
      EXPECT_EQ(ple.at("rows_per_token").get<double>(), 4.0);
      EXPECT_GE(ple.at("gather_ms_per_token").get<double>(), 0.0);
      EXPECT_EQ(ple.at("issue_ms_per_token").get<double>() > 0.0, prefetch == "on");
    }
  }
  const Output no_ple = bench("--ple-cold");
  EXPECT_EQ(no_ple.rc, 1);
  EXPECT_NE(no_ple.err.find("has no PLE n-gram tables"), std::string::npos) << no_ple.err;
  EXPECT_NE(bench("--ple-prefetch maybe").rc, 0);
  EXPECT_FALSE(nlohmann::json::parse(bench("").out).at("decode").contains("ple"));
}

}  // namespace
}  // namespace strata
