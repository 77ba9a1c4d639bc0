// The scale step of activation quantization, shared by the scalar reference (act.cpp) and the
// SIMD paths (act_avx2.cpp, act_avx512.cpp) so that they write the same bytes. The rule is
// ggml's x86 rule, so that an activation quantizes to the bytes llama.cpp's CPU backend makes:
//
//  Q8_0 (ggml's AVX2 quantize_row_q8_0): amax = max |x| over the 32 elements; the block stores
//    d = fp16(amax / 127) and codes q = round-to-nearest-even(x * (127 / amax)).
//  Q8_K (ggml's quantize_row_q8_K_ref, which its x86 build calls): max = the first element of
//    largest |x|, with its sign; iscale = -127 / max; q = round-to-nearest-even(iscale * x);
//    d = 1 / iscale (so d is negative when max is positive, as in ggml); bsums are the sums of
//    16 codes.
//
// |x * (127 / amax)| <= 127 * (1 + 2^-24)^2 < 127.5, so every code is in [-127, 127] without a
// clamp (ggml's min(127, q) never acts); the i-quant kernels rely on -128 never appearing.
// amax is compared on the bit patterns (|x| as an integer), which orders finite values as floats
// do and does not depend on the order of a SIMD reduction.
//
// Where ggml's codes are undefined (inf * 0, nan) we define them: a block whose amax is zero,
// inf or nan, or so small that 127 / amax overflows (amax < 127 / FLT_MAX, below FLT_MIN * 32),
// becomes d = 0 and all-zero codes. ggml agrees for a zero block and multiplies its garbage by a d
// of 0 in the others, so dot products agree there too.
#pragma once

#include <bit>
#include <cfloat>
#include <cstdint>

namespace strata::quant {
namespace {  // internal linkage: each SIMD translation unit keeps its own copy

struct ActScale {
  bool zero;  // the block is d = 0 with all-zero codes
  float mul;  // what x is multiplied by before rounding
  float d;    // the block's scale (Q8_0: before the fp16 conversion)
};

inline bool act_block_is_zero(uint32_t amax_bits) {
  return amax_bits == 0 || amax_bits >= 0x7f800000u ||
         !(127.0f / std::bit_cast<float>(amax_bits) <= FLT_MAX);
}

// Q8_0 from the block's largest |x| as bits.
inline ActScale q8_0_scale(uint32_t amax_bits) {
  if (act_block_is_zero(amax_bits)) return {true, 0.0f, 0.0f};
  const float amax = std::bit_cast<float>(amax_bits);
  return {false, 127.0f / amax, amax / 127.0f};
}

// Q8_K from the block's largest |x| as bits and the first element with that |x|.
inline ActScale q8_k_scale(uint32_t amax_bits, float signed_max) {
  if (act_block_is_zero(amax_bits)) return {true, 0.0f, 0.0f};
  const float mul = -127.0f / signed_max;
  return {false, mul, 1.0f / mul};
}

}  // namespace
}  // namespace strata::quant
