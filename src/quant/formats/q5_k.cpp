// Q5_K weights (ggml block_q5_K): Q4_K's groups, scales and nibble order, plus a fifth bit:
// element e = 64 j + 32 k + l has q = nibble + 16 * (bit 2 j + k of qh[l]), q in 0..31.
// Dotted with Q8_K; reference dot as Q4_K's.
#include "quant/formats/blocks.h"
#include "quant/formats/fit.h"
#include "quant/formats/formats.h"

namespace strata::quant {

namespace {

void codes(const BlockQ5_K& x, uint8_t* q) {
  for (int e = 0; e < kQK_K; ++e) {
    const int j = e / 64, k = (e / 32) % 2, l = e % 32;
    q[e] = uint8_t(((x.qs[32 * j + l] >> (4 * k)) & 0xF) | (((x.qh[l] >> (2 * j + k)) & 1) << 4));
  }
}

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockQ5_K*>(blocks);
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
  auto* y = static_cast<BlockQ5_K*>(blocks);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t q[kQK_K], sc[8], m[8];
    fit_affine(in + b * kQK_K, 8, 31, 63, q, &y[b].d, &y[b].dmin, sc, m);
    pack_scale_min_k4(sc, m, y[b].scales);
    for (int l = 0; l < 32; ++l) y[b].qh[l] = 0;
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = q[64 * j + l], hi = q[64 * j + 32 + l];
        y[b].qs[32 * j + l] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
        y[b].qh[l] |= uint8_t(((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1)));
      }
  }
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* y = static_cast<BlockQ5_K*>(blocks);
  for (int64_t b = 0; b < nblocks; ++b) {
    y[b].d = random_scale(rng, 1.0f / (63 * 31));
    y[b].dmin = random_scale(rng, 1.0f / 63);
    random_bytes(rng, y[b].scales, sizeof(y[b].scales));
    random_bytes(rng, y[b].qh, sizeof(y[b].qh));
    random_bytes(rng, y[b].qs, sizeof(y[b].qs));
  }
}


}  // namespace

const FormatKernels kQ5_KKernels = {Type::Q5_K, ActFormat::Q8_K, dequantize, quantize, random_blocks,
                                    dot_scale_min_k_ref<BlockQ5_K, codes>, dot_q5_k_avx2, 0.0f};

}  // namespace strata::quant
