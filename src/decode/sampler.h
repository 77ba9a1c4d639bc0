// Token selection from logits: penalties, then greedy or temperature sampling restricted by top-k,
// top-p and min-p. Deterministic: the same logits, history and seed give the same token on every
// machine (fixed sort order, ties broken by token id, our own RNG).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>


namespace strata::decode {

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
  // The k whose top-k candidates (Backend::top_k, where the logits are) are all a sampled choice
  // reads (temperature sampling with top-k, no penalties): 0 when it needs the whole row.
  int32_t device_top_k() const;

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
  // sample_at from a row's top-k candidates as Backend::top_k gives them (k = device_top_k(),
  // column -1 past the row's non-NaN values): the same token as sample_at on the whole row.
  int32_t sample_top_at(std::span<const int32_t> columns, std::span<const float> logits, uint64_t position);

  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };
  void apply_penalties(std::span<const int32_t> history);
  int32_t choose(std::span<const float> logits, std::span<const int32_t> history, uint64_t counter);
  // Temperature sampling over candidates_, already in the sampler's order and cut to top-k.
  int32_t sample_sorted(uint64_t counter);
  int32_t draw(float uniform);

  SamplingParams params_;
  int64_t n_vocab_;
  uint64_t draws_ = 0;  // sample()'s counter
  std::vector<Candidate> candidates_;
  std::vector<float> probs_;
  std::unordered_map<int32_t, int32_t> counts_;
};

// Greedy choice without a Sampler: the lowest id among the maxima.
int32_t argmax(std::span<const float> logits);

}  // namespace strata::decode
