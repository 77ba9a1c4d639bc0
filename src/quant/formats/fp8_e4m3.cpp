// FP8_E4M3 (strata type 1024): conversions, quantizers, scalar reference and kernel table.
//
// The dot product (F32 activation) is defined with a fixed evaluation order that the AVX2 kernel
// reproduces exactly (one 8-wide vector per quarter of a block): with w = e4m3(code), a block's
// partial sum for l < 8 is s[l] = fma(w[l+8], x[l+8], w[l] * x[l]) + fma(w[l+24], x[l+24],
// w[l+16] * x[l+16]); it adds into lane l of eight row lanes as fma(scale, s[l], lane[l]); the row
// result is ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "quant/formats/formats.h"
#include "quant/fp8.h"

namespace strata::quant {

float dot_fp8_e4m3_avx2(const void* weights, const void* act, int64_t n);

uint8_t float_to_e4m3(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const auto sign = uint8_t((bits >> 24) & 0x80);
  const float a = std::fabs(v);
  if (std::isnan(a)) return 0x7F;
  if (!(a < kE4M3Max)) return sign | 0x7E;
  if (a < 0x1p-6f) {
    // Subnormal range, steps of 2^-9: round a * 512 (exact) to an integer, ties to even. 8 is the
    // code of 2^-6, the smallest normal, so rounding up into it needs no special case.
    const float f = a * 512.0f;
    auto q = uint8_t(f);
    const float rem = f - float(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1))) ++q;
    return sign | q;
  }
  // Round the fp32 mantissa to 3 bits, ties to even (a carry moves into the exponent), then rebias
  // the exponent from 127 to 7. a < 448 never rounds past 0x7E.
  const uint32_t mag = bits & 0x7FFFFFFFu;
  const uint32_t rounded = (mag + 0x7FFFFu + ((mag >> 20) & 1)) >> 20;
  return sign | uint8_t(rounded - (120u << 3));
}

namespace {

float tile_scale(float amax) { return amax > 0.0f ? amax / kE4M3Max : 1.0f; }

void encode_block(const float* in, float scale, BlockFP8& out) {
  out.scale = scale;
  for (int64_t j = 0; j < kFP8BlockElems; ++j) out.q[j] = float_to_e4m3(in[j] / scale);
}

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* b = static_cast<const BlockFP8*>(blocks);
  for (int64_t i = 0; i < n / kFP8BlockElems; ++i)
    for (int64_t j = 0; j < kFP8BlockElems; ++j) *out++ = b[i].scale * e4m3_to_float(b[i].q[j]);
}

// Encodes the rows [r0, r1) x columns [c0, c1) of a row-major matrix with cols columns into its
// blocks (cols / 32 per row), all with the tile's scale.
void encode_tile(const float* src, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                 BlockFP8* out) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(src[r * cols + c]));
  const float scale = tile_scale(amax);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; c += kFP8BlockElems)
      encode_block(src + r * cols + c, scale, out[(r * cols + c) / kFP8BlockElems]);
}

// n elements as one row: each 128-element tile of it (the last may be 32..96) gets its own scale.
void quantize(const float* in, void* blocks, int64_t n) {
  auto* b = static_cast<BlockFP8*>(blocks);
  for (int64_t c = 0; c < n; c += kFP8TileElems)
    encode_tile(in, n, 0, 1, c, std::min(n, c + kFP8TileElems), b);
}

void random_blocks(Rng& rng, void* blocks, int64_t nblocks) {
  auto* b = static_cast<BlockFP8*>(blocks);
  for (int64_t i = 0; i < nblocks; ++i) {
    b[i].scale = rng.uniform(0.5f, 1.0f) * (2.0f / kE4M3Max);
    for (auto& q : b[i].q) {
      do q = uint8_t(rng.next() >> 56);
      while ((q & 0x7F) == 0x7F);  // the NaN codes
    }
  }
}

float dot_ref(const void* weights, const void* act, int64_t n) {
  const auto* b = static_cast<const BlockFP8*>(weights);
  const auto* x = static_cast<const float*>(act);
  float lane[8] = {};
  for (int64_t i = 0; i < n / kFP8BlockElems; ++i, x += kFP8BlockElems) {
    const auto w = [&](int j) { return e4m3_to_float(b[i].q[j]); };
    for (int l = 0; l < 8; ++l) {
      const float lo = std::fma(w(l + 8), x[l + 8], w(l) * x[l]);
      const float hi = std::fma(w(l + 24), x[l + 24], w(l + 16) * x[l + 16]);
      lane[l] = std::fma(b[i].scale, lo + hi, lane[l]);
    }
  }
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

}  // namespace

void quantize_fp8_e4m3_2d(const float* src, int64_t rows, int64_t cols, void* dst) {
  auto* out = static_cast<BlockFP8*>(dst);
  for (int64_t r0 = 0; r0 < rows; r0 += kFP8TileElems)
    for (int64_t c0 = 0; c0 < cols; c0 += kFP8TileElems)
      encode_tile(src, cols, r0, std::min(rows, r0 + kFP8TileElems), c0,
                  std::min(cols, c0 + kFP8TileElems), out);
}

const FormatKernels kFP8_E4M3Kernels = {
    Type::FP8_E4M3, ActFormat::F32,       dequantize, quantize, random_blocks,
    dot_ref,        dot_fp8_e4m3_avx2, 0.0f,
};

}  // namespace strata::quant
