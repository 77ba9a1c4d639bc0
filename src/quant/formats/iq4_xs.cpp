// IQ4_XS (ggml type 23, 4.25 bits per weight): scalar reference and kernel table.
#include "quant/formats/formats.h"
#include "quant/formats/iq_common.h"

namespace strata::quant {

namespace {
using iq::BlockIQ4XS;
using iq::BlockQ8K;

// Sub-block ib's 6-bit scale minus its bias of 32.
int32_t scale(const BlockIQ4XS& b, int ib) {
  const int32_t lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15;
  const int32_t hi = (b.scales_h >> (2 * ib)) & 3;
  return (lo | hi << 4) - 32;
}

// Code of element k (0..31) of a sub-block whose 16 bytes start at qs.
int32_t code(const uint8_t* qs, int k) {
  return iq::kIQ4NLValues[k < 16 ? qs[k] & 15 : qs[k - 16] >> 4];
}

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockIQ4XS*>(blocks);
  for (int64_t i = 0; i < n / iq::kQK; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      // d*(ls-32)*code is exact in fp32 (11 + 6 + 7 significant bits).
      const float dl = d * float(scale(x[i], ib));
      for (int k = 0; k < 32; ++k) *out++ = dl * float(code(x[i].qs + 16 * ib, k));
    }
  }
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* x = static_cast<BlockIQ4XS*>(blocks);
  for (int64_t i = 0; i < nblocks; ++i) {
    x[i].d = iq::random_d(rng, 2.0f / (127.0f * 32.0f));
    iq::random_bytes(rng, &x[i].scales_h, sizeof(x[i].scales_h));
    iq::random_bytes(rng, x[i].scales_l, sizeof(x[i].scales_l));
    iq::random_bytes(rng, x[i].qs, sizeof(x[i].qs));
  }
}

float dot_ref(const void* weights, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ4XS*>(weights);
  const auto* y = static_cast<const BlockQ8K*>(act);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / iq::kQK; ++i) {
    int32_t isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int8_t* q8 = y[i].qs + 32 * ib;
      int32_t sub = 0;
      for (int k = 0; k < 32; ++k) sub += code(x[i].qs + 16 * ib, k) * q8[k];
      isum += sub * scale(x[i], ib);
    }
    acc = iq::accumulate_block(acc, isum, x[i].d, y[i].d);
  }
  return acc;
}
}  // namespace

const FormatKernels kIQ4_XSKernels = {
    Type::IQ4_XS,  ActFormat::Q8_K, dequantize,          nullptr,
    random_blocks, dot_ref,         iq::dot_iq4_xs_avx2, 0.0f,
};

}  // namespace strata::quant
