// Q8_0 weights x Q8_0 activations on the tensor cores, for calls of more than kMaxMatvecTokens
// activations (prefill windows): y[t * rows + r] = dot_ref(W[r,:], act_t), bitwise the mat-vec
// (matvec_q_q8_0.cu) and the CPU. q8_0_mma.cuh has the block step and its exactness; each thread
// keeps the eight lane chains of each of its results and extends chain b % 8 in block order.
//
// A CTA of 8 warps computes 64 rows x 32 tokens (warp w: rows 16 (w % 4).., tokens 16 (w / 4)..,
// two m16n8 tiles), walking the rows in steps of 8 blocks: 272 bytes of each of its rows and
// activations, staged with cp.async and double-buffered. The 272-byte pitch is 16 mod 128, so the
// 8 rows (or tokens) a fragment load touches fall in distinct banks. Consecutive CTAs take the
// token tiles of one row tile, so a weight row comes from DRAM once and from L2 after that.
#include "backend/cuda/q8_0_mma.cuh"

namespace strata::cuda::detail::mvq {

namespace {

using namespace q8_0_mma;

constexpr int kMmaWarps = 8, kMmaThreads = 32 * kMmaWarps;
constexpr int kTileRows = 64, kTileTokens = 32;
constexpr int kStepBlocks = 8;
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

__global__ void __launch_bounds__(kMmaThreads, 2) matmul_q8_0_mma_kernel(const MmaArgs a) {
  await_previous_kernel();
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, tig = lane % 4;
  const int wr = warp % 4, wt = warp / 4;
  const int64_t r0 = int64_t(blockIdx.y) * kTileRows, t0 = int64_t(blockIdx.x) * kTileTokens;

  // chain[n][c][e]: lane chain c of result e of m16n8 tile n (e: rows g, g + 8 x tokens 2 tig,
  // 2 tig + 1 of the tile, row-major).
  float chain[2][kStepBlocks][4] = {};

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
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const uint8_t* tile = tokens + 8 * n * kPitch;
        block_step(row_g, row_g8, tile + g * kPitch, tile + 2 * tig * kPitch,
                   tile + (2 * tig + 1) * kPitch, i, tig, chain[n][i]);
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
      float lanes[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) lanes[c] = chain[n][c][e];
      const float v = reduce8(lanes);
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
