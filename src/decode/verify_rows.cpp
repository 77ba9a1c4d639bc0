#include "decode/verify_rows.h"

#include <algorithm>

#include "spec/verify.h"

namespace strata::decode {

WindowRows verify_rows(std::span<const int32_t> window, const RowHooks& hooks) {
  const int64_t rows = std::max<int64_t>(1, int64_t(window.size()));
  WindowRows w;
  w.kept = rows;
  for (int64_t r = 0; r < rows; ++r) {
    if (hooks.cancelled()) {
      w.kept = r + 1;
      w.done = true;
      return w;
    }
    const int32_t id = hooks.choose(r);
    const bool drafted = r + 1 < rows;
    const int32_t draft = drafted ? window[size_t(r + 1)] : id;
    const int32_t taken = drafted && id != draft && hooks.typical && hooks.typical(r, draft) ? draft : id;
    if (hooks.take(r, taken)) {
      w.kept = r + 1;
      w.done = true;
      return w;
    }
    if (!drafted) return w;
    ++w.judged;
    if (taken != draft) {
      w.kept = r + 1;
      return w;
    }
    ++w.accepted;
  }
  return w;
}

std::function<bool(int64_t, int32_t)> typical_rule(const spec::Options& o, std::span<const float> logits,
                                                   int64_t n_vocab, float temperature) {
  if (!o.typical) return {};
  return [&o, logits, n_vocab, temperature](int64_t r, int32_t draft) {
    return spec::typical_accept(logits.subspan(size_t(r * n_vocab), size_t(n_vocab)), draft, temperature,
                                o.typical_epsilon, o.typical_delta);
  };
}

}  // namespace strata::decode
