// Kernel launchers of the CUDA backend (one op per .cu file), called by device.cpp. Internal:
// these name CUDA types and are not part of the engine-facing cuda_backend.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace strata::cuda::detail {

// Read-only tables the decoders index, resident in device memory (device.cpp uploads them from
// the quant module's own copies, so CPU and GPU decode with the same codebooks).
struct DecodeTables {
  const uint64_t* iq2xxs_grid;  // 256 entries, 8 magnitudes each
  const uint64_t* iq2xs_grid;   // 512 entries
  const uint32_t* iq3xxs_grid;  // 256 entries, 4 magnitudes each
  const int8_t* iq4nl_values;   // 16 codebook values of IQ4_XS
};

// Limits that keep a launch valid for any problem size: kernels loop over their work with a
// grid-stride, so the grid never needs to exceed max_blocks.
struct LaunchLimits {
  int max_blocks;
};

// What every launcher needs from its Device: the stream ops are queued on, the decoder tables and
// the launch limits.
struct DeviceContext {
  int index = 0;
  cudaStream_t stream = nullptr;
  DecodeTables tables{};
  LaunchLimits limits{};
};

void launch_dequantize(quant::Type t, const void* blocks, float* out, int64_t n,
                       const DecodeTables& tables, const LaunchLimits& limits, cudaStream_t stream);

void launch_matvec(quant::Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols,
                   const float* x, float* y, const DecodeTables& tables, const LaunchLimits& limits,
                   cudaStream_t stream);

}  // namespace strata::cuda::detail
