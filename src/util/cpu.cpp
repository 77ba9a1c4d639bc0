#include "util/cpu.h"

#include <cstdlib>
#include <cstring>

namespace strata {

namespace {
CpuFeatures detect() {
  CpuFeatures f;
  const char* forced = std::getenv("STRATA_ISA");
  if (forced && std::strcmp(forced, "scalar") == 0) return f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
  return f;
}
}  // namespace

std::string CpuFeatures::describe() const {
  if (avx512) return "avx2+fma+f16c (avx512 present)";
  if (avx2) return "avx2+fma+f16c";
  return "scalar";
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace strata
