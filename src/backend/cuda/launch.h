// Kernel launchers of the CUDA backend (one op per .cu file), called by device.cpp. Internal:
// these name CUDA types and are not part of the engine-facing cuda_backend.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "quant/kernels.h"
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

// Activation quantizer (act_q.cu): `tokens` rows of `cols` floats (x + t * cols) into the
// activation layout f, row t at out + t * out_stride, bytes equal to quant::quantize_act_ref.
void launch_quantize_act(quant::ActFormat f, const float* x, int64_t cols, int tokens, void* out,
                         size_t out_stride, const LaunchLimits& limits, cudaStream_t stream);

// Integer mat-vec (matvec_q*.cu) against activations already in the format's layout.
constexpr int kMaxDevices = 64;
struct MatvecQLaunch {
  const void* w;
  size_t row_stride;
  int64_t rows;
  int64_t blocks;  // weight blocks per row
  const void* act;  // `tokens` activations, act_stride bytes apart
  size_t act_stride;
  int tokens;  // 1..8
  float* y;    // y[t * rows + r]
  DecodeTables tables;
  int rows_per_warp;  // 8 (one activation), else 4
  int grid_copies;    // IQ2_XS codebook copies in shared memory (8, 32), else 1
  int device, sm_count;
  cudaStream_t stream;
};
void launch_matvec_q(quant::Type t, const MatvecQLaunch& l);

// What Device::matvec_q hands to run_matvec_q: its device, stream, tables and activation scratch
// (grown on demand, after the stream has drained).
struct MatvecQContext {
  int device, sm_count;
  cudaStream_t stream;
  DecodeTables tables;
  LaunchLimits limits;
  DeviceBuffer& scratch;
};
void run_matvec_q(quant::Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols,
                  const float* x, float* y, int tokens, const MatvecQOptions& options,
                  const MatvecQContext& ctx);

}  // namespace strata::cuda::detail
