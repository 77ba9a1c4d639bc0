// Kernel launchers of the CUDA backend (one op per .cu file), called by device.cpp. Internal:
// these name CUDA types and are not part of the engine-facing cuda_backend.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

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
  int sm_count = 0;
};

void launch_dequantize(quant::Type t, const void* blocks, float* out, int64_t n,
                       const DecodeTables& tables, const LaunchLimits& limits, cudaStream_t stream);

void launch_matvec(quant::Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols,
                   const float* x, float* y, const DecodeTables& tables, const LaunchLimits& limits,
                   cudaStream_t stream);

// Activation quantizer (act_q.cu): `tokens` rows of `cols` floats (x + t * x_stride; 0: cols)
// into the activation layout f, row t at out + t * out_stride, bytes equal to
// quant::quantize_act_ref.
void launch_quantize_act(quant::ActFormat f, const float* x, int64_t cols, int tokens, void* out,
                         size_t out_stride, const LaunchLimits& limits, cudaStream_t stream,
                         int64_t x_stride = 0);

// Integer mat-vec (matvec_q*.cu) against activations already in the format's layout.
constexpr int kMaxDevices = 64;
// Activations up to this wide are quantized by the MoE mat-vec's CTAs themselves (MoeQLaunch::x):
// no quantize kernel. (For the plain mat-vec of many row groups that measured slower on the H200:
// the quantization sits on each CTA's critical path, 10.7 us against 6.9 + 2.6 for the two
// kernels; it quantizes its own x only for rows of one step, MatvecQLaunch::x.)
constexpr int64_t kMaxFusedActCols = 8192;

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
  // n_matrices > 1 (one activation): these matrices in one launch, w / row_stride / rows / y
  // being the first's.
  const MatvecQMatrix* matrices;
  int n_matrices;
  // A format's from_x launch (matvec_q.cu): the fp32 activations (x_stride floats apart), which
  // the kernel's CTAs quantize themselves; act is then unused.
  const float* x;
  int64_t x_stride;
};
void launch_matvec_q(quant::Type t, const MatvecQLaunch& l);

struct ExpertEntry;  // ops.h

// Pairs of a long list grouped by expert (moe_group_kernel; device memory): n_active experts
// with pairs, each with count[slot] list positions from items + first[slot], run in chunks of
// kMoeChunkPairs: chunk_first[slot] is the slot's first chunk, n_chunks all of them.
struct MoeGroups {
  const int32_t* n_active;
  const int32_t* active;
  const int32_t* first;
  const int32_t* count;
  const int32_t* items;
  const int32_t* chunk_first;
  const int32_t* n_chunks;
};
constexpr int kMoeChunkPairs = 8;

// The integer mat-vec over routed pairs. Position i < n_pairs is pair p = listed[i] (listed null:
// p = i) of expert ids[p]; for matrix m = matrices[z] (z < n_matrices) of that expert,
// y[z] + Y * y_stride = W_m act(i), act(i) = act[a] + (A / act_div) * act_stride[a] in the
// matrix's activation layout a (its ExpertEntry::act), where A is p if act_at_pair else i, and Y
// is p if y_at_pair else i. Only matrices of type `type` are computed; with write_zeros, a pair
// whose id is outside the table or whose expert has no weights gets zero rows (max_rows of them;
// grouped, a pair whose id is outside the table is in no group and gets nothing).
struct MoeQLaunch {
  const ExpertEntry* table;
  int64_t n_experts;
  const int32_t* ids;
  const int32_t* listed;
  int64_t n_pairs;
  int64_t first;  // the launch covers positions first .. first + gridDim.y - 1 (launch_moe_q's)
  quant::Type type;
  int block_elems;  // of `type`
  int matrices[2];
  int n_matrices;
  const uint8_t* act[3];
  size_t act_stride[3];
  const float* x;    // non-null: the fp32 rows themselves (x_stride floats apart, at most
  int64_t x_stride;  // kMaxFusedActCols columns), quantized in the kernel for Q8_0 / Q8_K layouts
  int64_t act_div;
  bool act_at_pair, y_at_pair;
  float* y[2];
  int64_t y_stride;
  int64_t max_rows;
  int64_t max_cols;  // of every expert matrix the launch reads (sizes the kernels' stages)
  bool write_zeros;
  // With groups.items set: the grouped kernel over at most max_chunks chunks.
  MoeGroups groups;
  int64_t max_chunks;
  DecodeTables tables;
  int device, sm_count;
  cudaStream_t stream;
};
void launch_moe_q(const MoeQLaunch& l);

// What Device::matvec_q hands to run_matvec_q: its device, stream, tables and activation scratch
// (grown on demand, after the stream has drained).
struct QuantizedAct {
  const float* x = nullptr;
  int64_t cols = 0;
  int tokens = 0;
  int format = -1;  // quant::ActFormat
  bool operator==(const QuantizedAct&) const = default;
};
struct MatvecQContext {
  int device, sm_count;
  cudaStream_t stream;
  DecodeTables tables;
  LaunchLimits limits;
  DeviceBuffer& scratch;
  QuantizedAct& in_scratch;  // what scratch holds
};
void run_matvec_q(quant::Type t, std::span<const MatvecQMatrix> matrices, int64_t cols,
                  const float* x, int tokens, const MatvecQOptions& options,
                  const MatvecQContext& ctx);

}  // namespace strata::cuda::detail
