// Dequantize: blocks of any weight format -> fp32, one thread per group of 8 elements.
#include "backend/cuda/check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/decode.cuh"
#include "backend/cuda/launch.h"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 256;

template <typename D>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t* __restrict__ blocks, float* __restrict__ out, int64_t groups,
                      DecodeTables tables) {
  await_previous_kernel();
  constexpr int kGroups = D::kElems / 8;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < groups; i += stride) {
    float v[8];
    D::decode(blocks + (i / kGroups) * D::kBytes, int(i % kGroups), tables, v);
    float4* o = reinterpret_cast<float4*>(out + 8 * i);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

}  // namespace

void launch_dequantize(quant::Type t, const void* blocks, float* out, int64_t n,
                       const DecodeTables& tables, const LaunchLimits& limits,
                       cudaStream_t stream) {
  const bool known = visit_decoder(t, [&](auto decoder) {
    using D = decltype(decoder);
    if (n < 0 || n % D::kElems != 0 || n % 8 != 0)
      fail("CUDA dequantize ", quant::type_name(t), ": ", n,
           " elements is not a multiple of the block (", int(D::kElems), ") and of 8");
    if (!aligned(blocks, D::kAlign) || !aligned(out, 16))
      fail("CUDA dequantize ", quant::type_name(t), ": misaligned input (needs ", int(D::kAlign),
           " bytes) or output (needs 16)");
    const int64_t groups = n / 8;
    if (groups == 0) return;
    const int64_t blocks_needed = (groups + kThreads - 1) / kThreads;
    const int grid = int(blocks_needed < limits.max_blocks ? blocks_needed : limits.max_blocks);
    launch_kernel(dequantize_kernel<D>, grid, kThreads, 0, stream,
                  static_cast<const uint8_t*>(blocks), out, groups, tables);
    check_launch("dequantize launch");
  });
  if (!known) fail("CUDA dequantize: no decoder for tensor type ", quant::type_name(t));
}

}  // namespace strata::cuda::detail
