#include "backend/cpu/matvec.h"

#include "quant/kernels.h"

namespace strata::cpu {

void matvec_parallel(ThreadPool& pool, quant::Type t, const void* w, size_t row_stride,
                     int64_t rows, int64_t cols, const float* x, float* y, void* act_scratch) {
  // The activation is a few KiB and takes well under a microsecond to quantize (see
  // bench_matvec's quantize_act numbers), less than starting a parallel step would cost.
  quant::quantize_act(quant::kernels(t).act, x, act_scratch, cols);
  const quant::DotFn dot = quant::dot_kernel(t);
  const auto* base = static_cast<const uint8_t*>(w);
  pool.parallel_for(rows, [&](int64_t r) {
    y[r] = dot(base + size_t(r) * row_stride, act_scratch, cols);
  });
}

}  // namespace strata::cpu
