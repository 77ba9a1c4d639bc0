#include <cstdlib>
#include <cstring>

#include "backend/cuda/dependent_launch.cuh"

namespace strata::cuda::detail {

bool dependent_launch_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("STRATA_CUDA_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

}  // namespace strata::cuda::detail
