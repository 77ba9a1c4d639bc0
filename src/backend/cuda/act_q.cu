// The activation quantizer: fp32 rows into ggml's block_q8_0 / block_q8_K, byte for byte what
// quant::quantize_act_ref writes (quant/act.cpp), so the integer mat-vecs see the CPU's
// activation. The rule is quant/act_rule.h's (ggml's x86 rule): Q8_0 stores fp16(amax / 127) and
// codes round-to-even(x * (127 / amax)); Q8_K takes the first element of largest |x| with its
// sign, iscale = -127 / max, codes round-to-even(iscale * x), d = 1 / iscale; a block with amax
// zero, inf, nan or too small for 127 / amax is d = 0 with zero codes. Every step is an IEEE
// operation with the CPU's rounding (__fdiv_rn, __fmul_rn, __float2int_rn), and Q8_0's fp16 d is
// util/half.h's conversion.
#include "backend/cuda/act_rule.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/launch.h"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xffffffffu;

// util/half.h's fp32_to_fp16, bit for bit (round to nearest even, quiet NaN payloads kept).
__device__ uint32_t fp32_to_fp16_bits(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u, abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;
  if (abs < 0x38800000u) {
    const float scaled = __fmul_rn(__uint_as_float(abs), 0x1p24f);
    uint32_t q = __float2uint_rz(scaled);
    const float rem = __fsub_rn(scaled, __uint2float_rn(q));
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return sign | q;
  }
  return sign | ((abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u) >> 13);
}

// Codes of n elements: round-to-even(x * mul), or zeros for a zero block.
template <int n>
__device__ void codes(const float* e, bool zero, float mul, int* q) {
#pragma unroll
  for (int k = 0; k < n; ++k) q[k] = zero ? 0 : __float2int_rn(__fmul_rn(e[k], mul));
}

__device__ __forceinline__ uint32_t pack4(const int* q) {
  return (uint32_t(q[0]) & 0xffu) | (uint32_t(q[1]) & 0xffu) << 8 | (uint32_t(q[2]) & 0xffu) << 16 |
         (uint32_t(q[3]) & 0xffu) << 24;
}

// block_q8_K (f32 d, 256 codes, 16 int16 sums of 16 codes): one warp per block, 8 elements a lane.
__global__ void __launch_bounds__(kThreads)
    quantize_q8_k(const float* __restrict__ x, int64_t x_stride, int64_t cols, int tokens,
                  uint8_t* __restrict__ out, size_t stride) {
  const int lane = threadIdx.x % 32;
  const int64_t nb = cols / 256, total = nb * tokens;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  for (int64_t i = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; i < total;
       i += warps) {
    const int64_t tok = i / nb, b = i % nb;
    const float4* src = reinterpret_cast<const float4*>(x + tok * x_stride + b * 256) + 2 * lane;
    const float4 u = __ldg(src), v = __ldg(src + 1);
    const float e[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
    const uint32_t amax = act_warp_amax(e);
    const float first_max = act_warp_first_max(e, amax);
    const bool zero = act_block_is_zero(amax);
    const float mul = zero ? 0.0f : __fdiv_rn(-127.0f, first_max);
    const float d = zero ? 0.0f : __fdiv_rn(1.0f, mul);
    int q[8];
    codes<8>(e, zero, mul, q);
    uint8_t* o = out + size_t(tok) * stride + size_t(b) * 292;
    if (lane == 0) *reinterpret_cast<float*>(o) = d;
    *reinterpret_cast<uint32_t*>(o + 4 + 8 * lane) = pack4(q);
    *reinterpret_cast<uint32_t*>(o + 8 + 8 * lane) = pack4(q + 4);
    int sum = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += q[k];
    sum += __shfl_xor_sync(kFull, sum, 1);  // lanes 2g, 2g + 1 hold the 16 codes of sum g
    if (lane % 2 == 0) *reinterpret_cast<int16_t*>(o + 260 + lane) = int16_t(sum);
  }
}

// block_q8_0 (fp16 d, 32 codes): 8 lanes per block, 4 elements a lane, 4 blocks a warp.
__global__ void __launch_bounds__(kThreads)
    quantize_q8_0(const float* __restrict__ x, int64_t x_stride, int64_t cols, int tokens,
                  uint8_t* __restrict__ out, size_t stride) {
  const int lane = threadIdx.x % 32, sub = lane % 8;
  const int64_t nb = cols / 32, total = nb * tokens;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  for (int64_t first = (int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32) * 4;
       first < total; first += warps * 4) {
    const int64_t i = first + lane / 8;
    const bool active = i < total;  // lanes past the end still take part in the shuffles
    const int64_t tok = (active ? i : total - 1) / nb, b = (active ? i : total - 1) % nb;
    const float4 u = __ldg(reinterpret_cast<const float4*>(x + tok * x_stride + b * 32) + sub);
    const float e[4] = {u.x, u.y, u.z, u.w};
    uint32_t amax = max(max(act_abs_bits(e[0]), act_abs_bits(e[1])),
                        max(act_abs_bits(e[2]), act_abs_bits(e[3])));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = max(amax, __shfl_xor_sync(kFull, amax, o));
    const bool zero = act_block_is_zero(amax);
    const float d = zero ? 0.0f : __fdiv_rn(__uint_as_float(amax), 127.0f);
    int q[4];
    codes<4>(e, zero, zero ? 0.0f : __fdiv_rn(127.0f, __uint_as_float(amax)), q);
    if (!active) continue;
    uint8_t* o = out + size_t(tok) * stride + size_t(b) * 34;
    if (sub == 0) *reinterpret_cast<uint16_t*>(o) = uint16_t(fp32_to_fp16_bits(d));
    const uint32_t packed = pack4(q);
    *reinterpret_cast<uint16_t*>(o + 2 + 4 * sub) = uint16_t(packed);
    *reinterpret_cast<uint16_t*>(o + 4 + 4 * sub) = uint16_t(packed >> 16);
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
      quantize_q8_k<<<int(grid < limits.max_blocks ? grid : limits.max_blocks), kThreads, 0,
                      stream>>>(x, x_stride, cols, tokens, o, out_stride);
      break;
    }
    case quant::ActFormat::Q8_0: {
      const int64_t tasks = (cols / 32 * tokens + 3) / 4;
      const int64_t grid = (tasks + warps_per_block - 1) / warps_per_block;
      quantize_q8_0<<<int(grid < limits.max_blocks ? grid : limits.max_blocks), kThreads, 0,
                      stream>>>(x, x_stride, cols, tokens, o, out_stride);
      break;
    }
  }
  check(cudaGetLastError(), "quantize_act launch");
}

}  // namespace strata::cuda::detail
