// Shared helpers of the test_quant_*.cpp tests.
#pragma once

#include <cstdint>
#include <vector>

#include "quant/formats/blocks.h"
#include "quant/kernels.h"
#include "quant/types.h"
#include "util/cpu.h"

namespace strata::quant::testing {

// The hardware's answer, whatever STRATA_ISA says.
inline bool cpu_has_avx2() { return hardware_features().avx2; }

constexpr Type kMyTypes[] = {Type::F32,  Type::F16,  Type::BF16, Type::Q8_0, Type::Q4_0,
                             Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K};

inline int64_t block_elems(Type t) { return type_info(t).block_elems; }

// n elements of random blocks of type t.
inline std::vector<uint8_t> random_weights(Type t, int64_t n, uint64_t seed) {
  std::vector<uint8_t> w(row_bytes(t, n));
  Rng rng(seed);
  kernels(t).random_blocks(rng, w.data(), n / block_elems(t));
  return w;
}

// Roughly unit-scale activations with some larger outliers.
inline std::vector<float> random_floats(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = rng.normal() * (rng.below(16) == 0 ? 4.0f : 1.0f);
  return x;
}

// The activation values a dot product actually sees.
inline std::vector<float> dequantize_act(ActFormat f, const void* a, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  if (f == ActFormat::F32) {
    const auto* x = static_cast<const float*>(a);
    out.assign(x, x + n);
  } else if (f == ActFormat::Q8_0) {
    const auto* y = static_cast<const BlockQ8_0*>(a);
    for (int64_t i = 0; i < n; ++i) out[i] = y[i / kQK].qs[i % kQK] * fp16_to_fp32(y[i / kQK].d);
  } else {
    const auto* y = static_cast<const BlockQ8_K*>(a);
    for (int64_t i = 0; i < n; ++i) out[i] = y[i / kQK_K].qs[i % kQK_K] * y[i / kQK_K].d;
  }
  return out;
}

}  // namespace strata::quant::testing
