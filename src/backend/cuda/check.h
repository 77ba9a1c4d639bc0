// CUDA error checking for the backend's own files: a failed call becomes a strata::Error that
// names the call (and, through the macros, the file and line), so engine code never sees a CUDA
// error code.
#pragma once

#include <cuda_runtime.h>

#include <string>

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

// What launch_kernel refused to launch on this thread (a grid or block outside the device's
// limits), for the launch check that follows it to report with the kernel's name; empty if none.
inline thread_local std::string refused_launch;

// After a kernel launch: a refused configuration, a bad one the driver rejected, or an earlier
// asynchronous fault becomes a strata::Error naming `what` (file and line when given).
inline void check_launch(const char* what, const char* file = nullptr, int line = 0) {
  if (!refused_launch.empty()) {
    const std::string why = std::move(refused_launch);
    refused_launch.clear();
    if (file) fail("CUDA error at ", file, ":", line, " in launch of ", what, ": ", why);
    fail("CUDA error in ", what, ": ", why);
  }
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return;
  if (file) fail("CUDA error at ", file, ":", line, " in launch of ", what, ": ", cudaGetErrorString(err));
  fail("CUDA error in ", what, ": ", cudaGetErrorString(err));
}

}  // namespace strata::cuda::detail

// Throws strata::Error("CUDA error at file:line in <call>: <message>") when `call` fails.
#define STRATA_CUDA_CHECK(call) ::strata::cuda::detail::check_at((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration (or an earlier asynchronous fault) names the kernel.
#define STRATA_CUDA_CHECK_LAUNCH(kernel) \
  ::strata::cuda::detail::check_launch(kernel, __FILE__, __LINE__)
