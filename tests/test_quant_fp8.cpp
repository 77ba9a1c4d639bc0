// FP8_E4M3_B128: the E4M3FN code table against the OCP definition, the rounding encoder, the row
// and 2-D (128x128 tile) quantizers, and the AVX2 dot against the reference.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant/formats/formats.h"
#include "quant/fp8.h"
#include "quant/kernels.h"
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

TEST(QuantFP8, RowQuantizerRoundTrip) {
  const FormatKernels& k = kernels(Type::FP8_E4M3_B128);
  EXPECT_EQ(&k, &kFP8_E4M3_B128Kernels);
  const int64_t n = 128 * 6;
  Rng rng(4);
  std::vector<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = rng.normal() * float(1 << (i / 128));
  std::vector<BlockFP8> b(n / 128);
  k.quantize(x.data(), b.data(), n);
  k.dequantize(b.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    float amax = 0;
    for (int64_t j = i / 128 * 128; j < i / 128 * 128 + 128; ++j)
      amax = std::max(amax, std::fabs(x[j]));
    EXPECT_EQ(b[i / 128].scale, amax / 448.0f);
    // Half a step of a 3-bit mantissa, or of the subnormal spacing scale * 2^-9; plus the rounding
    // of x / scale and of the product.
    const float bound = std::max(std::fabs(x[i]) * 0x1p-4f, b[i / 128].scale * 0x1p-10f) * 1.0001f;
    EXPECT_LE(std::fabs(y[i] - x[i]), bound) << i;
  }
  // An all-zero block gets scale 1 and zero codes.
  std::vector<float> zeros(128, 0.0f);
  k.quantize(zeros.data(), b.data(), 128);
  EXPECT_EQ(b[0].scale, 1.0f);
  for (uint8_t q : b[0].q) EXPECT_EQ(q, 0);
}

TEST(QuantFP8, TwoDQuantizerUsesTileScales) {
  // 300 x 384: tile rows of 128, 128, 44 and three tile columns, each tile with its own range.
  const int64_t rows = 300, cols = 384;
  std::vector<float> x(rows * cols);
  Rng rng(5);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[r * cols + c] = rng.uniform(-1.0f, 1.0f) * std::ldexp(1.0f, int(r / 128 * 3 + c / 128));
  std::vector<BlockFP8> b(rows * cols / 128);
  quantize_fp8_e4m3_b128_2d(x.data(), rows, cols, b.data());
  for (int64_t tr = 0; tr < 3; ++tr)
    for (int64_t tc = 0; tc < 3; ++tc) {
      float amax = 0;
      for (int64_t r = tr * 128; r < std::min(rows, tr * 128 + 128); ++r)
        for (int64_t c = tc * 128; c < tc * 128 + 128; ++c)
          amax = std::max(amax, std::fabs(x[r * cols + c]));
      for (int64_t r = tr * 128; r < std::min(rows, tr * 128 + 128); ++r) {
        const BlockFP8& blk = b[r * 3 + tc];
        ASSERT_EQ(blk.scale, amax / 448.0f) << r << "," << tc;
        for (int64_t j = 0; j < 128; ++j)
          ASSERT_EQ(blk.q[j], float_to_e4m3(x[r * cols + tc * 128 + j] / blk.scale));
      }
    }
  // Row r's blocks are one contiguous run of rows * 132 bytes in order.
  EXPECT_EQ(sizeof(BlockFP8) * 3, row_bytes(Type::FP8_E4M3_B128, cols));
}

TEST(QuantFP8, RandomBlocksValidAndDeterministic) {
  const FormatKernels& k = kFP8_E4M3_B128Kernels;
  std::vector<BlockFP8> a(64), b(64);
  Rng r1(9), r2(9);
  k.random_blocks(r1, a.data(), 64);
  k.random_blocks(r2, b.data(), 64);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 64 * sizeof(BlockFP8)), 0);
  std::vector<float> y(64 * 128);
  k.dequantize(a.data(), y.data(), 64 * 128);
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
  const FormatKernels& k = kFP8_E4M3_B128Kernels;
  Rng rng(10);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t nb = 1 + rng.below(40), n = nb * 128;
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
    // Each product enters through at most 4 + 2 + nb + 3 roundings.
    EXPECT_NEAR(k.dot_ref(w.data(), x.data(), n), exact, (nb + 10) * 0x1p-24 * mag);
  }
}

TEST(QuantFP8, Avx2BitwiseEqualsReference) {
  if (!cpu_features().avx2) GTEST_SKIP() << "no AVX2";
  const FormatKernels& k = kFP8_E4M3_B128Kernels;
  ASSERT_NE(k.dot_avx2, nullptr);
  EXPECT_EQ(k.dot_tolerance, 0.0f);
  Rng rng(13);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t nb = 1 + rng.below(48), n = nb * 128;
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
  // A NaN code makes both results NaN.
  std::vector<BlockFP8> w(2);
  k.random_blocks(rng, w.data(), 2);
  w[1].q[77] = 0xFF;
  const std::vector<float> x = random_x(rng, 256);
  EXPECT_TRUE(std::isnan(k.dot_ref(w.data(), x.data(), 256)));
  EXPECT_TRUE(std::isnan(k.dot_avx2(w.data(), x.data(), 256)));
}

}  // namespace
}  // namespace strata::quant
