// Which SIMD kernels this process may use, decided once at run time from CPUID.
//
// Levels, each a superset of the one before:
//   scalar  the reference kernels only;
//   avx2    AVX2 + FMA + F16C: the *_avx2.cpp kernels;
//   avx512  AVX-512 F, BW, VL, DQ and VNNI on top (Ice Lake, Zen 4 and later): the *_avx512.cpp
//           kernels. A CPU with AVX-512 but without VNNI (Skylake-X) runs at avx2.
// STRATA_ISA=scalar|avx2|avx512 in the environment forces a level; asking for one the CPU lacks,
// or for an unknown one, is a strata::Error (a silent fallback would make a test or a benchmark
// "at avx512" lie). Every fast kernel is bitwise equal to its scalar reference, so the level
// changes speed, never results.
#pragma once

#include <string>

namespace strata {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

// "scalar", "avx2", "avx512": the names STRATA_ISA takes and benchmarks report.
const char* isa_name(Isa isa);

struct CpuFeatures {
  bool avx2 = false;
  bool avx512 = false;  // implies avx2
  Isa level() const { return avx512 ? Isa::Avx512 : avx2 ? Isa::Avx2 : Isa::Scalar; }
  std::string describe() const;  // "avx512 (forced by STRATA_ISA; the CPU has avx512)"
};

// What this process uses: the CPU's level, or STRATA_ISA's. Throws strata::Error naming
// STRATA_ISA for an unknown level or one the CPU lacks.
const CpuFeatures& cpu_features();

// What the CPU offers, whatever STRATA_ISA says (tests that compare every level use it).
const CpuFeatures& hardware_features();

}  // namespace strata
