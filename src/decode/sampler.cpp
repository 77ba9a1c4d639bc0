#include "decode/sampler.h"

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "backend/sampling_weight.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::decode {

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0)
    fail("sampling: temperature must be >= 0, got ", temperature);
  if (top_k < 0) fail("sampling: top_k must be >= 0, got ", top_k);
  if (!(top_p > 0 && top_p <= 1)) fail("sampling: top_p must be in (0, 1], got ", top_p);
  if (!(min_p >= 0 && min_p <= 1)) fail("sampling: min_p must be in [0, 1], got ", min_p);
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty))
    fail("sampling: repetition_penalty must be > 0, got ", repetition_penalty);
  if (!std::isfinite(presence_penalty) || std::fabs(presence_penalty) > 2)
    fail("sampling: presence_penalty must be in [-2, 2], got ", presence_penalty);
  if (!std::isfinite(frequency_penalty) || std::fabs(frequency_penalty) > 2)
    fail("sampling: frequency_penalty must be in [-2, 2], got ", frequency_penalty);
  if (penalty_last_n < -1) fail("sampling: penalty_last_n must be >= -1, got ", penalty_last_n);
}

static_assert(kMaxNucleus <= backend::Backend::kMaxTopK, "a nucleus's candidates come from Backend::top_k");

int32_t SamplingParams::device_candidates() const {
  if (temperature <= 0.0f || penalized()) return 0;
  if (top_k > 0) return top_k <= backend::Backend::kMaxTopK ? top_k : 0;
  return nucleus() ? kMaxNucleus : 0;
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[size_t(best)]) best = int32_t(i);
  return best;
}

Sampler::Sampler(const SamplingParams& params, int64_t n_vocab)
    : params_(params), n_vocab_(n_vocab) {
  params_.validate();
  if (n_vocab <= 0) fail("sampling: vocabulary is empty");
}

void Sampler::apply_penalties(std::span<const int32_t> history) {
  const bool any = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                   params_.frequency_penalty != 0.0f;
  if (!any || history.empty() || params_.penalty_last_n == 0) return;
  size_t first = 0;
  if (params_.penalty_last_n > 0 && history.size() > size_t(params_.penalty_last_n))
    first = history.size() - size_t(params_.penalty_last_n);
  counts_.clear();
  for (size_t i = first; i < history.size(); ++i)
    if (history[i] >= 0 && history[i] < n_vocab_) ++counts_[history[i]];
  // candidates_ is indexed by id at this point (filled in id order, not yet filtered).
  for (const auto& [id, count] : counts_) {
    float& l = candidates_[size_t(id)].logit;
    l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    l -= params_.presence_penalty + params_.frequency_penalty * float(count);
  }
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  return choose(logits, history, draws_++);
}

int32_t Sampler::sample_at(std::span<const float> logits, std::span<const int32_t> history,
                           uint64_t position) {
  return choose(logits, history, position);
}

namespace {

struct ByLogit {
  template <class C>
  bool operator()(const C& a, const C& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};

}  // namespace

int32_t Sampler::choose(std::span<const float> logits, std::span<const int32_t> history,
                        uint64_t counter) {
  if (int64_t(logits.size()) != n_vocab_)
    fail("sampling: got ", logits.size(), " logits for a vocabulary of ", n_vocab_);
  candidates_.resize(size_t(n_vocab_));
  for (int64_t i = 0; i < n_vocab_; ++i) candidates_[size_t(i)] = {int32_t(i), logits[size_t(i)]};
  apply_penalties(history);

  // NaN logits never win; if every logit is NaN that is a model fault, not a choice.
  std::erase_if(candidates_, [](const Candidate& c) { return std::isnan(c.logit); });
  if (candidates_.empty()) fail("sampling: every logit is NaN");
  if (params_.temperature <= 0.0f) return std::min_element(candidates_.begin(), candidates_.end(), ByLogit())->id;

  if (params_.top_k > 0 && size_t(params_.top_k) < candidates_.size()) {
    std::nth_element(candidates_.begin(), candidates_.begin() + params_.top_k, candidates_.end(), ByLogit());
    candidates_.resize(size_t(params_.top_k));
    std::sort(candidates_.begin(), candidates_.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  }
  const float max = std::min_element(candidates_.begin(), candidates_.end(), ByLogit())->logit;
  backend::ChunkedSum z;
  for (Candidate& c : candidates_) {
    c.weight = backend::sampling_weight(c.logit, max, params_.temperature);
    z.add(c.id, c.weight);
  }
  if (!params_.nucleus()) return params_.top_k > 0 ? draw_in_id_order(z.total(), counter) : draw_plain(counter);
  const size_t best = std::min(candidates_.size(), size_t(kMaxNucleus));
  std::nth_element(candidates_.begin(), candidates_.begin() + std::ptrdiff_t(best), candidates_.end(), ByLogit());
  candidates_.resize(best);
  std::sort(candidates_.begin(), candidates_.end(), ByLogit());
  return sample_kept(z.total(), counter);
}

int32_t Sampler::sample_candidates_at(std::span<const int32_t> columns, std::span<const float> logits,
                                      float row_sum, uint64_t position) {
  const int32_t k = params_.device_candidates();
  if (k == 0 || columns.size() != size_t(k) || logits.size() != size_t(k))
    fail("sampling: ", columns.size(), " candidates for ", k, k == 0 ? " (these parameters need the whole row)" : "");
  if (params_.device_row_sum() == std::isnan(row_sum))
    fail("sampling: ", params_.device_row_sum() ? "no" : "a", " row sum with the candidates for top_k ",
         params_.top_k);
  candidates_.clear();
  for (size_t i = 0; i < columns.size(); ++i) {
    if (columns[i] < 0) break;
    if (columns[i] >= n_vocab_) fail("sampling: candidate ", columns[i], " is outside the vocabulary of ", n_vocab_);
    candidates_.push_back({columns[i], logits[i]});
  }
  if (candidates_.empty()) fail("sampling: every logit is NaN");
  const float max = candidates_[0].logit;
  for (Candidate& c : candidates_) c.weight = backend::sampling_weight(c.logit, max, params_.temperature);
  if (params_.device_row_sum()) return sample_kept(row_sum, position);
  // Top-k: the candidates are K, their sum taken in id order.
  kept_.clear();
  for (const Candidate& c : candidates_) kept_.emplace_back(c.id, c.weight);
  std::sort(kept_.begin(), kept_.end());
  backend::ChunkedSum z;
  for (const auto& [id, w] : kept_) z.add(id, w);
  return sample_kept(z.total(), position);
}

namespace {

// Step 4 over `kept` in id order, p(k) its probability: the first whose running sum of p exceeds
// u times their total (the last one when rounding leaves u at the total).
template <class Range, class IdOf, class ProbOf>
int32_t draw_in_order(const Range& kept, float u, IdOf id_of, ProbOf p_of) {
  double total = 0;
  for (const auto& k : kept) total += p_of(k);
  const double target = double(u) * total;
  double cum = 0;
  for (const auto& k : kept) {
    cum += p_of(k);
    if (target < cum) return id_of(k);
  }
  return id_of(kept.back());
}

}  // namespace

int32_t Sampler::draw_in_id_order(float z, uint64_t counter) const {
  return draw_in_order(
      candidates_, counter_uniform(params_.seed, counter), [](const Candidate& c) { return c.id; },
      [z](const Candidate& c) { return c.weight / z; });
}

int32_t Sampler::draw_plain(uint64_t counter) {
  row_weights_.assign(size_t(n_vocab_), 0.0f);
  for (const Candidate& c : candidates_) row_weights_[size_t(c.id)] = c.weight;
  const int64_t id = backend::draw_row(row_weights_.data(), n_vocab_, counter_uniform(params_.seed, counter));
  if (id < 0) fail("sampling: every logit is NaN");
  return int32_t(id);
}

int32_t Sampler::sample_kept(float z, uint64_t counter) {
  probs_.resize(candidates_.size());
  for (size_t i = 0; i < candidates_.size(); ++i) probs_[i] = candidates_[i].weight / z;
  size_t n = candidates_.size();
  if (params_.top_p < 1.0f) {
    double cum = 0;
    size_t i = 0;
    while (i < n) {
      cum += probs_[i++];
      if (cum >= params_.top_p) break;
    }
    n = i;
  }
  if (params_.min_p > 0.0f) {
    const float floor = params_.min_p * probs_[0];
    size_t i = 1;
    while (i < n && probs_[i] >= floor) ++i;
    n = i;
  }
  kept_.resize(n);
  for (size_t i = 0; i < n; ++i) kept_[i] = {candidates_[i].id, probs_[i]};
  if (!std::is_sorted(kept_.begin(), kept_.end())) std::sort(kept_.begin(), kept_.end());
  return draw_in_order(
      kept_, counter_uniform(params_.seed, counter), [](const auto& k) { return k.first; },
      [](const auto& k) { return k.second; });
}

}  // namespace strata::decode
