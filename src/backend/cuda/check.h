// CUDA error checking for the backend's own files: a failed call becomes a strata::Error that
// names the call, so engine code never sees a CUDA error code.
#pragma once

#include <cuda_runtime.h>

#include "util/error.h"

namespace strata::cuda::detail {

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorString(err));
}

}  // namespace strata::cuda::detail
