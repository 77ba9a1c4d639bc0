// Speculative decoding is exact: on tiny synthetic models of all four architectures, generation
// with drafted windows gives token for token the output of plain decoding (greedy and sampled),
// with an oracle drafter that is right for a scripted number of drafts and then wrong, so every
// rollback depth is exercised; a rolled-back state equals a state that never saw the rejected
// rows, bitwise. On every backend (CUDA skips without a device): there the verification windows
// are recorded as graphs and replayed, journal copies included.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend_test_util.h"
#include "decode/generate.h"
#include "gguf_test_util.h"
#include "model/journal.h"
#include "model/model.h"
#include "synth/synth.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace strata::decode {
namespace {

using gguf::testing::TempDir;
using strata::testing::bitwise_equal;

struct Tiny {
  TempDir dir;
  std::string backend_name;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

std::unique_ptr<Tiny> load_tiny(const std::string& arch, const std::string& backend_name) {
  auto t = std::make_unique<Tiny>();
  synth::SynthOptions o;
  o.arch = arch;
  o.preset = "tiny";
  o.output = t->dir.file(arch + ".gguf");
  o.progress = false;
  o.seed = 5;
  synth::run_synth(o);
  t->backend_name = backend_name;
  t->backend = backend::testing::make_backend(backend_name);
  t->model = model::Model::load(o.output, *t->backend);
  t->tok = std::make_unique<tokenizer::Tokenizer>(tokenizer::read_vocab_metadata(t->model->reader()));
  return t;
}

std::vector<int32_t> prompt_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t((i * 7919 + 13) % (vocab - 8)) + 4);
  return p;
}

// (architecture, backend)
class SpecDecode : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    const auto& [arch, backend_name] = GetParam();
    const std::string why = backend::testing::unavailable(backend_name);
    if (!why.empty()) GTEST_SKIP() << why;
    tiny_ = load_tiny(arch, backend_name);
  }

  GenerateResult plain(std::span<const int32_t> prompt, const GenerateParams& p) {
    Session s(*tiny_->model, *tiny_->tok, {.n_ctx = 160});
    return s.generate(prompt, p, {});
  }

  std::unique_ptr<Tiny> tiny_;
};

GenerateParams params(bool sampled) {
  GenerateParams p;
  p.max_tokens = 40;
  if (sampled) {
    p.sampling.temperature = 0.9f;
    p.sampling.top_k = 40;
    p.sampling.seed = 77;
  }
  return p;
}

// Drafts from the plain output: right for `right` drafts (cycling 0..depth over the windows),
// then one wrong token, so rejections land at every position and some windows are all right.
struct OracleDrafter {
  std::vector<int32_t> prompt, expected;
  int64_t vocab;
  int depth;
  int windows = 0;
  std::vector<int32_t> operator()(std::span<const int32_t> history, int limit) {
    const size_t done = history.size() - prompt.size();  // output tokens so far, pending included
    const int right = windows++ % (depth + 1);
    std::vector<int32_t> d;
    for (int j = 0; j < std::min(limit, depth); ++j) {
      const size_t i = done + size_t(j);
      const int32_t truth = i < expected.size() ? expected[i] : 0;
      d.push_back(j < right ? truth : int32_t((truth + 1 + j) % vocab));
    }
    return d;
  }
};

void expect_same_as_plain(Tiny& t, bool sampled, const GenerateResult& reference,
                          std::span<const int32_t> prompt) {
  const int64_t vocab = t.model->config().n_vocab;
  for (int depth : {1, 3, 5}) {
    SessionOptions so{.n_ctx = 160};
    so.spec.mode = spec::Mode::Suffix;
    so.spec.depth = depth;
    Session s(*t.model, *t.tok, so);
    s.speculator().set_external_drafter(
        OracleDrafter{{prompt.begin(), prompt.end()}, reference.tokens, vocab, depth});
    const uint64_t replays_before = t.backend->counters().graph_replays;
    const GenerateResult r = s.generate(prompt, params(sampled), {});
    const uint64_t replays = t.backend->counters().graph_replays - replays_before;
    EXPECT_EQ(r.tokens, reference.tokens) << "depth " << depth;
    EXPECT_EQ(r.text, reference.text);
    EXPECT_EQ(r.finish, reference.finish);
    ASSERT_TRUE(r.telemetry.spec.has_value());
    const spec::Report& rep = *r.telemetry.spec;
    EXPECT_GT(rep.drafted_windows, 0);
    EXPECT_GT(rep.rollbacks, 0);
    // CUDA records windows: more replay than the plain ones, so drafted windows do too.
    if (t.backend_name == "cuda") {
      EXPECT_GT(replays, uint64_t(r.telemetry.decode_steps - rep.drafted_windows)) << "depth " << depth;
    }
    // Every rejection position 1..depth was exercised.
    for (int j = 1; j <= depth; ++j) EXPECT_GT(rep.judged[size_t(spec::Source::Suffix)][size_t(j)], 0) << j;
    EXPECT_LT(r.telemetry.decode_steps, reference.telemetry.decode_steps);
    EXPECT_EQ(r.telemetry.decode_tokens, reference.telemetry.decode_tokens);
    // The state holds what plain decoding's holds, bitwise: the next window's logits agree, and a
    // follow-up turn continues identically.
    std::vector<int32_t> next(s.tokens());
    next.push_back(int32_t(vocab / 2));
    Session fresh(*t.model, *t.tok, {.n_ctx = 160});
    fresh.generate(prompt, params(sampled), {});
    EXPECT_EQ(s.tokens(), fresh.tokens());
    model::State a = s.state(), b = fresh.state();
    const std::vector<int32_t> probe{3, int32_t(vocab / 3)};
    EXPECT_TRUE(bitwise_equal(t.model->forward(probe, a, model::LogitsMode::All),
                              t.model->forward(probe, b, model::LogitsMode::All)))
        << "depth " << depth;
    GenerateParams more = params(sampled);
    more.max_tokens = 6;
    EXPECT_EQ(s.generate(next, more, {}).tokens, fresh.generate(next, more, {}).tokens);
  }
}

TEST_P(SpecDecode, GreedyEqualsPlainWithRejectionsAtEveryPosition) {
  const auto prompt = prompt_tokens(12, tiny_->model->config().n_vocab);
  const GenerateResult reference = plain(prompt, params(false));
  ASSERT_EQ(reference.tokens.size(), 40u);
  expect_same_as_plain(*tiny_, false, reference, prompt);
}

// The first drafted window allocates the journal's copies, a one-time cost (56 ms of a 212 ms
// window on the 12-layer 80B cut against 104-128 ms later): timed, it priced its depth for the
// rest of the run and SpecGate stopped drafting there. It is left out of T(n); later windows of
// the same rows are timed.
TEST_P(SpecDecode, TheWindowThatGrowsTheJournalIsNotTimed) {
  const int64_t vocab = tiny_->model->config().n_vocab;
  const auto prompt = prompt_tokens(12, vocab);
  SessionOptions so{.n_ctx = 160};
  so.spec.mode = spec::Mode::Suffix;
  so.spec.depth = 1;
  Session s(*tiny_->model, *tiny_->tok, so);
  // One draft, always wrong: after the prefill's token, the one 2-row window, then a plain one.
  s.speculator().set_external_drafter(
      [&](std::span<const int32_t>, int limit) { return std::vector<int32_t>(size_t(std::min(limit, 1)), 0); });
  GenerateParams p = params(false);
  p.max_tokens = 3;
  const uint64_t layout = s.speculator().journal().layout();
  ASSERT_EQ(s.generate(prompt, p, {}).telemetry.spec->drafted_windows, 1);
  // qwen3moe has no recurrent state, so nothing to copy: its journal does not grow.
  const bool grew = s.speculator().journal().layout() != layout;
  EXPECT_EQ(grew, tiny_->model->config().arch != model::Arch::Qwen3Moe);
  // (On CUDA the first windows of each row count also warm their recording, so they are not timed
  // whatever the journal does.)
  const bool cpu = tiny_->backend_name == "cpu";
  if (cpu) {
    EXPECT_EQ(s.speculator().gate().measured(2), !grew);
    EXPECT_TRUE(s.speculator().gate().measured(1));
  }
  // The journal keeps its copies: the next 2-row window is timed (on CUDA once its recording,
  // two windows, has warmed).
  int runs = 0;
  while (!s.speculator().gate().measured(2) && runs < 3) {
    s.generate(prompt, p, {});
    ++runs;
  }
  EXPECT_TRUE(s.speculator().gate().measured(2));
  EXPECT_TRUE(s.speculator().gate().measured(1));
  if (cpu) {
    EXPECT_EQ(runs, grew ? 1 : 0);
  }
}

TEST_P(SpecDecode, SampledEqualsPlainWithRejectionsAtEveryPosition) {
  const auto prompt = prompt_tokens(9, tiny_->model->config().n_vocab);
  const GenerateResult reference = plain(prompt, params(true));
  expect_same_as_plain(*tiny_, true, reference, prompt);
}

TEST_P(SpecDecode, SuffixDrafterGatedByDefaultGivesThePlainTokens) {
  // A repetitive prompt gives the suffix drafter something to propose; the gate decides.
  std::vector<int32_t> prompt;
  const auto unit = prompt_tokens(6, tiny_->model->config().n_vocab);
  for (int i = 0; i < 4; ++i) prompt.insert(prompt.end(), unit.begin(), unit.end());
  for (bool sampled : {false, true}) {
    const GenerateResult reference = plain(prompt, params(sampled));
    SessionOptions so{.n_ctx = 160};
    so.spec.mode = spec::Mode::Auto;
    Session s(*tiny_->model, *tiny_->tok, so);
    EXPECT_EQ(s.generate(prompt, params(sampled), {}).tokens, reference.tokens);
  }
}

// Typical acceptance (opt-in, not exact): at a temperature that makes the target's distribution
// nearly flat, a draft the target did not choose still has the probability the rule asks for, so
// the output keeps drafts exact acceptance would reject, and the report says it was typical.
TEST_P(SpecDecode, TypicalAcceptanceKeepsDraftsTheRuleFindsLikely) {
  const auto prompt = prompt_tokens(12, tiny_->model->config().n_vocab);
  GenerateParams p = params(true);
  p.sampling.temperature = 1000.0f;
  p.sampling.top_k = 0;
  const int32_t drafted = int32_t(tiny_->model->config().n_vocab / 2);
  const GenerateResult reference = plain(prompt, p);
  SessionOptions so{.n_ctx = 160};
  so.spec.mode = spec::Mode::Suffix;
  so.spec.depth = 2;
  so.spec.typical = true;
  Session s(*tiny_->model, *tiny_->tok, so);
  s.speculator().set_external_drafter([drafted](std::span<const int32_t>, int limit) {
    return std::vector<int32_t>(size_t(std::min(limit, 2)), drafted);
  });
  const GenerateResult r = s.generate(prompt, p, {});
  ASSERT_TRUE(r.telemetry.spec.has_value());
  const spec::Report& rep = *r.telemetry.spec;
  EXPECT_TRUE(rep.typical);
  EXPECT_GT(rep.accepted, 0);
  EXPECT_GE(std::count(r.tokens.begin(), r.tokens.end(), drafted), rep.accepted);
  EXPECT_NE(r.tokens, reference.tokens) << "kept drafts that exact acceptance would have rejected";
}

TEST_P(SpecDecode, RollbackEqualsNeverSeeingTheRejectedRowsBitwise) {
  model::Model& m = *tiny_->model;
  const auto tokens = prompt_tokens(16, m.config().n_vocab);
  const std::span<const int32_t> all(tokens);
  model::Journal journal(m.backend());
  for (int64_t keep = 1; keep <= 5; ++keep) {
    // rolled: 6 rows, then a 5-row window rolled back to `keep`; straight: 6 + keep rows.
    model::State rolled = m.new_state(32), straight = m.new_state(32);
    m.forward(all.first(6), rolled, model::LogitsMode::Last);
    m.forward(all.subspan(6, 5), rolled, model::LogitsMode::All, {.journal = &journal});
    m.rollback(rolled, journal, keep);
    m.forward(all.first(size_t(6 + keep)), straight, model::LogitsMode::Last);
    ASSERT_EQ(rolled.n_past, straight.n_past);
    EXPECT_EQ(rolled.ple_history, straight.ple_history);
    // The next windows see the same state: the same logits, bitwise.
    const auto next = all.subspan(size_t(11), 4);
    EXPECT_TRUE(bitwise_equal(m.forward(next, rolled, model::LogitsMode::All),
                              m.forward(next, straight, model::LogitsMode::All)))
        << "keep " << keep;
  }
  EXPECT_EQ(journal.rollbacks(), 4);  // keep = 5 keeps the whole window
  EXPECT_THROW(journal.rollback(*std::make_unique<model::State>(m.new_state(8)), 1), Error);
}

TEST_P(SpecDecode, MtpModeNeedsAnMtpBlock) {
  SessionOptions so{.n_ctx = 64};
  so.spec.mode = spec::Mode::Mtp;
  if (tiny_->model->has_mtp())
    EXPECT_NO_THROW(Session(*tiny_->model, *tiny_->tok, so));
  else
    EXPECT_THROW(Session(*tiny_->model, *tiny_->tok, so), Error);
}

// The MTP head drafting for real (tiny random weights: its drafts are mostly wrong, which is
// what exercises the rollbacks), then with the acceptance knob on a forced continuation.
class MtpDecode : public SpecDecode {};

TEST_P(MtpDecode, MtpDraftsGiveThePlainTokens) {
  const auto prompt = prompt_tokens(20, tiny_->model->config().n_vocab);
  for (bool sampled : {false, true}) {
    const GenerateResult reference = plain(prompt, params(sampled));
    for (std::optional<int> depth : {std::optional<int>(1), std::optional<int>(3), std::optional<int>()}) {
      SessionOptions so{.n_ctx = 160};
      so.spec.mode = spec::Mode::Mtp;
      so.spec.depth = depth;
      Session s(*tiny_->model, *tiny_->tok, so);
      const GenerateResult r = s.generate(prompt, params(sampled), {});
      EXPECT_EQ(r.tokens, reference.tokens) << "sampled " << sampled << " depth " << depth.value_or(-1);
      ASSERT_TRUE(r.telemetry.spec.has_value());
      if (depth) {
        EXPECT_GT(r.telemetry.spec->source_windows[size_t(spec::Source::Mtp)], 0);
      }
      // A second turn on the same session: the head's cache catches up over the new prompt.
      std::vector<int32_t> next(s.tokens());
      next.push_back(7);
      Session fresh(*tiny_->model, *tiny_->tok, {.n_ctx = 160});
      fresh.generate(prompt, params(sampled), {});
      GenerateParams more = params(sampled);
      more.max_tokens = 8;
      EXPECT_EQ(s.generate(next, more, {}).tokens, fresh.generate(next, more, {}).tokens);
    }
  }
}

TEST_P(MtpDecode, AcceptanceKnobOnAForcedContinuation) {
  const int64_t vocab = tiny_->model->config().n_vocab;
  // A text without end tokens (one would end the generation, as in plain decoding).
  std::vector<int32_t> text = prompt_tokens(60, vocab);
  const auto& v = tiny_->tok->vocab();
  for (const auto& end : {v.eos, v.find("<|im_end|>"), v.find("<|endoftext|>")})
    if (end) std::replace(text.begin(), text.end(), int32_t(*end), int32_t(5));
  const std::span<const int32_t> all(text);
  for (double knob : {1.0, 0.5}) {
    SessionOptions so{.n_ctx = 160};
    so.spec.mode = spec::Mode::Mtp;
    so.spec.depth = 3;
    so.spec.mtp_acceptance_knob = knob;
    Session s(*tiny_->model, *tiny_->tok, so);
    GenerateParams p = params(false);
    p.max_tokens = 100;
    p.forced.assign(text.begin() + 20, text.end());
    const GenerateResult r = s.generate(all.first(20), p, {});
    EXPECT_EQ(r.tokens, p.forced);  // the output is the text, however the drafts went
    const spec::Report& rep = *r.telemetry.spec;
    ASSERT_GT(rep.drafted, 0);
    if (knob == 1.0) {
      EXPECT_EQ(rep.accepted, rep.drafted);
      EXPECT_EQ(rep.rollbacks, 0);
      EXPECT_LT(r.telemetry.decode_steps, 40 / 3 + 2);
    } else {
      EXPECT_GT(rep.accepted, 0);
      EXPECT_LT(rep.accepted, rep.drafted);
      EXPECT_NEAR(rep.acceptance(1), 0.5, 0.3);
    }
  }
}

// The draft vocabulary: the head scores only its ids (the best of them, bitwise the full head's
// logits there), drafts from it still give the plain tokens, and the knob cannot accept a text
// token the head could not have drafted.
TEST_P(MtpDecode, DraftVocabularyScoresItsIdsOnly) {
  model::Model& m = *tiny_->model;
  const int64_t n_vocab = m.config().n_vocab, head = n_vocab / 4;
  const model::DraftVocab dv = spec::draft_vocab(tiny_->tok->vocab(), head, n_vocab);
  ASSERT_FALSE(dv.whole());
  ASSERT_EQ(dv.head, head);
  ASSERT_LT(dv.tail_first, n_vocab);  // the tiny vocab ends on Qwen's added tokens
  EXPECT_EQ(dv.size(n_vocab), head + n_vocab - dv.tail_first);

  const int64_t T = 5, cols = m.hidden_cols();
  const std::vector<int32_t> tokens = prompt_tokens(T, n_vocab);
  std::vector<float> hidden(size_t(T * cols));
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = float((i * 37) % 23) / 23.0f - 0.5f;
  model::State whole = m.new_mtp_state(16), part = m.new_mtp_state(16);
  const std::vector<float> logits = m.mtp_forward(tokens, hidden, whole, model::LogitsMode::Last, nullptr);
  std::vector<int32_t> best;
  std::vector<float> prob;
  m.mtp_forward(tokens, hidden, part, model::LogitsMode::Last, nullptr, &best, &prob, dv);
  int32_t want = -1;
  for (int32_t id = 0; id < int32_t(n_vocab); ++id)
    if (dv.contains(id) && (want < 0 || logits[size_t(id)] > logits[size_t(want)])) want = id;
  ASSERT_EQ(best.size(), 1u);
  EXPECT_EQ(best[0], want);
  EXPECT_GT(prob[0], 0.0f);
  model::State other = m.new_mtp_state(16);
  EXPECT_THROW(m.mtp_forward(tokens, hidden, other, model::LogitsMode::All, nullptr, &best, &prob, dv), Error);
  EXPECT_THROW(m.mtp_forward(tokens, hidden, other, model::LogitsMode::Last, nullptr, nullptr, nullptr, dv), Error);

  const auto prompt = prompt_tokens(20, n_vocab);
  for (bool sampled : {false, true}) {
    SessionOptions so{.n_ctx = 160};
    so.spec.mode = spec::Mode::Mtp;
    so.spec.depth = 2;
    so.spec.draft_vocab = head;
    Session s(m, *tiny_->tok, so);
    EXPECT_EQ(s.generate(prompt, params(sampled), {}).tokens, plain(prompt, params(sampled)).tokens)
        << "sampled " << sampled;
  }

  // A text of ordinary tokens (no end token, none among the trailing special ones) from ids 2 and
  // up: none of them is in the draft vocabulary of ids [0, 2) and the special tokens.
  std::vector<int32_t> text = prompt_tokens(40, n_vocab);
  for (int32_t& t : text) t = 2 + t % int32_t(dv.tail_first - 2);
  SessionOptions so{.n_ctx = 160};
  so.spec.mode = spec::Mode::Mtp;
  so.spec.depth = 2;
  so.spec.mtp_acceptance_knob = 1.0;
  so.spec.draft_vocab = 2;
  Session s(m, *tiny_->tok, so);
  GenerateParams p = params(false);
  p.max_tokens = 20;
  p.forced.assign(text.begin() + 20, text.end());
  const GenerateResult r = s.generate(std::span(text).first(20), p, {});
  EXPECT_EQ(r.tokens, p.forced);
  ASSERT_GT(r.telemetry.spec->drafted, 0);
  EXPECT_EQ(r.telemetry.spec->accepted, 0);
}

TEST(DraftVocab, TheFirstIdsAndTheTrailingSpecialTokens) {
  using tokenizer::TokenType;
  tokenizer::Vocab v;
  v.types.assign(10, TokenType::Normal);
  v.types[8] = TokenType::Control;
  v.types[9] = TokenType::UserDefined;
  v.types[3] = TokenType::Control;  // not trailing: only the first ids keep it
  const model::DraftVocab dv = spec::draft_vocab(v, 4, 12);  // ids 10 and 11: past the tokenizer
  EXPECT_EQ(dv.head, 4);
  EXPECT_EQ(dv.tail_first, 8);
  EXPECT_EQ(dv.size(12), 8);
  for (int32_t id : {0, 3, 8, 11}) EXPECT_TRUE(dv.contains(id)) << id;
  for (int32_t id : {4, 7}) EXPECT_FALSE(dv.contains(id)) << id;
  EXPECT_EQ(dv.id(3), 3);
  EXPECT_EQ(dv.id(4), 8);
  EXPECT_EQ(dv.id(7), 11);
  EXPECT_TRUE(spec::draft_vocab(v, 0, 12).whole());
  EXPECT_TRUE(spec::draft_vocab(v, 12, 12).whole());
  EXPECT_TRUE(spec::draft_vocab(v, 8, 12).whole());  // [0, 8) and [8, 12) leave nothing out
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param);
}

INSTANTIATE_TEST_SUITE_P(HeadArchitectures, MtpDecode,
                         ::testing::Combine(::testing::Values("qwen35moe", "qwen4exp"),
                                            ::testing::ValuesIn(backend::testing::backend_names())),
                         case_name);

INSTANTIATE_TEST_SUITE_P(AllArchitectures, SpecDecode,
                         ::testing::Combine(::testing::Values("qwen3moe", "qwen3next", "qwen35moe", "qwen4exp"),
                                            ::testing::ValuesIn(backend::testing::backend_names())),
                         case_name);

}  // namespace
}  // namespace strata::decode
