// Q8_0 weights x Q8_0 activation (ggml block_q8_0: fp16 d, 32 int8 codes; 34 bytes).
//
// CPU reference (quant/formats/q8_0.cpp): per block b the exact sum s = sum q_w q_a, then
// lane[b % 8] = fma(d_w * d_a, float(s), lane[b % 8]); the lanes are reduced by reduce8.
//
// Mapping: lane = 8 * slot + c. A step is 32 blocks (1088 bytes of a row); lane c takes blocks c,
// c + 8, c + 16, c + 24 of the step in the rows slot, slot + 4, ... of its warp, so chain b % 8 = c
// lives in one lane and is extended in block order with no communication; the eight chains of a
// row meet in reduce8_lanes at the end.
#include "backend/cuda/q8_0_mma.cuh"

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

// Three to eight activations on the tensor cores (q8_0_mma.cuh): a CTA's 16 rows are one m16
// tile and its 8 activations one n8 tile, and the four warps split the blocks by chain instead of
// the rows: warp w extends chains 2 w and 2 w + 1 (blocks b with b % 8 in {2 w, 2 w + 1}, in block
// order), so each chain is still one sequence of FMAs in block order, and finish() meets the eight
// chains of every (row, activation) in reduce8 through shared memory. The dp4a kernel above spends
// about two instructions per weight and activation; here a block of 16 rows x 8 activations is one
// mma and a dozen float instructions per thread. Sixteen rows a CTA (not 64, as the tiles) keep a
// decode projection of 2048 rows on 128 SMs.
struct Q8_0MmaKernel {
  static constexpr int R = 4, T = 8, kStep = 32, kBytes = 34, kActBlockBytes = 34;
  // A 16-byte pad makes the pitch 1104 bytes (276 words, 20 mod 32), which puts the 8 rows or
  // activations of a fragment load in distinct banks; 1088 would put rows g and g + 2 in the same
  // ones.
  static constexpr int kRowPad = 16, kActPad = 16, kActStride = kStep * kActBlockBytes;
  static constexpr int kSharedBytes = 0;
  static constexpr bool kPresentTokensOnly = true;
  static_assert(kWarps * R == 16 && kStep % 8 == 0, "one m16 tile; steps of whole chain rounds");

  struct Acc {
    float v[2][4];  // chains 2 warp + c, results e (rows g, g + 8 x activations 2 tig, 2 tig + 1)
  };

  __device__ static void init_shared(uint8_t*, const Args&) {}

  // `rows` is this warp's share of the stage (run_row_groups' row split); the warp reads all 16.
  // Only the a.tokens activations present are staged: the fragments of the others read the last
  // one (their results are not written).
  __device__ static void step(const uint8_t* rows, const uint8_t* act, const uint8_t*,
                              const Args& a, int t, int lane, Acc& acc) {
    const int warp = threadIdx.x / 32, g = lane >> 2, tig = lane & 3;
    const uint8_t* row_g = rows + (g - warp * R) * a.stage_row;
    const uint8_t* row_g8 = row_g + 8 * a.stage_row;
    const int last = a.tokens - 1;
    const uint8_t* act_g = act + min(g, last) * a.stage_act;
    const uint8_t* act_c0 = act + min(2 * tig, last) * a.stage_act;
    const uint8_t* act_c1 = act + min(2 * tig + 1, last) * a.stage_act;
    const int left = a.nb - t * kStep;
#pragma unroll
    for (int j = 0; j < kStep / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int i = 8 * j + 2 * warp + c;
        if (i < left)  // uniform across the warp
          q8_0_mma::block_step(row_g, row_g8, act_g, act_c0, act_c1, i, tig, acc.v[c]);
      }
  }

  template <bool kGather>
  __device__ static void finish(Acc& acc, const Args& a, int64_t warp_r0, int lane) {
    // chains[c][activation][row] (17 floats a row of 16: fewer bank conflicts on the writes).
    __shared__ float chains[8][T][17];
    const int warp = threadIdx.x / 32, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        chains[2 * warp + c][2 * tig + e % 2][g + 8 * (e / 2)] = acc.v[c][e];
    __syncthreads();
    // (The next row group's finish writes `chains` again only after its steps' barriers.)
    const int row = threadIdx.x % 16, tok = threadIdx.x / 16;
    float lanes[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) lanes[c] = chains[c][tok][row];
    const int64_t r = warp_r0 - warp * R + row;
    if (r < a.rows && tok < a.tokens) y_of<kGather>(a, tok)[r] = q8_0_mma::reduce8(lanes);
  }
};

// The fewest activations a call runs on the tensor cores. The kernel's time hardly depends on
// how many of its 8 columns are used: the 80B shape's four decode projections of a layer took
// 44.2 us at 2 activations and 51.5 at 8 (ncu, H200), the dp4a kernels 38.8 at 2, 52.0 at 4 and
// 70.2 at 8.
constexpr int kMmaMinTokens = 3;

}  // namespace

void launch_matvec_q_q8_0(const MatvecQLaunch& l) {
  if (l.tokens >= kMmaMinTokens) return launch<Q8_0MmaKernel>(l);
  if (l.tokens == 2) return launch<Q8_0Kernel<4, 2>>(l);
  if (l.rows_per_warp == 8) return launch<Q8_0Kernel<8, 1>>(l);
  return launch<Q8_0Kernel<4, 1>>(l);
}

void launch_moe_q_q8_0(const MoeQLaunch& l) {
  launch_moe<Q8_0Kernel<4, 1>, Q8_0Kernel<4, 8>>(l);
}

}  // namespace strata::cuda::detail::mvq
