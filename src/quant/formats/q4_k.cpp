// Q4_K weights (ggml block_q4_K): 256 elements in 8 groups of 32 with 6-bit scales and mins
// (scale_min_k4); x = d * sc * q - dmin * m, q in 0..15. Element e = 64 j + 32 k + l (j < 4,
// k < 2, l < 32) is the low (k = 0) or high (k = 1) nibble of qs[32 j + l], in group e / 32.
// Dotted with Q8_K.
//
// Reference dot: per super-block the exact integer sums S = sum_s sc_s * sum_{e in s} q_e a_e and
// M = sum_s m_s * (bsums_2s + bsums_2s+1); lane b % 8 takes fma(d * d_a, S, lane) then
// fma(-(dmin * d_a), M, lane); the lanes are reduced by reduce8.
#include "quant/formats/blocks.h"
#include "quant/formats/fit.h"
#include "quant/formats/formats.h"

namespace strata::quant {

namespace {

void codes(const BlockQ4_K& x, uint8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    const int j = e / 64, k = (e / 32) % 2, l = e % 32;
    q[e] = (x.qs[32 * j + l] >> (4 * k)) & 0xF;
  }
}

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockQ4_K*>(blocks);
  for (int64_t b = 0; b < n / kQK_K; ++b, out += kQK_K) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    uint8_t q[kQK_K];
    codes(x[b], q);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      scale_min_k4(s, x[b].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      for (int l = 0; l < 32; ++l) out[32 * s + l] = d1 * q[32 * s + l] - m1;
    }
  }
}

void quantize(const float* in, void* blocks, int64_t n) {
  auto* y = static_cast<BlockQ4_K*>(blocks);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t q[kQK_K], sc[8], m[8];
    fit_affine(in + b * kQK_K, 8, 15, 63, q, &y[b].d, &y[b].dmin, sc, m);
    pack_scale_min_k4(sc, m, y[b].scales);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l)
        y[b].qs[32 * j + l] = uint8_t(q[64 * j + l] | (q[64 * j + 32 + l] << 4));
  }
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* y = static_cast<BlockQ4_K*>(blocks);
  for (int64_t b = 0; b < nblocks; ++b) {
    y[b].d = random_scale(rng, 1.0f / (63 * 15));
    y[b].dmin = random_scale(rng, 1.0f / 63);
    random_bytes(rng, y[b].scales, sizeof(y[b].scales));
    random_bytes(rng, y[b].qs, sizeof(y[b].qs));
  }
}


}  // namespace

const FormatKernels kQ4_KKernels = {Type::Q4_K, ActFormat::Q8_K, dequantize, quantize, random_blocks,
                                    dot_scale_min_k_ref<BlockQ4_K, codes>, dot_q4_k_avx2, 0.0f,
                                    nullptr, dot_q4_k_avx512};

}  // namespace strata::quant
