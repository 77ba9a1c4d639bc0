// Q6_K weights (ggml block_q6_K): 256 elements in 16 groups of 16 with int8 scales; x = d * sc * q,
// q in -32..31. Element e = 128 h + 32 k + l (h < 2, k < 4, l < 32): low 4 bits are the low
// (k < 2) or high nibble of ql[64 h + 32 (k % 2) + l], high 2 bits are bits 2 k of qh[32 h + l];
// q = bits - 32, group e / 16. Dotted with Q8_K.
//
// Reference dot: per super-block the exact integer S = sum_s sc_s * sum_{e in s} q_e a_e; lane
// b % 8 takes fma(d * d_a, S, lane); the lanes are reduced by reduce8.
#include "quant/formats/blocks.h"
#include "quant/formats/fit.h"
#include "quant/formats/formats.h"

namespace strata::quant {

namespace {

void codes(const BlockQ6_K& x, int8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, k = (e / 32) % 4, l = e % 32;
    const int lo = (x.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
    const int hi = (x.qh[32 * h + l] >> (2 * k)) & 3;
    q[e] = int8_t((lo | (hi << 4)) - 32);
  }
}

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(blocks);
  for (int64_t b = 0; b < n / kQK_K; ++b, out += kQK_K) {
    const float d = fp16_to_fp32(x[b].d);
    int8_t q[kQK_K];
    codes(x[b], q);
    for (int e = 0; e < kQK_K; ++e) out[e] = d * x[b].scales[e / 16] * q[e];
  }
}

void quantize(const float* in, void* blocks, int64_t n) {
  auto* y = static_cast<BlockQ6_K*>(blocks);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int8_t q[kQK_K];
    fit_symmetric(in + b * kQK_K, 32, 128, q, &y[b].d, y[b].scales);
    for (int i = 0; i < 128; ++i) y[b].ql[i] = 0;
    for (int i = 0; i < 64; ++i) y[b].qh[i] = 0;
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, k = (e / 32) % 4, l = e % 32;
      const int bits = q[e] + 32;
      y[b].ql[64 * h + 32 * (k % 2) + l] |= uint8_t((bits & 0xF) << (4 * (k / 2)));
      y[b].qh[32 * h + l] |= uint8_t((bits >> 4) << (2 * k));
    }
  }
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* y = static_cast<BlockQ6_K*>(blocks);
  for (int64_t b = 0; b < nblocks; ++b) {
    random_bytes(rng, y[b].ql, sizeof(y[b].ql));
    random_bytes(rng, y[b].qh, sizeof(y[b].qh));
    random_bytes(rng, reinterpret_cast<uint8_t*>(y[b].scales), sizeof(y[b].scales));
    y[b].d = random_scale(rng, 2.0f / (128 * 32));
  }
}

float dot_ref(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int8_t q[kQK_K];
    codes(x[b], q);
    int32_t sum = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t g = 0;
      for (int l = 0; l < 16; ++l) g += q[16 * s + l] * y[b].qs[16 * s + l];
      sum += x[b].scales[s] * g;
    }
    lanes[b % 8] = std::fma(fp16_to_fp32(x[b].d) * y[b].d, float(sum), lanes[b % 8]);
  }
  return reduce8(lanes);
}

}  // namespace

const FormatKernels kQ6_KKernels = {Type::Q6_K,    ActFormat::Q8_K, dequantize,    quantize,
                                    random_blocks, dot_ref,         dot_q6_k_avx2, 0.0f,
                                    nullptr,       dot_q6_k_avx512};

}  // namespace strata::quant
