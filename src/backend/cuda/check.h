// CUDA error checking for the backend's own files: a failed call becomes a strata::Error that
// names the call (and, through the macros, the file and line), so engine code never sees a CUDA
// error code.
#pragma once

#include <cuda_runtime.h>

#include "util/error.h"

namespace strata::cuda::detail {

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorString(err));
}

inline void check_at(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    fail("CUDA error at ", file, ":", line, " in ", call, ": ", cudaGetErrorString(err));
  }
}

}  // namespace strata::cuda::detail

// Throws strata::Error("CUDA error at file:line in <call>: <message>") when `call` fails.
#define STRATA_CUDA_CHECK(call) ::strata::cuda::detail::check_at((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration (or an earlier asynchronous fault) names the kernel.
#define STRATA_CUDA_CHECK_LAUNCH(kernel) \
  ::strata::cuda::detail::check_at(cudaGetLastError(), "launch of " kernel, __FILE__, __LINE__)
