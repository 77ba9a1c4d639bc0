// FP8_E4M3 weights x fp32 activation (quant/fp8.h: fp32 scale, 32 e4m3 codes; 36 bytes). The CPU
// pairs this format with an fp32 activation, so this kernel has no integer part: it is here to
// follow the CPU's float order exactly (and to take T activations per weight read).
//
// CPU reference (quant/formats/fp8_e4m3.cpp): for l < 8, per block
//   lo = fma(w[l+8], x[l+8], w[l] * x[l]), hi = fma(w[l+24], x[l+24], w[l+16] * x[l+16]),
//   lane[l] = fma(scale, lo + hi, lane[l]),
// in block order; the row is ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
//
// Mapping: lane = 8 * slot + l. Lane l owns element lane l of the rows slot, slot + 4, ... of its
// warp: it reads the four codes l, l + 8, l + 16, l + 24 of every block (one byte of each of four
// words) and its four activations, and extends its chain in block order; reduce8_lanes joins the
// lanes at the end. A step is 32 blocks (1152 bytes of a row).
#include <cuda_fp8.h>

#include "backend/cuda/matvec_q.cuh"

namespace strata::cuda::detail::mvq {

namespace {

template <int R_, int T_>
struct FP8Kernel {
  static_assert(R_ % 4 == 0, "four row slots per warp");
  static constexpr int R = R_, T = T_, kStep = 32, kBytes = 36, kActBlockBytes = 32 * 4;
  // 16 bytes of padding per row: the four row slots read the same word offsets at once, and a
  // 1168-byte stride (292 words, 4 mod 32) puts them in different banks.
  static constexpr int kRowPad = 16, kActStride = kStep * kActBlockBytes;
  static constexpr int kSharedBytes = 0;
  static constexpr int moe_min_ctas() { return 1; }
  static constexpr int kRowsPerLane = R / 4;

  struct Acc {
    float v[kRowsPerLane][T];
  };

  __device__ static void init_shared(uint8_t*, const Args&) {}

  // Two e4m3 codes as floats, exactly: Hopper's e4m3x2 -> f16x2 conversion (every e4m3 value is an
  // f16 value), then f16 -> f32.
  __device__ static float2 decode2(uint32_t pair) {
    const auto raw = static_cast<__nv_fp8x2_storage_t>(pair);
    return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(raw, __NV_E4M3)));
  }

  __device__ static void step(const uint8_t* rows, const uint8_t* act, const uint8_t*,
                              const Args& a, int t, int lane, Acc& acc) {
    const int l = lane & 7, slot = lane >> 3;
    // Byte l % 4 of two words into one 16-bit pair: selector nibbles l % 4 and 4 + l % 4.
    const uint32_t pick = uint32_t(l & 3) | uint32_t(4 + (l & 3)) << 4;
    const int nblk = min(kStep, a.nb - t * kStep);
#pragma unroll 4
    for (int i = 0; i < kStep; ++i) {
      if (i >= nblk) break;  // uniform across the warp
      float x[T][4];
#pragma unroll
      for (int tok = 0; tok < T; ++tok) {
        const float* xa = reinterpret_cast<const float*>(act + tok * a.stage_act);
#pragma unroll
        for (int q = 0; q < 4; ++q) x[tok][q] = xa[32 * i + l + 8 * q];
      }
#pragma unroll
      for (int k = 0; k < kRowsPerLane; ++k) {
        const uint8_t* b = rows + (slot + 4 * k) * a.stage_row + kBytes * i;
        const float scale = *reinterpret_cast<const float*>(b);
        // Code l + 8q is byte l % 4 of word 1 + l / 4 + 2q of the block.
        const uint8_t* codes = b + 4 + 4 * (l >> 2);
        const uint32_t c0 = ld_shared_u32(codes), c1 = ld_shared_u32(codes + 8);
        const uint32_t c2 = ld_shared_u32(codes + 16), c3 = ld_shared_u32(codes + 24);
        const float2 w01 = decode2(__byte_perm(c0, c1, pick));
        const float2 w23 = decode2(__byte_perm(c2, c3, pick));
#pragma unroll
        for (int tok = 0; tok < T; ++tok) {
          const float lo = __fmaf_rn(w01.y, x[tok][1], __fmul_rn(w01.x, x[tok][0]));
          const float hi = __fmaf_rn(w23.y, x[tok][3], __fmul_rn(w23.x, x[tok][2]));
          acc.v[k][tok] = __fmaf_rn(scale, __fadd_rn(lo, hi), acc.v[k][tok]);
        }
      }
    }
  }

  template <bool kGather>
  __device__ static void finish(Acc& acc, const Args& a, int64_t r0, int lane) {
    const int l = lane & 7, slot = lane >> 3;
#pragma unroll
    for (int k = 0; k < kRowsPerLane; ++k) {
      const int64_t r = r0 + slot + 4 * k;
#pragma unroll
      for (int tok = 0; tok < T; ++tok) {
        const float v = reduce8_lanes<1>(acc.v[k][tok]);
        if (l == 0 && r < a.rows && tok < a.tokens) y_of<kGather>(a, tok)[r] = v;
      }
    }
  }
};

}  // namespace

void launch_matvec_q_fp8(const MatvecQLaunch& l) {
  if (l.tokens == 1) {
    if (l.rows_per_warp == 8) return launch<FP8Kernel<8, 1>>(l);
    return launch<FP8Kernel<4, 1>>(l);
  }
  if (l.tokens == 2) return launch<FP8Kernel<4, 2>>(l);
  if (l.tokens <= 4) return launch<FP8Kernel<4, 4>>(l);
  return launch<FP8Kernel<4, 8>>(l);
}

void launch_moe_q_fp8(const MoeQLaunch& l) {
  launch_moe<FP8Kernel<4, 1>, FP8Kernel<4, 8>>(l);
}

}  // namespace strata::cuda::detail::mvq
