// ggml's block layouts, byte for byte (ggml-common.h), shared by the reference and AVX2 kernels
// of the F32/F16/BF16/Q8_0/Q4_0/K-quant formats and by the activation layouts (act.cpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/kernels.h"
#include "util/half.h"
#include "util/rng.h"

namespace strata::quant {

constexpr int kQK = 32;     // elements per Q4_0 / Q8_0 block
constexpr int kQK_K = 256;  // elements per K-quant super-block

#pragma pack(push, 1)
struct BlockQ4_0 {
  uint16_t d;      // fp16 scale
  uint8_t qs[16];  // element j: low nibble of qs[j]; element j + 16: high nibble; value q - 8
};
// Also the activation layout of Q8_0/Q4_0 dots. As an activation, quantize_act keeps qs in
// [-127, 127], which the AVX2 kernels rely on: their |w| * sign(a, w) products would overflow
// for a = -128.
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[32];
};
struct BlockQ2_K {
  uint8_t scales[16];  // per 16 elements: low nibble scale, high nibble min
  uint8_t qs[64];      // 2-bit codes, 4 per byte (see q2_k.cpp for the element order)
  uint16_t d;          // fp16 super-block scale of the scales
  uint16_t dmin;       // fp16 super-block scale of the mins
};
struct BlockQ3_K {
  uint8_t hmask[32];   // high bit of each 3-bit code (set means +4 relative to the low bits - 4)
  uint8_t qs[64];      // low 2 bits of each code
  uint8_t scales[12];  // 16 6-bit scales, offset by 32
  uint16_t d;          // fp16 super-block scale
};
struct BlockQ4_K {
  uint16_t d;          // fp16 super-block scale of the scales
  uint16_t dmin;       // fp16 super-block scale of the mins
  uint8_t scales[12];  // 8 6-bit scales and 8 6-bit mins (get_scale_min_k4 packing)
  uint8_t qs[128];     // 4-bit codes
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];   // fifth bit of each code
  uint8_t qs[128];  // low 4 bits of each code
};
struct BlockQ6_K {
  uint8_t ql[128];    // low 4 bits of each code
  uint8_t qh[64];     // high 2 bits of each code
  int8_t scales[16];  // signed 8-bit scale per 16 elements
  uint16_t d;         // fp16 super-block scale
};
// Activation layout of K-quant dot products (quantize_act keeps qs in [-127, 127]).
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];  // sum of qs over each group of 16
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// Scale j (0..7) and min j of the 12-byte Q4_K/Q5_K scale field: j < 4 keep 6 bits of byte j and
// j + 4; j >= 4 take their low 4 bits from byte j + 4 and their high 2 bits from the top of bytes
// j - 4 (scale) and j (min).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The 16 Q3_K scales as signed values (the stored 6 bits minus 32). Scale j takes its low 4 bits
// from the low nibble of byte j (j < 8) or the high nibble of byte j - 8, and its high 2 bits from
// bits 2 * (j / 4) and up of byte 8 + j % 4.
inline void q3_k_scales(const uint8_t* s, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = int8_t((lo | (hi << 4)) - 32);
  }
}

// The 8 float lanes used by every deterministic dot: lanes are reduced as (l, l + 4) pairs, then
// (l, l + 2), then (0, 1), the order an AVX2 horizontal sum takes.
inline float reduce8(const float* l) {
  const float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  const float b0 = a0 + a2, b1 = a1 + a3;
  return b0 + b1;
}

// The reference dot of the float formats: element i accumulates into lane i % 32 with a fused
// multiply-add, then lanes l, l + 8, l + 16, l + 24 are summed as (l + (l + 8)) + ((l + 16) +
// (l + 24)) and the 8 results reduced by reduce8: four 8-wide FMA accumulators in AVX2.
template <typename Weight>
float dot_lanes32(Weight w, const float* a, int64_t n) {
  float acc[32] = {};
  for (int64_t i = 0; i < n; ++i) acc[i % 32] = std::fma(w(i), a[i], acc[i % 32]);
  float l8[8];
  for (int l = 0; l < 8; ++l) l8[l] = (acc[l] + acc[l + 8]) + (acc[l + 16] + acc[l + 24]);
  return reduce8(l8);
}

// The reference dot of Q4_K and Q5_K against Q8_K: per block, 8 sub-blocks of 32 codes (from
// `codes`) with 6-bit scales and mins; the integer sums are exact, then two fused steps in lane
// b % 8 (d * sum, then -dmin * mins), the order dot_q4_k_avx2 and dot_q5_k_avx2 keep.
template <typename Block, void (*codes)(const Block&, uint8_t*)>
float dot_scale_min_k_ref(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const BlockQ8_K*>(a);
  float lanes[8] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t q[kQK_K];
    codes(x[b], q);
    int32_t sum = 0, mins = 0;
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      scale_min_k4(s, x[b].scales, &sc, &m);
      int32_t g = 0;
      for (int l = 0; l < 32; ++l) g += q[32 * s + l] * y[b].qs[32 * s + l];
      sum += sc * g;
      mins += m * (y[b].bsums[2 * s] + y[b].bsums[2 * s + 1]);
    }
    float& lane = lanes[b % 8];
    lane = std::fma(fp16_to_fp32(x[b].d) * y[b].d, float(sum), lane);
    lane = std::fma(-(fp16_to_fp32(x[b].dmin) * y[b].d), float(mins), lane);
  }
  return reduce8(lanes);
}

// Random-block helpers: a positive fp16 scale in [max / 2, max), and raw random bytes.
inline uint16_t random_scale(Rng& rng, float max) {
  return fp32_to_fp16(rng.uniform(0.5f, 1.0f) * max);
}
inline void random_bytes(Rng& rng, uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = uint8_t(rng.next() >> 56);
}

// AVX2 kernels, defined in the *_avx2.cpp files (only called when the CPU has AVX2+FMA+F16C).
float dot_f32_avx2(const void* w, const void* a, int64_t n);
float dot_f16_avx2(const void* w, const void* a, int64_t n);
float dot_bf16_avx2(const void* w, const void* a, int64_t n);
float dot_q8_0_avx2(const void* w, const void* a, int64_t n);
void dot_rows_q8_0_avx2(const void* w, const void* const* acts, int count, int64_t n, float* out);
float dot_q4_0_avx2(const void* w, const void* a, int64_t n);
float dot_q2_k_avx2(const void* w, const void* a, int64_t n);
float dot_q3_k_avx2(const void* w, const void* a, int64_t n);
float dot_q4_k_avx2(const void* w, const void* a, int64_t n);
float dot_q5_k_avx2(const void* w, const void* a, int64_t n);
float dot_q6_k_avx2(const void* w, const void* a, int64_t n);
void quantize_act_avx2(ActFormat f, const float* x, void* out, int64_t n);

// AVX-512 kernels, defined in the *_avx512.cpp files (only called when util/cpu.h's avx512 holds).
float dot_q8_0_avx512(const void* w, const void* a, int64_t n);
void dot_rows_q8_0_avx512(const void* w, const void* const* acts, int count, int64_t n, float* out);
float dot_q4_k_avx512(const void* w, const void* a, int64_t n);
float dot_q6_k_avx512(const void* w, const void* a, int64_t n);
void quantize_act_avx512(ActFormat f, const float* x, void* out, int64_t n);

}  // namespace strata::quant
