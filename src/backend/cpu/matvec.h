// Quantized mat-vec over the CPU thread pool: the decode-time y = W x of every weight format.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/thread_pool.h"
#include "quant/types.h"

namespace strata::cpu {

// y[r] = W[r,:] . x for rows [0, rows), bitwise equal to quant::matvec with the same arguments
// whatever the pool size: the caller quantizes x once into act_scratch (which must hold
// quant::act_bytes(quant::kernels(t).act, cols)), then each row is one dot by one thread.
void matvec_parallel(ThreadPool& pool, quant::Type t, const void* w, size_t row_stride,
                     int64_t rows, int64_t cols, const float* x, float* y, void* act_scratch);

}  // namespace strata::cpu
