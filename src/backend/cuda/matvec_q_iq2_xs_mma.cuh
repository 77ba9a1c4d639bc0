// IQ2_XS weights x Q8_K activations on the tensor cores, for the grouped MoE (a chunk of up to 8
// pairs of one expert): the kernel traits of run_row_groups with mma.sync m16n8k16 (int8 in,
// int32 out), bitwise the dp4a kernels and the CPU (matvec_q_iq2_xs.cu has the block layout).
//
// CPU reference (quant/formats/iq2_xs.cpp): per block the exact integer sum
// isum = sum_h (2 s_h + 1) sum_{e in h} grid_e sign_e a_e over its 16 sub-blocks h of 16, then one
// chain in block order, acc = fma(float(isum), d_w * d_a, acc); the row is acc * 0.125.
//
// A warp computes 16 rows x the chunk's 8 pairs. Per sub-block h one m16n8k16 gives the exact
// sub-block sums of 16 rows x 8 pairs; each thread scales its four by its rows' 2 s_h + 1 and adds
// them into the block's isum, so the integer work matches the reference exactly and the float
// work is the reference's chain, once per (row, pair, block). The weights go straight from the
// staged blocks into the A fragments: thread (g, tig) needs elements 4 tig .. 4 tig + 3 of rows
// g and g + 8 of each sub-block, i.e. one half of one grid group: the half word of its codebook
// entry (magnitudes 8, 25, 43 fit int8) with the negative bytes negated by a byte-wise subtract.
// The dp4a kernels spend about two instructions per weight and pair; here a chunk's weights are
// decoded once and the pairs cost one mma per 2048 weight-pair products.
#pragma once

#include "backend/cuda/matvec_q.cuh"

namespace strata::cuda::detail::mvq {

namespace {

struct IQ2_XSMmaKernel {
  static constexpr int R = 16, T = kMoeChunkPairs, kBytes = 74, kActBlockBytes = 292;
  static constexpr int kStep = 4;
  static constexpr int kRowPad = 0;
  static constexpr int kActStride = kStep * kActBlockBytes;
  // The codebook as two words per entry: entry e's elements 0..3 at word 2e, 4..7 at 2e + 1.
  static constexpr int kSharedBytes = 512 * 8;
  static_assert(T == 8, "one n8 tile of pairs");

  struct Acc {
    float v[4];  // rows g, g + 8 x pairs 2 tig, 2 tig + 1
  };

  __device__ static void init_shared(uint8_t* smem, const Args& a) {
    uint32_t* table = reinterpret_cast<uint32_t*>(smem);
    for (int e = threadIdx.x; e < 512; e += kThreads) {
      const uint64_t entry = __ldg(a.iq2xs_grid + e);
      table[2 * e] = uint32_t(entry);
      table[2 * e + 1] = uint32_t(entry >> 32);
    }
    __syncthreads();
  }

  // Elements 4 half .. 4 half + 3 of grid group `group` of a staged block, as signed bytes.
  __device__ static uint32_t weight_bytes(const uint8_t* block, int group, int half,
                                          const uint32_t* table) {
    const uint32_t q = *reinterpret_cast<const uint16_t*>(block + 2 + 2 * group);
    const uint32_t field = q >> 9;
    const uint32_t signs = field | uint32_t(__popc(field) & 1) << 7;  // bit j: element j negative
    const uint32_t bits = (signs >> (4 * half)) & 15u;
    // Bit k of `bits` to byte k (the shifted copies never overlap), then 0x01 -> 0xff.
    const uint32_t negative = ((bits * 0x00204081u) & 0x01010101u) * 0xffu;
    const uint32_t magnitude = table[2 * (q & 511u) + half];
    return __vsub4(magnitude ^ negative, negative);  // -m where negative: (m ^ 0xff) - 0xff
  }

  __device__ static int sub_block_scale(const uint8_t* block, int h) {
    return int(2 * ((block[66 + h / 2] >> (4 * (h & 1))) & 15) + 1);
  }

  __device__ static void step(const uint8_t* rows, const uint8_t* act, const uint8_t* smem,
                              const Args& a, int t, int lane, Acc& acc) {
    const int g = lane >> 2, tig = lane & 3;
    const uint32_t* table = reinterpret_cast<const uint32_t*>(smem);
    const uint8_t* pair_g = act + g * a.stage_act;  // the B fragment's pair
    const uint8_t* pair_c[2] = {act + 2 * tig * a.stage_act, act + (2 * tig + 1) * a.stage_act};
#pragma unroll 1
    for (int bi = 0; bi < kStep; ++bi) {
      if (t * kStep + bi >= a.nb) break;  // uniform across the CTA
      const uint8_t* row[2] = {rows + g * a.stage_row + kBytes * bi,
                               rows + (g + 8) * a.stage_row + kBytes * bi};
      const uint8_t* q8 = pair_g + kActBlockBytes * bi + 4 + 4 * tig;
      int isum[4] = {};
#pragma unroll 4
      for (int h = 0; h < 16; ++h) {
        const int group = 2 * h + (tig >> 1), half = tig & 1;
        const uint32_t a0 = weight_bytes(row[0], group, half, table);
        const uint32_t a1 = weight_bytes(row[1], group, half, table);
        const uint32_t b0 = ld_shared_u32(q8 + 16 * h);
        int d[4];
        asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
            "{%7, %7, %7, %7};"
            : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
            : "r"(a0), "r"(a1), "r"(b0), "r"(0));
        const int s0 = sub_block_scale(row[0], h), s1 = sub_block_scale(row[1], h);
        isum[0] += d[0] * s0;
        isum[1] += d[1] * s0;
        isum[2] += d[2] * s1;
        isum[3] += d[3] * s1;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float dw = half_bits_to_float(*reinterpret_cast<const uint16_t*>(row[e / 2]));
        const float da = *reinterpret_cast<const float*>(pair_c[e % 2] + kActBlockBytes * bi);
        acc.v[e] = __fmaf_rn(__int2float_rn(isum[e]), __fmul_rn(dw, da), acc.v[e]);
      }
    }
  }

  template <bool kGather>
  __device__ static void finish(Acc& acc, const Args& a, int64_t r0, int lane) {
    const int g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t r = r0 + g + 8 * (e / 2);
      const int tok = 2 * tig + e % 2;
      if (r < a.rows && tok < a.tokens) y_of<kGather>(a, tok)[r] = __fmul_rn(acc.v[e], 0.125f);
    }
  }
};

}  // namespace

}  // namespace strata::cuda::detail::mvq
