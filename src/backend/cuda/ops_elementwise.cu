// Element-wise ops: one thread per output element, the CPU's expressions operation for operation
// (add, scale and the copies are bitwise the CPU's; the sigmoid ops differ only by expf's rounding).
#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 256;

// A strided [rows, cols] fp32 matrix as kernels take it.
struct Mat {
  float* p;
  int64_t cols;
  int64_t stride;
  __device__ float& at(int64_t r, int64_t c) const { return p[r * stride + c]; }
};

Mat mat(const Tensor& t) { return {t.data, t.cols, t.stride}; }

// Runs fn(r, c) for every element of a [rows, cols] shape, grid-stride.
template <typename Fn>
__device__ __forceinline__ void for_elements(int64_t rows, int64_t cols, Fn fn) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    fn(i / cols, i % cols);
}

__global__ void fill_kernel(Mat t, int64_t rows, float value) {
  await_previous_kernel();
  for_elements(rows, t.cols, [&](int64_t r, int64_t c) { t.at(r, c) = value; });
}

__global__ void copy_kernel(Mat src, Mat dst, int64_t rows) {
  await_previous_kernel();
  for_elements(rows, src.cols, [&](int64_t r, int64_t c) { dst.at(r, c) = src.at(r, c); });
}

__global__ void set_rows_kernel(Mat src, const int32_t* __restrict__ ids, Mat dst, int64_t rows,
                                int64_t dst_rows) {
  await_previous_kernel();
  for_elements(rows, src.cols, [&](int64_t r, int64_t c) {
    const int64_t to = ids[r];
    if (to >= 0 && to < dst_rows) dst.at(to, c) = src.at(r, c);
  });
}

__global__ void add_kernel(Mat a, Mat b, Mat y, int64_t rows) {
  await_previous_kernel();
  for_elements(rows, a.cols,
               [&](int64_t r, int64_t c) { y.at(r, c) = __fadd_rn(a.at(r, c), b.at(r, c)); });
}

__global__ void scale_kernel(Mat x, float s, Mat y, int64_t rows) {
  await_previous_kernel();
  for_elements(rows, x.cols, [&](int64_t r, int64_t c) { y.at(r, c) = __fmul_rn(x.at(r, c), s); });
}

// y = x * (1 / (1 + e^-gate)); a one-column gate scales its whole row.
__global__ void mul_sigmoid_kernel(Mat x, Mat gate, bool per_row, Mat y, int64_t rows) {
  await_previous_kernel();
  for_elements(rows, x.cols, [&](int64_t r, int64_t c) {
    const float g = gate.at(r, per_row ? 0 : c);
    y.at(r, c) = __fmul_rn(x.at(r, c), sigmoid_value(g));
  });
}

// y += x * sigmoid(gate) (mul_sigmoid then add, in one pass: the same bits), then residual += y
// where residual.p is set.
__global__ void add_mul_sigmoid_kernel(Mat y, Mat x, Mat gate, bool per_row, Mat residual,
                                       int64_t rows) {
  await_previous_kernel();
  for_elements(rows, x.cols, [&](int64_t r, int64_t c) {
    const float g = gate.at(r, per_row ? 0 : c);
    const float sum = __fadd_rn(y.at(r, c), __fmul_rn(x.at(r, c), sigmoid_value(g)));
    y.at(r, c) = sum;
    if (residual.p) residual.at(r, c) = __fadd_rn(residual.at(r, c), sum);
  });
}

__global__ void swiglu_kernel(Mat gate, Mat up, Mat y, int64_t rows) {
  await_previous_kernel();
  for_elements(rows, gate.cols,
               [&](int64_t r, int64_t c) { y.at(r, c) = swiglu_value(gate.at(r, c), up.at(r, c)); });
}

__global__ void scaled_silu_kernel(Mat x, float s, Mat y, int64_t rows) {
  await_previous_kernel();
  for_elements(rows, x.cols,
               [&](int64_t r, int64_t c) { y.at(r, c) = swiglu_value(__fmul_rn(x.at(r, c), s), 1.0f); });
}

// y = (x_0 sigmoid(gate_0) + ... + x_{S-1} sigmoid(gate_{S-1})) * inv, streams n = y.cols wide,
// added in stream order.
__global__ void mean_mul_sigmoid_streams_kernel(Mat x, Mat gate, int64_t streams, float inv, Mat y,
                                                int64_t rows) {
  await_previous_kernel();
  for_elements(rows, y.cols, [&](int64_t r, int64_t c) {
    float sum = __fmul_rn(x.at(r, c), sigmoid_value(gate.at(r, c)));
    for (int64_t s = 1; s < streams; ++s) {
      const int64_t cs = s * y.cols + c;
      sum = __fadd_rn(sum, __fmul_rn(x.at(r, cs), sigmoid_value(gate.at(r, cs))));
    }
    y.at(r, c) = __fmul_rn(sum, inv);
  });
}

// x[:, s n + c] += (out[:, c] * sigmoid(logits[:, s] * logit_scale)) * 2.
__global__ void inject_streams_kernel(Mat x, Mat out, Mat logits, float logit_scale, int64_t rows) {
  await_previous_kernel();
  for_elements(rows, x.cols, [&](int64_t r, int64_t c) {
    const int64_t n = out.cols, s = c / n;
    const float gate = sigmoid_value(__fmul_rn(logits.at(r, s), logit_scale));
    x.at(r, c) = __fadd_rn(x.at(r, c), __fmul_rn(__fmul_rn(out.at(r, c - s * n), gate), 2.0f));
  });
}

// Column c of x's row belongs to group c / group_width, part by the offset inside the group.
__global__ void split_groups_kernel(Mat x, int64_t rows, int64_t group_width, SplitParts parts) {
  await_previous_kernel();
  for_elements(rows, x.cols, [&](int64_t r, int64_t c) {
    const int64_t g = c / group_width;
    int64_t off = c % group_width;
    int i = 0;
    while (off >= parts.width[i]) off -= parts.width[i++];
    parts.out[i][r * parts.out_stride[i] + g * parts.width[i] + off] = x.at(r, c);
  });
}

int grid(const DeviceContext& ctx, const Tensor& t) {
  return grid_for(t.rows * t.cols, kThreads, ctx.limits.max_blocks);
}

bool empty(const Tensor& t) { return t.rows == 0 || t.cols == 0; }

}  // namespace

void launch_fill(const DeviceContext& ctx, Tensor t, float value) {
  if (empty(t)) return;
  launch_kernel(fill_kernel, grid(ctx, t), kThreads, 0, ctx.stream, mat(t), t.rows, value);
  STRATA_CUDA_CHECK_LAUNCH("fill_kernel");
}

void launch_copy(const DeviceContext& ctx, const Tensor& src, Tensor dst) {
  if (empty(src)) return;
  launch_kernel(copy_kernel, grid(ctx, src), kThreads, 0, ctx.stream, mat(src), mat(dst), src.rows);
  STRATA_CUDA_CHECK_LAUNCH("copy_kernel");
}

void launch_set_rows(const DeviceContext& ctx, const Tensor& src, const int32_t* rows, Tensor dst) {
  if (empty(src)) return;
  launch_kernel(set_rows_kernel, grid(ctx, src), kThreads, 0, ctx.stream, mat(src), rows, mat(dst),
                src.rows, dst.rows);
  STRATA_CUDA_CHECK_LAUNCH("set_rows_kernel");
}

void launch_add(const DeviceContext& ctx, const Tensor& a, const Tensor& b, Tensor y) {
  if (empty(a)) return;
  launch_kernel(add_kernel, grid(ctx, a), kThreads, 0, ctx.stream, mat(a), mat(b), mat(y), a.rows);
  STRATA_CUDA_CHECK_LAUNCH("add_kernel");
}

void launch_scale(const DeviceContext& ctx, const Tensor& x, float s, Tensor y) {
  if (empty(x)) return;
  launch_kernel(scale_kernel, grid(ctx, x), kThreads, 0, ctx.stream, mat(x), s, mat(y), x.rows);
  STRATA_CUDA_CHECK_LAUNCH("scale_kernel");
}

void launch_mul_sigmoid(const DeviceContext& ctx, const Tensor& x, const Tensor& gate, Tensor y) {
  if (empty(x)) return;
  const bool per_row = gate.cols == 1 && x.cols != 1;
  launch_kernel(mul_sigmoid_kernel, grid(ctx, x), kThreads, 0, ctx.stream, mat(x), mat(gate),
                per_row, mat(y), x.rows);
  STRATA_CUDA_CHECK_LAUNCH("mul_sigmoid_kernel");
}

void launch_add_mul_sigmoid(const DeviceContext& ctx, Tensor y, const Tensor& x, const Tensor& gate,
                            const Tensor* residual) {
  if (empty(x)) return;
  launch_kernel(add_mul_sigmoid_kernel, grid(ctx, x), kThreads, 0, ctx.stream, mat(y), mat(x),
                mat(gate), gate.cols == 1 && x.cols != 1, residual ? mat(*residual) : Mat{},
                x.rows);
  STRATA_CUDA_CHECK_LAUNCH("add_mul_sigmoid_kernel");
}

void launch_swiglu(const DeviceContext& ctx, const Tensor& gate, const Tensor& up, Tensor y) {
  if (empty(gate)) return;
  launch_kernel(swiglu_kernel, grid(ctx, gate), kThreads, 0, ctx.stream, mat(gate), mat(up), mat(y),
                gate.rows);
  STRATA_CUDA_CHECK_LAUNCH("swiglu_kernel");
}

void launch_scaled_silu(const DeviceContext& ctx, const Tensor& x, float s, Tensor y) {
  if (empty(x)) return;
  launch_kernel(scaled_silu_kernel, grid(ctx, x), kThreads, 0, ctx.stream, mat(x), s, mat(y), x.rows);
  STRATA_CUDA_CHECK_LAUNCH("scaled_silu_kernel");
}

void launch_mean_mul_sigmoid_streams(const DeviceContext& ctx, const Tensor& x, const Tensor& gate,
                                     int64_t streams, Tensor y) {
  if (empty(y)) return;
  launch_kernel(mean_mul_sigmoid_streams_kernel, grid(ctx, y), kThreads, 0, ctx.stream, mat(x),
                mat(gate), streams, 1.0f / float(streams), mat(y), y.rows);
  STRATA_CUDA_CHECK_LAUNCH("mean_mul_sigmoid_streams_kernel");
}

void launch_inject_streams(const DeviceContext& ctx, Tensor x, const Tensor& out,
                           const Tensor& logits, float logit_scale) {
  if (empty(x)) return;
  launch_kernel(inject_streams_kernel, grid(ctx, x), kThreads, 0, ctx.stream, mat(x), mat(out),
                mat(logits), logit_scale, x.rows);
  STRATA_CUDA_CHECK_LAUNCH("inject_streams_kernel");
}

void launch_split_groups(const DeviceContext& ctx, const Tensor& x, int64_t n_groups,
                         const SplitParts& parts) {
  if (empty(x)) return;
  launch_kernel(split_groups_kernel, grid(ctx, x), kThreads, 0, ctx.stream, mat(x), x.rows,
                x.cols / n_groups, parts);
  STRATA_CUDA_CHECK_LAUNCH("split_groups_kernel");
}

}  // namespace strata::cuda::detail
