// AVX-512 dot kernels against the scalar reference, bit for bit, for every format that has them:
// random blocks and activations, extreme codes (largest scales, activation codes at +-127, weight
// codes at -128 where the format allows them) and block counts that leave every tail of the 8-block
// groups; each multi-activation result equals the single-activation kernel. The activation
// quantizer's AVX-512 path is checked in test_quant_act.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <iterator>
#include <vector>

#include "test_quant_util.h"
#include "util/cpu.h"
#include "util/half.h"

namespace strata::quant {
namespace {

// The formats with AVX-512 dot kernels, and those of them with a multi-activation kernel too;
// TheListsAreComplete keeps both in step with the registry.
constexpr Type kAvx512Formats[] = {Type::Q8_0, Type::Q4_K, Type::Q6_K, Type::IQ2_XXS,
                                   Type::IQ2_XS};
constexpr Type kAvx512RowsFormats[] = {Type::Q8_0, Type::IQ2_XS};

template <size_t N>
bool listed(const Type (&list)[N], Type t) {
  return std::find(std::begin(list), std::end(list), t) != std::end(list);
}

constexpr Type kAllFormats[] = {Type::F32,     Type::F16,    Type::BF16,    Type::Q8_0,
                                Type::Q4_0,    Type::Q2_K,   Type::Q3_K,    Type::Q4_K,
                                Type::Q5_K,    Type::Q6_K,   Type::IQ2_XXS, Type::IQ2_XS,
                                Type::IQ3_XXS, Type::IQ4_XS, Type::FP8_E4M3};

// Activations of n elements: quantized random floats, or (raw) blocks whose codes sit at the ends
// of what quantize_act writes, [-127, 127], with a scale of either sign.
std::vector<uint8_t> activation(ActFormat f, int64_t n, Rng& rng, bool raw) {
  std::vector<uint8_t> out(act_bytes(f, n));
  if (!raw || f == ActFormat::F32) {
    const auto x = testing::random_floats(n, rng.next());
    quantize_act_ref(f, x.data(), out.data(), n);
    return out;
  }
  const auto code = [&] { return rng.below(2) ? int8_t(rng.below(2) ? 127 : -127) : int8_t(int(rng.below(255)) - 127); };
  if (f == ActFormat::Q8_0) {
    auto* b = reinterpret_cast<BlockQ8_0*>(out.data());
    for (int64_t i = 0; i < n / kQK; ++i) {
      b[i].d = fp32_to_fp16(rng.uniform(0.001f, 0.1f));
      for (int8_t& q : b[i].qs) q = code();
    }
  } else {
    auto* b = reinterpret_cast<BlockQ8_K*>(out.data());
    for (int64_t i = 0; i < n / kQK_K; ++i) {
      b[i].d = rng.uniform(0.001f, 0.1f) * (rng.below(2) ? 1.0f : -1.0f);
      int sum = 0;
      for (int k = 0; k < kQK_K; ++k) {
        b[i].qs[k] = code();
        sum += b[i].qs[k];
        if (k % 16 == 15) b[i].bsums[k / 16] = int16_t(sum), sum = 0;
      }
    }
  }
  return out;
}

// Where a block of t keeps its fp16 scales (bytes the extreme-code trials leave alone).
struct ScaleField {
  size_t offset, bytes;
};
ScaleField scale_field(Type t) {
  switch (t) {
    case Type::Q4_K:
      return {0, 4};  // d, dmin
    case Type::Q6_K:
      return {208, 2};  // d after ql, qh and scales
    default:
      return {0, 2};  // Q8_0, IQ2_XXS, IQ2_XS: d first
  }
}

TEST(QuantAvx512, TheListsAreComplete) {
  for (Type t : kAllFormats) {
    EXPECT_EQ(kernels(t).dot_avx512 != nullptr, listed(kAvx512Formats, t)) << type_name(t);
    EXPECT_EQ(kernels(t).dot_rows_avx512 != nullptr, listed(kAvx512RowsFormats, t)) << type_name(t);
  }
}

class QuantAvx512Dot : public ::testing::TestWithParam<Type> {};

TEST_P(QuantAvx512Dot, BitwiseEqualsReference) {
  const Type t = GetParam();
  const FormatKernels& k = kernels(t);
  if (!hardware_features().avx512) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/DQ/VNNI";
  const int64_t be = std::max(testing::block_elems(t), act_block_elems(k.act));
  const int64_t bytes = type_info(t).block_bytes;
  Rng rng(uint64_t(t) * 131 + 7);
  for (int trial = 0; trial < 120; ++trial) {
    const int64_t nb = 1 + int64_t(rng.below(trial < 40 ? 24 : 70)), n = nb * be;
    std::vector<uint8_t> w(size_t(row_bytes(t, n)));
    k.random_blocks(rng, w.data(), n / testing::block_elems(t));
    if (trial % 5 == 0) {
      // Every code and sub-block scale byte with its top bits set (keeping the fp16 scales), to
      // reach the largest integer sums; for Q8_0 that puts weight codes at -128.
      const ScaleField keep = scale_field(t);
      for (size_t i = 0; i < w.size(); ++i) {
        const size_t at = i % size_t(bytes);
        if (at < keep.offset || at >= keep.offset + keep.bytes) w[i] |= trial % 10 == 0 ? 0xF0 : 0x80;
      }
    }
    const auto a = activation(k.act, n, rng, trial % 3 == 0);
    const float ref = k.dot_ref(w.data(), a.data(), n);
    const float fast = k.dot_avx512(w.data(), a.data(), n);
    ASSERT_EQ(std::bit_cast<uint32_t>(fast), std::bit_cast<uint32_t>(ref))
        << type_name(t) << " trial " << trial << " n=" << n << ": " << fast << " vs " << ref;
  }
}

class QuantAvx512Rows : public ::testing::TestWithParam<Type> {};

TEST_P(QuantAvx512Rows, EachEqualsTheSingleDot) {
  const Type t = GetParam();
  const FormatKernels& k = kernels(t);
  if (!hardware_features().avx512) GTEST_SKIP() << "CPU lacks AVX-512 F/BW/VL/DQ/VNNI";
  const int64_t be = std::max(testing::block_elems(t), act_block_elems(k.act));
  Rng rng(99);
  for (int64_t n : {be, 3 * be, 8 * be, 11 * be, 21 * be}) {
    const auto w = testing::random_weights(t, n, uint64_t(n));
    std::vector<std::vector<uint8_t>> acts;
    const void* ptrs[kMaxDotRows];
    for (int j = 0; j < kMaxDotRows; ++j) {
      acts.push_back(activation(k.act, n, rng, j % 2 == 1));
      ptrs[j] = acts.back().data();
    }
    for (int count = 1; count <= kMaxDotRows; ++count) {
      float out[kMaxDotRows];
      k.dot_rows_avx512(w.data(), ptrs, count, n, out);
      for (int j = 0; j < count; ++j)
        EXPECT_EQ(std::bit_cast<uint32_t>(out[j]),
                  std::bit_cast<uint32_t>(k.dot_avx512(w.data(), ptrs[j], n)))
            << type_name(t) << " n=" << n << " count=" << count << " row " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantAvx512Dot, ::testing::ValuesIn(kAvx512Formats),
                         [](const auto& info) { return std::string(type_name(info.param)); });
INSTANTIATE_TEST_SUITE_P(Formats, QuantAvx512Rows, ::testing::ValuesIn(kAvx512RowsFormats),
                         [](const auto& info) { return std::string(type_name(info.param)); });

}  // namespace
}  // namespace strata::quant
