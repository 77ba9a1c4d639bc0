// Programmatic dependent launch (sm_90): a window is ~1700 small kernels a token, and between two
// of them the GPU otherwise drains one grid, then launches and ramps up the next. Every kernel of
// the backend is launched through launch_kernel (cudaLaunchKernelEx with programmatic stream
// serialization, also inside captured graphs), so the next kernel's CTAs are placed while the
// current one runs; each kernel's first statement, await_previous_kernel, holds them until the
// kernel before has completed and its writes are visible. STRATA_CUDA_PDL=0 launches plainly.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"

namespace strata::cuda::detail {

// The first statement of every kernel, run by every thread before it touches memory: waits for
// the previous kernel in the stream (complete, writes visible), then lets the next one launch.
// Waiting first keeps completion in stream order (no kernel finishes before the one it follows,
// so waiting on the previous kernel covers all earlier ones) and keeps at most one kernel placed
// ahead. Outside a dependent launch both instructions do nothing.
__device__ __forceinline__ void await_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// False when STRATA_CUDA_PDL=0 (read once): every launch then waits for the previous kernel.
bool dependent_launch_enabled();

// kernel<<<grid, block, smem, stream>>>(args...) as a dependent launch, its CTAs in clusters of
// cluster_x along x where that is more than 1 (sm_90: a cluster's CTAs run at the same time and
// can wait for each other, cooperative_groups::this_cluster().sync()), or nothing when the grid or
// block is outside the hardware's limits (launch_out_of_range, cuda_backend.h). Either way the
// launch check that follows (STRATA_CUDA_CHECK_LAUNCH or check_launch, as after <<<>>>) reports
// what went wrong.
template <typename... Params, typename... Args>
void launch_kernel_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, unsigned cluster_x, Args&&... args) {
  if (std::string why = launch_out_of_range(grid.x, grid.y, grid.z, block.x, block.y, block.z);
      !why.empty()) {
    refused_launch = std::move(why);
    return;
  }
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (dependent_launch_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n++].val.clusterDim = {cluster_x, 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  launch_kernel_clusters(kernel, grid, block, smem, stream, 1, std::forward<Args>(args)...);
}

}  // namespace strata::cuda::detail
