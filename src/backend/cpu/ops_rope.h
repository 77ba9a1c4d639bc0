// Rotary position embedding, NeoX layout (rotate_half), as Qwen models apply it.
#pragma once

#include <span>

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

// In place on every head_dim group of every row r: for i < rope_dim / 2, with
// a = x[i], b = x[i + rope_dim/2], angle = float(positions[r]) * inv_freq[i]:
//   x[i] = a * cos - b * sin;  x[i + rope_dim/2] = b * cos + a * sin
// (two products then one add, as torch's q * cos + rotate_half(q) * sin). Columns from rope_dim
// to head_dim pass through.
//
// inv_freq[i] = 1 / float(theta ^ (float(2i) / float(rope_dim))), in fp32 as the reference
// builds it. The angle is the fp32 product, as the reference's fp32 matmul of inv_freq and the
// positions gives; cos and sin are then taken in double of that fp32 angle and rounded to float
// (correctly rounded in practice, where torch's fp32 cos/sin may differ by an ulp).
void rope_neox(Tensor x, std::span<const int32_t> positions, int64_t head_dim, int64_t rope_dim,
               float theta);

}  // namespace strata::cpu
