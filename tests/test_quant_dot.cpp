// Dot kernels: AVX2 against the scalar reference (bitwise where dot_tolerance is 0), the
// reference against the dequantized definition, mat-vec and dispatch, random_blocks.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "test_quant_util.h"
#include "util/cpu.h"

namespace strata::quant {
namespace {

using testing::block_elems;
using testing::kMyTypes;

class QuantDot : public ::testing::TestWithParam<Type> {};

// Lengths of one to many blocks (and, for the float formats, lengths with tails).
std::vector<int64_t> lengths(Type t) {
  const int64_t be = std::max<int64_t>(block_elems(t), 32);
  std::vector<int64_t> out = {be, 2 * be, 7 * be, 8 * be, 9 * be, 256, 2560, 4096, 16384};
  if (block_elems(t) == 1) out.insert(out.end(), {1, 5, 31, 33, 100, 1000, 2561});
  std::erase_if(out, [&](int64_t n) { return n % block_elems(t) != 0; });
  return out;
}

struct Case {
  std::vector<uint8_t> w, a;
  std::vector<float> x;
};

Case make_case(Type t, int64_t n, uint64_t seed) {
  const FormatKernels& k = kernels(t);
  Case c{testing::random_weights(t, n, seed), {}, testing::random_floats(n, seed + 1000)};
  c.a.resize(act_bytes(k.act, n));
  quantize_act_ref(k.act, c.x.data(), c.a.data(), n);
  return c;
}

TEST_P(QuantDot, Avx2MatchesReference) {
  if (!testing::cpu_has_avx2()) GTEST_SKIP() << "CPU lacks AVX2+FMA+F16C";
  const FormatKernels& k = kernels(GetParam());
  ASSERT_NE(k.dot_avx2, nullptr);
  for (int64_t n : lengths(GetParam())) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      const Case c = make_case(GetParam(), n, seed * 7919 + uint64_t(n));
      const float ref = k.dot_ref(c.w.data(), c.a.data(), n);
      const float fast = k.dot_avx2(c.w.data(), c.a.data(), n);
      if (k.dot_tolerance == 0.0f) {
        EXPECT_EQ(std::bit_cast<uint32_t>(fast), std::bit_cast<uint32_t>(ref))
            << "n=" << n << " seed=" << seed << " ref=" << ref << " avx2=" << fast;
      } else {
        const auto wd = [&] {
          std::vector<float> v(static_cast<size_t>(n));
          k.dequantize(c.w.data(), v.data(), n);
          return v;
        }();
        const auto ad = testing::dequantize_act(k.act, c.a.data(), n);
        double mag = 0;
        for (int64_t i = 0; i < n; ++i) mag += std::fabs(double(wd[i]) * ad[i]);
        EXPECT_LE(std::fabs(double(fast) - ref), k.dot_tolerance * mag) << "n=" << n;
      }
    }
  }
}

// The reference dot is the dot of the dequantized vectors, up to float rounding: each lane adds
// at most n / 8 terms, each with a few roundings of relative 2^-24.
TEST_P(QuantDot, ReferenceMatchesDequantized) {
  const FormatKernels& k = kernels(GetParam());
  for (int64_t n : lengths(GetParam())) {
    const Case c = make_case(GetParam(), n, 42 + uint64_t(n));
    std::vector<float> wd(static_cast<size_t>(n));
    k.dequantize(c.w.data(), wd.data(), n);
    const auto ad = testing::dequantize_act(k.act, c.a.data(), n);
    double exact = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      exact += double(wd[i]) * ad[i];
      mag += std::fabs(double(wd[i]) * ad[i]);
    }
    const double bound = (double(n) / 8 + 16) * 0x1p-24 * mag;
    EXPECT_NEAR(k.dot_ref(c.w.data(), c.a.data(), n), exact, bound) << "n=" << n;
  }
}

TEST_P(QuantDot, MatvecEqualsRowDots) {
  const Type t = GetParam();
  const FormatKernels& k = kernels(t);
  const int64_t cols = 1024, rows = 13;
  const size_t stride = row_bytes(t, cols);
  const auto w = testing::random_weights(t, rows * cols, 5);
  const auto x = testing::random_floats(cols, 6);
  std::vector<uint8_t> scratch(act_bytes(k.act, cols)), a(act_bytes(k.act, cols));
  std::vector<float> y(static_cast<size_t>(rows));
  matvec(t, w.data(), stride, rows, cols, x.data(), y.data(), scratch.data());
  quantize_act_ref(k.act, x.data(), a.data(), cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float ref = k.dot_ref(w.data() + size_t(r) * stride, a.data(), cols);
    if (k.dot_tolerance == 0.0f)
      EXPECT_EQ(std::bit_cast<uint32_t>(y[r]), std::bit_cast<uint32_t>(ref)) << "row " << r;
    else
      EXPECT_NEAR(y[r], ref, k.dot_tolerance * std::fabs(ref) + 1e-6f) << "row " << r;
  }
}

TEST_P(QuantDot, DispatchFollowsCpu) {
  const FormatKernels& k = kernels(GetParam());
  const DotFn want = cpu_features().avx512 && k.dot_avx512 ? k.dot_avx512
                     : cpu_features().avx2 && k.dot_avx2   ? k.dot_avx2
                                                           : k.dot_ref;
  EXPECT_EQ(dot_kernel(GetParam()), want);
  if (const char* isa = std::getenv("STRATA_ISA"); isa && std::string(isa) == "scalar") {
    EXPECT_EQ(dot_kernel(GetParam()), k.dot_ref);
  }
}

TEST_P(QuantDot, RandomBlocksFiniteAndDeterministic) {
  const Type t = GetParam();
  const int64_t n = 64 * std::max<int64_t>(block_elems(t), 32);
  const auto w1 = testing::random_weights(t, n, 99), w2 = testing::random_weights(t, n, 99);
  const auto w3 = testing::random_weights(t, n, 100);
  EXPECT_EQ(w1, w2);
  EXPECT_NE(w1, w3);
  std::vector<float> v(static_cast<size_t>(n));
  kernels(t).dequantize(w1.data(), v.data(), n);
  float amax = 0;
  for (float f : v) {
    ASSERT_TRUE(std::isfinite(f));
    amax = std::max(amax, std::fabs(f));
  }
  EXPECT_LE(amax, 2.5f);
  EXPECT_GT(amax, 0.1f);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantDot, ::testing::ValuesIn(kMyTypes),
                         [](const auto& info) { return std::string(type_name(info.param)); });

}  // namespace
}  // namespace strata::quant
