// `strata run` end to end through the built binary on a tiny synthetic model: one-shot with the
// chat template and with --raw (the reply equals decode::Session's), the telemetry line on
// stderr, the interactive chat on piped stdin, and clear errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "decode/generate.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "synth/synth.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace strata::decode {
namespace {

using gguf::testing::TempDir;

struct Output {
  int rc = -1;
  std::string out, err;
};

class RunCommand : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    synth::SynthOptions o;
    o.arch = "qwen35moe";
    o.preset = "tiny";
    o.output = dir_->file("tiny.gguf");
    o.progress = false;
    o.seed = 11;
    synth::run_synth(o);
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string model() { return dir_->file("tiny.gguf"); }

  // Runs `strata run ARGS` with `input` on stdin; stdout and stderr apart.
  static Output strata_run(const std::string& args, const std::string& input = "") {
    std::ofstream(dir_->file("stdin.txt"), std::ios::binary) << input;
    const std::string err = dir_->file("stderr.txt");
    const std::string cmd = std::string(STRATA_BINARY) + " run " + args + " --threads 1 < " +
                            dir_->file("stdin.txt") + " 2> " + err;
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

  static size_t count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }

  static inline TempDir* dir_ = nullptr;
};

TEST_F(RunCommand, RawOneShotEqualsTheSession) {
  const std::string prompt = "Once upon a time";
  const auto o = strata_run("-m " + model() + " --raw -p '" + prompt + "' --max-tokens 12");
  ASSERT_EQ(o.rc, 0) << o.err;

  backend::CpuBackend backend(1);
  auto m = model::Model::load(model(), backend);
  const tokenizer::Tokenizer tok(tokenizer::read_vocab_metadata(m->reader()));
  const auto ids = tok.encode(prompt);
  Session s(*m, tok, {.n_ctx = 4096});
  GenerateParams p;
  p.max_tokens = 12;
  const auto r = s.generate(std::vector<int32_t>(ids.begin(), ids.end()), p, {});
  const std::string expected = r.text.empty() || r.text.back() != '\n' ? r.text + "\n" : r.text;
  EXPECT_EQ(o.out, expected);
  EXPECT_EQ(count(o.err, "[strata] prompt " + std::to_string(ids.size()) + " tok, prefill "), 1u)
      << o.err;
  // Speculation is on by default (auto) and changes no token; the telemetry line says what it did.
  EXPECT_NE(o.err.find(" | cache hit - | ssd - GB/s | stall - ms/tok | spec auto: T1 "), std::string::npos)
      << o.err;
}

TEST_F(RunCommand, ChatTemplateOneShot) {
  const auto o = strata_run("-m " + model() + " -p 'Hello there' --system 'Be brief.' "
                            "--no-think -n 6 --temp 0.8 --seed 3 --stop xyz");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(count(o.err, "[strata] prompt "), 1u) << o.err;
  EXPECT_EQ(strata_run("-m " + model() + " -p 'Hello there' --system 'Be brief.' --no-think "
                       "--max-tokens 6 --temp 0.8 --seed 3 --stop xyz")
                .out,
            o.out);
}

TEST_F(RunCommand, InteractiveChatReusesTheConversation) {
  const auto once = strata_run("-m " + model() + " --max-tokens 5 -p Hi");
  ASSERT_EQ(once.rc, 0) << once.err;
  const auto o = strata_run("-m " + model() + " --max-tokens 5",
                            "Hi\nTell me more\n/reset\nHi\n/exit\nignored\n");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(count(o.err, "[strata] prompt "), 3u) << o.err;
  EXPECT_EQ(count(o.err, " reused, prefill "), 1u) << o.err;
  EXPECT_EQ(count(o.err, "conversation cleared"), 1u) << o.err;
  // The first question gets the one-shot answer, and again after /reset.
  ASSERT_GT(o.out.size(), 2 * once.out.size());
  EXPECT_EQ(o.out.substr(0, once.out.size()), once.out);
  EXPECT_EQ(o.out.substr(o.out.size() - once.out.size()), once.out);
}

TEST_F(RunCommand, ClearErrors) {
  const auto missing = strata_run("-m " + dir_->file("nope.gguf") + " -p hi");
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("model file '" + dir_->file("nope.gguf") + "' does not exist"),
            std::string::npos)
      << missing.err;

  const auto long_prompt = strata_run("-m " + model() + " --ctx 8 -p 'a prompt far longer than "
                                      "eight tokens, even in a tiny vocabulary'");
  EXPECT_EQ(long_prompt.rc, 1);
  EXPECT_NE(long_prompt.err.find("more than --ctx 8"), std::string::npos) << long_prompt.err;

  const auto bad_temp = strata_run("-m " + model() + " -p hi --temp=-1");
  EXPECT_EQ(bad_temp.rc, 1);
  EXPECT_NE(bad_temp.err.find("temperature"), std::string::npos) << bad_temp.err;
}

}  // namespace
}  // namespace strata::decode
