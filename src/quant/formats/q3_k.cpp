// Q3_K weights (ggml block_q3_K): 256 elements in 16 groups of 16 with signed 6-bit scales
// (q3_k_scales); x = d * sc * q with q in -4..3. Element e = 128 h + 32 j + 16 k + l (h < 2,
// j < 4, k < 2, l < 16): low 2 bits are bits 2 j of qs[32 h + 16 k + l], and q = low - 4 unless
// bit 4 h + j of hmask[16 k + l] is set (then q = low). Group e / 16. Dotted with Q8_K.
//
// Reference dot: per super-block the exact integer S = sum_s sc_s * sum_{e in s} q_e a_e; lane
// b % 8 takes fma(d * d_a, S, lane); the lanes are reduced by reduce8.
#include <cstring>

#include "quant/formats/blocks.h"
#include "quant/formats/fit.h"
#include "quant/formats/formats.h"

namespace strata::quant {

namespace {

void codes(const BlockQ3_K& x, int8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, j = (e / 32) % 4, k = (e / 16) % 2, l = e % 16;
    const int low = (x.qs[32 * h + 16 * k + l] >> (2 * j)) & 3;
    const bool high = (x.hmask[16 * k + l] >> (4 * h + j)) & 1;
    q[e] = int8_t(high ? low : low - 4);
  }
}

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockQ3_K*>(blocks);
  for (int64_t b = 0; b < n / kQK_K; ++b, out += kQK_K) {
    const float d = fp16_to_fp32(x[b].d);
    int8_t q[kQK_K], sc[16];
    codes(x[b], q);
    q3_k_scales(x[b].scales, sc);
    for (int s = 0; s < 16; ++s) {
      const float dl = d * sc[s];
      for (int l = 0; l < 16; ++l) out[16 * s + l] = dl * q[16 * s + l];
    }
  }
}

void quantize(const float* in, void* blocks, int64_t n) {
  auto* y = static_cast<BlockQ3_K*>(blocks);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int8_t q[kQK_K], sc[16];
    fit_symmetric(in + b * kQK_K, 4, 32, q, &y[b].d, sc);
    std::memset(y[b].scales, 0, sizeof(y[b].scales));
    for (int j = 0; j < 16; ++j) {
      const int v = sc[j] + 32;
      y[b].scales[j % 8] |= uint8_t((v & 0xF) << (4 * (j / 8)));
      y[b].scales[8 + j % 4] |= uint8_t((v >> 4) << (2 * (j / 4)));
    }
    std::memset(y[b].hmask, 0, sizeof(y[b].hmask));
    std::memset(y[b].qs, 0, sizeof(y[b].qs));
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, j = (e / 32) % 4, k = (e / 16) % 2, l = e % 16;
      const bool high = q[e] >= 0;  // q = low when the high bit is set, low - 4 otherwise
      y[b].qs[32 * h + 16 * k + l] |= uint8_t((high ? q[e] : q[e] + 4) << (2 * j));
      y[b].hmask[16 * k + l] |= uint8_t(high << (4 * h + j));
    }
  }
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* y = static_cast<BlockQ3_K*>(blocks);
  for (int64_t b = 0; b < nblocks; ++b) {
    random_bytes(rng, y[b].hmask, sizeof(y[b].hmask));
    random_bytes(rng, y[b].qs, sizeof(y[b].qs));
    random_bytes(rng, y[b].scales, sizeof(y[b].scales));
    y[b].d = random_scale(rng, 2.0f / (32 * 4));
  }
}

float dot_ref(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int8_t q[kQK_K], sc[16];
    codes(x[b], q);
    q3_k_scales(x[b].scales, sc);
    int32_t sum = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t g = 0;
      for (int l = 0; l < 16; ++l) g += q[16 * s + l] * y[b].qs[16 * s + l];
      sum += sc[s] * g;
    }
    lanes[b % 8] = std::fma(fp16_to_fp32(x[b].d) * y[b].d, float(sum), lanes[b % 8]);
  }
  return reduce8(lanes);
}

}  // namespace

const FormatKernels kQ3_KKernels = {Type::Q3_K,    ActFormat::Q8_K, dequantize,    quantize,
                                    random_blocks, dot_ref,         dot_q3_k_avx2, 0.0f};

}  // namespace strata::quant
