#include "backend/cuda/check.h"
#include "backend/cuda/op_profile.h"

namespace strata::cuda::detail {

namespace {

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void hold_kernel(const volatile uint32_t* gate, uint32_t segment, uint32_t* timed_out,
                            uint64_t timeout_ns) {
  const uint64_t start = global_ns();
  while (int32_t(gate[0] - segment) < 0) {
    if (global_ns() - start > timeout_ns) {
      *timed_out = 1;
      return;
    }
    __nanosleep(1000);
  }
}

}  // namespace

void launch_hold(const uint32_t* gate, uint32_t segment, uint32_t* timed_out, uint64_t timeout_ns,
                 cudaStream_t stream) {
  hold_kernel<<<1, 1, 0, stream>>>(gate, segment, timed_out, timeout_ns);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::cuda::detail
