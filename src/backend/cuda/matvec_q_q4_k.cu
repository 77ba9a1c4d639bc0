// Q4_K weights x Q8_K activation (ggml block_q4_K: fp16 d, dmin, 12 bytes of 6-bit scales and
// mins, 128 bytes of 4-bit codes; 144 bytes per 256 elements).
//
// CPU reference (quant/formats/blocks.h dot_scale_min_k_ref): per block the exact sums
// S = sum_s sc_s sum_{e in s} q_e a_e and M = sum_s m_s (bsums_2s + bsums_2s+1), then in lane b % 8
// lane = fma(d * d_a, S, lane); lane = fma(-(dmin * d_a), M, lane); the lanes are reduced by
// reduce8.
//
// Mapping: a step is 8 blocks (1152 bytes of a row) in two halves of 4; the 8 lanes of group g
// take block g of a half, lane j = 2p + h the 16 bytes qs[32p + 16h, +16): the low nibbles are
// elements 64p + 16h + [0, 16) (sub-block 2p), the high nibbles elements 64p + 32 + 16h + [0, 16)
// (sub-block 2p + 1). An 8-lane integer butterfly gives S and M. Block 8t + 4 half + g lies in
// chain g (first half) or g + 4 (second), so group g keeps both chains and extends them in block
// order by itself.
#include "backend/cuda/matvec_q.cuh"

namespace strata::cuda::detail::mvq {

namespace {

template <int R_, int T_>
struct Q4_KKernel {
  static constexpr int R = R_, T = T_, kStep = 8, kBytes = 144, kActBlockBytes = 292;
  static constexpr int kRowPad = 0, kActStride = kStep * kActBlockBytes;
  static constexpr int kSharedBytes = 0;
  static constexpr int moe_min_ctas() { return 1; }

  struct Acc {
    float low[R][T], high[R][T];  // chains g and g + 4
  };

  __device__ static void init_shared(uint8_t*, const Args&) {}

  // Scales and mins of sub-blocks 2p and 2p + 1 (ggml's get_scale_min_k4 on the 12-byte field,
  // read as 16-bit pairs): sc in the low and high byte of *sc, mins likewise in *mins.
  __device__ static void scales(uint4 head, int p, uint32_t& sc, uint32_t& mins) {
    const int shift = 16 * (p & 1);
    const uint32_t lo = (head.y >> shift) & 0xffffu;   // bytes 2(p%2), +1: scales 0..3
    const uint32_t mid = (head.z >> shift) & 0xffffu;  // scales 4..7
    const uint32_t hi = (head.w >> shift) & 0xffffu;   // scales 8..11
    if (p < 2) {
      sc = lo & 0x3f3fu;
      mins = mid & 0x3f3fu;
    } else {
      sc = (hi & 0x0f0fu) | ((lo & 0xc0c0u) >> 2);
      mins = ((hi >> 4) & 0x0f0fu) | ((mid & 0xc0c0u) >> 2);
    }
  }

  // The lane's part of one activation block: its 32 codes, the two sums of 16 its mins pair with,
  // and the block's scale.
  struct ActSlice {
    uint32_t lo[4], hi[4];
    int bs_lo, bs_hi;
    float d;
  };

  __device__ static ActSlice load_act(const uint8_t* block, int p, int h) {
    ActSlice s;
    const uint8_t* q8 = block + 4 + 64 * p + 16 * h;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s.lo[k] = ld_shared_u32(q8 + 4 * k);
      s.hi[k] = ld_shared_u32(q8 + 32 + 4 * k);
    }
    const int16_t* bsums = reinterpret_cast<const int16_t*>(block + 260);
    s.bs_lo = bsums[4 * p + h];
    s.bs_hi = bsums[4 * p + 2 + h];
    s.d = *reinterpret_cast<const float*>(block);
    return s;
  }

  // One row's block against one activation: `chain` extended by the block (when valid).
  __device__ static float accumulate(const uint32_t cw[4], uint32_t sc, uint32_t mins, float d,
                                     float dmin, const ActSlice& x, bool valid, float chain) {
    int lo = 0, hi = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      lo = __dp4a(int(cw[k] & 0x0f0f0f0fu), int(x.lo[k]), lo);
      hi = __dp4a(int((cw[k] >> 4) & 0x0f0f0f0fu), int(x.hi[k]), hi);
    }
    const int s = group_sum<8>(int(sc & 0xffu) * lo + int(sc >> 8) * hi);
    const int m = group_sum<8>(int(mins & 0xffu) * x.bs_lo + int(mins >> 8) * x.bs_hi);
    if (!valid) return chain;
    chain = __fmaf_rn(__fmul_rn(d, x.d), __int2float_rn(s), chain);
    return __fmaf_rn(-__fmul_rn(dmin, x.d), __int2float_rn(m), chain);
  }

  __device__ static void step(const uint8_t* rows, const uint8_t* act, const uint8_t*,
                              const Args& a, int t, int lane, Acc& acc) {
    const int g = lane >> 3, j = lane & 7, p = j >> 1, h = j & 1;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (t * kStep + 4 * half >= a.nb) break;  // uniform across the warp
      const int bi = 4 * half + g;
      const bool valid = t * kStep + bi < a.nb;  // uniform within the 8-lane group
      // One activation: its slice read once for all R rows.
      ActSlice x1{};
      if constexpr (T == 1) x1 = load_act(act + kActBlockBytes * bi, p, h);
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const uint8_t* b = rows + rr * a.stage_row + kBytes * bi;
        const uint4 head = *reinterpret_cast<const uint4*>(b);
        const uint4 codes = *reinterpret_cast<const uint4*>(b + 16 + 16 * j);
        const uint32_t cw[4] = {codes.x, codes.y, codes.z, codes.w};
        uint32_t sc, mins;
        scales(head, p, sc, mins);
        const float d = half_bits_to_float(head.x & 0xffffu);
        const float dmin = half_bits_to_float(head.x >> 16);
#pragma unroll
        for (int tok = 0; tok < T; ++tok) {
          ActSlice x;
          if constexpr (T == 1)
            x = x1;
          else
            x = load_act(act + tok * a.stage_act + kActBlockBytes * bi, p, h);
          if (half == 0)
            acc.low[rr][tok] = accumulate(cw, sc, mins, d, dmin, x, valid, acc.low[rr][tok]);
          else
            acc.high[rr][tok] = accumulate(cw, sc, mins, d, dmin, x, valid, acc.high[rr][tok]);
        }
      }
    }
  }

  // Group g holds chains g and g + 4: their sum is reduce8's first level; groups 0/2 and 1/3, then
  // 0/1 finish it.
  template <bool kGather>
  __device__ static void finish(Acc& acc, const Args& a, int64_t r0, int lane) {
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
#pragma unroll
      for (int tok = 0; tok < T; ++tok) {
        float v = __fadd_rn(acc.low[rr][tok], acc.high[rr][tok]);
        v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 16));
        v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 8));
        if (lane == 0 && r0 + rr < a.rows && tok < a.tokens)
          y_of<kGather>(a, tok)[r0 + rr] = v;
      }
    }
  }
};

}  // namespace

void launch_matvec_q_q4_k(const MatvecQLaunch& l) {
  if (l.tokens == 1) {
    if (l.rows_per_warp == 8) return launch<Q4_KKernel<8, 1>>(l);
    return launch<Q4_KKernel<4, 1>>(l);
  }
  if (l.tokens == 2) return launch<Q4_KKernel<4, 2>>(l);
  if (l.tokens <= 4) return launch<Q4_KKernel<2, 4>>(l);
  return launch<Q4_KKernel<2, 8>>(l);
}

void launch_moe_q_q4_k(const MoeQLaunch& l) {
  launch_moe<Q4_KKernel<4, 1>, Q4_KKernel<2, 8>>(l);
}

}  // namespace strata::cuda::detail::mvq
