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

// The 32 codes (as 8 words) and the scale of block c of a 4-byte aligned chunk in shared memory: 9
// aligned words from the aligned-down start (up to 2 bytes past the block's end); an even block
// starts word-aligned (codes from byte 2), an odd one 2 bytes in (codes word-aligned).
__device__ __forceinline__ float load_block(const uint8_t* chunk, int c, uint32_t q[8]) {
  const uint8_t* p = chunk + ((34 * c) & ~3);
  uint32_t w[9];
#pragma unroll
  for (int i = 0; i < 9; ++i) w[i] = ld_shared_u32(p + 4 * i);
  const int shift = (c & 1) ? 32 : 16;  // funnelshift_rc clamps: 32 takes the high word
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] = __funnelshift_rc(w[i], w[i + 1], shift);
  return half_bits_to_float((c & 1) ? w[0] >> 16 : w[0] & 0xffffu);
}

template <int R_, int T_>
struct Q8_0Kernel {
  static_assert(R_ % 4 == 0, "four row slots per warp");
  static constexpr int R = R_, T = T_, kStep = 32, kBytes = 34, kActBlockBytes = 34;
  static constexpr int kRowPad = 0, kActStride = kStep * kActBlockBytes;
  static constexpr int kSharedBytes = 0;
  static constexpr int moe_min_ctas() { return 6; }
  static constexpr int kRowsPerLane = R / 4;

  struct Acc {
    float v[kRowsPerLane][T];
  };

  __device__ static void init_shared(uint8_t*, const Args&) {}

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

// Long rows in few row groups (a hyper-connection mixer's down projection, 320 rows of 10240
// columns, with its 4-row inject; an out-projection of 2048-2560 rows): at 16 rows a CTA the
// kernels above give such a matrix 20-160 CTAs, each streaming its rows step after step while most
// SMs idle. Here a CTA takes 2, 4 or 8 rows whole, so there are up to resident-capacity CTAs, all
// loading at once. The chains that make the CPU's bits are sequential (chain b % 8 of a row runs
// in block order), so they cannot be split among threads; everything before them can: every
// thread turns its share of the CTA's blocks into the chain's two factors, d_w * d_a and
// float(s), in shared memory, then one thread per (row, activation, chain) runs the chain's
// nb / 8 FMAs and the eight meet in reduce8_lanes as in Q8_0Kernel: the same operations, so the
// same bits.
namespace wide {

constexpr int kMinBlocks = 64;        // two of the kernels' steps: shorter rows stay on them
constexpr int kRowChoices[] = {2, 4, 8};

struct Args {
  int nb, rows_per_cta, pitch;  // pitch: bytes a staged row or activation takes
  const uint8_t* act;
  size_t act_stride;
  int w_unit, a_unit;
};

__host__ __device__ constexpr int pitch(int64_t blocks) {
  return int((blocks * 34 + 4 + 15) / 16 * 16);  // +4: load_block reads up to 2 bytes past
}

__host__ __device__ constexpr size_t smem_bytes(int64_t blocks, int rows_per_cta, int tokens) {
  return size_t(rows_per_cta + tokens) * size_t(pitch(blocks)) +
         size_t(rows_per_cta) * size_t(tokens) * size_t(blocks) * sizeof(float2);
}

template <int T>
__global__ void __launch_bounds__(kThreads) kernel(const Args a, const Matrices m) {
  await_previous_kernel();
  extern __shared__ __align__(16) uint8_t smem[];
  int i = 0;
  while (i + 1 < m.n && int(blockIdx.x) >= m.at[i + 1].first_cta) ++i;
  const Matrices::Matrix& mx = m.at[i];
  const int64_t r0 = int64_t(int(blockIdx.x) - mx.first_cta) * a.rows_per_cta;
  const int rows = int(min(int64_t(a.rows_per_cta), mx.rows - r0));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, row_bytes = a.nb * 34;
  uint8_t* const w_stage = smem;
  uint8_t* const a_stage = smem + a.rows_per_cta * a.pitch;
  float2* const factors = reinterpret_cast<float2*>(a_stage + T * a.pitch);  // [row][token][block]
  for (int r = warp; r < rows; r += kWarps)
    warp_copy(w_stage + r * a.pitch, mx.w + size_t(r0 + r) * mx.row_stride, row_bytes, a.w_unit,
              lane);
  for (int tok = warp; tok < T; tok += kWarps)
    warp_copy(a_stage + tok * a.pitch, a.act + size_t(tok) * a.act_stride, row_bytes, a.a_unit,
              lane);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  for (int k = threadIdx.x; k < rows * a.nb; k += kThreads) {
    const int r = k / a.nb, b = k - r * a.nb;
    uint32_t qw[8];
    const float dw = load_block(w_stage + r * a.pitch, b, qw);
#pragma unroll
    for (int tok = 0; tok < T; ++tok) {
      uint32_t qa[8];
      const float da = load_block(a_stage + tok * a.pitch, b, qa);
      int s = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) s = __dp4a(int(qw[j]), int(qa[j]), s);
      factors[(r * T + tok) * a.nb + b] = make_float2(__fmul_rn(dw, da), __int2float_rn(s));
    }
  }
  __syncthreads();
  // Thread 8 (r T + tok) + c runs chain c of row r and activation tok (rows_per_cta * T <= 16).
  const int c = threadIdx.x % 8, pair = threadIdx.x / 8;
  float acc = 0.0f;
  if (pair < rows * T) {
    const float2* f = factors + pair * a.nb;
    for (int b = c; b < a.nb; b += 8) acc = __fmaf_rn(f[b].x, f[b].y, acc);
  }
  acc = reduce8_lanes<1>(acc);
  if (c == 0 && pair < rows * T)
    mx.y[size_t(pair % T) * size_t(mx.rows) + size_t(r0 + pair / T)] = acc;
}

// Runs l on kernel<T> and returns true where its matrices have long rows in fewer row groups than
// two an SM, with the fewest rows a CTA that keep every CTA resident at once.
template <int T>
bool launch(const MatvecQLaunch& l) {
  if (l.blocks < kMinBlocks) return false;
  const MatvecQMatrix one{l.w, l.row_stride, l.rows, l.y};
  const MatvecQMatrix* mats = l.n_matrices > 1 ? l.matrices : &one;
  const int n = l.n_matrices > 1 ? l.n_matrices : 1;
  int64_t groups = 0;
  constexpr int64_t kGroupRows = kCtaRows<Q8_0Kernel<4, 1>>;
  for (int i = 0; i < n; ++i) groups += (mats[i].rows + kGroupRows - 1) / kGroupRows;
  if (groups >= 2 * int64_t(l.sm_count)) return false;
  for (const int rows_per_cta : kRowChoices) {
    int64_t ctas = 0;
    for (int i = 0; i < n; ++i) ctas += (mats[i].rows + rows_per_cta - 1) / rows_per_cta;
    const size_t smem = smem_bytes(l.blocks, rows_per_cta, T);
    if (ctas > int64_t(resident_per_sm<kernel<T>>(l.device, smem, 0)) * l.sm_count) continue;
    Args a{int(l.blocks), rows_per_cta, pitch(l.blocks), static_cast<const uint8_t*>(l.act),
           l.act_stride, 16, 0};
    a.a_unit = copy_unit(l.act, l.act_stride, size_t(l.blocks) * 34, 0);
    Matrices m{};
    m.n = n;
    int first = 0;
    for (int i = 0; i < n; ++i) {
      const int c = int((mats[i].rows + rows_per_cta - 1) / rows_per_cta);
      m.at[i] = {static_cast<const uint8_t*>(mats[i].w), mats[i].row_stride, mats[i].rows,
                 mats[i].y, first, c};
      first += c;
      a.w_unit = std::min(a.w_unit, copy_unit(mats[i].w, mats[i].row_stride,
                                              size_t(l.blocks) * 34, 0));
    }
    launch_kernel(kernel<T>, first, kThreads, smem, l.stream, a, m);
    check_launch("matvec_q launch");
    return true;
  }
  return false;
}

}  // namespace wide

}  // namespace

void launch_matvec_q_q8_0(const MatvecQLaunch& l) {
  // (rows_per_warp asks for the row-group kernels by name.)
  if (l.rows_per_warp == 0 && l.tokens == 1 && wide::launch<1>(l)) return;
  if (l.rows_per_warp == 0 && l.tokens == 2 && wide::launch<2>(l)) return;
  if (l.tokens >= kMmaMinTokens) return launch<Q8_0MmaKernel>(l);
  if (l.tokens == 2) return launch<Q8_0Kernel<4, 2>>(l);
  if (l.rows_per_warp == 8) return launch<Q8_0Kernel<8, 1>>(l);
  return launch<Q8_0Kernel<4, 1>>(l);
}

// Where the CTAs quantizing x themselves saves the quantize kernel without slowing the mat-vec:
// rows of one step at one activation (a hyper-connection mixer's up projection, 320 columns; a
// shared expert's down, 512 or 640), whose CTAs quantize a block or two each. (Long rows a few a
// CTA quantizing their whole activation in every CTA measured slower than the quantize kernel and
// the kernel apart on the flagship's mixer down projection, 13.7 us against 3.4 + 6.9, H100.)
bool launch_matvec_q_q8_0_from_x(const MatvecQLaunch& l) {
  if (l.tokens != 1 || l.n_matrices > 1 || l.blocks > Q8_0Kernel<4, 1>::kStep) return false;
  launch<Q8_0Kernel<4, 1>, true>(l);
  return true;
}

void launch_moe_q_q8_0(const MoeQLaunch& l) {
  launch_moe<Q8_0Kernel<4, 1>, Q8_0Kernel<4, 8>>(l);
}

}  // namespace strata::cuda::detail::mvq
