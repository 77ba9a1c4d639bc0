// IQ2_XS (ggml type 17, 2.31 bits per weight): scalar reference and kernel table.
#include "quant/formats/formats.h"
#include "quant/formats/iq_common.h"

namespace strata::quant {

namespace {
using iq::BlockIQ2XS;
using iq::BlockQ8K;

// Scale nibble of the 16-element half `h` (0..31) of a block.
uint32_t scale_nibble(const BlockIQ2XS& b, int h) {
  return (b.scales[h / 2] >> (4 * (h % 2))) & 15;
}

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockIQ2XS*>(blocks);
  for (int64_t i = 0; i < n / iq::kQK; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int g8 = 0; g8 < iq::kQK / 8; ++g8) {
      // d*(0.5+s)*0.25 as ggml writes it; every step is exact in fp32.
      const float db = d * (0.5f + float(scale_nibble(x[i], g8 / 2))) * 0.25f;
      const uint64_t g = iq::kIQ2XSGrid[x[i].qs[g8] & 511];
      const uint8_t signs = iq::sign_byte(x[i].qs[g8] >> 9);
      for (int j = 0; j < 8; ++j)
        *out++ = iq::apply_sign(db * float(iq::grid_byte(g, j)), signs, j);
    }
  }
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* x = static_cast<BlockIQ2XS*>(blocks);
  for (int64_t i = 0; i < nblocks; ++i) {
    x[i].d = iq::random_d(rng, 2.0f / (43.0f * 31.0f / 8.0f));
    iq::random_bytes(rng, x[i].qs, sizeof(x[i].qs));
    iq::random_bytes(rng, x[i].scales, sizeof(x[i].scales));
  }
}

float dot_ref(const void* weights, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ2XS*>(weights);
  const auto* y = static_cast<const BlockQ8K*>(act);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / iq::kQK; ++i) {
    const int8_t* q8 = y[i].qs;
    int32_t isum = 0;
    for (int h = 0; h < iq::kQK / 16; ++h) {
      int32_t sub = 0;
      for (int l = 2 * h; l < 2 * h + 2; ++l) {
        const uint64_t g = iq::kIQ2XSGrid[x[i].qs[l] & 511];
        const uint8_t signs = iq::sign_byte(x[i].qs[l] >> 9);
        for (int j = 0; j < 8; ++j) {
          const int32_t p = int32_t(iq::grid_byte(g, j)) * q8[j];
          sub += (signs >> j) & 1 ? -p : p;
        }
        q8 += 8;
      }
      isum += sub * int32_t(2 * scale_nibble(x[i], h) + 1);
    }
    acc = iq::accumulate_block(acc, isum, x[i].d, y[i].d);
  }
  return acc * 0.125f;
}
}  // namespace

const FormatKernels kIQ2_XSKernels = {
    Type::IQ2_XS,  ActFormat::Q8_K, dequantize,          nullptr,
    random_blocks, dot_ref,         iq::dot_iq2_xs_avx2, 0.0f, iq::dot_rows_iq2_xs_avx2,
    iq::dot_iq2_xs_avx512, iq::dot_rows_iq2_xs_avx512,
};

}  // namespace strata::quant
