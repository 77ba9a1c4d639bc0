// IQ2_XXS, IQ2_XS, IQ3_XXS and IQ4_XS against ggml's block definitions: hand-built blocks with
// values worked out from the definition, the codebooks, and the AVX2 dots against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "quant/formats/formats.h"
#include "quant/formats/iq_common.h"
#include "quant/kernels.h"
#include "quant/types.h"
#include "util/cpu.h"
#include "util/half.h"
#include "util/rng.h"

namespace strata::quant {
namespace {

constexpr uint16_t kOne = 0x3C00;  // fp16 1.0

// 64-bit FNV-1a over the little-endian bytes of a table.
template <typename T>
uint64_t fnv1a(const T* table, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i)
    for (size_t b = 0; b < sizeof(T); ++b) {
      h ^= uint8_t(uint64_t(table[i]) >> (8 * b));
      h *= 0x100000001b3ull;
    }
  return h;
}

TEST(QuantIQ, GridTables) {
  EXPECT_EQ(iq::kIQ2XXSGrid[0], 0x0808080808080808ull);
  EXPECT_EQ(iq::kIQ2XXSGrid[1], 0x080808080808082bull);
  EXPECT_EQ(iq::kIQ2XXSGrid[100], 0x08192b0808081908ull);
  EXPECT_EQ(iq::kIQ2XXSGrid[255], 0x2b2b2b1908081908ull);
  EXPECT_EQ(iq::kIQ2XSGrid[1], 0x080808080808082bull);
  EXPECT_EQ(iq::kIQ2XSGrid[300], 0x1908190808191908ull);
  EXPECT_EQ(iq::kIQ2XSGrid[511], 0x2b2b2b2b2b2b2b2bull);
  EXPECT_EQ(iq::kIQ3XXSGrid[0], 0x04040404u);
  EXPECT_EQ(iq::kIQ3XXSGrid[100], 0x14040c1cu);
  EXPECT_EQ(iq::kIQ3XXSGrid[200], 0x2c043e04u);
  EXPECT_EQ(iq::kIQ3XXSGrid[255], 0x3e341c04u);
  // Checksums of ggml's tables (computed from ggml-common.h), so any edit is caught.
  EXPECT_EQ(fnv1a(iq::kIQ2XXSGrid, 256), 0xbb4ee025b5ac6e8eull);
  EXPECT_EQ(fnv1a(iq::kIQ2XSGrid, 512), 0xc9b1ee61e79909bdull);
  EXPECT_EQ(fnv1a(iq::kIQ3XXSGrid, 256), 0xdfa5dc83d6a155d5ull);
  const int8_t iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};
  EXPECT_EQ(std::memcmp(iq::kIQ4NLValues, iq4nl, 16), 0);
}

TEST(QuantIQ, SignBytesAreGgmlKsigns) {
  EXPECT_EQ(iq::sign_byte(0), 0);
  EXPECT_EQ(iq::sign_byte(1), 129);
  EXPECT_EQ(iq::sign_byte(3), 3);
  EXPECT_EQ(iq::sign_byte(112), 240);
  EXPECT_EQ(iq::sign_byte(126), 126);
  EXPECT_EQ(iq::sign_byte(127), 255);
  EXPECT_EQ(iq::sign_byte(0x80 | 5), 5);  // bits above the field are ignored
  uint8_t table[128];
  for (int i = 0; i < 128; ++i) table[i] = iq::sign_byte(i);
  EXPECT_EQ(fnv1a(table, 128),
            0xf19ba8f8c3292ba5ull);  // checksum of ggml's ksigns_iq2xs
}

std::vector<float> dequant(const FormatKernels& k, const void* blocks, int64_t n) {
  std::vector<float> out(n);
  k.dequantize(blocks, out.data(), n);
  return out;
}

// A Q8_K activation block with d = 0.5 and every code 1, so a dot is half the sum of the weights.
iq::BlockQ8K half_ones() {
  iq::BlockQ8K a{};
  a.d = 0.5f;
  std::memset(a.qs, 1, sizeof(a.qs));
  return a;
}

void expect_dots(const FormatKernels& k, const void* w, float expected) {
  const iq::BlockQ8K a = half_ones();
  EXPECT_EQ(k.dot_ref(w, &a, 256), expected);
  if (hardware_features().avx2) {
    EXPECT_EQ(k.dot_avx2(w, &a, 256), expected);
  }
  if (hardware_features().avx512 && k.dot_avx512) {
    EXPECT_EQ(k.dot_avx512(w, &a, 256), expected);
  }
}

TEST(QuantIQ, IQ2XXSHandBuilt) {
  iq::BlockIQ2XXS b{};
  b.d = kOne;
  // Sub-block 0: grid indices 0, 1, 255, 2; sign fields 0, 1, 127, 3; scale 0, so db = 1 * (0.5 +
  // 0) * 0.25 = 0.125. Field 1 has one bit, so element 7 is negative too; 127 has seven, so all
  // eight are; 3 has two, so only elements 0 and 1.
  const uint32_t grids0 = 0u | 1u << 8 | 255u << 16 | 2u << 24;
  const uint32_t aux0 = 0u | 1u << 7 | 127u << 14 | 3u << 21 | 0u << 28;
  // Sub-block 1: grid 0 everywhere, no signs, scale 15: db = (0.5 + 15) * 0.25 = 3.875.
  const uint32_t aux1 = 15u << 28;
  std::memcpy(b.qs + 0, &grids0, 4);
  std::memcpy(b.qs + 2, &aux0, 4);
  std::memcpy(b.qs + 6, &aux1, 4);
  std::vector<float> want(256,
                          1.0f);  // other sub-blocks: grid 0 (all 8) * 0.125
  const float sub0[32] = {1,       1,       1,       1,  1,
                          1,       1,       1,  // grid[0] = 8s
                          -5.375f, 1,       1,       1,  1,
                          1,       1,       -1,  // grid[1] = 43, 8 x7
                          -1,      -3.125f, -1,      -1, -3.125f,
                          -5.375f, -5.375f, -5.375f,  // grid[255] bytes 8,25,8,8,25,43,43,43
                          -3.125f, -3.125f, 1,       1,  1,
                          1,       1,       1};  // grid[2] = 25, 25, 8 x6
  for (int j = 0; j < 32; ++j) want[j] = sub0[j];
  for (int j = 32; j < 64; ++j) want[j] = 31.0f;  // 8 * 3.875
  EXPECT_EQ(dequant(kIQ2_XXSKernels, &b, 256), want);
  // Sum: sub-block 0 is -18, sub-block 1 is 992, the six others 32 each: 1166, halved.
  expect_dots(kIQ2_XXSKernels, &b, 583.0f);
}

TEST(QuantIQ, IQ2XSHandBuilt) {
  iq::BlockIQ2XS b{};
  b.d = kOne;
  b.qs[0] = 1 | 1 << 9;       // grid[1] = 43, 8 x7; sign field 1: elements 0 and 7 negative
  b.qs[1] = 511 | 127 << 9;   // grid[511] = 43 x8; all negative
  b.scales[0] = 3 | 10 << 4;  // elements 0..15: (0.5 + 3) * 0.25 = 0.875; 16..31: 2.625
  std::vector<float> want(256,
                          1.0f);  // the rest: grid[0] = 8s, scale 0: 8 * 0.125
  const float first16[16] = {-37.625f, 7,        7,        7,
                             7,        7,        7,        -7,  // 43 * 0.875, 8 * 0.875
                             -37.625f, -37.625f, -37.625f, -37.625f,
                             -37.625f, -37.625f, -37.625f, -37.625f};
  for (int j = 0; j < 16; ++j) want[j] = first16[j];
  for (int j = 16; j < 32; ++j) want[j] = 21.0f;  // 8 * 2.625
  EXPECT_EQ(dequant(kIQ2_XSKernels, &b, 256), want);
  // -37.625 * 9 + 6 * 7 - 7 + 16 * 21 + 224 = 256.375, halved.
  expect_dots(kIQ2_XSKernels, &b, 128.1875f);
}

TEST(QuantIQ, IQ3XXSHandBuilt) {
  iq::BlockIQ3XXS b{};
  b.d = kOne;
  b.qs[0] = 0;    // grid[0] = 4, 4, 4, 4
  b.qs[1] = 255;  // grid[255] = 4, 28, 52, 62
  // Sub-block 0: sign field 1 (elements 0 and 7 negative), scale 1: (0.5 + 1) * 0.5 = 0.75.
  const uint32_t aux0 = 1u | 1u << 28;
  std::memcpy(b.qs + 64, &aux0, 4);
  std::vector<float> want(256, 1.0f);           // sub-blocks 1..7: 4 * (0.5 + 0) * 0.5
  for (int j = 0; j < 32; ++j) want[j] = 3.0f;  // the rest of sub-block 0: 4 * 0.75
  const float first8[8] = {-3, 3, 3, 3, 3, 21, 39, -46.5f};
  for (int j = 0; j < 8; ++j) want[j] = first8[j];
  EXPECT_EQ(dequant(kIQ3_XXSKernels, &b, 256), want);
  // (-3 + 9 + 3 + 21 + 39 - 46.5) + 24 * 3 + 224 = 318.5, halved.
  expect_dots(kIQ3_XXSKernels, &b, 159.25f);
}

TEST(QuantIQ, IQ4XSHandBuilt) {
  iq::BlockIQ4XS b{};
  b.d = kOne;
  // Scales (6 bits, minus 32): sub-block 0: 33 (low 1, high 2) -> 1; sub-block 1: 0 -> -32;
  // sub-blocks 2..7: 32 (low 0, high 2) -> 0.
  b.scales_l[0] = 0x01;
  b.scales_h = 2 | 0 << 2 | 2 << 4 | 2 << 6 | 2 << 8 | 2 << 10 | 2 << 12 | 2 << 14;
  b.qs[0] = 0xF0;   // element 0: values[0] = -127; element 16: values[15] = 113
  b.qs[1] = 0x78;   // element 1: values[8] = 1; element 17: values[7] = -10
  b.qs[16] = 0x09;  // element 32: values[9] = 13 (* -32); element 48: values[0]
  std::vector<float> want(256, 0.0f);
  for (int j = 0; j < 32; ++j) want[j] = -127.0f;  // nibble 0, scale 1
  want[16] = 113, want[1] = 1, want[17] = -10;
  for (int j = 32; j < 64; ++j) want[j] = 4064.0f;  // -127 * -32
  want[32] = -416.0f;                               // 13 * -32
  EXPECT_EQ(dequant(kIQ4_XSKernels, &b, 256), want);
  // -127 * 29 + 113 + 1 - 10 - 416 + 31 * 4064 = 121989, halved.
  expect_dots(kIQ4_XSKernels, &b, 60994.5f);
}

const FormatKernels* const kIQ[] = {&kIQ2_XXSKernels, &kIQ2_XSKernels, &kIQ3_XXSKernels,
                                    &kIQ4_XSKernels};

TEST(QuantIQ, Registered) {
  for (const FormatKernels* k : kIQ) {
    EXPECT_EQ(&kernels(k->type), k);
    EXPECT_EQ(k->act, ActFormat::Q8_K);
    EXPECT_EQ(k->dot_tolerance, 0.0f);
    EXPECT_EQ(type_info(k->type).block_elems, 256);
  }
}

TEST(QuantIQ, RandomBlocksFiniteBoundedDeterministic) {
  for (const FormatKernels* k : kIQ) {
    const size_t bytes = type_info(k->type).block_bytes;
    const int64_t nb = 64;
    std::vector<uint8_t> a(nb * bytes), b(nb * bytes);
    Rng r1(7), r2(7);
    k->random_blocks(r1, a.data(), nb);
    k->random_blocks(r2, b.data(), nb);
    EXPECT_EQ(a, b) << type_name(k->type);
    float amax = 0.0f;
    for (float v : dequant(*k, a.data(), nb * 256)) {
      ASSERT_TRUE(std::isfinite(v));
      amax = std::max(amax, std::fabs(v));
    }
    EXPECT_LE(amax, 2.0f) << type_name(k->type);
    EXPECT_GE(amax, 0.5f) << type_name(k->type);
  }
}

// Random Q8_K activations: either quantize_act of random floats, or raw blocks whose codes span the
// whole range quantize_act can write, [-127, 127], to reach the kernels' integer extremes.
std::vector<uint8_t> random_act(Rng& rng, int64_t n, bool raw) {
  std::vector<uint8_t> out(act_bytes(ActFormat::Q8_K, n));
  if (!raw) {
    std::vector<float> x(n);
    for (float& v : x) v = rng.normal() * (rng.below(8) == 0 ? 10.0f : 1.0f);
    quantize_act(ActFormat::Q8_K, x.data(), out.data(), n);
    return out;
  }
  auto* blocks = reinterpret_cast<iq::BlockQ8K*>(out.data());
  for (int64_t i = 0; i < n / 256; ++i) {
    blocks[i].d = rng.uniform(0.001f, 0.1f);
    const bool extreme = rng.below(2) == 0;
    for (int8_t& q : blocks[i].qs)
      q = extreme ? (rng.below(2) ? 127 : -127) : int8_t(int(rng.below(255)) - 127);
  }
  return out;
}

TEST(QuantIQ, DotRefMatchesDequantizedSum) {
  Rng rng(11);
  for (const FormatKernels* k : kIQ) {
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t nb = 1 + rng.below(24), n = nb * 256;
      std::vector<uint8_t> w(nb * type_info(k->type).block_bytes);
      k->random_blocks(rng, w.data(), nb);
      const std::vector<uint8_t> a = random_act(rng, n, trial % 2);
      const std::vector<float> wf = dequant(*k, w.data(), n);
      const auto* ab = reinterpret_cast<const iq::BlockQ8K*>(a.data());
      double exact = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double p = double(wf[i]) * ab[i / 256].d * ab[i / 256].qs[i % 256];
        exact += p;
        mag += std::fabs(p);
      }
      // Per block one rounding of the integer sum, one of d_w * d_a and one fma.
      const double bound = 4.0 * nb * 0x1p-24 * mag + 1e-30;
      EXPECT_NEAR(k->dot_ref(w.data(), a.data(), n), exact, bound) << type_name(k->type);
    }
  }
}

TEST(QuantIQ, Avx2BitwiseEqualsReference) {
  if (!hardware_features().avx2) GTEST_SKIP() << "CPU lacks AVX2+FMA+F16C";
  Rng rng(12);
  for (const FormatKernels* k : kIQ) {
    ASSERT_NE(k->dot_avx2, nullptr);
    for (int trial = 0; trial < 200; ++trial) {
      const int64_t nb = 1 + rng.below(40), n = nb * 256;
      std::vector<uint8_t> w(nb * type_info(k->type).block_bytes);
      k->random_blocks(rng, w.data(), nb);
      if (trial % 5 == 0) {
        // Sometimes the largest scale codes everywhere, to reach the largest integer sums.
        for (uint8_t& byte : w) byte |= trial % 10 == 0 ? 0xF0 : 0;
        for (int64_t i = 0; i < nb; ++i)
          std::memcpy(w.data() + i * type_info(k->type).block_bytes, &kOne, 2);
      }
      const std::vector<uint8_t> a = random_act(rng, n, trial % 3 == 0);
      const float ref = k->dot_ref(w.data(), a.data(), n);
      const float fast = k->dot_avx2(w.data(), a.data(), n);
      ASSERT_EQ(std::bit_cast<uint32_t>(fast), std::bit_cast<uint32_t>(ref))
          << type_name(k->type) << " trial " << trial << ": " << fast << " vs " << ref;
    }
  }
}

}  // namespace
}  // namespace strata::quant
