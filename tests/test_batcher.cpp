// Several sequences per window (decode::Batcher over decode::SequenceRun) on a tiny synthetic
// qwen35moe: every sequence's tokens, text, finish reason and stop string equal those of the
// same request run alone through Session::generate, with staggered arrivals, mixed prompt and
// reply lengths, greedy and sampled requests, stop strings, a JSON constraint, a cancellation
// mid-reply and one during the prefill, and prompt-cache reuse across requests. The same on the
// GPU where there is one (the batched windows there against the requests run alone there).
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#ifdef STRATA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "decode/batcher.h"
#include "decode/generate.h"
#include "decode/json_constraint.h"
#include "decode/sequence_run.h"
#include "gguf_test_util.h"
#include "model/journal.h"
#include "model/model.h"
#include "synth/synth.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

namespace strata::decode {
namespace {

using gguf::testing::TempDir;

class Batching : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    synth::SynthOptions o;
    o.arch = "qwen35moe";
    o.preset = "tiny";
    o.output = dir_->file("tiny.gguf");
    o.progress = false;
    o.seed = 4;  // greedy replies in plain ASCII, which stop strings can match
    synth::run_synth(o);
    path_ = new std::string(o.output);
    backend_ = new backend::CpuBackend(1);
    model_ = model::Model::load(o.output, *backend_).release();
    tok_ = new tokenizer::Tokenizer(tokenizer::read_vocab_metadata(model_->reader()));
    vocab_ = new JsonVocab(*tok_);
  }
  static void TearDownTestSuite() {
    delete vocab_;
    delete tok_;
    delete model_;
    delete backend_;
    delete path_;
    delete dir_;
  }

  static std::vector<int32_t> encode(const std::string& text) {
    const auto ids = tok_->encode(text);
    return {ids.begin(), ids.end()};
  }

  // Runs the requests of EverySequenceEqualsTheSameRequestRunAlone on `model`.
  static void expect_every_sequence_equals_alone(model::Model& model);
  // Runs the requests of ARunAloneDraftsAndKeepsThePlainTokens on `model`.
  static void expect_lone_runs_draft(model::Model& model);
  // Runs TheMtpHeadDraftsInTheFirstWindowAlone on `model`.
  static void expect_a_draft_once_alone(model::Model& model);

  // Runs `check` on the model loaded on the GPU; skips where there is none.
  static void on_the_gpu(void (*check)(model::Model&)) {
#ifdef STRATA_HAVE_CUDA
    if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason();
    backend::CudaBackend gpu(0);
    check(*model::Model::load(*path_, gpu));
#else
    (void)check;
    GTEST_SKIP() << "the CUDA backend is not compiled in (no nvcc)";
#endif
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string* path_ = nullptr;
  static inline backend::CpuBackend* backend_ = nullptr;
  static inline model::Model* model_ = nullptr;
  static inline tokenizer::Tokenizer* tok_ = nullptr;
  static inline JsonVocab* vocab_ = nullptr;
};

// One request: its prompt and parameters, built fresh for each run (hooks hold per-run state).
struct Request {
  std::string prompt;
  std::function<GenerateParams()> params;
  size_t arrives = 0;  // the window before which it joins
};

GenerateParams sampled(int64_t max_tokens, uint64_t seed, float temperature = 1.0f) {
  GenerateParams p;
  p.max_tokens = max_tokens;
  p.sampling.temperature = temperature;
  p.sampling.top_k = 20;
  p.sampling.seed = seed;
  return p;
}

// should_stop that fires once `after` tokens have been generated (counted through on_token), or
// at once with after = 0 (a client gone before its prompt is in).
GenerateParams cancelled_after(int64_t after, GenerateParams p) {
  auto count = std::make_shared<int64_t>(0);
  p.on_token = [count](int32_t) { ++*count; };
  p.should_stop = [count, after] { return after == 0 || *count >= after; };
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text, streamed, stop;
  FinishReason finish = FinishReason::Length;
};

TEST_F(Batching, EverySequenceEqualsTheSameRequestRunAlone) { expect_every_sequence_equals_alone(*model_); }

TEST_F(Batching, OnTheGpuEverySequenceEqualsTheSameRequestRunAlone) { on_the_gpu(expect_every_sequence_equals_alone); }

void Batching::expect_every_sequence_equals_alone(model::Model& model) {
  const std::string long_prompt(400, 'x');
  std::vector<Request> requests = {
      {"The quick brown fox", [] { return sampled(24, 0, 0.0f); }, 0},
      {"Say something", [] { return sampled(30, 7); }, 0},
      {long_prompt + " and then", [] { return sampled(12, 3); }, 1},  // a long prefill joins decoding ones
      {"Stop me", [] {
         GenerateParams p = sampled(40, 0, 0.0f);
         p.stop = {"alt"};
         return p;
       }, 2},
      {"Cancel me mid-way", [] { return cancelled_after(5, sampled(60, 11)); }, 2},
      {"Never started", [] { return cancelled_after(0, sampled(10, 1)); }, 3},
      {"A short one", [] { return sampled(3, 5); }, 5},
      {"Late arrival, greedy", [] { return sampled(16, 0, 0.0f); }, 9},
      // Top-p alone (the window's best 1024 and its row sum), plain temperature (the whole row).
      {"Nucleus", [] {
         GenerateParams p = sampled(14, 4, 0.8f);
         p.sampling.top_k = 0;
         p.sampling.top_p = 0.9f;
         return p;
       }, 1},
      {"Plain temperature", [] {
         GenerateParams p = sampled(14, 6, 0.9f);
         p.sampling.top_k = 0;
         return p;
       }, 3},
  };
  // A JSON constraint through the hooks, its token budget steering it to an end.
  auto constraint = std::make_shared<std::unique_ptr<JsonConstraint>>();
  requests.push_back({"Reply in JSON", [constraint] {
                        *constraint = std::make_unique<JsonConstraint>(*vocab_, JsonGrammar::any_object());
                        (*constraint)->set_token_budget(20);
                        GenerateParams p = sampled(20, 9);
                        JsonConstraint* c = constraint->get();
                        p.logits_filter = [c](std::span<float> l) { c->apply(l); };
                        p.on_token = [c](int32_t id) { c->accept(id); };
                        return p;
                      }, 4});

  std::vector<Outcome> alone;
  for (const Request& r : requests) {
    Session s(model, *tok_, {.n_ctx = 1024});
    Outcome o;
    const auto result = s.generate(encode(r.prompt), r.params(), [&](const std::string& p) { o.streamed += p; });
    o.tokens = result.tokens;
    o.text = result.text;
    o.finish = result.finish;
    o.stop = result.stop_sequence;
    alone.push_back(o);
  }

  for (int64_t budget : {1, 7, 512}) {
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<std::unique_ptr<SequenceRun>> runs;
    std::vector<Outcome> together(requests.size());
    std::vector<GenerateParams> params;
    for (const Request& r : requests) params.push_back(r.params());
    Batcher batcher(model, budget);
    size_t joined = 0;
    for (size_t window = 0;; ++window) {
      while (joined < requests.size() && requests[joined].arrives <= window) {
        sessions.push_back(std::make_unique<Session>(model, *tok_, SessionOptions{.n_ctx = 1024}));
        Outcome* out = &together[joined];
        runs.push_back(std::make_unique<SequenceRun>(*sessions.back(), encode(requests[joined].prompt), params[joined],
                                                     [out](const std::string& p) { out->streamed += p; }));
        ++joined;
      }
      std::vector<SequenceRun*> active;
      for (auto& run : runs) active.push_back(run.get());
      if (batcher.step(active) == 0 && joined == requests.size()) break;
      ASSERT_LT(window, 10000u);
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      const SequenceRun& run = *runs[i];
      ASSERT_TRUE(run.done());
      ASSERT_FALSE(run.error()) << *run.error();
      const Outcome& a = alone[i];
      EXPECT_EQ(run.result().tokens, a.tokens) << "request " << i << ", row budget " << budget;
      EXPECT_EQ(run.result().text, a.text) << "request " << i;
      EXPECT_EQ(together[i].streamed, a.streamed) << "request " << i;
      EXPECT_EQ(run.result().finish, a.finish) << "request " << i;
      EXPECT_EQ(run.result().stop_sequence, a.stop) << "request " << i;
    }
  }
  // The cases the test means to cover did happen.
  EXPECT_EQ(alone[3].finish, FinishReason::Stop);
  EXPECT_EQ(alone[4].finish, FinishReason::Cancelled);
  EXPECT_EQ(alone[4].tokens.size(), 5u);
  EXPECT_TRUE(alone[5].tokens.empty());
  EXPECT_EQ(alone.back().finish, FinishReason::Eos) << "the constrained reply closed its document";
}

// A session's prompt cache works the same inside a batch: a second turn that extends the first
// reuses the state, and gives the tokens of a session that ran both turns alone.
TEST_F(Batching, ThePromptCacheCarriesAcrossBatchedTurns) {
  const auto first = encode("First turn of a conversation");
  Session alone_session(*model_, *tok_, {.n_ctx = 512, .snapshot_prompt = true});
  const auto a1 = alone_session.generate(first, sampled(8, 0, 0.0f), {});
  auto second = first;
  second.insert(second.end(), a1.tokens.begin(), a1.tokens.end());
  const auto more = encode(" and the second one?");
  second.insert(second.end(), more.begin(), more.end());
  const auto a2 = alone_session.generate(second, sampled(8, 0, 0.0f), {});

  Session mine(*model_, *tok_, {.n_ctx = 512, .snapshot_prompt = true});
  Session other(*model_, *tok_, {.n_ctx = 512});
  Batcher batcher(*model_, 4);
  const auto run_pair = [&](const std::vector<int32_t>& prompt) {
    SequenceRun run(mine, prompt, sampled(8, 0, 0.0f), {});
    SequenceRun noise(other, encode("Unrelated traffic in the same windows"), sampled(10, 2), {});
    SequenceRun* both[] = {&noise, &run};
    while (batcher.step(both) > 0) {
    }
    return run.result();
  };
  const auto b1 = run_pair(first);
  const auto b2 = run_pair(second);
  EXPECT_EQ(b1.tokens, a1.tokens);
  EXPECT_EQ(b2.tokens, a2.tokens);
  EXPECT_EQ(b2.telemetry.reused_tokens, a2.telemetry.reused_tokens);
  EXPECT_GT(b2.telemetry.reused_tokens, int64_t(first.size()));
}

// With speculation on in the sessions, a run that has the window to itself drafts, and every
// run's tokens still equal the plain ones: a run alone from the start, another joining it (its
// windows then carry one row each: a journal in a shared window would be an error), the first
// alone again once the other ends, and late arrivals. The MTP head's drafts (random weights) and
// suffix drafts right for 0..depth tokens, then wrong (so rejections land at every position).
TEST_F(Batching, ARunAloneDraftsAndKeepsThePlainTokens) { expect_lone_runs_draft(*model_); }

TEST_F(Batching, OnTheGpuARunAloneDraftsAndKeepsThePlainTokens) { on_the_gpu(expect_lone_runs_draft); }

void Batching::expect_lone_runs_draft(model::Model& model) {
  struct Case {
    std::string prompt;
    GenerateParams params;
    size_t arrives;
  };
  const std::vector<Case> cases = {
      {"The quick brown fox", sampled(36, 0, 0.0f), 0},
      {"Say something", sampled(12, 7), 3},
      {"A later question", sampled(20, 0, 0.0f), 60},
      {"And one right after it", sampled(16, 3), 61},
  };
  std::vector<GenerateResult> plain;
  for (const Case& c : cases) {
    Session s(model, *tok_, {.n_ctx = 1024});
    plain.push_back(s.generate(encode(c.prompt), c.params, {}));
  }
  const int64_t vocab = model.config().n_vocab;
  for (spec::Mode mode : {spec::Mode::Mtp, spec::Mode::Suffix}) {
    SessionOptions so{.n_ctx = 1024};
    so.spec.mode = mode;
    so.spec.depth = mode == spec::Mode::Mtp ? 2 : 3;
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<std::unique_ptr<SequenceRun>> runs;
    Batcher batcher(model, 16);
    size_t joined = 0;
    for (size_t window = 0;; ++window) {
      while (joined < cases.size() && cases[joined].arrives <= window) {
        const Case& c = cases[joined];
        sessions.push_back(std::make_unique<Session>(model, *tok_, so));
        if (mode == spec::Mode::Suffix) {
          const std::vector<int32_t> prompt = encode(c.prompt), expected = plain[joined].tokens;
          auto drafts = std::make_shared<int>(0);
          sessions.back()->speculator().set_external_drafter(
              [prompt, expected, vocab, drafts](std::span<const int32_t> history, int limit) {
                const size_t done = history.size() - prompt.size();
                const int right = (*drafts)++ % 4;
                std::vector<int32_t> d;
                for (int j = 0; j < std::min(limit, 3); ++j) {
                  const size_t i = done + size_t(j);
                  const int32_t truth = i < expected.size() ? expected[i] : 0;
                  d.push_back(j < right ? truth : int32_t((truth + 1 + j) % vocab));
                }
                return d;
              });
        }
        runs.push_back(std::make_unique<SequenceRun>(*sessions.back(), encode(c.prompt), c.params, PieceFn{}));
        ++joined;
      }
      std::vector<SequenceRun*> active;
      for (auto& run : runs) active.push_back(run.get());
      if (batcher.step(active) == 0 && joined == cases.size()) break;
      ASSERT_LT(window, 10000u);
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      const SequenceRun& run = *runs[i];
      ASSERT_TRUE(run.done());
      ASSERT_FALSE(run.error()) << *run.error();
      EXPECT_EQ(run.result().tokens, plain[i].tokens) << spec::mode_name(mode) << ", request " << i;
      EXPECT_EQ(run.result().text, plain[i].text) << spec::mode_name(mode) << ", request " << i;
      EXPECT_EQ(run.result().finish, plain[i].finish) << spec::mode_name(mode) << ", request " << i;
      ASSERT_TRUE(run.result().telemetry.spec.has_value());
    }
    // The first run had windows to itself at its start and after the second ended, and drafted in
    // them; so did the later pair once the last one ended.
    for (size_t i : {size_t(0), size_t(2)})
      EXPECT_GT(runs[i]->result().telemetry.spec->drafted_windows, 0) << spec::mode_name(mode) << ", request " << i;
    // The oracle's drafts to the first run were rejected at every position, and saved windows.
    const spec::Report& first = *runs[0]->result().telemetry.spec;
    if (mode != spec::Mode::Suffix) continue;
    for (int j = 1; j <= 3; ++j) EXPECT_GT(first.judged[size_t(spec::Source::Suffix)][size_t(j)], 0) << j;
    EXPECT_GT(first.rollbacks, 0);
    EXPECT_LT(runs[0]->result().telemetry.decode_steps, plain[0].telemetry.decode_steps);
  }
}

// The MTP head reads the hidden states of windows shared with other sequences too, so a run
// left alone drafts in its first window alone (a head missing the last rows could not draft).
TEST_F(Batching, TheMtpHeadDraftsInTheFirstWindowAlone) { expect_a_draft_once_alone(*model_); }

TEST_F(Batching, OnTheGpuTheMtpHeadDraftsInTheFirstWindowAlone) { on_the_gpu(expect_a_draft_once_alone); }

void Batching::expect_a_draft_once_alone(model::Model& model) {
  SessionOptions so{.n_ctx = 256};
  so.spec.mode = spec::Mode::Mtp;
  so.spec.depth = 2;
  Session long_session(model, *tok_, so), short_session(model, *tok_, so);
  SequenceRun long_run(long_session, encode("The quick brown fox"), sampled(24, 0, 0.0f), {});
  SequenceRun short_run(short_session, encode("Say something"), sampled(4, 7), {});
  SequenceRun* both[] = {&long_run, &short_run};
  Batcher batcher(model, 16);
  while (!short_run.done()) ASSERT_GT(batcher.step(both), 0u);
  ASSERT_FALSE(long_run.done());
  EXPECT_EQ(long_session.speculator().report().drafted_windows, 0);
  batcher.step(both);
  EXPECT_EQ(long_session.speculator().report().drafted_windows, 1);
}

TEST_F(Batching, BadInputIsAClearError) {
  Session s(*model_, *tok_, {.n_ctx = 16});
  EXPECT_THROW(SequenceRun(s, std::vector<int32_t>{}, sampled(4, 0), {}), Error);
  EXPECT_THROW(SequenceRun(s, std::vector<int32_t>(17, 5), sampled(4, 0), {}), Error);
  EXPECT_THROW(Batcher(*model_, 0), Error);
  // A hook that throws ends its run with the error, not the others.
  Session t(*model_, *tok_, {.n_ctx = 64});
  GenerateParams bad = sampled(4, 0);
  bad.on_token = [](int32_t) { throw Error("the hook failed"); };
  SequenceRun failing(s, encode("x"), bad, {});
  SequenceRun fine(t, encode("y"), sampled(4, 0), {});
  SequenceRun* both[] = {&failing, &fine};
  Batcher batcher(*model_, 8);
  while (batcher.step(both) > 0) {
  }
  ASSERT_TRUE(failing.error());
  EXPECT_NE(failing.error()->find("the hook failed"), std::string::npos);
  EXPECT_FALSE(fine.error());
  EXPECT_EQ(fine.result().tokens.size(), 4u);
  // A journal belongs to a window of one sequence.
  model::State a = model_->new_state(16), b = model_->new_state(16);
  model::Journal journal(model_->backend());
  const std::vector<int32_t> rows{5, 6};
  const model::Model::SequenceRows with_journal[] = {{rows, &a, model::LogitsMode::All, nullptr, nullptr, &journal},
                                                     {rows, &b}};
  try {
    model_->forward_batch(with_journal);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 0: a journal needs a window of the sequence alone"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace strata::decode
