#include "backend/cpu/ops_argmax.h"

#include <cmath>

namespace strata::cpu {

void argmax(const Tensor& x, std::span<int32_t> index, Tensor prob) {
  constexpr const char* op = "argmax";
  check_tensor(op, "x", x);
  check_tensor(op, "prob", prob);
  const bool probs = prob.rows > 0;
  require(int64_t(index.size()) == x.rows && (!probs || (prob.rows == x.rows && prob.cols == 1)),
          op, "x ", shape(x), " needs one index and a prob [", x.rows, " x 1], got ",
          index.size(), " and ", shape(prob));
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* row = x.data + r * x.stride;
    int32_t best = -1;
    for (int64_t c = 0; c < x.cols; ++c)
      if (!std::isnan(row[c]) && (best < 0 || row[c] > row[best])) best = int32_t(c);
    index[size_t(r)] = best;
    if (!probs) continue;
    if (best < 0 || !std::isfinite(row[best])) {
      prob.data[r * prob.stride] = 1.0f;
      continue;
    }
    const double top = row[best];
    double sum = 0;
    for (int64_t c = 0; c < x.cols; ++c)
      if (!std::isnan(row[c])) sum += std::exp(double(row[c]) - top);
    prob.data[r * prob.stride] = float(1.0 / sum);
  }
}

}  // namespace strata::cpu
