// Activation layouts: sizes, hand-checked Q8_0/Q8_K values under ggml's x86 rule, the reference
// against that rule written out independently, and every SIMD level's bytes equal to the
// reference bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "test_quant_util.h"
#include "util/cpu.h"
#include "util/half.h"

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

// The rule multiplies by 127 / amax (ggml's), not by 1 / (amax / 127): for this pair the two
// products are 91.49999 and 91.5, so only the first gives ggml's code 91.
constexpr float kAmax = 0x1.8626eap+0f, kTieBreaker = 0x1.1918p+0f;

TEST(QuantAct, Q8_0MultipliesBy127OverAmax) {
  std::vector<float> x(32, 0.0f);
  x[0] = kAmax;
  x[1] = kTieBreaker;
  BlockQ8_0 b;
  quantize_act_ref(ActFormat::Q8_0, x.data(), &b, 32);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 91);
  EXPECT_EQ(b.d, fp32_to_fp16(kAmax / 127.0f));
}

TEST(QuantAct, Q8_KTakesTheSignOfTheFirstLargest) {
  // The first element of largest |x| is +kAmax: iscale = -127 / kAmax, so codes and d are
  // negative where x is positive, as ggml writes them; +-kAmax later does not change that.
  std::vector<float> x(256, 0.0f);
  x[3] = kAmax;
  x[4] = kTieBreaker;
  x[5] = -kAmax;
  x[200] = -1.0f;
  BlockQ8_K b;
  quantize_act_ref(ActFormat::Q8_K, x.data(), &b, 256);
  EXPECT_EQ(b.d, 1.0f / (-127.0f / kAmax));
  EXPECT_LT(b.d, 0.0f);
  EXPECT_EQ(b.qs[3], -127);
  EXPECT_EQ(b.qs[4], -91);
  EXPECT_EQ(b.qs[5], 127);
  EXPECT_EQ(b.bsums[0], -127 - 91 + 127);
  // The same block led by -kAmax flips every code and d.
  x[3] = -kAmax;
  x[5] = kAmax;
  quantize_act_ref(ActFormat::Q8_K, x.data(), &b, 256);
  EXPECT_GT(b.d, 0.0f);
  EXPECT_EQ(b.qs[3], -127);
  EXPECT_EQ(b.qs[4], 91);
  EXPECT_EQ(b.qs[5], 127);
}

// ggml's rule written out from its description (act_rule.h), with ggml's own rounding device:
// adding 1.5 * 2^23 rounds a float below 2^22 in magnitude to an integer, ties to even.
int magic_round(float v) {
  const float shifted = v + 12582912.0f;
  uint32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return int(bits & 0x007fffff) - 0x00400000;
}

void ggml_q8_k(const float* x, BlockQ8_K& y) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 256; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
  if (amax == 0.0f) {
    std::memset(&y, 0, sizeof y);
    return;
  }
  const float iscale = -127.0f / max;
  for (int j = 0; j < 256; ++j) y.qs[j] = int8_t(std::min(127, magic_round(iscale * x[j])));
  for (int g = 0; g < 16; ++g) {
    int s = 0;
    for (int j = 0; j < 16; ++j) s += y.qs[16 * g + j];
    y.bsums[g] = int16_t(s);
  }
  y.d = 1.0f / iscale;
}

void ggml_q8_0(const float* x, BlockQ8_0& y) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  y.d = fp32_to_fp16(amax / 127.0f);
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int j = 0; j < 32; ++j) y.qs[j] = int8_t(magic_round(x[j] * id));
}

TEST(QuantAct, ReferenceIsGgmlsRule) {
  for (uint64_t seed = 0; seed < 64; ++seed) {
    auto x = testing::random_floats(1024, seed);
    for (size_t i = 0; i < 64; ++i) x[i] = float(int(i % 9) - 4) * 0.25f;  // ties, equal |max|
    x[300] = std::ldexp(1.0f, -120);  // tiny but ordinary blocks
    for (size_t i = 512; i < 768; ++i) x[i] *= 1e-30f;
    std::vector<BlockQ8_K> k(4), kg(4);
    quantize_act_ref(ActFormat::Q8_K, x.data(), k.data(), 1024);
    for (int b = 0; b < 4; ++b) ggml_q8_k(x.data() + 256 * b, kg[size_t(b)]);
    EXPECT_EQ(std::memcmp(k.data(), kg.data(), sizeof(BlockQ8_K) * 4), 0) << "seed " << seed;
    std::vector<BlockQ8_0> z(32), zg(32);
    quantize_act_ref(ActFormat::Q8_0, x.data(), z.data(), 1024);
    for (int b = 0; b < 32; ++b) ggml_q8_0(x.data() + 32 * b, zg[size_t(b)]);
    EXPECT_EQ(std::memcmp(z.data(), zg.data(), sizeof(BlockQ8_0) * 32), 0) << "seed " << seed;
  }
}

TEST(QuantAct, ZeroBlock) {
  std::vector<float> x(256, 0.0f);
  BlockQ8_K b;
  quantize_act_ref(ActFormat::Q8_K, x.data(), &b, 256);
  EXPECT_EQ(b.d, 0.0f);
  for (int8_t q : b.qs) EXPECT_EQ(q, 0);
}

// Blocks where ggml's codes are undefined (act_rule.h) are zero blocks at every level.
TEST(QuantAct, ZeroInfNanAndTinyBlocks) {
  for (float v : {0.0f, INFINITY, -INFINITY, NAN, 1e-38f}) {
    std::vector<float> x(256, 0.5f * v);
    x[7] = v;
    BlockQ8_K k;
    quantize_act_ref(ActFormat::Q8_K, x.data(), &k, 256);
    EXPECT_EQ(k.d, 0.0f) << v;
    for (int8_t q : k.qs) EXPECT_EQ(q, 0) << v;
    for (int16_t s : k.bsums) EXPECT_EQ(s, 0) << v;
    BlockQ8_0 z;
    quantize_act_ref(ActFormat::Q8_0, x.data(), &z, 32);
    EXPECT_EQ(z.d, 0);
    for (int8_t q : z.qs) EXPECT_EQ(q, 0) << v;
  }
}

using QuantizeFn = void (*)(ActFormat, const float*, void*, int64_t);

void expect_bytes_equal_reference(QuantizeFn fast_path) {
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
        if (seed == 3) x[size_t(n - 200)] = NAN;
        if (seed == 4) x[40] = -INFINITY;
        if (seed == 5)  // the largest |x| twice, with both signs, in several blocks
          for (int64_t i = 0; i + 256 <= n; i += 256) x[size_t(i + 9)] = 40.0f, x[size_t(i + 3)] = -40.0f;
        std::vector<uint8_t> ref(act_bytes(f, n)), fast(act_bytes(f, n));
        quantize_act_ref(f, x.data(), ref.data(), n);
        fast_path(f, x.data(), fast.data(), n);
        EXPECT_EQ(ref, fast) << "format " << int(f) << " n=" << n << " seed=" << seed;
      }
    }
  }
}

TEST(QuantAct, Avx2BytesEqualReference) {
  if (!hardware_features().avx2) GTEST_SKIP() << "CPU lacks AVX2+FMA+F16C";
  expect_bytes_equal_reference(quantize_act_avx2);
}

TEST(QuantAct, Avx512BytesEqualReference) {
  if (!hardware_features().avx512) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/DQ/VNNI";
  expect_bytes_equal_reference(quantize_act_avx512);
}

// quantize_act takes the path of the level in force (STRATA_ISA included): same bytes.
TEST(QuantAct, DispatchEqualsReference) {
  expect_bytes_equal_reference(quantize_act);
}

}  // namespace
}  // namespace strata::quant
