#include "backend/cpu/ops_rope.h"

#include <cmath>
#include <vector>

namespace strata::cpu {

void rope_neox(Tensor x, std::span<const int32_t> positions, int64_t head_dim, int64_t rope_dim,
               float theta) {
  constexpr const char* op = "rope_neox";
  check_tensor(op, "x", x);
  require(int64_t(positions.size()) == x.rows, op, positions.size(), " positions for ", x.rows,
          " rows");
  require(head_dim > 0 && x.cols % head_dim == 0, op, "head_dim ", head_dim,
          " does not divide the ", x.cols, " columns of x");
  require(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= head_dim, op, "rope_dim ", rope_dim,
          " must be even and within head_dim ", head_dim);
  require(theta > 0.0f, op, "theta must be positive, not ", theta);

  const int64_t half = rope_dim / 2;
  std::vector<float> inv_freq(half), cos_v(half), sin_v(half);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = float(2 * i) / float(rope_dim);
    inv_freq[i] = 1.0f / float(std::pow(double(theta), double(exponent)));
  }
  const int64_t n_heads = x.cols / head_dim;
  for (int64_t r = 0; r < x.rows; ++r) {
    const float pos = float(positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      cos_v[i] = float(std::cos(double(angle)));
      sin_v[i] = float(std::sin(double(angle)));
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x.data + r * x.stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        const float ac = a * cos_v[i];
        const float bs = b * sin_v[i];
        const float bc = b * cos_v[i];
        const float as = a * sin_v[i];
        v[i] = ac - bs;
        v[i + half] = bc + as;
      }
    }
  }
}

}  // namespace strata::cpu
