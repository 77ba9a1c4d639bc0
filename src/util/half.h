// IEEE binary16 and bfloat16 conversions, bit-exact and independent of the host's FPU mode.
// Rounding to the narrow type is round-to-nearest-even, as F16C's _mm_cvtps_ph(x, 0) and
// ggml's reference conversions do, so scalar and SIMD paths agree bit for bit.
#pragma once

#include <bit>
#include <cstdint>

namespace strata {

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: value = mant * 2^-24, exact in fp32.
    const float v = float(mant) * 0x1p-24f;
    bits = sign | std::bit_cast<uint32_t>(v);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan: keep a quiet nan payload bit
    return uint16_t(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 | ((abs >> 13) & 0x3ff) : 0));
  }
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): round abs * 2^24 to an integer, ties to even.
    const float scaled = std::bit_cast<float>(abs) * 0x1p24f;
    uint32_t q = uint32_t(scaled);
    const float rem = scaled - float(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1))) ++q;
    return uint16_t(sign | q);
  }
  uint32_t mant = abs + 0xfffu + ((abs >> 13) & 1);  // round to nearest even at bit 13
  return uint16_t(sign | ((mant - 0x38000000u) >> 13));
}

inline float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet nan
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

}  // namespace strata
