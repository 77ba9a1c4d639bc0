#include "backend/cpu/ops_sampling_sums.h"

#include <cmath>
#include <limits>

namespace strata::cpu {

void sampling_sums(const Tensor& x, float temperature, Tensor sums) {
  constexpr const char* op = "sampling_sums";
  check_tensor(op, "x", x);
  check_tensor(op, "sums", sums);
  require(sums.rows == x.rows && sums.cols == 1, op, "x ", shape(x), " needs sums [", x.rows, " x 1], got ",
          shape(sums));
  require(temperature > 0 && std::isfinite(temperature), op, "temperature must be > 0, got ", temperature);
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* row = x.data + r * x.stride;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < x.cols; ++c)
      if (row[c] > max) max = row[c];
    backend::ChunkedSum sum;
    for (int64_t c = 0; c < x.cols; ++c)
      if (!std::isnan(row[c])) sum.add(c, backend::sampling_weight(row[c], max, temperature));
    sums.data[r * sums.stride] = sum.total();
  }
}

}  // namespace strata::cpu
