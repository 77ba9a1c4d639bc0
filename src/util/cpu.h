// Which SIMD kernels this process may use, decided once at run time from CPUID.
// STRATA_ISA=scalar in the environment forces the scalar reference kernels everywhere.
#pragma once

#include <string>

namespace strata {

struct CpuFeatures {
  bool avx2 = false;  // AVX2 + FMA + F16C, the set every *_avx2.cpp kernel is compiled for
  bool avx512 = false;
  std::string describe() const;
};

const CpuFeatures& cpu_features();

}  // namespace strata
