// The activation quantizer: fp32 rows into ggml's block_q8_0 / block_q8_K, byte for byte what
// quant::quantize_act_ref writes (quant/act.cpp), so the integer mat-vecs see the CPU's
// activation. The rule is quant/act_rule.h's (ggml's x86 rule): Q8_0 stores fp16(amax / 127) and
// codes round-to-even(x * (127 / amax)); Q8_K takes the first element of largest |x| with its
// sign, iscale = -127 / max, codes round-to-even(iscale * x), d = 1 / iscale; a block with amax
// zero, inf, nan or too small for 127 / amax is d = 0 with zero codes. Every step is an IEEE
// operation with the CPU's rounding (__fdiv_rn, __fmul_rn, __float2int_rn), and Q8_0's fp16 d is
// util/half.h's conversion.
#include "backend/cuda/act_q.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/launch.h"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 256;

// block_q8_K: one warp per block.
__global__ void __launch_bounds__(kThreads)
    quantize_q8_k(const float* __restrict__ x, int64_t x_stride, int64_t cols, int tokens,
                  uint8_t* __restrict__ out, size_t stride) {
  await_previous_kernel();
  const int lane = threadIdx.x % 32;
  const int64_t nb = cols / 256, total = nb * tokens;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  for (int64_t i = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; i < total;
       i += warps) {
    const int64_t tok = i / nb, b = i % nb;
    quantize_q8_k_block(x + tok * x_stride + b * 256, out + size_t(tok) * stride + size_t(b) * 292,
                        lane);
  }
}

// block_q8_0: 8 lanes per block, 4 blocks a warp.
__global__ void __launch_bounds__(kThreads)
    quantize_q8_0(const float* __restrict__ x, int64_t x_stride, int64_t cols, int tokens,
                  uint8_t* __restrict__ out, size_t stride) {
  await_previous_kernel();
  const int lane = threadIdx.x % 32;
  const int64_t nb = cols / 32, total = nb * tokens;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  for (int64_t first = (int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32) * 4;
       first < total; first += warps * 4) {
    const int64_t i = first + lane / 8;
    const bool active = i < total;  // lanes past the end still take part in the shuffles
    const int64_t tok = (active ? i : total - 1) / nb, b = (active ? i : total - 1) % nb;
    quantize_q8_0_block(x + tok * x_stride + b * 32, out + size_t(tok) * stride + size_t(b) * 34,
                        active, lane % 8);
  }
}

}  // namespace

void launch_quantize_act(quant::ActFormat f, const float* x, int64_t cols, int tokens, void* out,
                         size_t out_stride, const LaunchLimits& limits, cudaStream_t stream,
                         int64_t x_stride) {
  if (x_stride == 0) x_stride = cols;
  const int64_t block = quant::act_block_elems(f);
  if (cols <= 0 || cols % block != 0)
    fail("CUDA quantize_act: ", cols, " columns is not a positive multiple of the block (", block,
         ")");
  if (tokens < 1) fail("CUDA quantize_act: ", tokens, " activations");
  if (out_stride < quant::act_bytes(f, cols) || out_stride % 16 != 0)
    fail("CUDA quantize_act: output stride ", out_stride, " is not a multiple of 16 holding ",
         quant::act_bytes(f, cols), " bytes");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0 ||
      x_stride < cols || x_stride % 4 != 0)
    fail("CUDA quantize_act: input and output need 16-byte alignment, rows ", x_stride,
         " floats apart (a multiple of 4, at least ", cols, ")");
  auto* o = static_cast<uint8_t*>(out);
  const int64_t warps_per_block = kThreads / 32;
  switch (f) {
    case quant::ActFormat::F32:
      check(cudaMemcpy2DAsync(out, out_stride, x, size_t(x_stride) * sizeof(float),
                              size_t(cols) * sizeof(float), size_t(tokens),
                              cudaMemcpyDeviceToDevice, stream),
            "quantize_act copy");
      return;
    case quant::ActFormat::Q8_K: {
      const int64_t tasks = cols / 256 * tokens;
      const int64_t grid = (tasks + warps_per_block - 1) / warps_per_block;
      launch_kernel(quantize_q8_k, int(grid < limits.max_blocks ? grid : limits.max_blocks),
                    kThreads, 0, stream, x, x_stride, cols, tokens, o, out_stride);
      break;
    }
    case quant::ActFormat::Q8_0: {
      const int64_t tasks = (cols / 32 * tokens + 3) / 4;
      const int64_t grid = (tasks + warps_per_block - 1) / warps_per_block;
      launch_kernel(quantize_q8_0, int(grid < limits.max_blocks ? grid : limits.max_blocks),
                    kThreads, 0, stream, x, x_stride, cols, tokens, o, out_stride);
      break;
    }
  }
  check_launch("quantize_act launch");
}

}  // namespace strata::cuda::detail
