// IQ3_XXS (ggml type 18, 3.06 bits per weight): scalar reference and kernel table.
#include <cstring>

#include "quant/formats/formats.h"
#include "quant/formats/iq_common.h"

namespace strata::quant {

namespace {
using iq::BlockIQ3XXS;
using iq::BlockQ8K;

// Sub-block ib's word of four 7-bit sign fields and a 4-bit scale, stored after the 64 indices.
uint32_t signs_scale(const BlockIQ3XXS& b, int ib) {
  uint32_t aux;
  std::memcpy(&aux, b.qs + iq::kQK / 4 + 4 * ib, 4);
  return aux;
}

uint8_t grid_byte(uint8_t index, int j) { return uint8_t(iq::kIQ3XXSGrid[index] >> (8 * j)); }

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockIQ3XXS*>(blocks);
  for (int64_t i = 0; i < n / iq::kQK; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t aux = signs_scale(x[i], ib);
      // d*(0.5+s)*0.5 as ggml writes it; every step is exact in fp32.
      const float db = d * (0.5f + float(aux >> 28)) * 0.5f;
      const uint8_t* idx = x[i].qs + 8 * ib;
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = iq::sign_byte(aux >> (7 * l));
        for (int j = 0; j < 8; ++j)
          *out++ = iq::apply_sign(db * float(grid_byte(idx[2 * l + j / 4], j % 4)), signs, j);
      }
    }
  }
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* x = static_cast<BlockIQ3XXS*>(blocks);
  for (int64_t i = 0; i < nblocks; ++i) {
    x[i].d = iq::random_d(rng, 2.0f / (62.0f * 31.0f / 4.0f));
    iq::random_bytes(rng, x[i].qs, sizeof(x[i].qs));
  }
}

float dot_ref(const void* weights, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ3XXS*>(weights);
  const auto* y = static_cast<const BlockQ8K*>(act);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / iq::kQK; ++i) {
    const int8_t* q8 = y[i].qs;
    int32_t isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t aux = signs_scale(x[i], ib);
      const uint8_t* idx = x[i].qs + 8 * ib;
      int32_t sub = 0;
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = iq::sign_byte(aux >> (7 * l));
        for (int j = 0; j < 8; ++j) {
          const int32_t p = int32_t(grid_byte(idx[2 * l + j / 4], j % 4)) * q8[j];
          sub += (signs >> j) & 1 ? -p : p;
        }
        q8 += 8;
      }
      isum += sub * int32_t(2 * (aux >> 28) + 1);
    }
    acc = iq::accumulate_block(acc, isum, x[i].d, y[i].d);
  }
  return acc * 0.25f;
}
}  // namespace

const FormatKernels kIQ3_XXSKernels = {
    Type::IQ3_XXS, ActFormat::Q8_K, dequantize,           nullptr,
    random_blocks, dot_ref,         iq::dot_iq3_xxs_avx2, 0.0f,
};

}  // namespace strata::quant
