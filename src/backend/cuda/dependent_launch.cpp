#include <cstdlib>
#include <cstring>

#include "backend/cuda/dependent_launch.cuh"

#include "util/error.h"

namespace strata::cuda::detail {

bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

bool dependent_launch_enabled() {
  static const bool enabled = env_switch_on("STRATA_CUDA_PDL");
  return enabled;
}

}  // namespace strata::cuda::detail

namespace strata::cuda {

std::string launch_out_of_range(uint64_t gx, uint64_t gy, uint64_t gz, uint64_t bx, uint64_t by,
                                uint64_t bz) {
  constexpr uint64_t kMaxGridX = 2147483647, kMaxGridYZ = 65535, kMaxBlockThreads = 1024,
                     kMaxBlockZ = 64;
  const uint64_t threads = bx * by * bz;
  if (gx >= 1 && gx <= kMaxGridX && gy >= 1 && gy <= kMaxGridYZ && gz >= 1 && gz <= kMaxGridYZ &&
      bx >= 1 && by >= 1 && bz >= 1 && bz <= kMaxBlockZ && threads <= kMaxBlockThreads)
    return {};
  return cat("grid [", gx, " x ", gy, " x ", gz, "] of blocks [", bx, " x ", by, " x ", bz,
             "] is outside the device's launch limits (grid x 1..", kMaxGridX, ", y and z 1..",
             kMaxGridYZ, "; 1..", kMaxBlockThreads, " threads a block, z up to ", kMaxBlockZ,
             "): not launched");
}

}  // namespace strata::cuda
