// Multi-activation dots (DotRows): every result equals the single-row dot of the same dispatch bit
// for bit, and the scalar reference where the format's fast dot is exact, for every count, length
// and format. This is what keeps a T-row window equal to T one-row windows once matmul and the MoE
// tiles decode a weight row once for several activations.
#include <gtest/gtest.h>

#include <bit>
#include <vector>

#include "test_quant_util.h"

namespace strata::quant {
namespace {

constexpr Type kAllFormats[] = {Type::F32,     Type::F16,    Type::BF16,    Type::Q8_0,
                                Type::Q4_0,    Type::Q2_K,   Type::Q3_K,    Type::Q4_K,
                                Type::Q5_K,    Type::Q6_K,   Type::IQ2_XXS, Type::IQ2_XS,
                                Type::IQ3_XXS, Type::IQ4_XS, Type::FP8_E4M3};

class QuantDotRows : public ::testing::TestWithParam<Type> {};

// One block up to lengths whose block count leaves every tail of the 8-block groups.
std::vector<int64_t> lengths(Type t) {
  const FormatKernels& k = kernels(t);
  const int64_t be = std::max(testing::block_elems(t), act_block_elems(k.act));
  return {be, 3 * be, 8 * be, 11 * be, 21 * be};
}

TEST_P(QuantDotRows, EachResultEqualsTheSingleRowDot) {
  const Type t = GetParam();
  const FormatKernels& k = kernels(t);
  const DotRows rows = dot_rows_kernel(t);
  const DotFn dot = dot_kernel(t);
  EXPECT_EQ(rows.dot, dot);
  for (int64_t n : lengths(t)) {
    const auto w = testing::random_weights(t, n, 17 + uint64_t(n));
    std::vector<std::vector<uint8_t>> act(kMaxDotRows);
    const void* ptrs[kMaxDotRows];
    for (int j = 0; j < kMaxDotRows; ++j) {
      const auto x = testing::random_floats(n, 1000 * uint64_t(j) + uint64_t(n));
      act[j].resize(act_bytes(k.act, n));
      quantize_act_ref(k.act, x.data(), act[j].data(), n);
      ptrs[j] = act[j].data();
    }
    for (int count = 1; count <= kMaxDotRows; ++count) {
      float out[kMaxDotRows];
      rows(w.data(), ptrs, count, n, out);
      for (int j = 0; j < count; ++j) {
        const float single = dot(w.data(), ptrs[j], n);
        EXPECT_EQ(std::bit_cast<uint32_t>(out[j]), std::bit_cast<uint32_t>(single))
            << "n=" << n << " count=" << count << " row " << j;
        if (k.dot_tolerance == 0.0f) {
          const float ref = k.dot_ref(w.data(), ptrs[j], n);
          EXPECT_EQ(std::bit_cast<uint32_t>(out[j]), std::bit_cast<uint32_t>(ref))
              << "n=" << n << " count=" << count << " row " << j << " (reference)";
        }
      }
    }
  }
}

// The same activation in every slot gives the same bits in every slot (no state leaks between
// the accumulators of one call).
TEST_P(QuantDotRows, RepeatedActivationGivesRepeatedResult) {
  const Type t = GetParam();
  const FormatKernels& k = kernels(t);
  const int64_t n = 8 * std::max(testing::block_elems(t), act_block_elems(k.act));
  const auto w = testing::random_weights(t, n, 3);
  const auto x = testing::random_floats(n, 4);
  std::vector<uint8_t> a(act_bytes(k.act, n));
  quantize_act_ref(k.act, x.data(), a.data(), n);
  const void* ptrs[kMaxDotRows];
  for (auto& p : ptrs) p = a.data();
  float out[kMaxDotRows];
  dot_rows_kernel(t)(w.data(), ptrs, kMaxDotRows, n, out);
  for (int j = 1; j < kMaxDotRows; ++j)
    EXPECT_EQ(std::bit_cast<uint32_t>(out[j]), std::bit_cast<uint32_t>(out[0])) << "row " << j;
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantDotRows, ::testing::ValuesIn(kAllFormats),
                         [](const auto& info) { return std::string(type_name(info.param)); });

}  // namespace
}  // namespace strata::quant
