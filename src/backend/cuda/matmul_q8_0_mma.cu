// Q8_0 weights x Q8_0 activations on the tensor cores, for calls of more than kMaxMatvecTokens
// activations (prefill windows): y[t * rows + r] = dot_ref(W[r,:], act_t), bitwise the mat-vec
// (matvec_q_q8_0.cu) and the CPU.
//
// CPU reference (quant/formats/q8_0.cpp): per block b the exact s = sum q_w q_a, then
// lane[b % 8] = fma(d_w * d_a, float(s), lane[b % 8]); the eight lanes meet in reduce8.
//
// One mma.sync m16n8k32 (int8 in, int32 out) is one block of 32 codes for 16 rows x 8 tokens,
// and its int32 results are those blocks' exact sums. Only the float steps after it need the CPU's
// order, and they get it: each thread keeps the eight lane chains of each of its results and
// extends chain b % 8 in block order. float(s) is formed by the magic-number add (exact for
// |s| < 2^22; a Q8_0 block sum is at most 32 * 128 * 127 in magnitude) instead of I2F, which runs
// at an eighth of the FMA rate on sm_90.
//
// A CTA of 8 warps computes 64 rows x 32 tokens (warp w: rows 16 (w % 4).., tokens 16 (w / 4)..,
// two m16n8 tiles), walking the rows in steps of 8 blocks: 272 bytes of each of its rows and
// activations, staged with cp.async and double-buffered. The 272-byte pitch is 16 mod 128, so the
// 8 rows (or tokens) a fragment load touches fall in distinct banks. Consecutive CTAs take the
// token tiles of one row tile, so a weight row comes from DRAM once and from L2 after that.
#include "backend/cuda/matvec_q.cuh"

namespace strata::cuda::detail::mvq {

namespace {

constexpr int kMmaWarps = 8, kMmaThreads = 32 * kMmaWarps;
constexpr int kTileRows = 64, kTileTokens = 32;
constexpr int kStepBlocks = 8, kBlockBytes = 34;
constexpr int kPitch = kStepBlocks * kBlockBytes;  // 272
constexpr int kStageBytes = (kTileRows + kTileTokens) * kPitch;
constexpr size_t kMmaSmem = 2 * size_t(kStageBytes);
constexpr int64_t kMaxGridY = 65535;

struct MmaArgs {
  const uint8_t* w;
  size_t row_stride;
  int64_t rows;
  const uint8_t* act;
  size_t act_stride;
  int64_t tokens;
  int nb, nsteps;      // blocks per row; steps of kStepBlocks
  int w_unit, a_unit;  // copy granularity of weight and activation chunks
  float* y;            // y[t * rows + r]
};

// Step t's chunks of the CTA's rows and tokens into `stage`, warp w taking chunks w, w + 8, ...
// Rows (tokens) past the end copy the last one again, so every byte a lane reads was written.
__device__ __forceinline__ void stage_mma_step(uint8_t* stage, const MmaArgs& a, int64_t r0,
                                               int64_t t0, int t, int warp, int lane) {
  const int blk0 = t * kStepBlocks;
  const int bytes = min(kStepBlocks, a.nb - blk0) * kBlockBytes;
  for (int c = warp; c < kTileRows + kTileTokens; c += kMmaWarps) {
    if (c < kTileRows) {
      const int64_t r = min(r0 + c, a.rows - 1);
      warp_copy(stage + c * kPitch, a.w + size_t(r) * a.row_stride + size_t(blk0) * kBlockBytes,
                bytes, a.w_unit, lane);
    } else {
      const int64_t tok = min(t0 + (c - kTileRows), a.tokens - 1);
      warp_copy(stage + c * kPitch,
                a.act + size_t(tok) * a.act_stride + size_t(blk0) * kBlockBytes, bytes, a.a_unit,
                lane);
    }
  }
}

// Codes 4 tig .. 4 tig + 3 (lo) and 16 + 4 tig .. (hi) of block i of a chunk. An odd block's
// codes are word-aligned; an even block's start 2 bytes past a word.
__device__ __forceinline__ void block_codes(const uint8_t* chunk, int i, int tig, uint32_t& lo,
                                            uint32_t& hi) {
  const uint8_t* codes = chunk + kBlockBytes * i + 2;
  if (i & 1) {
    lo = ld_shared_u32(codes + 4 * tig);
    hi = ld_shared_u32(codes + 16 + 4 * tig);
  } else {
    const uint8_t* p = codes - 2 + 4 * tig;
    lo = __funnelshift_r(ld_shared_u32(p), ld_shared_u32(p + 4), 16);
    hi = __funnelshift_r(ld_shared_u32(p + 16), ld_shared_u32(p + 20), 16);
  }
}

__device__ __forceinline__ float block_scale(const uint8_t* chunk, int i) {
  return half_bits_to_float(*reinterpret_cast<const uint16_t*>(chunk + kBlockBytes * i));
}

// float(s), exactly, for |s| < 2^22.
__device__ __forceinline__ float small_int_to_float(int s) {
  return __fsub_rn(__int_as_float(0x4B400000 + s), 12582912.0f);
}

__device__ __forceinline__ float reduce8(const float (&l)[8]) {
  const float a0 = __fadd_rn(l[0], l[4]), a1 = __fadd_rn(l[1], l[5]);
  const float a2 = __fadd_rn(l[2], l[6]), a3 = __fadd_rn(l[3], l[7]);
  return __fadd_rn(__fadd_rn(a0, a2), __fadd_rn(a1, a3));
}

__global__ void __launch_bounds__(kMmaThreads, 2) matmul_q8_0_mma_kernel(const MmaArgs a) {
  await_previous_kernel();
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, tig = lane % 4;
  const int wr = warp % 4, wt = warp / 4;
  const int64_t r0 = int64_t(blockIdx.y) * kTileRows, t0 = int64_t(blockIdx.x) * kTileTokens;

  // chain[n][e][c]: lane chain c of result e of m16n8 tile n (e: rows g, g + 8 x tokens 2 tig,
  // 2 tig + 1 of the tile, row-major).
  float chain[2][4][8] = {};

  stage_mma_step(smem, a, r0, t0, 0, warp, lane);
  cp_async_commit();
  for (int t = 0; t < a.nsteps; ++t) {
    if (t + 1 < a.nsteps)
      stage_mma_step(smem + ((t + 1) & 1) * kStageBytes, a, r0, t0, t + 1, warp, lane);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint8_t* stage = smem + (t & 1) * kStageBytes;
    const uint8_t* row_g = stage + (16 * wr + g) * kPitch;
    const uint8_t* row_g8 = row_g + 8 * kPitch;
    const uint8_t* tokens = stage + (kTileRows + 16 * wt) * kPitch;
    const int nblk = min(kStepBlocks, a.nb - t * kStepBlocks);
#pragma unroll
    for (int i = 0; i < kStepBlocks; ++i) {
      if (i >= nblk) break;  // uniform across the CTA
      uint32_t a0, a1, a2, a3;
      block_codes(row_g, i, tig, a0, a2);
      block_codes(row_g8, i, tig, a1, a3);
      const float dw[2] = {block_scale(row_g, i), block_scale(row_g8, i)};
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const uint8_t* tile = tokens + 8 * n * kPitch;
        uint32_t b0, b1;
        block_codes(tile + g * kPitch, i, tig, b0, b1);
        const float da[2] = {block_scale(tile + 2 * tig * kPitch, i),
                             block_scale(tile + (2 * tig + 1) * kPitch, i)};
        int s[4];
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%10, %10, %10, %10};"
            : "=r"(s[0]), "=r"(s[1]), "=r"(s[2]), "=r"(s[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#pragma unroll
        for (int e = 0; e < 4; ++e)
          chain[n][e][i] = __fmaf_rn(__fmul_rn(dw[e / 2], da[e % 2]), small_int_to_float(s[e]),
                                     chain[n][e][i]);
      }
    }
    __syncthreads();  // every warp is done reading this stage before it is refilled
  }

#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t r = r0 + 16 * wr + g + 8 * (e / 2);
      const int64_t tok = t0 + 16 * wt + 8 * n + 2 * tig + e % 2;
      const float v = reduce8(chain[n][e]);
      if (r < a.rows && tok < a.tokens) a.y[size_t(tok) * size_t(a.rows) + size_t(r)] = v;
    }
}

}  // namespace

void launch_matmul_q8_0_mma(const MatvecQLaunch& l) {
  if (l.rows == 0 || l.tokens == 0) return;
  const int64_t row_tiles = (l.rows + kTileRows - 1) / kTileRows;
  if (row_tiles > kMaxGridY)
    fail("CUDA matmul q8_0 (tensor cores): ", l.rows, " rows, at most ", kMaxGridY * kTileRows);
  {
    static std::mutex mutex;
    static std::map<int, bool> configured;
    const std::lock_guard lock(mutex);
    if (!configured[l.device]) {
      check(cudaFuncSetAttribute(matmul_q8_0_mma_kernel,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMmaSmem)),
            "cudaFuncSetAttribute");
      configured[l.device] = true;
    }
  }
  MmaArgs a{};
  a.w = static_cast<const uint8_t*>(l.w);
  a.row_stride = l.row_stride;
  a.rows = l.rows;
  a.act = static_cast<const uint8_t*>(l.act);
  a.act_stride = l.act_stride;
  a.tokens = l.tokens;
  a.nb = int(l.blocks);
  a.nsteps = int((l.blocks + kStepBlocks - 1) / kStepBlocks);
  const size_t last = size_t(l.blocks % kStepBlocks) * kBlockBytes;
  a.w_unit = copy_unit(l.w, l.row_stride, kPitch, last);
  a.a_unit = copy_unit(l.act, l.act_stride, kPitch, last);
  a.y = l.y;
  const dim3 grid(unsigned((l.tokens + kTileTokens - 1) / kTileTokens), unsigned(row_tiles));
  launch_kernel(matmul_q8_0_mma_kernel, grid, kMmaThreads, kMmaSmem, l.stream, a);
  check_launch("matmul q8_0 (tensor cores) launch");
}

}  // namespace strata::cuda::detail::mvq
