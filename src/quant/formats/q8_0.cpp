// Q8_0 weights (ggml block_q8_0): 32 elements, fp16 d, int8 q; x = q * d. Dotted with Q8_0.
//
// Reference dot: per block the exact integer sum s = sum q_w * q_a, then lane b % 8 (block b)
// takes fma(d_w * d_a, float(s), lane), and the lanes are reduced by reduce8.
#include <algorithm>
#include <cmath>

#include "quant/formats/blocks.h"
#include "quant/formats/formats.h"

namespace strata::quant {

namespace {

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(blocks);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < kQK; ++j) out[b * kQK + j] = x[b].qs[j] * d;
  }
}

// d = amax / 127, q = round(x / d) (ties to even): error at most d / 2 per element (plus the
// rounding of d to fp16).
void quantize(const float* in, void* blocks, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(blocks);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = in + b * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK; ++j)
      y[b].qs[j] = int8_t(std::clamp(std::nearbyint(x[j] * id), -127.0f, 127.0f));
  }
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* y = static_cast<BlockQ8_0*>(blocks);
  for (int64_t b = 0; b < nblocks; ++b) {
    y[b].d = random_scale(rng, 2.0f / 128.0f);
    random_bytes(rng, reinterpret_cast<uint8_t*>(y[b].qs), sizeof(y[b].qs));
  }
}

float dot_ref(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t s = 0;
    for (int j = 0; j < kQK; ++j) s += x[b].qs[j] * y[b].qs[j];
    const float d = fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d);
    lanes[b % 8] = std::fma(d, float(s), lanes[b % 8]);
  }
  return reduce8(lanes);
}

}  // namespace

const FormatKernels kQ8_0Kernels = {Type::Q8_0,       ActFormat::Q8_0,    dequantize,
                                    quantize,         random_blocks,      dot_ref,
                                    dot_q8_0_avx2,    0.0f,               dot_rows_q8_0_avx2,
                                    dot_q8_0_avx512,  dot_rows_q8_0_avx512};

}  // namespace strata::quant
