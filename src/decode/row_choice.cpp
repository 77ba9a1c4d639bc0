#include "decode/row_choice.h"

#include <cmath>

#include "util/error.h"
#include "util/rng.h"

namespace strata::decode {

RowChoice::RowChoice(const SamplingParams& params, bool rows_unread)
    : greedy_(rows_unread && params.plain_greedy()), seed_(params.seed) {
  if (!rows_unread) return;
  candidates_.k = params.device_candidates();
  if (params.device_row_sum()) candidates_.sum_temperature = params.temperature;
  if (params.device_draw()) candidates_.draw_temperature = params.temperature;
}

void RowChoice::at_positions(uint64_t first, int64_t rows) {
  first_position_ = first;
  if (candidates_.draw_temperature <= 0.0f) return;
  candidates_.uniforms.resize(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) candidates_.uniforms[size_t(r)] = counter_uniform(seed_, first + uint64_t(r));
}

int32_t RowChoice::choose(Sampler& sampler, std::span<float> logits, int64_t r,
                          std::span<const int32_t> history, uint64_t position,
                          const std::function<void(std::span<float>)>& filter) {
  if (greedy_) {
    const int32_t id = choices_.at(size_t(r));
    if (id < 0) fail("sampling: every logit is NaN");
    return id;
  }
  if (candidates_.draw_temperature > 0.0f) {
    if (position != first_position_ + uint64_t(r))
      fail("sampling: window row ", r, " was drawn for position ", first_position_ + uint64_t(r), ", not ",
           position);
    const int32_t id = candidates_.columns.at(size_t(r));
    if (id < 0) fail("sampling: every logit is NaN");
    return id;
  }
  if (candidates_.k > 0) {
    const size_t k = size_t(candidates_.k);
    const float row_sum = candidates_.sums.empty() ? NAN : candidates_.sums.at(size_t(r));
    return sampler.sample_candidates_at(std::span(candidates_.columns).subspan(size_t(r) * k, k),
                                        std::span(candidates_.logits).subspan(size_t(r) * k, k), row_sum,
                                        position);
  }
  const size_t n = size_t(sampler.n_vocab());
  if (logits.size() < (size_t(r) + 1) * n) fail("sampling: no logits for window row ", r);
  const auto row = logits.subspan(size_t(r) * n, n);
  if (filter) filter(row);
  return sampler.sample_at(row, history, position);
}

}  // namespace strata::decode
