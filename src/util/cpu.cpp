#include "util/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

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
  // F16C has no __builtin_cpu_supports name in every compiler (clang 14 lacks it): read its
  // CPUID bit (leaf 1, ECX bit 29) directly.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
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
