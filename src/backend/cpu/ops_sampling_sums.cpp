#include "backend/cpu/ops_sampling_sums.h"

#include <cmath>
#include <limits>
#include <vector>

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

void draw(const Tensor& x, float temperature, const Tensor& uniforms, std::span<int32_t> index) {
  constexpr const char* op = "draw";
  check_tensor(op, "x", x);
  check_tensor(op, "uniforms", uniforms);
  require(uniforms.rows == x.rows && uniforms.cols == 1, op, "x ", shape(x), " needs uniforms [", x.rows,
          " x 1], got ", shape(uniforms));
  require(index.size() == size_t(x.rows), op, "x ", shape(x), " needs index [", x.rows, " x 1], got ",
          index.size(), " ids");
  require(temperature > 0 && std::isfinite(temperature), op, "temperature must be > 0, got ", temperature);
  std::vector<float> weights(size_t(x.cols));
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* row = x.data + r * x.stride;
    const float u = uniforms.data[r * uniforms.stride];
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < x.cols; ++c)
      if (row[c] > max) max = row[c];
    for (int64_t c = 0; c < x.cols; ++c)
      weights[size_t(c)] = std::isnan(row[c]) ? 0.0f : backend::sampling_weight(row[c], max, temperature);
    index[size_t(r)] = int32_t(backend::draw_row(weights.data(), x.cols, u));
  }
}

}  // namespace strata::cpu
