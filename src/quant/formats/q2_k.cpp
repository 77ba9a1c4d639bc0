// Q2_K weights (ggml block_q2_K): 256 elements in 16 groups of 16; group s has a 4-bit scale
// (low nibble of scales[s]) and 4-bit min (high nibble); x = d * sc * q - dmin * m, q in 0..3.
// Element e = 128 h + 32 j + 16 k + l (h < 2, j < 4, k < 2, l < 16) is bits 2 j of
// qs[32 h + 16 k + l], in group e / 16. Dotted with Q8_K.
//
// Reference dot: per super-block the exact integer sums S = sum_s sc_s * sum_{e in s} q_e a_e and
// M = sum_s m_s * bsums_s; lane b % 8 takes fma(d * d_a, S, lane) then fma(-(dmin * d_a), M, lane);
// the lanes are reduced by reduce8.
#include <cstring>

#include "quant/formats/blocks.h"
#include "quant/formats/fit.h"
#include "quant/formats/formats.h"

namespace strata::quant {

namespace {

void codes(const BlockQ2_K& x, uint8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, j = (e / 32) % 4, k = (e / 16) % 2, l = e % 16;
    q[e] = (x.qs[32 * h + 16 * k + l] >> (2 * j)) & 3;
  }
}

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockQ2_K*>(blocks);
  for (int64_t b = 0; b < n / kQK_K; ++b, out += kQK_K) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    uint8_t q[kQK_K];
    codes(x[b], q);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * (x[b].scales[s] & 0xF), ml = dmin * (x[b].scales[s] >> 4);
      for (int l = 0; l < 16; ++l) out[16 * s + l] = dl * q[16 * s + l] - ml;
    }
  }
}

void quantize(const float* in, void* blocks, int64_t n) {
  auto* y = static_cast<BlockQ2_K*>(blocks);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t q[kQK_K], sc[16], m[16];
    fit_affine(in + b * kQK_K, 16, 3, 15, q, &y[b].d, &y[b].dmin, sc, m);
    for (int s = 0; s < 16; ++s) y[b].scales[s] = uint8_t(sc[s] | (m[s] << 4));
    std::memset(y[b].qs, 0, sizeof(y[b].qs));
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, j = (e / 32) % 4, k = (e / 16) % 2, l = e % 16;
      y[b].qs[32 * h + 16 * k + l] |= uint8_t(q[e] << (2 * j));
    }
  }
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* y = static_cast<BlockQ2_K*>(blocks);
  for (int64_t b = 0; b < nblocks; ++b) {
    random_bytes(rng, y[b].scales, sizeof(y[b].scales));
    random_bytes(rng, y[b].qs, sizeof(y[b].qs));
    y[b].d = random_scale(rng, 2.0f / (15 * 3));
    y[b].dmin = random_scale(rng, 2.0f / 15);
  }
}

float dot_ref(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t q[kQK_K];
    codes(x[b], q);
    int32_t sum = 0, mins = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t g = 0;
      for (int l = 0; l < 16; ++l) g += q[16 * s + l] * y[b].qs[16 * s + l];
      sum += (x[b].scales[s] & 0xF) * g;
      mins += (x[b].scales[s] >> 4) * y[b].bsums[s];
    }
    float& lane = lanes[b % 8];
    lane = std::fma(fp16_to_fp32(x[b].d) * y[b].d, float(sum), lane);
    lane = std::fma(-(fp16_to_fp32(x[b].dmin) * y[b].d), float(mins), lane);
  }
  return reduce8(lanes);
}

}  // namespace

const FormatKernels kQ2_KKernels = {Type::Q2_K,    ActFormat::Q8_K, dequantize,    quantize,
                                    random_blocks, dot_ref,         dot_q2_k_avx2, 0.0f};

}  // namespace strata::quant
