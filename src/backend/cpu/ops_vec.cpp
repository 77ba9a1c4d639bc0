#include "backend/cpu/ops_vec.h"

#include "backend/cpu/ops_vec_body.h"
#include "util/cpu.h"

namespace strata::cpu {

const VecKernels kVecBaseline = make_vec_kernels("baseline");

const VecKernels& vec() {
  static const VecKernels* const chosen =
      (cpu_features().avx2 && vec_avx2()) ? vec_avx2() : &kVecBaseline;
  return *chosen;
}

}  // namespace strata::cpu
