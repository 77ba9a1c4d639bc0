// Q8_0 weights x Q8_0 activation (ggml block_q8_0: fp16 d, 32 int8 codes; 34 bytes).
//
// CPU reference (quant/formats/q8_0.cpp): per block b the exact sum s = sum q_w q_a, then
// lane[b % 8] = fma(d_w * d_a, float(s), lane[b % 8]); the lanes are reduced by reduce8.
//
// Mapping: lane = 8 * slot + c. A step is 32 blocks (1088 bytes of a row); lane c takes blocks c,
// c + 8, c + 16, c + 24 of the step in the rows slot, slot + 4, ... of its warp, so chain b % 8 = c
// lives in one lane and is extended in block order with no communication; the eight chains of a
// row meet in reduce8_lanes at the end.
#include "backend/cuda/matvec_q.cuh"

namespace strata::cuda::detail::mvq {

namespace {

template <int R_, int T_>
struct Q8_0Kernel {
  static_assert(R_ % 4 == 0, "four row slots per warp");
  static constexpr int R = R_, T = T_, kStep = 32, kBytes = 34, kActBlockBytes = 34;
  static constexpr int kRowPad = 0, kActStride = kStep * kActBlockBytes;
  static constexpr int kSharedBytes = 0;
  static constexpr int kMoeMinCtas = 6;
  static constexpr int kRowsPerLane = R / 4;

  struct Acc {
    float v[kRowsPerLane][T];
  };

  __device__ static void init_shared(uint8_t*, const Args&) {}

  // The 32 codes (as 8 words) and the scale of block c at `chunk`: 9 aligned words from the
  // aligned-down start; an even block starts word-aligned (codes from byte 2), an odd one
  // 2 bytes in (codes word-aligned).
  __device__ static float load_block(const uint8_t* chunk, int c, uint32_t q[8]) {
    const uint8_t* p = chunk + ((34 * c) & ~3);
    uint32_t w[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) w[i] = ld_shared_u32(p + 4 * i);
    const int shift = (c & 1) ? 32 : 16;  // funnelshift_rc clamps: 32 takes the high word
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = __funnelshift_rc(w[i], w[i + 1], shift);
    return half_bits_to_float((c & 1) ? w[0] >> 16 : w[0] & 0xffffu);
  }

  __device__ static void step(const uint8_t* rows, const uint8_t* act, const uint8_t*,
                              const Args& a, int t, int lane, Acc& acc) {
    const int c = lane & 7, slot = lane >> 3;
#pragma unroll
    for (int i = 0; i < kStep / 8; ++i) {
      if (t * kStep + 8 * i + c >= a.nb) break;  // this lane's next block is past the row's end
      // Block c + 8i starts 272 i bytes after block c, so it has block c's alignment.
      uint32_t qa[T][8];
      float da[T];
#pragma unroll
      for (int tok = 0; tok < T; ++tok)
        da[tok] = load_block(act + tok * a.stage_act + 272 * i, c, qa[tok]);
#pragma unroll
      for (int k = 0; k < kRowsPerLane; ++k) {
        uint32_t qw[8];
        const float dw = load_block(rows + (slot + 4 * k) * a.stage_row + 272 * i, c, qw);
#pragma unroll
        for (int tok = 0; tok < T; ++tok) {
          int s = 0;
#pragma unroll
          for (int j = 0; j < 8; ++j) s = __dp4a(int(qw[j]), int(qa[tok][j]), s);
          acc.v[k][tok] = __fmaf_rn(__fmul_rn(dw, da[tok]), __int2float_rn(s), acc.v[k][tok]);
        }
      }
    }
  }

  template <bool kGather>
  __device__ static void finish(Acc& acc, const Args& a, int64_t r0, int lane) {
    const int c = lane & 7, slot = lane >> 3;
#pragma unroll
    for (int k = 0; k < kRowsPerLane; ++k) {
      const int64_t r = r0 + slot + 4 * k;
#pragma unroll
      for (int tok = 0; tok < T; ++tok) {
        const float v = reduce8_lanes<1>(acc.v[k][tok]);
        if (c == 0 && r < a.rows && tok < a.tokens) y_of<kGather>(a, tok)[r] = v;
      }
    }
  }
};

}  // namespace

void launch_matvec_q_q8_0(const MatvecQLaunch& l) {
  if (l.tokens == 1) {
    if (l.rows_per_warp == 8) return launch<Q8_0Kernel<8, 1>>(l);
    return launch<Q8_0Kernel<4, 1>>(l);
  }
  if (l.tokens == 2) return launch<Q8_0Kernel<4, 2>>(l);
  if (l.tokens <= 4) return launch<Q8_0Kernel<4, 4>>(l);
  return launch<Q8_0Kernel<4, 8>>(l);
}

void launch_moe_q_q8_0(const MoeQLaunch& l) {
  launch_moe<Q8_0Kernel<4, 1>, Q8_0Kernel<4, 8>>(l);
}

}  // namespace strata::cuda::detail::mvq
