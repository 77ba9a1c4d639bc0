// Q4_0 weights (ggml block_q4_0): 32 elements, fp16 d, 4-bit q; x = (q - 8) * d, element j in
// the low nibble of byte j and element j + 16 in its high nibble. Dotted with Q8_0.
//
// Reference dot: as Q8_0 (exact integer block sum, lane b % 8 fma, reduce8).
#include <algorithm>
#include <cmath>

#include "quant/formats/blocks.h"
#include "quant/formats/formats.h"

namespace strata::quant {

namespace {

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(blocks);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < 16; ++j) {
      out[b * kQK + j] = ((x[b].qs[j] & 0xF) - 8) * d;
      out[b * kQK + j + 16] = ((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

// The element of largest magnitude maps to code 0 (d = max / -8), so the full [-8, 7] range is
// used on the side of the extreme; error at most d / 2 elsewhere.
void quantize(const float* in, void* blocks, int64_t n) {
  auto* y = static_cast<BlockQ4_0*>(blocks);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = in + b * kQK;
    float max = 0.0f;
    for (int j = 0; j < kQK; ++j)
      if (std::fabs(x[j]) > std::fabs(max)) max = x[j];
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    uint8_t q[kQK];
    for (int j = 0; j < kQK; ++j)
      q[j] = uint8_t(std::clamp(std::nearbyint(x[j] * id) + 8.0f, 0.0f, 15.0f));
    for (int j = 0; j < 16; ++j) y[b].qs[j] = uint8_t(q[j] | (q[j + 16] << 4));
  }
}

// d of either sign (quantize makes it negative for a positive extreme), codes all random.
void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* y = static_cast<BlockQ4_0*>(blocks);
  for (int64_t b = 0; b < nblocks; ++b) {
    y[b].d = uint16_t(random_scale(rng, 2.0f / 8.0f) | ((rng.next() >> 63) << 15));
    random_bytes(rng, y[b].qs, sizeof(y[b].qs));
  }
}

float dot_ref(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8_0*>(a);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t s = 0;
    for (int j = 0; j < 16; ++j)
      s += ((x[b].qs[j] & 0xF) - 8) * y[b].qs[j] + ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + 16];
    const float d = fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d);
    lanes[b % 8] = std::fma(d, float(s), lanes[b % 8]);
  }
  return reduce8(lanes);
}

}  // namespace

const FormatKernels kQ4_0Kernels = {Type::Q4_0,    ActFormat::Q8_0, dequantize,    quantize,
                                    random_blocks, dot_ref,         dot_q4_0_avx2, 0.0f};

}  // namespace strata::quant
