// One decoder per weight format, shared by every op that reads weights (dequantize.cu,
// matvec.cu), so an op's weights are by construction the values the dequantizer writes.
//
// A decoder turns group g (8 consecutive elements, g < kElems / 8) of one block into 8 floats
// bitwise equal to the scalar reference (quant/formats/*.cpp). The reference's arithmetic is a
// few multiplies and one subtraction per element, each rounded once; here each is an explicit
// __fmul_rn / __fsub_rn / __fadd_rn, which nvcc never fuses into an FMA, so the kernels need no
// -fmad=false and keep FMA for their own accumulations. Integers reach float exactly through the
// 2^23 mantissa trick (one byte-permute and one FADD), not I2F, whose throughput is a quarter of
// the FP32 pipe's.
//
// Layouts are ggml's blocks (ggml-common.h); FP8_E4M3 is quant/fp8.h's. kAlign is the
// alignment each decoder's loads assume: the launchers check block pointers and row strides.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/launch.h"
#include "quant/types.h"
#include "util/error.h"

namespace strata::cuda::detail {

using quant::Type;

// Loads ------------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t ld_u8(const uint8_t* p) { return __ldg(p); }
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint16_t*>(p));
}
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint32_t*>(p));
}
// Four bytes at an address that is only 2-byte aligned.
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
  return ld_u16(p) | (ld_u16(p + 2) << 16);
}
__device__ __forceinline__ uint2 ld_u64(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint2*>(p));
}

// Exact conversions ------------------------------------------------------------------------------

// v in (-2^22, 2^22) as float: added to the integer bits of 1.5 * 2^23 it lands in the mantissa.
__device__ __forceinline__ float small_to_float(int v) {
  return __int_as_float(0x4B400000 + v) - 12582912.0f;
}

// Byte J of w as float, minus `bias`: the byte becomes the low mantissa byte of 2^23.
template <int J>
__device__ __forceinline__ float byte_minus(uint32_t w, float bias) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440 | J)) - (8388608.0f + bias);
}

// The 8 bytes of (lo, hi) as floats, each minus bias.
__device__ __forceinline__ void bytes8_minus(uint32_t lo, uint32_t hi, float bias, float v[8]) {
  v[0] = byte_minus<0>(lo, bias);
  v[1] = byte_minus<1>(lo, bias);
  v[2] = byte_minus<2>(lo, bias);
  v[3] = byte_minus<3>(lo, bias);
  v[4] = byte_minus<0>(hi, bias);
  v[5] = byte_minus<1>(hi, bias);
  v[6] = byte_minus<2>(hi, bias);
  v[7] = byte_minus<3>(hi, bias);
}

// IEEE binary16 -> fp32 bit for bit as util/half.h does it (NaN payloads kept, subnormals exact),
// for F16 weights, whose NaNs the dequantizer passes through unchanged whatever the hardware's
// conversion does with them.
__device__ __forceinline__ float half_to_float(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, em = h & 0x7fffu;
  if (em >= 0x7c00u) return __uint_as_float(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em >= 0x0400u) return __uint_as_float(sign | ((em << 13) + 0x38000000u));
  return __uint_as_float(sign | __float_as_uint(__fmul_rn(small_to_float(int(em)), 0x1p-24f)));
}

__device__ __forceinline__ float bf16_to_float(uint32_t h) { return __uint_as_float(h << 16); }

// A block scale (fp16) as fp32. The hardware conversion is exact for every non-NaN value, and a
// NaN scale gives NaN elements on both sides (a GPU multiply returns its canonical NaN anyway).
__device__ __forceinline__ float scale_to_float(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

// ggml's ksigns_iq2xs: 7 stored sign bits, the eighth makes the count of negatives even.
__device__ __forceinline__ uint32_t sign_byte(uint32_t bits) {
  const uint32_t field = bits & 127u;
  return field | ((__popc(field) & 1u) << 7);
}

// v * (bit j of signs ? -1 : 1), exactly as the reference's negation.
__device__ __forceinline__ void apply_signs(uint32_t signs, float v[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    v[j] = __uint_as_float(__float_as_uint(v[j]) ^ (((signs >> j) & 1u) << 31));
}

__device__ __forceinline__ void scale8(float d, float v[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = __fmul_rn(d, v[j]);
}

// d * v - m, rounded after the multiply and after the subtraction, as the reference does.
__device__ __forceinline__ void scale_min8(float d, float m, float v[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = __fsub_rn(__fmul_rn(d, v[j]), m);
}

// Decoders ---------------------------------------------------------------------------------------

template <Type T>
struct Decoder;

// Plain types: a "block" is one group of 8 elements.
template <>
struct Decoder<Type::F32> {
  static constexpr int kElems = 8, kBytes = 32, kAlign = 16;
  __device__ static void decode(const uint8_t* b, int, const DecodeTables&, float v[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(b));
    const float4 c = __ldg(reinterpret_cast<const float4*>(b) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
  }
};

template <>
struct Decoder<Type::F16> {
  static constexpr int kElems = 8, kBytes = 16, kAlign = 16;
  __device__ static void decode(const uint8_t* b, int, const DecodeTables&, float v[8]) {
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(b));
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = half_to_float(words[i] & 0xffffu);
      v[2 * i + 1] = half_to_float(words[i] >> 16);
    }
  }
};

template <>
struct Decoder<Type::BF16> {
  static constexpr int kElems = 8, kBytes = 16, kAlign = 16;
  __device__ static void decode(const uint8_t* b, int, const DecodeTables&, float v[8]) {
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(b));
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = bf16_to_float(words[i] & 0xffffu);
      v[2 * i + 1] = bf16_to_float(words[i] >> 16);
    }
  }
};

// d (fp16), qs[32] int8: x = q * d.
template <>
struct Decoder<Type::Q8_0> {
  static constexpr int kElems = 32, kBytes = 34, kAlign = 2;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables&, float v[8]) {
    const float d = scale_to_float(ld_u16(b));
    // Flipping the top bit maps int8 q to the byte q + 128.
    const uint32_t lo = ld_u32_a2(b + 2 + 8 * g) ^ 0x80808080u;
    const uint32_t hi = ld_u32_a2(b + 6 + 8 * g) ^ 0x80808080u;
    bytes8_minus(lo, hi, 128.0f, v);
    scale8(d, v);
  }
};

// d (fp16), qs[16]: element j in the low nibble of qs[j], element j + 16 in its high nibble;
// x = (q - 8) * d.
template <>
struct Decoder<Type::Q4_0> {
  static constexpr int kElems = 32, kBytes = 18, kAlign = 2;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables&, float v[8]) {
    const float d = scale_to_float(ld_u16(b));
    const uint8_t* q = b + 2 + 8 * (g & 1);
    const int shift = 4 * (g >> 1);
    bytes8_minus((ld_u32_a2(q) >> shift) & 0x0F0F0F0Fu, (ld_u32_a2(q + 4) >> shift) & 0x0F0F0F0Fu,
                 8.0f, v);
    scale8(d, v);
  }
};

// Element e = 128 h + 32 j + 16 k + l: code bits 2j of qs[32h + 16k + l]; sub-block e / 16.
struct KQuantGroup {
  int h, j, k, l0;
  __device__ explicit KQuantGroup(int g)
      : h(g >> 4), j((g >> 2) & 3), k((g >> 1) & 1), l0(8 * (g & 1)) {}
};

// scales[16] (low nibble scale, high nibble min), qs[64], d, dmin: x = d*sc*q - dmin*m.
template <>
struct Decoder<Type::Q2_K> {
  static constexpr int kElems = 256, kBytes = 84, kAlign = 4;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables&, float v[8]) {
    const KQuantGroup p(g);
    const uint8_t* q = b + 16 + 32 * p.h + 16 * p.k + p.l0;
    const uint32_t sc = ld_u8(b + (g >> 1));
    const float dl = __fmul_rn(scale_to_float(ld_u16(b + 80)), small_to_float(int(sc & 0xF)));
    const float ml = __fmul_rn(scale_to_float(ld_u16(b + 82)), small_to_float(int(sc >> 4)));
    const int shift = 2 * p.j;
    bytes8_minus((ld_u32(q) >> shift) & 0x03030303u, (ld_u32(q + 4) >> shift) & 0x03030303u, 0.0f,
                 v);
    scale_min8(dl, ml, v);
  }
};

// hmask[32], qs[64], scales[12] (16 6-bit scales, offset 32), d: x = d * (s - 32) * q with
// q = low 2 bits - 4, plus 4 where the hmask bit 4h + j of byte 16k + l is set.
template <>
struct Decoder<Type::Q3_K> {
  static constexpr int kElems = 256, kBytes = 110, kAlign = 2;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables&, float v[8]) {
    const KQuantGroup p(g);
    const uint8_t* q = b + 32 + 32 * p.h + 16 * p.k + p.l0;
    const uint8_t* hm = b + 16 * p.k + p.l0;
    const int s = g >> 1;
    const uint8_t* scales = b + 96;
    const uint32_t lo4 = s < 8 ? ld_u8(scales + s) & 0xF : ld_u8(scales + s - 8) >> 4;
    const uint32_t hi2 = (ld_u8(scales + 8 + (s & 3)) >> (2 * (s >> 2))) & 3;
    const float dl =
        __fmul_rn(scale_to_float(ld_u16(b + 108)), small_to_float(int(lo4 | (hi2 << 4)) - 32));
    const int shift = 2 * p.j, hbit = 4 * p.h + p.j;
    const uint32_t lo =
        ((ld_u32_a2(q) >> shift) & 0x03030303u) | (((ld_u32_a2(hm) >> hbit) & 0x01010101u) << 2);
    const uint32_t hi = ((ld_u32_a2(q + 4) >> shift) & 0x03030303u) |
                        (((ld_u32_a2(hm + 4) >> hbit) & 0x01010101u) << 2);
    bytes8_minus(lo, hi, 4.0f, v);
    scale8(dl, v);
  }
};

// Scale and min s (0..7) of the 12-byte Q4_K/Q5_K field (ggml's get_scale_min_k4). Branch-free:
// lanes of a warp take different s, and q[s - 4] lies inside the block (the fp16 d, dmin) when
// s < 4, where its value is not used.
__device__ __forceinline__ void scale_min_k4(int s, const uint8_t* q, int& sc, int& m) {
  const uint32_t lo = ld_u8(q + s), hi = ld_u8(q + s + 4), below = ld_u8(q + s - 4);
  sc = int(s < 4 ? lo & 63 : (hi & 0xF) | ((below >> 6) << 4));
  m = int(s < 4 ? hi & 63 : (hi >> 4) | ((lo >> 6) << 4));
}

// d, dmin, scales[12], qs[128]: sub-block s (32 elements) takes the low (s even) or high nibbles
// of qs[32 (s/2) .. +32]; x = d*sc*q - dmin*m.
template <>
struct Decoder<Type::Q4_K> {
  static constexpr int kElems = 256, kBytes = 144, kAlign = 8;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables&, float v[8]) {
    const int s = g >> 2;
    int sc, m;
    scale_min_k4(s, b + 4, sc, m);
    const float d1 = __fmul_rn(scale_to_float(ld_u16(b)), small_to_float(sc));
    const float m1 = __fmul_rn(scale_to_float(ld_u16(b + 2)), small_to_float(m));
    const uint2 w = ld_u64(b + 16 + 32 * (s >> 1) + 8 * (g & 3));
    const int shift = 4 * (s & 1);
    bytes8_minus((w.x >> shift) & 0x0F0F0F0Fu, (w.y >> shift) & 0x0F0F0F0Fu, 0.0f, v);
    scale_min8(d1, m1, v);
  }
};

// As Q4_K plus qh[32]: bit s of qh[l] is the fifth bit of element l of sub-block s.
template <>
struct Decoder<Type::Q5_K> {
  static constexpr int kElems = 256, kBytes = 176, kAlign = 8;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables&, float v[8]) {
    const int s = g >> 2;
    int sc, m;
    scale_min_k4(s, b + 4, sc, m);
    const float d1 = __fmul_rn(scale_to_float(ld_u16(b)), small_to_float(sc));
    const float m1 = __fmul_rn(scale_to_float(ld_u16(b + 2)), small_to_float(m));
    const uint2 ql = ld_u64(b + 48 + 32 * (s >> 1) + 8 * (g & 3));
    const uint2 qh = ld_u64(b + 16 + 8 * (g & 3));
    const int shift = 4 * (s & 1);
    bytes8_minus(((ql.x >> shift) & 0x0F0F0F0Fu) | (((qh.x >> s) & 0x01010101u) << 4),
                 ((ql.y >> shift) & 0x0F0F0F0Fu) | (((qh.y >> s) & 0x01010101u) << 4), 0.0f, v);
    scale_min8(d1, m1, v);
  }
};

// ql[128], qh[64], scales[16] (int8), d. Element e = 128 h + 32 k + l: low 4 bits from nibble k/2
// of ql[64h + 32 (k%2) + l], high 2 bits from bits 2k of qh[32h + l]; x = d * sc[e/16] * (q - 32).
template <>
struct Decoder<Type::Q6_K> {
  static constexpr int kElems = 256, kBytes = 210, kAlign = 2;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables&, float v[8]) {
    const int h = g >> 4, k = (g >> 2) & 3, l0 = 8 * (g & 3);
    const uint8_t* ql = b + 64 * h + 32 * (k & 1) + l0;
    const uint8_t* qh = b + 128 + 32 * h + l0;
    const int sc = int(int8_t(ld_u8(b + 192 + (g >> 1))));
    const float dl = __fmul_rn(scale_to_float(ld_u16(b + 208)), small_to_float(sc));
    const int lshift = 4 * (k >> 1), hshift = 2 * k;
    bytes8_minus(((ld_u32_a2(ql) >> lshift) & 0x0F0F0F0Fu) |
                     (((ld_u32_a2(qh) >> hshift) & 0x03030303u) << 4),
                 ((ld_u32_a2(ql + 4) >> lshift) & 0x0F0F0F0Fu) |
                     (((ld_u32_a2(qh + 4) >> hshift) & 0x03030303u) << 4),
                 32.0f, v);
    scale8(dl, v);
  }
};

// The 8 magnitudes of a 2-bit grid entry (byte j is element j) times db, then signed.
__device__ __forceinline__ void grid8(uint2 entry, float db, uint32_t signs, float v[8]) {
  bytes8_minus(entry.x, entry.y, 0.0f, v);
  scale8(db, v);
  apply_signs(signs, v);
}

// d, then per 32 elements two uint32: four grid indices (bytes), four 7-bit sign fields and a
// 4-bit scale s in bits 28..31; x = d * (0.5 + s) * 0.25 * grid * sign.
template <>
struct Decoder<Type::IQ2_XXS> {
  static constexpr int kElems = 256, kBytes = 66, kAlign = 2;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables& t, float v[8]) {
    const int ib = g >> 2, l = g & 3;
    const uint32_t grids = ld_u32_a2(b + 2 + 8 * ib), aux = ld_u32_a2(b + 6 + 8 * ib);
    const float db = __fmul_rn(
        __fmul_rn(scale_to_float(ld_u16(b)), __fadd_rn(0.5f, small_to_float(int(aux >> 28)))),
        0.25f);
    const uint2 entry =
        __ldg(reinterpret_cast<const uint2*>(t.iq2xxs_grid + ((grids >> (8 * l)) & 255)));
    grid8(entry, db, sign_byte(aux >> (7 * l)), v);
  }
};

// d, qs[32] (9-bit grid index | 7-bit sign field << 9, one per 8 elements), scales[8] (a nibble
// per 16 elements); x = d * (0.5 + s) * 0.25 * grid * sign.
template <>
struct Decoder<Type::IQ2_XS> {
  static constexpr int kElems = 256, kBytes = 74, kAlign = 2;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables& t, float v[8]) {
    const uint32_t q = ld_u16(b + 2 + 2 * g);
    const uint32_t s = (ld_u8(b + 66 + (g >> 2)) >> (4 * ((g >> 1) & 1))) & 15;
    const float db = __fmul_rn(
        __fmul_rn(scale_to_float(ld_u16(b)), __fadd_rn(0.5f, small_to_float(int(s)))), 0.25f);
    const uint2 entry = __ldg(reinterpret_cast<const uint2*>(t.iq2xs_grid + (q & 511)));
    grid8(entry, db, sign_byte(q >> 9), v);
  }
};

// d, qs[64] grid indices (4 elements each), then per 32 elements a uint32 of four 7-bit sign
// fields and a 4-bit scale s; x = d * (0.5 + s) * 0.5 * grid * sign.
template <>
struct Decoder<Type::IQ3_XXS> {
  static constexpr int kElems = 256, kBytes = 98, kAlign = 2;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables& t, float v[8]) {
    const int ib = g >> 2, l = g & 3;
    const uint32_t idx = ld_u16(b + 2 + 8 * ib + 2 * l);
    const uint32_t aux = ld_u32_a2(b + 66 + 4 * ib);
    const float db = __fmul_rn(
        __fmul_rn(scale_to_float(ld_u16(b)), __fadd_rn(0.5f, small_to_float(int(aux >> 28)))),
        0.5f);
    bytes8_minus(__ldg(t.iq3xxs_grid + (idx & 255)), __ldg(t.iq3xxs_grid + (idx >> 8)), 0.0f, v);
    scale8(db, v);
    apply_signs(sign_byte(aux >> (7 * l)), v);
  }
};

// d, scales_h, scales_l[4], qs[128]: 6-bit scale ls per 32 elements, byte j of a sub-block holds
// element j (low nibble) and j + 16 (high nibble); x = d * (ls - 32) * codebook[nibble].
template <>
struct Decoder<Type::IQ4_XS> {
  static constexpr int kElems = 256, kBytes = 136, kAlign = 8;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables& t, float v[8]) {
    const int ib = g >> 2, gi = g & 3;
    const uint32_t ls = ((ld_u8(b + 4 + (ib >> 1)) >> (4 * (ib & 1))) & 0xF) |
                        (((ld_u16(b + 2) >> (2 * ib)) & 3) << 4);
    const float dl = __fmul_rn(scale_to_float(ld_u16(b)), small_to_float(int(ls) - 32));
    const uint2 w = ld_u64(b + 8 + 16 * ib + 8 * (gi & 1));
    const int shift = 4 * (gi >> 1);
    const uint32_t words[2] = {(w.x >> shift) & 0x0F0F0F0Fu, (w.y >> shift) & 0x0F0F0F0Fu};
#pragma unroll
    for (int j = 0; j < 8; ++j)
      v[j] = __fmul_rn(
          dl, small_to_float(__ldg(t.iq4nl_values + ((words[j / 4] >> (8 * (j % 4))) & 0xF))));
  }
};

// fp32 scale, then 32 e4m3fn bytes: x = scale * e4m3. Pairs of codes go through Hopper's
// e4m3x2 -> f16x2 conversion, exact (every e4m3 value, subnormals included, is an f16 value;
// the NaN codes stay NaN), then to fp32, exact.
template <>
struct Decoder<Type::FP8_E4M3> {
  static constexpr int kElems = 32, kBytes = 36, kAlign = 4;
  __device__ static void decode(const uint8_t* b, int g, const DecodeTables&, float v[8]) {
    const float scale = __ldg(reinterpret_cast<const float*>(b));
    const uint32_t words[2] = {ld_u32(b + 4 + 8 * g), ld_u32(b + 8 + 8 * g)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2)));
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      v[2 * i] = __fmul_rn(scale, f.x);
      v[2 * i + 1] = __fmul_rn(scale, f.y);
    }
  }
};

// Host side
// ----------------------------------------------------------------------------------------

// Calls fn(Decoder<T>{}) for the run-time type t and returns true; false for a type with no
// decoder.
template <typename Fn>
bool visit_decoder(Type t, Fn&& fn) {
  switch (t) {
    case Type::F32:
      return fn(Decoder<Type::F32>{}), true;
    case Type::F16:
      return fn(Decoder<Type::F16>{}), true;
    case Type::BF16:
      return fn(Decoder<Type::BF16>{}), true;
    case Type::Q8_0:
      return fn(Decoder<Type::Q8_0>{}), true;
    case Type::Q4_0:
      return fn(Decoder<Type::Q4_0>{}), true;
    case Type::Q2_K:
      return fn(Decoder<Type::Q2_K>{}), true;
    case Type::Q3_K:
      return fn(Decoder<Type::Q3_K>{}), true;
    case Type::Q4_K:
      return fn(Decoder<Type::Q4_K>{}), true;
    case Type::Q5_K:
      return fn(Decoder<Type::Q5_K>{}), true;
    case Type::Q6_K:
      return fn(Decoder<Type::Q6_K>{}), true;
    case Type::IQ2_XXS:
      return fn(Decoder<Type::IQ2_XXS>{}), true;
    case Type::IQ2_XS:
      return fn(Decoder<Type::IQ2_XS>{}), true;
    case Type::IQ3_XXS:
      return fn(Decoder<Type::IQ3_XXS>{}), true;
    case Type::IQ4_XS:
      return fn(Decoder<Type::IQ4_XS>{}), true;
    case Type::FP8_E4M3:
      return fn(Decoder<Type::FP8_E4M3>{}), true;
    default:
      return false;
  }
}

inline bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace strata::cuda::detail
