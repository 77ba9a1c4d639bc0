#include "spec/mtp_drafter.h"

#include <algorithm>
#include <chrono>
#include <string_view>

#include "util/error.h"

namespace strata::spec {

model::DraftVocab draft_vocab(const tokenizer::Vocab& vocab, int64_t head, int64_t n_vocab) {
  if (head <= 0 || head >= n_vocab) return {};
  int64_t tail_first = n_vocab;
  while (tail_first > head &&
         (tail_first - 1 >= int64_t(vocab.types.size()) ||
          vocab.types[size_t(tail_first - 1)] != tokenizer::TokenType::Normal))
    --tail_first;
  if (tail_first <= head) return {};
  return {head, tail_first};
}

int64_t default_draft_vocab(const backend::Backend& backend) {
  return std::string_view(backend.name()) == "cpu" ? 65536 : 0;
}

model::DraftVocab draft_vocab(const model::Model& model, const tokenizer::Vocab& vocab,
                              std::optional<int64_t> head) {
  return draft_vocab(vocab, head.value_or(default_draft_vocab(model.backend())),
                     model.config().n_vocab);
}

MtpDrafter::MtpDrafter(model::Model& model, int64_t n_ctx, model::DraftVocab vocab)
    : model_(model), state_(model.new_mtp_state(n_ctx)), vocab_(vocab) {}

void MtpDrafter::observe(int64_t first, std::span<const float> hidden) {
  const int64_t cols = model_.hidden_cols();
  const int64_t have = int64_t(rows_.size()) / cols;
  if (rows_.empty() || first < first_ || first > first_ + have) {
    rows_.clear();
    first_ = first;
  } else {
    rows_.resize(size_t((first - first_) * cols));
  }
  rows_.insert(rows_.end(), hidden.begin(), hidden.end());
  const int64_t excess = int64_t(rows_.size()) / cols - kMaxPending;
  if (excess > 0) {
    rows_.erase(rows_.begin(), rows_.begin() + std::ptrdiff_t(excess * cols));
    first_ += excess;
  }
}

MtpDrafter::Drafts MtpDrafter::draft(std::span<const int32_t> history, int k) {
  Drafts d;
  const int64_t cols = model_.hidden_cols();
  const int64_t n = int64_t(history.size()) - 1;  // the last token's position
  const int64_t rows = int64_t(rows_.size()) / cols;
  if (k <= 0 || rows == 0 || first_ + rows != n) return d;
  // Catch-up: row t joins the hidden state of position first_ + t with the token after it.
  // Positions the head never saw (a prompt reused from an earlier call) stay as they are.
  state_.n_past = first_;
  const auto next = history.subspan(size_t(first_ + 1), size_t(rows));
  const auto t0 = std::chrono::steady_clock::now();
  // Only the head's greedy choice comes back from each step, not its logits.
  std::vector<int32_t> best;
  std::vector<float> prob;
  model_.mtp_forward(next, rows_, state_, model::LogitsMode::Last, &chain_, &best, &prob, vocab_);
  // The catch-up rows cost one head row per token however often the head drafts; its first
  // draft comes out of the same window.
  if (rows > 1) {
    d.catch_up_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() *
                         double(rows - 1) / double(rows);
    d.catch_up_rows = int(rows - 1);
  }
  rows_.clear();
  first_ = n;
  for (int j = 0; j < k && state_.n_past < state_.n_ctx(); ++j) {
    if (j > 0) {
      const std::span<const float> last(chain_.end() - cols, chain_.end());
      std::vector<float> h(last.begin(), last.end());
      model_.mtp_forward(std::span(&d.tokens.back(), 1), h, state_, model::LogitsMode::Last, &chain_, &best,
                         &prob, vocab_);
    }
    if (best[0] < 0) break;  // every logit NaN: no draft
    d.tokens.push_back(best[0]);
    d.probs.push_back(prob[0]);
  }
  // The chained steps' cache rows are past the sequence: the next catch-up writes them again.
  state_.n_past = n;
  return d;
}

}  // namespace strata::spec
