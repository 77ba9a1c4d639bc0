#include "backend/cpu/matvec.h"

#include "quant/kernels.h"

namespace strata::cpu {

void matvec_parallel(ThreadPool& pool, quant::Type t, const void* w, size_t row_stride,
                     int64_t rows, int64_t cols, const float* x, float* y, void* act_scratch) {
  // Quantizing a 2560-wide activation takes about a microsecond of one core (bench_matvec's
  // quantize_act), about what handing it to the pool would cost, so the caller does it alone.
  quant::quantize_act(quant::kernels(t).act, x, act_scratch, cols);
  const quant::DotFn dot = quant::dot_kernel(t);
  const auto* base = static_cast<const uint8_t*>(w);
  pool.parallel_for(rows, [&](int64_t r) {
    y[r] = dot(base + size_t(r) * row_stride, act_scratch, cols);
  });
}

}  // namespace strata::cpu
