// decode::Session on a tiny synthetic qwen35moe: greedy output equals argmax over
// Model::forward step by step, sampling is reproducible per seed, stop strings and max tokens
// end generation, the streamed pieces add up to the decoded text, the prefill window size does
// not change the tokens, and a prompt that extends (or diverges from) what the state holds gives
// the tokens of a fresh run.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "decode/generate.h"
#include "gguf_test_util.h"
#include "model/model.h"
#include "synth/synth.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

namespace strata::decode {
namespace {

using gguf::testing::TempDir;

// One model for the whole suite: synthesis and loading dominate the run time.
class Generate : public ::testing::Test {
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
    backend_ = new backend::CpuBackend(1);
    model_ = model::Model::load(o.output, *backend_).release();
    tok_ = new tokenizer::Tokenizer(tokenizer::read_vocab_metadata(model_->reader()));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete model_;
    delete backend_;
    delete dir_;
  }

  static std::vector<int32_t> encode(const std::string& text) {
    const auto ids = tok_->encode(text);
    return {ids.begin(), ids.end()};
  }

  static GenerateResult run(std::span<const int32_t> prompt, const GenerateParams& p,
                            const PieceFn& on_piece = {}) {
    Session s(*model_, *tok_, {.n_ctx = 256});
    return s.generate(prompt, p, on_piece);
  }

  static GenerateParams greedy(int64_t max_tokens) {
    GenerateParams p;
    p.max_tokens = max_tokens;
    return p;
  }

  static inline TempDir* dir_ = nullptr;
  static inline backend::CpuBackend* backend_ = nullptr;
  static inline model::Model* model_ = nullptr;
  static inline tokenizer::Tokenizer* tok_ = nullptr;
};

const std::string kText = "The quick brown fox jumps over the lazy dog; strata streams experts.";

TEST_F(Generate, GreedyEqualsArgmaxStepByStep) {
  const auto prompt = encode(kText);
  const auto result = run(prompt, greedy(24));

  model::State st = model_->new_state(256);
  auto logits = model_->forward(prompt, st, model::LogitsMode::Last);
  const auto& vocab = tok_->vocab();
  const auto ends = [&](int32_t id) {
    for (const auto& end : {vocab.eos, vocab.find("<|im_end|>"), vocab.find("<|endoftext|>")})
      if (end && id == int32_t(*end)) return true;
    return false;
  };
  std::vector<int32_t> expected;
  while (expected.size() < 24) {
    const int32_t id = argmax(logits);
    if (ends(id)) break;
    expected.push_back(id);
    logits = model_->forward(std::span(&id, 1), st, model::LogitsMode::Last);
  }
  EXPECT_EQ(result.tokens, expected);
  ASSERT_GE(result.tokens.size(), 8u) << "the tiny model ends too soon to test much";
  EXPECT_EQ(result.telemetry.prompt_tokens, int64_t(prompt.size()));
  EXPECT_EQ(result.telemetry.generated_tokens, int64_t(result.tokens.size()));
  EXPECT_EQ(run(prompt, greedy(24)).tokens, result.tokens);
  // The run above chose on the backend (Backend::argmax); a logits filter brings every row back
  // to the host sampler, which chooses the same.
  GenerateParams host = greedy(24);
  host.logits_filter = [](std::span<float>) {};
  EXPECT_EQ(run(prompt, host).tokens, result.tokens);
}

TEST_F(Generate, SameSeedSameTokens) {
  const auto prompt = encode(kText);
  const auto sampled = [&](uint64_t seed) {
    GenerateParams p = greedy(16);
    p.sampling.temperature = 1.0f;
    p.sampling.top_k = 40;
    p.sampling.seed = seed;
    return run(prompt, p).tokens;
  };
  const auto a = sampled(5);
  EXPECT_EQ(sampled(5), a);
  // Top-k sampling read k candidates a row (Backend::top_k); with a logits filter the host
  // sampler reads every row, and chooses the same.
  GenerateParams host = greedy(16);
  host.sampling = {.temperature = 1.0f, .top_k = 40, .top_p = 0.9f, .min_p = 0.02f, .seed = 5};
  const auto device = run(prompt, host).tokens;
  host.logits_filter = [](std::span<float>) {};
  EXPECT_EQ(run(prompt, host).tokens, device);
  // Top-p without top-k: the best kMaxNucleus candidates and the row's sum (Backend::sampling_sums).
  GenerateParams nucleus = greedy(16);
  nucleus.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 5};
  const auto nucleus_device = run(prompt, nucleus).tokens;
  nucleus.logits_filter = [](std::span<float>) {};
  EXPECT_EQ(run(prompt, nucleus).tokens, nucleus_device);
  // Plain temperature: each row drawn in the window with its position's number (Backend::draw).
  GenerateParams plain = greedy(16);
  plain.sampling = {.temperature = 0.9f, .seed = 5};
  const auto plain_device = run(prompt, plain).tokens;
  plain.logits_filter = [](std::span<float>) {};
  EXPECT_EQ(run(prompt, plain).tokens, plain_device);
  bool some_other_seed_differs = false;
  for (uint64_t seed = 1; seed <= 4; ++seed) some_other_seed_differs |= sampled(seed) != a;
  EXPECT_TRUE(some_other_seed_differs);
}

TEST_F(Generate, StreamedPiecesMakeTheDecodedText) {
  std::string streamed;
  int pieces = 0;
  const auto result = run(encode(kText), greedy(32), [&](const std::string& piece) {
    EXPECT_FALSE(piece.empty());
    streamed += piece;
    ++pieces;
  });
  const std::vector<uint32_t> ids(result.tokens.begin(), result.tokens.end());
  EXPECT_EQ(streamed, tok_->decode(ids));
  EXPECT_EQ(result.text, streamed);
  EXPECT_GT(pieces, 1);
}

TEST_F(Generate, StopStringCutsTheText) {
  const auto prompt = encode(kText);
  const auto full = run(prompt, greedy(32)).text;
  // A stop string taken from the second half of the reply: generation ends at its first
  // occurrence, which may come earlier.
  const size_t at = full.size() / 2;
  ASSERT_GT(full.size(), at + 2);
  const std::string stop = full.substr(at, 2);
  GenerateParams p = greedy(32);
  p.stop = {"never in this text \x01", stop};
  std::string streamed;
  const auto cut = run(prompt, p, [&](const std::string& piece) { streamed += piece; });
  EXPECT_EQ(cut.finish, FinishReason::Stop);
  EXPECT_EQ(cut.text, full.substr(0, full.find(stop)));
  EXPECT_EQ(streamed, cut.text);
}

TEST_F(Generate, MaxTokensRespected) {
  const auto prompt = encode(kText);
  for (int64_t n : {0, 1, 5}) {
    const auto r = run(prompt, greedy(n));
    EXPECT_EQ(int64_t(r.tokens.size()), n);
    EXPECT_EQ(r.finish, FinishReason::Length);
    EXPECT_EQ(r.telemetry.decode_steps, std::max<int64_t>(n - 1, 0));
  }
}

TEST_F(Generate, PrefillWindowsGiveTheSameTokens) {
  const auto prompt = encode(kText + " " + kText);
  ASSERT_GT(prompt.size(), 14u);
  GenerateParams p = greedy(12);
  p.batch = int64_t(prompt.size());
  const auto whole = run(prompt, p).tokens;
  for (int64_t batch : {1, 7}) {
    p.batch = batch;
    EXPECT_EQ(run(prompt, p).tokens, whole) << "batch " << batch;
  }
}

TEST_F(Generate, ReusedPrefixGivesTheTokensOfAFreshRun) {
  const auto p1 = encode(kText);
  Session chat(*model_, *tok_, {.n_ctx = 256, .snapshot_prompt = true});
  const auto r1 = chat.generate(p1, greedy(10), {});
  ASSERT_EQ(r1.tokens.size(), 10u);
  const size_t held = chat.tokens().size();
  EXPECT_EQ(held, p1.size() + 9);  // the last sampled token was never run

  // The next turn extends everything the state holds: only the new suffix is prefilled.
  auto p2 = p1;
  p2.insert(p2.end(), r1.tokens.begin(), r1.tokens.end());
  const auto more = encode(" And then?");
  p2.insert(p2.end(), more.begin(), more.end());
  const auto r2 = chat.generate(p2, greedy(10), {});
  EXPECT_EQ(r2.telemetry.reused_tokens, int64_t(held));
  EXPECT_EQ(r2.telemetry.prompt_tokens, int64_t(p2.size() - held));
  EXPECT_EQ(r2.tokens, run(p2, greedy(10)).tokens);

  // Diverging inside the second reply: back to the snapshot taken after p2's prefill.
  auto p3 = p2;
  p3.insert(p3.end(), more.begin(), more.end());
  const auto r3 = chat.generate(p3, greedy(10), {});
  EXPECT_EQ(r3.telemetry.reused_tokens, int64_t(p2.size()));
  EXPECT_EQ(r3.tokens, run(p3, greedy(10)).tokens);

  // Diverging before the snapshot: from the start.
  const auto p4 = encode("Something else entirely.");
  const auto r4 = chat.generate(p4, greedy(10), {});
  EXPECT_EQ(r4.telemetry.reused_tokens, 0);
  EXPECT_EQ(r4.tokens, run(p4, greedy(10)).tokens);

  // The same prompt again still runs its last token for fresh logits.
  const auto r5 = chat.generate(p4, greedy(10), {});
  EXPECT_EQ(r5.tokens, r4.tokens);
  EXPECT_GE(r5.telemetry.prompt_tokens, 1);
}

// A chat server keeps the state at the end of the conversation, before the generation prompt: the
// next turn, which re-renders the reply differently right after that point, still reuses it.
TEST_F(Generate, ASnapshotInsideThePromptServesATurnThatDivergesAfterIt) {
  const auto conversation = encode(kText);
  auto p1 = conversation;
  const auto header = encode(" Answer with care:");
  p1.insert(p1.end(), header.begin(), header.end());
  Session chat(*model_, *tok_, {.n_ctx = 256, .snapshot_prompt = true});
  GenerateParams p = greedy(6);
  p.snapshot_at = int64_t(conversation.size());
  chat.generate(p1, p, {});

  auto p2 = conversation;
  const auto next = encode(" Something different, and a question?");
  p2.insert(p2.end(), next.begin(), next.end());
  GenerateParams q = greedy(6);
  q.snapshot_at = int64_t(p2.size()) - 2;
  const auto r2 = chat.generate(p2, q, {});
  EXPECT_EQ(r2.telemetry.reused_tokens, int64_t(conversation.size()));
  EXPECT_EQ(r2.tokens, run(p2, greedy(6)).tokens);

  // A snapshot_at inside the reused prefix keeps the snapshot already held there.
  auto p3 = p2;
  p3.push_back(p2.back());
  GenerateParams k = greedy(6);
  k.snapshot_at = 3;
  const auto r3 = chat.generate(p3, k, {});
  EXPECT_EQ(r3.tokens, run(p3, greedy(6)).tokens);
  auto p4 = std::vector<int32_t>(p2.begin(), p2.end() - 2);
  const auto other = encode(" Quite another ending.");
  p4.insert(p4.end(), other.begin(), other.end());
  const auto r4 = chat.generate(p4, greedy(4), {});
  EXPECT_EQ(r4.telemetry.reused_tokens, int64_t(p2.size()) - 2) << "back to the snapshot kept at p2's end - 2";
  EXPECT_EQ(r4.tokens, run(p4, greedy(4)).tokens);
}

TEST_F(Generate, ClearErrors) {
  Session s(*model_, *tok_, {.n_ctx = 8});
  const auto message = [&](const std::vector<int32_t>& prompt, const GenerateParams& p) {
    try {
      s.generate(prompt, p, {});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message({}, greedy(4)).find("prompt is empty"), std::string::npos);
  EXPECT_NE(message(encode(kText), greedy(4)).find("more than the context of 8"),
            std::string::npos);
  GenerateParams bad = greedy(4);
  bad.batch = 0;
  EXPECT_NE(message({1, 2}, bad).find("batch"), std::string::npos);

  // A full context ends generation instead of failing.
  const auto r = s.generate(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, greedy(50), {});
  EXPECT_LE(s.tokens().size(), 8u);
  EXPECT_LE(r.tokens.size(), 3u);
}

TEST(Telemetry, FormatsPlaceholdersAsDashes) {
  Telemetry t;
  t.prompt_tokens = 42;
  t.prefill_seconds = 0.5;
  t.generated_tokens = 64;
  t.decode_steps = 63;
  t.decode_tokens = 63;
  t.decode_seconds = 3.0;
  EXPECT_EQ(format_telemetry(t),
            "prompt 42 tok, prefill 84.0 tok/s | 64 tok, decode 21.0 tok/s | cache hit - | "
            "ssd - GB/s | stall - ms/tok");
  t.reused_tokens = 100;
  t.cache_hit_rate = 0.875;
  t.ssd_gb_per_s = 5.5;
  t.stall_ms_per_token = 1.5;
  EXPECT_EQ(format_telemetry(t),
            "prompt 42 tok, 100 reused, prefill 84.0 tok/s | 64 tok, decode 21.0 tok/s | "
            "cache hit 87.5% | ssd 5.50 GB/s | stall 1.5 ms/tok");
  // Speculation: tok/s counts the tokens windows kept, and the spec part follows.
  t.decode_steps = 30;
  t.spec = spec::Report{};
  t.spec->mode = spec::Mode::Auto;
  t.spec->t1 = 0.0412;
  t.spec->t_ratio = {1.31, 0.0, 1.8};
  t.spec->windows = 30;
  t.spec->tokens = 63;
  t.spec->drafted_windows = 20;
  t.spec->accepted = 33;
  t.spec->judged[1][1] = 20;
  t.spec->hits[1][1] = 16;
  t.spec->judged[1][2] = 10;
  t.spec->hits[1][2] = 5;
  t.spec->source_windows[1] = 20;
  EXPECT_EQ(format_telemetry(t),
            "prompt 42 tok, 100 reused, prefill 84.0 tok/s | 64 tok, decode 21.0 tok/s | "
            "cache hit 87.5% | ssd 5.50 GB/s | stall 1.5 ms/tok | spec auto: T1 41.2 ms T2/T1 1.31 "
            "T4/T1 1.80 | acc 0.80 0.50 | 2.10 tok/window, 1.65 accepted/drafted window | 20/30 "
            "windows drafted (mtp 0, suffix 20) | rollback 0, 0.00 ms/window");
}

}  // namespace
}  // namespace strata::decode
