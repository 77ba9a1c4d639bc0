// FP8_E4M3: the E4M3FN code table against the OCP definition, the rounding encoder, the row and 2-D
// (128x128 tile) quantizers, the 36-byte block layout, and the AVX2 dot against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "quant/formats/formats.h"
#include "quant/fp8.h"
#include "quant/kernels.h"
#include "quant/types.h"
#include "util/cpu.h"
#include "util/rng.h"

namespace strata::quant {
namespace {

// OCP E4M3FN, written independently of the table: (-1)^s * 2^(e-7) * (1 + m/8) for e > 0, (-1)^s *
// 2^-6 * m/8 for e = 0; S.1111.111 is NaN; there are no infinities.
double ocp_e4m3(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(QuantFP8, EveryCodeMatchesTheOcpDefinition) {
  for (int c = 0; c < 256; ++c) {
    const double want = ocp_e4m3(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(e4m3_to_float(uint8_t(c)))) << c;
    } else {
      EXPECT_EQ(double(e4m3_to_float(uint8_t(c))), want) << c;
    }
  }
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x07), 7 * 0x1p-9f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
}

TEST(QuantFP8, EncoderRoundsToNearestEvenAndSaturates) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) != 0x7F) {
      EXPECT_EQ(float_to_e4m3(e4m3_to_float(uint8_t(c))), c);
    }
  }
  EXPECT_EQ(float_to_e4m3(1.0625f),
            0x38);                          // halfway 1 (0x38) .. 1.125 (0x39): even
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);  // halfway 1.125 .. 1.25 (0x3A): even
  EXPECT_EQ(float_to_e4m3(1.07f), 0x39);
  EXPECT_EQ(float_to_e4m3(0x1p-10f),
            0x00);                               // half the smallest subnormal: to even (0)
  EXPECT_EQ(float_to_e4m3(3 * 0x1p-10f), 0x02);  // 1.5 steps: to even (2)
  EXPECT_EQ(float_to_e4m3(15 * 0x1p-10f),
            0x08);  // 7.5 steps rounds up into the first normal
  EXPECT_EQ(float_to_e4m3(-0x1p-12f), 0x80);
  EXPECT_EQ(float_to_e4m3(460.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e6f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(float_to_e4m3(NAN), 0x7F);
  // Nearest on a dense sweep: no other code is closer.
  Rng rng(3);
  for (int i = 0; i < 20000; ++i) {
    const float v = std::ldexp(rng.uniform(-1.0f, 1.0f), int(rng.below(20)) - 11);
    const uint8_t q = float_to_e4m3(v);
    const double err = std::fabs(double(e4m3_to_float(q)) - v);
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7F) != 0x7F) {
        ASSERT_LE(err, std::fabs(ocp_e4m3(c) - v)) << v;
      }
    }
  }
}

TEST(QuantFP8, BlockLayoutAndTypeInfo) {
  const TypeInfo& info = type_info(Type::FP8_E4M3);
  EXPECT_STREQ(info.name, "fp8_e4m3");
  EXPECT_EQ(info.block_elems, 32);
  EXPECT_EQ(info.block_bytes, 36u);
  EXPECT_EQ(uint32_t(Type::FP8_E4M3), 1024u);
  EXPECT_EQ(parse_type("fp8"), Type::FP8_E4M3);
  EXPECT_EQ(parse_type("FP8_E4M3"), Type::FP8_E4M3);
  EXPECT_EQ(parse_type("fp8_e4m3_b128"), std::nullopt);
  EXPECT_EQ(sizeof(BlockFP8), 36u);
  EXPECT_EQ(offsetof(BlockFP8, q), 4u);
  // The flagship's 160-wide n-gram rows: five blocks, one contiguous 180-byte read.
  EXPECT_EQ(row_bytes(Type::FP8_E4M3, 160), 180u);
}

// The dequantizer decodes every code at its place in the block, times the block's scale.
TEST(QuantFP8, DequantizesEveryCodeInPlace) {
  std::vector<BlockFP8> b(256 / 32);
  for (int c = 0; c < 256; ++c) b[c / 32].q[c % 32] = uint8_t(c);
  for (size_t i = 0; i < b.size(); ++i) b[i].scale = std::ldexp(1.0f, int(i) - 3);
  std::vector<float> y(256);
  kFP8_E4M3Kernels.dequantize(b.data(), y.data(), 256);
  for (int c = 0; c < 256; ++c) {
    const float want = b[c / 32].scale * e4m3_to_float(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(y[c])) << c;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(y[c]), std::bit_cast<uint32_t>(want)) << c;
    }
  }
}

// Amax of columns [c0, c1) over rows [r0, r1) of a row-major matrix with cols columns.
float tile_amax(const std::vector<float>& x, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                int64_t c1) {
  float amax = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
  return amax;
}

TEST(QuantFP8, RowQuantizerRoundTrip) {
  const FormatKernels& k = kernels(Type::FP8_E4M3);
  EXPECT_EQ(&k, &kFP8_E4M3Kernels);
  // Five full 128-element tiles and a trailing partial one of 96, each with its own range.
  const int64_t n = 128 * 5 + 96;
  Rng rng(4);
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = rng.normal() * float(1 << (i / 128));
  std::vector<BlockFP8> b(n / 32);
  k.quantize(x.data(), b.data(), n);
  k.dequantize(b.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t0 = i / 128 * 128;
    EXPECT_EQ(b[i / 32].scale, tile_amax(x, n, 0, 1, t0, std::min(n, t0 + 128)) / 448.0f) << i;
    // Half a step of a 3-bit mantissa, or of the subnormal spacing scale * 2^-9; plus the rounding
    // of x / scale and of the product.
    const float bound = std::max(std::fabs(x[i]) * 0x1p-4f, b[i / 32].scale * 0x1p-10f) * 1.0001f;
    EXPECT_LE(std::fabs(y[i] - x[i]), bound) << i;
  }
  // An all-zero tile gets scale 1 and zero codes.
  std::vector<float> zeros(64, 0.0f);
  k.quantize(zeros.data(), b.data(), 64);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(b[i].scale, 1.0f);
    for (uint8_t q : b[i].q) EXPECT_EQ(q, 0);
  }
}

TEST(QuantFP8, TwoDQuantizerKeepsTileScalesExactly) {
  // 300 x 160: tile rows of 128, 128 and 44, tile columns of 128 and 32, each tile with its own
  // range, so every 32-block must carry its own tile's scale.
  const int64_t rows = 300, cols = 160, per_row = cols / 32;
  std::vector<float> x(rows * cols);
  Rng rng(5);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[r * cols + c] = rng.uniform(-1.0f, 1.0f) * std::ldexp(1.0f, int(r / 128 * 3 + c / 128));
  std::vector<BlockFP8> b(rows * per_row);
  quantize_fp8_e4m3_2d(x.data(), rows, cols, b.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < per_row; ++k) {
      const int64_t r0 = r / 128 * 128, c0 = k * 32 / 128 * 128;
      const float amax =
          tile_amax(x, cols, r0, std::min(rows, r0 + 128), c0, std::min(cols, c0 + 128));
      const BlockFP8& blk = b[r * per_row + k];
      ASSERT_EQ(blk.scale, amax / 448.0f) << r << "," << k;
      for (int64_t j = 0; j < 32; ++j)
        ASSERT_EQ(blk.q[j], float_to_e4m3(x[r * cols + k * 32 + j] / blk.scale));
    }

  // A native checkpoint's codes and tile scales come back bit for bit from its dequantized values
  // when each tile holds a code of +-448 and its scale has at most 20 significant bits (so that
  // code * scale, and 448 * scale, are exact in fp32).
  std::vector<float> ck_scale(3 * 2);
  for (float& s : ck_scale) s = std::ldexp(float((1 << 19) + rng.below(1 << 19)), -30);
  std::vector<uint8_t> codes(rows * cols);
  std::vector<float> deq(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      auto& q = codes[r * cols + c];
      do q = uint8_t(rng.next() >> 56);
      while ((q & 0x7F) >= 0x7E);
      if (r % 128 == 0 && c % 128 == 0) q = r % 256 ? 0xFE : 0x7E;  // the tile's amax
      deq[r * cols + c] = e4m3_to_float(q) * ck_scale[r / 128 * 2 + c / 128];
    }
  quantize_fp8_e4m3_2d(deq.data(), rows, cols, b.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < per_row; ++k) {
      const BlockFP8& blk = b[r * per_row + k];
      ASSERT_EQ(blk.scale, ck_scale[r / 128 * 2 + k * 32 / 128]) << r << "," << k;
      ASSERT_EQ(0, std::memcmp(blk.q, &codes[r * cols + k * 32], 32)) << r << "," << k;
    }
  // Row r is per_row blocks, one contiguous run of 5 * 36 bytes.
  EXPECT_EQ(sizeof(BlockFP8) * per_row, row_bytes(Type::FP8_E4M3, cols));
}

TEST(QuantFP8, RandomBlocksValidAndDeterministic) {
  const FormatKernels& k = kFP8_E4M3Kernels;
  std::vector<BlockFP8> a(64), b(64);
  Rng r1(9), r2(9);
  k.random_blocks(r1, a.data(), 64);
  k.random_blocks(r2, b.data(), 64);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 64 * sizeof(BlockFP8)), 0);
  std::vector<float> y(64 * 32);
  k.dequantize(a.data(), y.data(), 64 * 32);
  for (float v : y) {
    ASSERT_TRUE(std::isfinite(v));
    ASSERT_LE(std::fabs(v), 2.0f);
  }
}

std::vector<float> random_x(Rng& rng, int64_t n) {
  std::vector<float> x(n);
  for (float& v : x) v = rng.normal() * (rng.below(16) == 0 ? 100.0f : 1.0f);
  return x;
}

TEST(QuantFP8, DotRefMatchesDequantizedSum) {
  const FormatKernels& k = kFP8_E4M3Kernels;
  Rng rng(10);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t nb = 1 + rng.below(160), n = nb * 32;
    std::vector<BlockFP8> w(nb);
    k.random_blocks(rng, w.data(), nb);
    const std::vector<float> x = random_x(rng, n);
    std::vector<float> wf(n);
    k.dequantize(w.data(), wf.data(), n);
    double exact = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      exact += double(wf[i]) * x[i];
      mag += std::fabs(double(wf[i]) * x[i]);
    }
    // Each product enters through at most 3 + nb / 8 + 3 roundings (a lane takes every eighth
    // element of a block), plus the scale's.
    EXPECT_NEAR(k.dot_ref(w.data(), x.data(), n), exact, (nb + 10) * 0x1p-24 * mag);
  }
}

TEST(QuantFP8, Avx2BitwiseEqualsReference) {
  if (!hardware_features().avx2) GTEST_SKIP() << "CPU lacks AVX2+FMA+F16C";
  const FormatKernels& k = kFP8_E4M3Kernels;
  ASSERT_NE(k.dot_avx2, nullptr);
  EXPECT_EQ(k.dot_tolerance, 0.0f);
  Rng rng(13);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t nb = 1 + rng.below(192), n = nb * 32;
    std::vector<BlockFP8> w(nb);
    k.random_blocks(rng, w.data(), nb);
    if (trial % 4 == 0)  // subnormal codes everywhere
      for (BlockFP8& b : w)
        for (uint8_t& q : b.q) q &= 0x87;
    const std::vector<float> x = random_x(rng, n);
    const float ref = k.dot_ref(w.data(), x.data(), n);
    const float fast = k.dot_avx2(w.data(), x.data(), n);
    ASSERT_EQ(std::bit_cast<uint32_t>(fast), std::bit_cast<uint32_t>(ref))
        << "trial " << trial << ": " << fast << " vs " << ref;
  }
  // Every code at every position of a block, against the reference, one code per dot.
  std::vector<BlockFP8> one(1);
  one[0].scale = 0.75f;
  const std::vector<float> x = random_x(rng, 32);
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    for (int j = 0; j < 32; ++j) {
      std::memset(one[0].q, 0, 32);
      one[0].q[j] = uint8_t(c);
      const float ref = k.dot_ref(one.data(), x.data(), 32);
      const float fast = k.dot_avx2(one.data(), x.data(), 32);
      ASSERT_EQ(std::bit_cast<uint32_t>(fast), std::bit_cast<uint32_t>(ref)) << c << "@" << j;
    }
  }
  // A NaN code makes both results NaN.
  std::vector<BlockFP8> w(8);
  k.random_blocks(rng, w.data(), 8);
  w[5].q[13] = 0xFF;
  const std::vector<float> xn = random_x(rng, 256);
  EXPECT_TRUE(std::isnan(k.dot_ref(w.data(), xn.data(), 256)));
  EXPECT_TRUE(std::isnan(k.dot_avx2(w.data(), xn.data(), 256)));
}

}  // namespace
}  // namespace strata::quant
