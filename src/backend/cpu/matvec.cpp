#include "backend/cpu/matvec.h"

#include <algorithm>

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

void dot_tile(const backend::Weight& w, int64_t o0, int64_t o1, std::span<const void* const> acts,
              std::span<float* const> outs) {
  const quant::DotRows dots = quant::dot_rows_kernel(w.type);
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (size_t j0 = 0; j0 < acts.size(); j0 += quant::kMaxDotRows) {
    const int count = int(std::min<size_t>(quant::kMaxDotRows, acts.size() - j0));
    for (int64_t o = o0; o < o1; ++o) {
      float out[quant::kMaxDotRows];
      dots(base + size_t(o) * w.row_stride, acts.data() + j0, count, w.cols, out);
      for (int j = 0; j < count; ++j) outs[j0 + size_t(j)][o] = out[j];
    }
  }
}

}  // namespace strata::cpu
