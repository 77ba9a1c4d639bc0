#include "util/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdlib>
#include <string_view>

#include "util/error.h"

namespace strata {

namespace {

CpuFeatures detect_hardware() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C has no __builtin_cpu_supports name in every compiler (clang 14 lacks it): read its
  // CPUID bit (leaf 1, ECX bit 29) directly.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
#endif
  return f;
}

CpuFeatures at_level(Isa isa) {
  CpuFeatures f;
  f.avx2 = isa >= Isa::Avx2;
  f.avx512 = isa >= Isa::Avx512;
  return f;
}

bool forced() {
  const char* v = std::getenv("STRATA_ISA");
  return v && *v;
}

CpuFeatures detect() {
  const CpuFeatures& hw = hardware_features();
  if (!forced()) return hw;
  const std::string_view want = std::getenv("STRATA_ISA");
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (want != isa_name(isa)) continue;
    if (isa > hw.level())
      fail("STRATA_ISA=", want, ": this CPU offers ", isa_name(hw.level()), " at most");
    return at_level(isa);
  }
  fail("STRATA_ISA='", want, "' is not scalar, avx2 or avx512");
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    case Isa::Scalar:
      break;
  }
  return "scalar";
}

std::string CpuFeatures::describe() const {
  std::string s = isa_name(level());
  if (forced())
    s += cat(" (forced by STRATA_ISA; the CPU has ", isa_name(hardware_features().level()), ")");
  return s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

const CpuFeatures& hardware_features() {
  static const CpuFeatures features = detect_hardware();
  return features;
}

}  // namespace strata
