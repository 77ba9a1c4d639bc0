// Token selection from logits: penalties, then greedy or temperature sampling restricted by top-k,
// top-p and min-p. Deterministic: the same logits, history and seed give the same token on every
// machine (fixed orders, ties broken by token id, our own exp and RNG).
//
// Temperature sampling, exactly:
//   1. K: the top_k largest logits (value descending, lower id first among equals; NaN never),
//      or every non-NaN logit when top_k is 0.
//   2. weights w = backend::sampling_weight(logit, max over K, temperature), their sum Z over K
//      in id order by chunks (backend::kSumChunk), each token's p = w / Z.
//   3. Where top_p < 1 or min_p > 0, the nucleus: K's tokens in sampler order, at most
//      kMaxNucleus of them, while the running sum of p (in double) is below top_p, then those
//      with p >= min_p * the first's p.
//   4. The draw: u = counter_uniform(seed, counter); walking the kept tokens in id order, the
//      first whose running sum of p exceeds u times their total. Plain temperature sampling (no
//      top-k, no nucleus) draws in two steps instead, a chunk of kSumChunk columns and then a
//      column in it (backend/sampling_weight.h, pick_chunk and pick_column), which a backend
//      takes where the logits are (Backend::draw), so only the token comes back.
// Every step reads only K's best kMaxNucleus tokens and Z, so a backend can hand over those
// (Backend::top_k, Backend::sampling_sums) instead of the row, and no step sorts the row.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>


namespace strata::decode {

// The most tokens a nucleus (top-p, min-p) keeps: a nucleus larger than this, which only a nearly
// flat distribution gives, is cut to its best kMaxNucleus tokens.
constexpr int32_t kMaxNucleus = 1024;

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repetition_penalty = 1.0f;  // CTRL-style: positive logits divided, negative multiplied
  float presence_penalty = 0.0f;    // OpenAI-style: subtracted once per token seen
  float frequency_penalty = 0.0f;   // OpenAI-style: subtracted per occurrence
  int32_t penalty_last_n = 256;     // history window the penalties look at; -1: all
  uint64_t seed = 0;

  bool operator==(const SamplingParams&) const = default;
  // Throws strata::Error naming the parameter that is out of range.
  void validate() const;
  // Whether the choice is the logits' argmax as they come (greedy, no penalties): what
  // Backend::argmax computes where the logits are.
  bool plain_greedy() const {
    return temperature <= 0.0f && !penalized();
  }
  // The candidates per row that are all a sampled choice reads (Backend::top_k, where the logits
  // are): top_k itself with 0 < top_k <= Backend::kMaxTopK, kMaxNucleus with a nucleus and no
  // top-k; 0 (the whole row) for greedy choices, penalties, a larger top-k or plain temperature
  // sampling.
  int32_t device_candidates() const;
  // Whether those candidates need the row's softmax sum too (Backend::sampling_sums): without
  // top-k, Z is over the whole row.
  bool device_row_sum() const { return device_candidates() > 0 && top_k == 0; }
  // Where top-p or min-p cut the candidates.
  bool nucleus() const { return top_p < 1.0f || min_p > 0.0f; }
  // Plain temperature sampling, which a backend draws where the logits are (Backend::draw) from
  // the position's uniform number.
  bool device_draw() const { return temperature > 0.0f && !penalized() && top_k == 0 && !nucleus(); }

 private:
  bool penalized() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int64_t n_vocab);

  // Picks the next token. `logits` has n_vocab entries; `history` holds the tokens so far
  // (prompt and output), which the penalties read. Each call draws the next random number of the
  // seed's stream.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // The same with the random number keyed by `position` (counter_uniform(seed, position)), so the
  // token chosen for a position is the same whether or not other positions were sampled in
  // between: generation passes the token's position, and speculative verification re-samples
  // drafted positions with the numbers plain decoding would use.
  int32_t sample_at(std::span<const float> logits, std::span<const int32_t> history,
                    uint64_t position);
  // sample_at from a row's candidates as Backend::top_k gives them (k = device_candidates(),
  // column -1 past the row's non-NaN values) and, where device_row_sum(), the row's softmax sum
  // (Backend::sampling_sums; NaN otherwise): the same token as sample_at on the whole row.
  int32_t sample_candidates_at(std::span<const int32_t> columns, std::span<const float> logits, float row_sum,
                               uint64_t position);

  const SamplingParams& params() const { return params_; }
  int64_t n_vocab() const { return n_vocab_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float weight = 0.0f;  // backend::sampling_weight, once K's largest logit is known
  };
  void apply_penalties(std::span<const int32_t> history);
  int32_t choose(std::span<const float> logits, std::span<const int32_t> history, uint64_t counter);
  // Steps 3 and 4 over candidates_ (K, or its best kMaxNucleus in sampler order where a nucleus is
  // cut; weights set), whose weights sum to `z` over K.
  int32_t sample_kept(float z, uint64_t counter);
  // Step 4 alone where nothing is cut (no nucleus) and candidates_ are K in id order: the same
  // sums in the same order as sample_kept, without its copies of the row.
  int32_t draw_in_id_order(float z, uint64_t counter) const;
  // Step 4 of plain temperature sampling (candidates_: every non-NaN logit, in id order).
  int32_t draw_plain(uint64_t counter);

  SamplingParams params_;
  int64_t n_vocab_;
  uint64_t draws_ = 0;  // sample()'s counter
  std::vector<Candidate> candidates_;
  std::vector<float> probs_;
  std::vector<float> row_weights_;  // draw_plain: the row's weights by column, 0 for NaN
  std::vector<std::pair<int32_t, float>> kept_;  // (id, p), the draw's order
  std::unordered_map<int32_t, int32_t> counts_;
};

// Greedy choice without a Sampler: the lowest id among the maxima.
int32_t argmax(std::span<const float> logits);

}  // namespace strata::decode
