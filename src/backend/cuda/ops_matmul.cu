// matmul, get_rows and the activation quantization they share with the MoE.
//
// The CPU's matmul is y[r, o] = dot(W_o, quantize_act(x_r)): the activation is first quantized to
// the weight format's partner layout (Q8_0 / Q8_K blocks; fp32 for the float formats). Here the
// activation is quantized by the same rule and replaced by the values it encodes, then dotted in
// fp32 with the decoded weights (ops_matvec_rows.cuh), so the GPU multiplies the same numbers the
// CPU does and differs from it only by float rounding, not by quantization error.
#include <algorithm>
#include <climits>

#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/decode.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_matvec_rows.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// One warp per activation block of 32 * kPerLane elements; lane l holds elements l*kPerLane...
template <int kPerLane>
__global__ void __launch_bounds__(kThreads)
    quantize_act_kernel(const float* __restrict__ x, int64_t x_stride, int64_t rows, int64_t cols,
                        ActQuant mode, float* __restrict__ out) {
  await_previous_kernel();
  constexpr int kBlock = 32 * kPerLane;
  const int lane = threadIdx.x & 31;
  const int64_t per_row = cols / kBlock, units = rows * per_row;
  for (int64_t u = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; u < units;
       u += int64_t(gridDim.x) * kWarps) {
    const int64_t r = u / per_row, first = (u % per_row) * kBlock + lane * kPerLane;
    float v[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) v[i] = x[r * x_stride + first + i];
    quantize_block_warp(v, mode);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) out[r * cols + first + i] = v[i];
  }
}

// The weights of one matmul_kernel launch: rows first_row .. of the launch are matrix i's.
struct RowMatrices {
  struct Matrix {
    const uint8_t* w;
    size_t row_stride;
    int64_t first_row;
    float* y;
    int64_t y_stride;
  } at[kMaxMatvecQMatrices];
  int n;
  int64_t rows;  // of all of them
};

// Warp (blockIdx.x, warp) takes launch rows o; blockIdx.y a pass of per_pass (<= kActsPerPass)
// activation rows. A CTA has up to kWarps warps (fewer spread a short matrix over more SMs).
template <typename D>
__global__ void __launch_bounds__(kThreads)
    matmul_kernel(const RowMatrices m, int groups, const float* __restrict__ act,
                  int64_t act_stride, int64_t n_act, int per_pass, DecodeTables tables) {
  await_previous_kernel();
  const int64_t passes = (n_act + per_pass - 1) / per_pass;
  for (int64_t pass = blockIdx.y; pass < passes; pass += gridDim.y) {
    const int64_t first = pass * per_pass;
    const int n = int(n_act - first < per_pass ? n_act - first : per_pass);
    const int warps = int(blockDim.x) / 32;
    for (int64_t o = int64_t(blockIdx.x) * warps + threadIdx.x / 32; o < m.rows;
         o += int64_t(gridDim.x) * warps) {
      RowMatrices::Matrix mi = m.at[0];  // (constant indices: the list stays in registers)
#pragma unroll
      for (int i = 1; i < kMaxMatvecQMatrices; ++i)
        if (i < m.n && o >= m.at[i].first_row) mi = m.at[i];
      const int64_t r = o - mi.first_row;
      warp_row_dots<D>(
          mi.w + size_t(r) * mi.row_stride, groups, n, tables,
          [&](int j) { return act + (first + j) * act_stride; },
          [&](int j, float value) { mi.y[(first + j) * mi.y_stride + r] = value; });
    }
  }
}

// One thread per (row, group of 8).
template <typename D>
__global__ void get_rows_kernel(const uint8_t* __restrict__ table, size_t row_stride, int64_t cols,
                                const int32_t* __restrict__ ids, int64_t table_rows, int64_t rows,
                                float* __restrict__ y, int64_t y_stride, DecodeTables tables) {
  await_previous_kernel();
  constexpr int kGroups = D::kElems / 8;
  const int64_t groups = cols / 8, n = rows * groups;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = u / groups, g = u % groups;
    float* out = y + r * y_stride + 8 * g;
    const int64_t id = ids[r];
    if (id < 0 || id >= table_rows) {  // a bad id reads nothing outside the table
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = 0.0f;
      continue;
    }
    float v[8];
    D::decode(table + size_t(id) * row_stride + size_t(g / kGroups) * D::kBytes,
              int(g % kGroups), tables, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = v[i];
  }
}

// Activation rows a warp takes per pass over its weight row. A pass decodes the row once for all
// of them, but a small matrix (the router's 512 rows of 2048 floats) then leaves most of the GPU
// idle with one long dependent walk per warp: below about one warp per SM scheduler slot
// (32 an SM) the rows are split into more, shorter passes, each a warp of its own; the weights are
// read again, from L2. Every activation's dot is the same chain either way.
int acts_per_pass(int64_t rows, int64_t n_act, int sm_count) {
  const int64_t target_warps = int64_t(sm_count > 0 ? sm_count : 1) * 32;
  int per_pass = kActsPerPass;
  while (per_pass > 1 && rows * ((n_act + per_pass - 1) / per_pass) < target_warps) per_pass /= 2;
  return per_pass;
}

}  // namespace

void launch_quantize_act(const DeviceContext& ctx, quant::ActFormat f, const Tensor& x,
                         float* out) {
  if (x.rows == 0 || x.cols == 0) return;
  const ActQuant mode = act_quant(f);
  if (mode == ActQuant::None) return launch_copy(ctx, x, Tensor{out, x.rows, x.cols, x.cols});
  const int per_lane = mode == ActQuant::Q8_K ? 8 : 1;
  const int grid = grid_for(x.rows * x.cols / (32 * per_lane), kWarps, ctx.limits.max_blocks);
  if (per_lane == 8)
    launch_kernel(quantize_act_kernel<8>, grid, kThreads, 0, ctx.stream, x.data, x.stride, x.rows,
                  x.cols, mode, out);
  else
    launch_kernel(quantize_act_kernel<1>, grid, kThreads, 0, ctx.stream, x.data, x.stride, x.rows,
                  x.cols, mode, out);
  STRATA_CUDA_CHECK_LAUNCH("quantize_act_kernel");
}

void launch_matmul(const DeviceContext& ctx, quant::Type t, const void* w, size_t row_stride,
                   int64_t rows, int64_t cols, const float* act, int64_t act_stride, Tensor y) {
  const MatmulMatrix m{w, row_stride, rows, y};
  launch_matmuls(ctx, t, {&m, 1}, cols, act, act_stride);
}

void launch_matmuls(const DeviceContext& ctx, quant::Type t, std::span<const MatmulMatrix> ms,
                    int64_t cols, const float* act, int64_t act_stride) {
  const bool known = visit_decoder(t, [&](auto decoder) {
    using D = decltype(decoder);
    const char* name = quant::type_name(t);
    if (cols <= 0 || cols % D::kElems != 0 || cols % 8 != 0 || cols / 8 > INT_MAX - 32)
      fail("CUDA matmul ", name, ": ", cols, " columns is not a positive multiple of the block (",
           int(D::kElems), ") and of 8");
    if (ms.empty() || ms.size() > size_t(kMaxMatvecQMatrices))
      fail("CUDA matmul ", name, ": ", ms.size(), " matrices, expected 1 to ",
           kMaxMatvecQMatrices);
    RowMatrices m{};
    for (const MatmulMatrix& mm : ms) {
      if (!aligned(mm.w, D::kAlign) || mm.row_stride % D::kAlign != 0)
        fail("CUDA matmul ", name, ": weights and row stride need ", int(D::kAlign),
             "-byte alignment");
      if (mm.y.rows != ms[0].y.rows)
        fail("CUDA matmul ", name, ": outputs of ", mm.y.rows, " and ", ms[0].y.rows, " rows");
      m.at[m.n++] = {static_cast<const uint8_t*>(mm.w), mm.row_stride, m.rows, mm.y.data,
                     mm.y.stride};
      m.rows += mm.rows;
    }
    const int64_t n_act = ms[0].y.rows;
    if (m.rows == 0 || n_act == 0) return;
    const int per_pass = acts_per_pass(m.rows, n_act, ctx.sm_count);
    const int64_t passes = (n_act + per_pass - 1) / per_pass;
    // One pass of a matrix of few rows (the router's, in decode): as few warps a CTA as put a CTA
    // on every SM, instead of kWarps on some of them (latency, not bandwidth, bounds such a pass).
    int64_t warps = kWarps;
    if (passes == 1 && ctx.sm_count > 0)
      warps = std::clamp<int64_t>((m.rows + ctx.sm_count - 1) / ctx.sm_count, 2, kWarps);
    const int gx = grid_for(m.rows, warps, ctx.limits.max_blocks);
    const dim3 grid(unsigned(gx), unsigned(passes < 65535 ? passes : 65535));
    launch_kernel(matmul_kernel<D>, grid, unsigned(warps * 32), 0, ctx.stream, m, int(cols / 8),
                  act, act_stride, n_act, per_pass, ctx.tables);
    STRATA_CUDA_CHECK_LAUNCH("matmul_kernel");
  });
  if (!known) fail("CUDA matmul: no decoder for weight type ", quant::type_name(t));
}

void launch_get_rows(const DeviceContext& ctx, quant::Type t, const void* table, size_t row_stride,
                     int64_t cols, const int32_t* ids, int64_t table_rows, Tensor y) {
  const bool known = visit_decoder(t, [&](auto decoder) {
    using D = decltype(decoder);
    if (cols % D::kElems != 0 || cols % 8 != 0)
      fail("CUDA get_rows ", quant::type_name(t), ": ", cols,
           " columns is not a multiple of the block (", int(D::kElems), ") and of 8");
    if (!aligned(table, D::kAlign) || row_stride % D::kAlign != 0)
      fail("CUDA get_rows ", quant::type_name(t), ": the table needs ", int(D::kAlign),
           "-byte alignment");
    if (y.rows == 0 || cols == 0) return;
    launch_kernel(get_rows_kernel<D>, grid_for(y.rows * cols / 8, 256, ctx.limits.max_blocks), 256,
                  0, ctx.stream, static_cast<const uint8_t*>(table), row_stride, cols, ids,
                  table_rows, y.rows, y.data, y.stride, ctx.tables);
    STRATA_CUDA_CHECK_LAUNCH("get_rows_kernel");
  });
  if (!known) fail("CUDA get_rows: no decoder for weight type ", quant::type_name(t));
}

}  // namespace strata::cuda::detail
