// IQ2_XXS (ggml type 16, 2.06 bits per weight): scalar reference and kernel table.
#include <cstring>

#include "quant/formats/formats.h"
#include "quant/formats/iq_common.h"

namespace strata::quant {

namespace {
using iq::BlockIQ2XXS;
using iq::BlockQ8K;

// The two 32-bit words describing sub-block ib (32 elements): grid indices, then signs|scale.
void sub_block_words(const BlockIQ2XXS& b, int ib, uint32_t& grids, uint32_t& signs_scale) {
  std::memcpy(&grids, b.qs + 4 * ib, 4);
  std::memcpy(&signs_scale, b.qs + 4 * ib + 2, 4);
}

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* x = static_cast<const BlockIQ2XXS*>(blocks);
  for (int64_t i = 0; i < n / iq::kQK; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t grids, aux;
      sub_block_words(x[i], ib, grids, aux);
      // d*(0.5+s)*0.25 as ggml writes it; every step is exact in fp32.
      const float db = d * (0.5f + float(aux >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l) {
        const uint64_t g = iq::kIQ2XXSGrid[(grids >> (8 * l)) & 255];
        const uint8_t signs = iq::sign_byte(aux >> (7 * l));
        for (int j = 0; j < 8; ++j)
          *out++ = iq::apply_sign(db * float(iq::grid_byte(g, j)), signs, j);
      }
    }
  }
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* x = static_cast<BlockIQ2XXS*>(blocks);
  for (int64_t i = 0; i < nblocks; ++i) {
    x[i].d = iq::random_d(rng, 2.0f / (43.0f * 31.0f / 8.0f));
    iq::random_bytes(rng, x[i].qs, sizeof(x[i].qs));
  }
}

float dot_ref(const void* weights, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ2XXS*>(weights);
  const auto* y = static_cast<const BlockQ8K*>(act);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / iq::kQK; ++i) {
    const int8_t* q8 = y[i].qs;
    int32_t isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t grids, aux;
      sub_block_words(x[i], ib, grids, aux);
      int32_t sub = 0;
      for (int l = 0; l < 4; ++l) {
        const uint64_t g = iq::kIQ2XXSGrid[(grids >> (8 * l)) & 255];
        const uint8_t signs = iq::sign_byte(aux >> (7 * l));
        for (int j = 0; j < 8; ++j) {
          const int32_t p = int32_t(iq::grid_byte(g, j)) * q8[j];
          sub += (signs >> j) & 1 ? -p : p;
        }
        q8 += 8;
      }
      isum += sub * int32_t(2 * (aux >> 28) + 1);
    }
    acc = iq::accumulate_block(acc, isum, x[i].d, y[i].d);
  }
  return acc * 0.125f;
}
}  // namespace

const FormatKernels kIQ2_XXSKernels = {
    Type::IQ2_XXS, ActFormat::Q8_K, dequantize,           nullptr,
    random_blocks, dot_ref,         iq::dot_iq2_xxs_avx2, 0.0f,
    nullptr,       iq::dot_iq2_xxs_avx512,
};

}  // namespace strata::quant
