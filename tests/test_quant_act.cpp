// Activation layouts: sizes, hand-checked Q8_0/Q8_K values, and AVX2 bytes equal to the
// reference bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "test_quant_util.h"

namespace strata::quant {
namespace {

TEST(QuantAct, Sizes) {
  EXPECT_EQ(act_bytes(ActFormat::F32, 10), 40u);
  EXPECT_EQ(act_bytes(ActFormat::Q8_0, 64), 68u);
  EXPECT_EQ(act_bytes(ActFormat::Q8_K, 512), 584u);
  EXPECT_EQ(act_block_elems(ActFormat::F32), 1);
  EXPECT_EQ(act_block_elems(ActFormat::Q8_0), 32);
  EXPECT_EQ(act_block_elems(ActFormat::Q8_K), 256);
}

TEST(QuantAct, Q8_0ByHand) {
  // amax = 254 -> d = 2 (fp16 0x4000), id = 0.5: x = 3 -> 1.5 rounds to 2 (ties to even),
  // x = 5 -> 2.5 rounds to 2, x = -254 -> -127, x = 1 -> 0.5 rounds to 0, x = 0.2 -> 0.
  std::vector<float> x(32, 0.2f);
  x[0] = 3;
  x[1] = 5;
  x[2] = -254;
  x[3] = 1;
  BlockQ8_0 b;
  quantize_act_ref(ActFormat::Q8_0, x.data(), &b, 32);
  EXPECT_EQ(b.d, 0x4000);
  EXPECT_EQ(b.qs[0], 2);
  EXPECT_EQ(b.qs[1], 2);
  EXPECT_EQ(b.qs[2], -127);
  EXPECT_EQ(b.qs[3], 0);
  EXPECT_EQ(b.qs[4], 0);
}

TEST(QuantAct, Q8_KByHand) {
  // amax = 127 -> d = 1: codes are x rounded; bsums add groups of 16.
  std::vector<float> x(256, 0.0f);
  for (int i = 0; i < 16; ++i) x[i] = 1.0f;  // group 0 sums to 16
  x[16] = -127.0f;                           // group 1: -127 + 2.5 -> -127 + 2 = -125
  x[17] = 2.5f;
  x[255] = 3.49f;  // group 15: 3
  BlockQ8_K b;
  quantize_act_ref(ActFormat::Q8_K, x.data(), &b, 256);
  EXPECT_EQ(b.d, 1.0f);
  EXPECT_EQ(b.bsums[0], 16);
  EXPECT_EQ(b.bsums[1], -125);
  EXPECT_EQ(b.bsums[2], 0);
  EXPECT_EQ(b.bsums[15], 3);
  EXPECT_EQ(b.qs[17], 2);
}

TEST(QuantAct, ZeroBlock) {
  std::vector<float> x(256, 0.0f);
  BlockQ8_K b;
  quantize_act_ref(ActFormat::Q8_K, x.data(), &b, 256);
  EXPECT_EQ(b.d, 0.0f);
  for (int8_t q : b.qs) EXPECT_EQ(q, 0);
}

TEST(QuantAct, Avx2BytesEqualReference) {
  if (!testing::cpu_has_avx2()) GTEST_SKIP() << "CPU lacks AVX2+FMA+F16C";
  for (ActFormat f : {ActFormat::F32, ActFormat::Q8_0, ActFormat::Q8_K}) {
    for (int64_t n : {256, 1024, 2560, 16384}) {
      for (uint64_t seed = 0; seed < 8; ++seed) {
        auto x = testing::random_floats(n, seed);
        // Exact ties and tiny blocks exercise the rounding rule and the d = 0 path.
        for (int64_t i = 0; i < 32; ++i) x[size_t(i)] = float(i % 5) * 0.5f - 1.0f;
        x[size_t(n - 1)] = 127.0f;
        if (seed == 1)
          for (int64_t i = 0; i < 256; ++i) x[size_t(i)] = 0.0f;
        if (seed == 2)
          for (int64_t i = 0; i < 256; ++i) x[size_t(i)] = 1e-41f * float(i % 3);
        std::vector<uint8_t> ref(act_bytes(f, n)), fast(act_bytes(f, n));
        quantize_act_ref(f, x.data(), ref.data(), n);
        quantize_act_avx2(f, x.data(), fast.data(), n);
        EXPECT_EQ(ref, fast) << "format " << int(f) << " n=" << n << " seed=" << seed;
      }
    }
  }
}

}  // namespace
}  // namespace strata::quant
