// Reference vectors built by hand from the ggml block definitions: each test sets a few bit
// fields and checks the dequantized values worked out from the layout (see the comments).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "test_quant_util.h"

namespace strata::quant {
namespace {

std::vector<float> deq(Type t, const void* blocks, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize(t, blocks, out.data(), n);
  return out;
}

TEST(QuantVectors, F16AndBF16) {
  // 0x3C00 = 1.0; 0xC000 = -2.0; 0x0001 = smallest subnormal 2^-24; 0x7BFF = 65504 (max finite).
  const uint16_t h[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
  EXPECT_EQ(deq(Type::F16, h, 4), (std::vector<float>{1.0f, -2.0f, 0x1p-24f, 65504.0f}));
  // bf16 is the top half of fp32: 0x3F80 = 1.0, 0xC0A0 = -5.0, 0x0001 = 2^-133 (fp32 subnormal).
  const uint16_t b[3] = {0x3F80, 0xC0A0, 0x0001};
  EXPECT_EQ(deq(Type::BF16, b, 3), (std::vector<float>{1.0f, -5.0f, 0x1p-133f}));
  const float f[2] = {1.5f, -0.25f};
  EXPECT_EQ(deq(Type::F32, f, 2), (std::vector<float>{1.5f, -0.25f}));
}

TEST(QuantVectors, Q8_0) {
  BlockQ8_0 b{};
  b.d = 0x3800;    // 0.5
  b.qs[0] = 1;     // 0.5
  b.qs[1] = -128;  // -64
  b.qs[2] = 127;   // 63.5
  b.qs[31] = -3;   // -1.5
  const auto y = deq(Type::Q8_0, &b, 32);
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[1], -64.0f);
  EXPECT_EQ(y[2], 63.5f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(y[31], -1.5f);
}

TEST(QuantVectors, Q4_0) {
  BlockQ4_0 b;
  b.d = 0xC000;                           // -2.0
  std::memset(b.qs, 0x88, sizeof(b.qs));  // code 8 = value 0 everywhere else
  b.qs[0] = 0x1F;  // element 0: low nibble 15 -> (15 - 8) * -2 = -14; element 16: 1 -> 14
  b.qs[5] = 0x80;  // element 5: 0 -> (0 - 8) * -2 = 16; element 21: 8 -> 0
  const auto y = deq(Type::Q4_0, &b, 32);
  EXPECT_EQ(y[0], -14.0f);
  EXPECT_EQ(y[16], 14.0f);
  EXPECT_EQ(y[5], 16.0f);
  EXPECT_EQ(y[21], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
}

TEST(QuantVectors, Q2_K) {
  BlockQ2_K b{};
  b.d = 0x3C00;        // 1.0
  b.dmin = 0x3800;     // 0.5
  b.scales[0] = 0x21;  // group 0: scale 1, min 2 -> x = q - 1
  b.scales[1] = 0x03;  // group 1: scale 3, min 0 -> x = 3 q
  b.scales[2] = 0xF0;  // group 2: scale 0, min 15 -> x = -7.5
  b.scales[4] = 0x12;  // group 4: scale 2, min 1 -> x = 2 q - 0.5
  b.scales[8] = 0x1F;  // group 8: scale 15, min 1 -> x = 15 q - 0.5
  // qs[0] = 0b11'10'01'00: bit pairs j = 0..3 hold elements 0, 32, 64, 96 with codes 0, 1, 2, 3.
  b.qs[0] = 0xE4;
  b.qs[16] = 0x02;  // element 16 (k = 1, l = 0, j = 0): code 2
  b.qs[32] = 0x03;  // element 128 (h = 1, j = 0): code 3
  const auto y = deq(Type::Q2_K, &b, 256);
  EXPECT_EQ(y[0], -1.0f);    // group 0, q = 0
  EXPECT_EQ(y[1], -1.0f);    // group 0, q = 0
  EXPECT_EQ(y[16], 6.0f);    // group 1, q = 2
  EXPECT_EQ(y[32], -7.5f);   // group 2, q = 1, scale 0
  EXPECT_EQ(y[64], 3.5f);    // group 4, q = 2
  EXPECT_EQ(y[96], 0.0f);    // group 6 has scale 0 and min 0
  EXPECT_EQ(y[128], 44.5f);  // group 8, q = 3
}

TEST(QuantVectors, Q3_K) {
  BlockQ3_K b{};
  b.d = 0x3800;                                 // 0.5
  std::memset(b.hmask, 0xFF, sizeof(b.hmask));  // high bits set: q = low 2 bits
  b.hmask[0] = 0xFE;  // bit 0 of hmask[0] clear: element 0 gets q = low - 4
  // Scales: bytes 8..11 = 0b10'10'10'10 give every scale high bits 2 (= 32, cancelling the
  // offset), so scale j = low nibble of byte j (j < 8) or high nibble of byte j - 8. Byte 10 =
  // 0xA8 clears the bit pair of scale 2 only: scale 2 = 5 - 32 = -27.
  b.scales[0] = 0x31;  // scale 0 = 1, scale 8 = 3
  b.scales[1] = 0x02;  // scale 1 = 2, scale 9 = 0
  b.scales[2] = 0x05;  // scale 2 low nibble 5
  b.scales[8] = 0xAA;
  b.scales[9] = 0xAA;
  b.scales[10] = 0xA8;
  b.scales[11] = 0xAA;
  b.qs[0] = 0x0B;   // element 0: low 3, high clear -> q = -1; element 32: low 2 -> q = 2
  b.qs[16] = 0x01;  // element 16: low 1 -> q = 1
  b.qs[32] = 0x03;  // element 128: low 3, hmask[0] bit 4 set -> q = 3
  const auto y = deq(Type::Q3_K, &b, 256);
  EXPECT_EQ(y[0], -0.5f);    // 0.5 * 1 * -1
  EXPECT_EQ(y[1], 0.0f);     // q = 0
  EXPECT_EQ(y[16], 1.0f);    // 0.5 * 2 * 1 (group 1)
  EXPECT_EQ(y[32], -27.0f);  // 0.5 * -27 * 2 (group 2)
  EXPECT_EQ(y[128], 4.5f);   // 0.5 * 3 * 3 (group 8)
  EXPECT_EQ(y[144], 0.0f);   // group 9: scale 0
}

// Q4_K and Q5_K share the scale packing: byte 0 = 0x42 gives scale 0 = 2 and the high bits (1)
// of scale 4; byte 4 = 0x03 gives min 0 = 3; byte 8 = 0x25 gives scale 4 = 5 | 1 << 4 = 21 and
// min 4 = 2. d = 1, dmin = 0.5: group 0 is x = 2 q - 1.5, group 4 is x = 21 q - 1.
void set_k4_scales(uint8_t* s) {
  s[0] = 0x42;
  s[4] = 0x03;
  s[8] = 0x25;
}

TEST(QuantVectors, Q4_K) {
  BlockQ4_K b{};
  b.d = 0x3C00;
  b.dmin = 0x3800;
  set_k4_scales(b.scales);
  b.qs[0] = 0x7A;   // element 0 (low nibble) q = 10; element 32 (high nibble) q = 7
  b.qs[64] = 0x03;  // element 128 (j = 2, low nibble) q = 3
  const auto y = deq(Type::Q4_K, &b, 256);
  EXPECT_EQ(y[0], 18.5f);    // 2 * 10 - 1.5
  EXPECT_EQ(y[1], -1.5f);    // q = 0
  EXPECT_EQ(y[32], 0.0f);    // group 1: scale 0, min 0
  EXPECT_EQ(y[128], 62.0f);  // 21 * 3 - 1
  EXPECT_EQ(y[160], 0.0f);   // group 5: scale 0, min 0
}

TEST(QuantVectors, Q5_K) {
  BlockQ5_K b{};
  b.d = 0x3C00;
  b.dmin = 0x3800;
  set_k4_scales(b.scales);
  b.qs[0] = 0x7A;
  b.qs[64] = 0x03;
  b.qh[0] = 0x11;  // bit 0: element 0 gets +16; bit 4 (j = 2, low nibble): element 128 gets +16
  b.qh[1] = 0x01;  // element 1 gets +16
  const auto y = deq(Type::Q5_K, &b, 256);
  EXPECT_EQ(y[0], 50.5f);     // 2 * 26 - 1.5
  EXPECT_EQ(y[1], 30.5f);     // 2 * 16 - 1.5
  EXPECT_EQ(y[2], -1.5f);     // q = 0
  EXPECT_EQ(y[128], 398.0f);  // 21 * 19 - 1
}

TEST(QuantVectors, Q6_K) {
  BlockQ6_K b{};
  b.d = 0x3800;  // 0.5
  b.scales[0] = 2;
  b.scales[2] = -3;
  b.scales[4] = 4;
  b.scales[8] = 1;
  b.ql[0] = 0x5F;   // element 0 low bits 15, element 64 low bits 5
  b.qh[0] = 0x93;   // 0b10'01'00'11: high bits 3 (element 0), 0 (32), 1 (64), 2 (96)
  b.ql[64] = 0x01;  // element 128 low bits 1
  b.qh[32] = 0x02;  // element 128 high bits 2
  const auto y = deq(Type::Q6_K, &b, 256);
  EXPECT_EQ(y[0], 31.0f);    // 0.5 * 2 * (63 - 32)
  EXPECT_EQ(y[1], -32.0f);   // 0.5 * 2 * (0 - 32)
  EXPECT_EQ(y[32], 48.0f);   // 0.5 * -3 * (0 - 32), group 2
  EXPECT_EQ(y[64], -22.0f);  // 0.5 * 4 * (21 - 32), group 4
  EXPECT_EQ(y[96], 0.0f);    // group 6: scale 0
  EXPECT_EQ(y[128], 0.5f);   // 0.5 * 1 * (33 - 32), group 8
}

}  // namespace
}  // namespace strata::quant
