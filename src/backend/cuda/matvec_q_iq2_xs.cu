// IQ2_XS weights x Q8_K activation (ggml block_iq2_xs: fp16 d, 32 uint16 (9-bit grid index |
// 7-bit sign field << 9, one per 8 elements), 8 scale bytes (a nibble per 16 elements); 74 bytes
// per 256 elements).
//
// CPU reference (quant/formats/iq2_xs.cpp, iq_common.h): per block the exact integer sum
// isum = sum_h (2 s_h + 1) sum_{e in h} grid_e sign_e a_e, then one chain in block order,
// acc = fma(float(isum), d_w * d_a, acc); the row is acc * 0.125.
//
// Mapping: the 8 lanes of group g take block g of each part of a step (4 blocks), lane j its 32
// elements 32j.. (four groups of 8, scale byte j) in each of the warp's R rows. A reduce-scatter
// over the group leaves lane j with block g's isum of row j (R = 8), and lanes 0..7 run the rows'
// chains through blocks 0..3 in order with values shuffled down from groups 1..3: the float work
// is done once per row, not once per lane.
//
// Per group of 8 the integer work is: the codebook word from shared memory, the grid magnitudes
// of four elements by one byte-permute from a nibble-coded entry, the sign masks by two multiplies
// and two sign-replicating byte-permutes, and four dp4a: sum sign*g*a = dp4a(g, a) - 2 dp4a(g &
// neg, a).
#include "backend/cuda/matvec_q.cuh"
#include "backend/cuda/matvec_q_iq2_xs_mma.cuh"

namespace strata::cuda::detail::mvq {

namespace {

// Bytes 0, 1, 2 are the three grid magnitudes 8, 25, 43; a nibble code selects one.
constexpr uint32_t kGridValues = 0x002B1908u;

// Byte k of the result is the grid magnitude nibble k of `codes` selects (bytes of kGridValues).
// prmt by hand: __byte_perm masks its selector with 0x7777 first, two more instructions per
// group, which codes of 0..2 do not need.
__device__ __forceinline__ uint32_t grid_magnitudes(uint32_t codes) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(kGridValues), "r"(0u), "r"(codes));
  return r;
}

// Each byte of the result is 0xff where bit 7 of the same byte of x is set, else 0.
__device__ __forceinline__ uint32_t sign_bytes(uint32_t x) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(0u), "r"(0xBA98u));
  return r;
}

template <int R_, int T_, int NC>
struct IQ2_XSKernel {
  static constexpr int R = R_, T = T_, kBytes = 74, kActBlockBytes = 292;
  // A step is 16 blocks (1184 bytes of a row) for one activation, 8 for more (smaller activation
  // stages), in parts of 4 blocks.
  static constexpr int kStep = T == 1 ? 16 : 8, kParts = kStep / 4;
  static constexpr int kRowPad = 0;
  static constexpr int kActStride = kStep * kActBlockBytes;
  // NC copies of the 512-entry codebook, entry e of copy c at word e * NC + c: with NC = 32 each
  // lane reads its own bank, so the random lookups of a warp never conflict. One copy (about 3.5
  // conflicting lanes per lookup) measured fastest on the H200: the 64 KB of 32 copies cost more
  // occupancy than the conflicts.
  static constexpr int kSharedBytes = 512 * NC * 4;
  static constexpr int moe_min_ctas() { return 6; }

  // Lane j of group 0 keeps the chain of row j >> kRowShift (after the reduce-scatter, lane j of
  // every group holds that row's block sum).
  static constexpr int kRowShift = R == 8 ? 0 : R == 4 ? 1 : 2;
  static_assert(R == 2 || R == 4 || R == 8, "2, 4 or 8 rows per warp");

  struct Acc {
    float v[T];
  };

  // The codebook as nibble codes: nibble k of entry e is byte k of kIQ2XSGrid[e] (8, 25 or 43)
  // >> 4, i.e. 0, 1 or 2, the byte of kGridValues holding that magnitude.
  __device__ static void init_shared(uint8_t* smem, const Args& a) {
    uint32_t* table = reinterpret_cast<uint32_t*>(smem);
    for (int e = threadIdx.x; e < 512; e += kThreads) {
      const uint64_t entry = __ldg(a.iq2xs_grid + e);
      uint32_t word = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k) word |= uint32_t((entry >> (8 * k + 4)) & 0xf) << (4 * k);
      // Lanes start at different copies so a warp's stores spread over the banks.
      for (int c = 0; c < NC; ++c) table[e * NC + (c + threadIdx.x) % NC] = word;
    }
    __syncthreads();
  }

  // Group decode: the grid magnitudes of elements 0..3 / 4..7 (g0, g1) and the magnitudes of the
  // negative ones (n0, n1, the others zeroed). `word` holds the group's uint16 in its low bits
  // (kHigh: in bits 16..31).
  template <bool kHigh>
  __device__ static void decode(uint32_t word, const uint32_t* table, int copy, uint32_t& g0,
                                uint32_t& g1, uint32_t& n0, uint32_t& n1) {
    const uint32_t index = (kHigh ? word >> 16 : word) & 511u;
    const uint32_t field = kHigh ? word >> 25 : (word >> 9) & 127u;
    const uint32_t codes = table[index * NC + copy];
    g0 = grid_magnitudes(codes);
    g1 = grid_magnitudes(codes >> 16);
    // Sign k of the field to bit 8k + 7: the multiplier's shifted copies of the 7-bit field never
    // overlap (no carries), and only copy j = k lands on a bit 8m + 7. Elements 4..6 likewise;
    // element 7's sign is the field's parity (an even count of negatives), placed in bit 31.
    const uint32_t lo = field * 0x10204080u;
    const uint32_t hi = field * 0x01020408u + (uint32_t(__popc(field)) << 31);
    n0 = g0 & sign_bytes(lo);
    n1 = g1 & sign_bytes(hi);
  }

  // The lane's four groups (32 elements) of one row's block: their grid magnitudes and negative
  // magnitudes (decode above) and the block's scale byte. qs_offset/shift: where the lane's four
  // uint16 start in the row's chunk (step's alignment rule).
  struct Groups {
    uint32_t mag[4][2], neg_mag[4][2];
    uint32_t scale_byte;
  };
  __device__ static Groups decode_groups(const uint8_t* row, int bi, int j, int qs_offset,
                                         int shift, const uint32_t* table, int copy) {
    Groups q;
    const uint32_t w0 = ld_shared_u32(row + qs_offset), w1 = ld_shared_u32(row + qs_offset + 4);
    const uint32_t w2 = ld_shared_u32(row + qs_offset + 8);
    const uint32_t qa = __funnelshift_r(w0, w1, shift), qb = __funnelshift_r(w1, w2, shift);
    q.scale_byte = row[kBytes * bi + 66 + j];
    decode<false>(qa, table, copy, q.mag[0][0], q.mag[0][1], q.neg_mag[0][0], q.neg_mag[0][1]);
    decode<true>(qa, table, copy, q.mag[1][0], q.mag[1][1], q.neg_mag[1][0], q.neg_mag[1][1]);
    decode<false>(qb, table, copy, q.mag[2][0], q.mag[2][1], q.neg_mag[2][0], q.neg_mag[2][1]);
    decode<true>(qb, table, copy, q.mag[3][0], q.mag[3][1], q.neg_mag[3][0], q.neg_mag[3][1]);
    return q;
  }

  // The exact sum over the lane's 32 elements of (2 s_h + 1) grid sign a against activation codes
  // x: sum sign*g*a = dp4a(g, a) - 2 dp4a(g & neg, a), separate sums per group keeping the dp4a
  // dependency chains two deep.
  __device__ static int lane_isum(const Groups& q, const uint32_t x[8]) {
    int pos[4], neg[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      pos[i] =
          __dp4a(int(q.mag[i][0]), int(x[2 * i]), __dp4a(int(q.mag[i][1]), int(x[2 * i + 1]), 0));
      neg[i] = __dp4a(int(q.neg_mag[i][0]), int(x[2 * i]),
                      __dp4a(int(q.neg_mag[i][1]), int(x[2 * i + 1]), 0));
    }
    const int scale_lo = int(2 * (q.scale_byte & 15) + 1),
              scale_hi = int(2 * (q.scale_byte >> 4) + 1);
    return ((pos[0] + pos[1]) - 2 * (neg[0] + neg[1])) * scale_lo +
           ((pos[2] + pos[3]) - 2 * (neg[2] + neg[3])) * scale_hi;
  }

  __device__ static void load_act(const uint8_t* q8, uint32_t x[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = ld_shared_u32(q8 + 4 * k);
  }

  __device__ static void step(const uint8_t* rows, const uint8_t* act, const uint8_t* smem,
                              const Args& a, int t, int lane, Acc& acc) {
    const int g = lane >> 3, j = lane & 7;
    const uint32_t* table = reinterpret_cast<const uint32_t*>(smem);
    const int copy = lane % NC;
#pragma unroll 1
    for (int part = 0; part < kParts; ++part) {
      const int first = t * kStep + 4 * part;  // block index (in the row) of group 0
      if (first >= a.nb) break;                // uniform across the warp
      const int bi = 4 * part + g;             // this group's block in the chunk
      // The lane's four uint16 start 2 + 8j bytes into its block: word-aligned for odd bi, 2 bytes
      // past a word for even bi (74 bi = 2 mod 4 exactly when bi is odd).
      const int qs_offset = kBytes * bi + 2 + 8 * j - ((bi & 1) ? 0 : 2);
      const int shift = (bi & 1) ? 0 : 16;
      const int act_offset = kActBlockBytes * bi + 4 + 32 * j;
      // One activation: its 32 codes read once for all R rows.
      uint32_t x1[8] = {};
      if constexpr (T == 1) load_act(act + act_offset, x1);
      int isum[T][R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const Groups q =
            decode_groups(rows + rr * a.stage_row, bi, j, qs_offset, shift, table, copy);
#pragma unroll
        for (int tok = 0; tok < T; ++tok) {
          if (T > 1 && tok >= a.tokens) break;  // (uniform) a chunk of fewer pairs
          uint32_t x[8];
          if constexpr (T == 1) {
#pragma unroll
            for (int k = 0; k < 8; ++k) x[k] = x1[k];
          } else {
            load_act(act + tok * a.stage_act + act_offset, x);
          }
          isum[tok][rr] = lane_isum(q, x);
        }
      }
      // Lane j of group g: block bi's exact sum for row j >> kRowShift, with its d_w * d_a.
      const uint8_t* own_row = rows + (j >> kRowShift) * a.stage_row;
      const float dw =
          half_bits_to_float(*reinterpret_cast<const uint16_t*>(own_row + kBytes * bi));
#pragma unroll
      for (int tok = 0; tok < T; ++tok) {
        if (T > 1 && tok >= a.tokens) break;  // (uniform) a chunk of fewer pairs
        const uint8_t* act_tok = act + tok * a.stage_act;
        const float block_sum = __int2float_rn(reduce_scatter8<R>(isum[tok], j));
        const float scale =
            __fmul_rn(dw, *reinterpret_cast<const float*>(act_tok + kActBlockBytes * bi));
        // The chain through the part's blocks in order, in the lanes of group 0.
        float sums[4], scales[4];
#pragma unroll
        for (int gg = 0; gg < 4; ++gg) {
          sums[gg] = __shfl_down_sync(kFull, block_sum, 8 * gg);
          scales[gg] = __shfl_down_sync(kFull, scale, 8 * gg);
        }
#pragma unroll
        for (int gg = 0; gg < 4; ++gg)
          if (first + gg < a.nb) acc.v[tok] = __fmaf_rn(sums[gg], scales[gg], acc.v[tok]);
      }
    }
  }

  template <bool kGather>
  __device__ static void finish(Acc& acc, const Args& a, int64_t r0, int lane) {
    if (lane >= 8 || (lane & ((1 << kRowShift) - 1)) != 0) return;
    const int64_t r = r0 + (lane >> kRowShift);
    if (r >= a.rows) return;
#pragma unroll
    for (int tok = 0; tok < T; ++tok)
      if (tok < a.tokens) y_of<kGather>(a, tok)[r] = __fmul_rn(acc.v[tok], 0.125f);
  }
};

// Rows of at most two blocks (a 512-wide expert's down projection): the general mapping would
// leave groups 2 and 3 on blocks past the row's end, half the warp's integer work thrown away.
// Here group g takes block g & 1 of the rows 4 (g >> 1) .. 4 (g >> 1) + 3 of the warp's eight, so
// every lane works on a real block; a reduce-scatter leaves lane j of group g with row j >> 1's
// block sum, and groups 0 and 2 run their rows' chains through blocks 0 and 1 in order, the same
// float operations as the CPU's one chain.
struct IQ2_XSShortRowKernel : IQ2_XSKernel<8, 1, 1> {
  static constexpr int kRowsPerHalf = 4;

  __device__ static void step(const uint8_t* rows, const uint8_t* act, const uint8_t* smem,
                              const Args& a, int t, int lane, Acc& acc) {
    const int g = lane >> 3, j = lane & 7, bi = g & 1, half = g >> 1;
    const uint32_t* table = reinterpret_cast<const uint32_t*>(smem);
    const int qs_offset = kBytes * bi + 2 + 8 * j - ((bi & 1) ? 0 : 2);
    const int shift = (bi & 1) ? 0 : 16;
    const int act_offset = kActBlockBytes * bi + 4 + 32 * j;
    uint32_t x[8];
    load_act(act + act_offset, x);
    int isum[kRowsPerHalf];
#pragma unroll
    for (int rr = 0; rr < kRowsPerHalf; ++rr)
      isum[rr] = lane_isum(decode_groups(rows + (kRowsPerHalf * half + rr) * a.stage_row, bi, j,
                                         qs_offset, shift, table, 0),
                           x);
    const uint8_t* own_row = rows + (kRowsPerHalf * half + (j >> 1)) * a.stage_row;
    const float dw = half_bits_to_float(*reinterpret_cast<const uint16_t*>(own_row + kBytes * bi));
    const float block_sum = __int2float_rn(reduce_scatter8<kRowsPerHalf>(isum, j));
    const float scale = __fmul_rn(dw, *reinterpret_cast<const float*>(act + kActBlockBytes * bi));
    // Groups 0 and 2 hold block 0 of their rows; block 1 comes from the group after each.
    const float sum1 = __shfl_down_sync(kFull, block_sum, 8);
    const float scale1 = __shfl_down_sync(kFull, scale, 8);
    acc.v[0] = __fmaf_rn(block_sum, scale, acc.v[0]);
    if (a.nb > 1) acc.v[0] = __fmaf_rn(sum1, scale1, acc.v[0]);
  }

  template <bool kGather>
  __device__ static void finish(Acc& acc, const Args& a, int64_t r0, int lane) {
    const int g = lane >> 3, j = lane & 7;
    if ((g & 1) != 0 || (j & 1) != 0) return;
    const int64_t r = r0 + kRowsPerHalf * (g >> 1) + (j >> 1);
    if (r < a.rows) y_of<kGather>(a, 0)[r] = __fmul_rn(acc.v[0], 0.125f);
  }
};

}  // namespace

void launch_matvec_q_iq2_xs(const MatvecQLaunch& l) {
  if (l.tokens == 1) {
    if (l.grid_copies == 8) return launch<IQ2_XSKernel<4, 1, 8>>(l);
    if (l.grid_copies == 32) return launch<IQ2_XSKernel<4, 1, 32>>(l);
    if (l.rows_per_warp == 8) return launch<IQ2_XSKernel<8, 1, 1>>(l);
    return launch<IQ2_XSKernel<4, 1, 1>>(l);
  }
  if (l.tokens == 2) return launch<IQ2_XSKernel<4, 2, 1>>(l);
  if (l.tokens <= 4) return launch<IQ2_XSKernel<2, 4, 1>>(l);
  return launch<IQ2_XSKernel<2, 8, 1>>(l);
}

void launch_moe_q_iq2_xs(const MoeQLaunch& l) {
  if (moe_stage_blocks(l) <= 2) return launch_moe<IQ2_XSShortRowKernel, IQ2_XSMmaKernel>(l);
  launch_moe<IQ2_XSKernel<4, 1, 1>, IQ2_XSMmaKernel>(l);
}

}  // namespace strata::cuda::detail::mvq
