// Quantized mat-vec over the CPU thread pool: the decode-time y = W x of every weight format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"
#include "quant/types.h"

namespace strata::cpu {

// y[r] = W[r,:] . x for rows [0, rows), bitwise equal to quant::matvec with the same arguments
// whatever the pool size: the caller quantizes x once into act_scratch (which must hold
// quant::act_bytes(quant::kernels(t).act, cols)), then each row is one dot by one thread.
void matvec_parallel(ThreadPool& pool, quant::Type t, const void* w, size_t row_stride,
                     int64_t rows, int64_t cols, const float* x, float* y, void* act_scratch);

// outs[j][o] = W[o,:] . acts[j] for the weight rows o in [o0, o1) and every activation j (already
// in the weight's activation layout): one tile of a prefill product. Activations go through the
// format's multi-activation kernel quant::kMaxDotRows at a time, each group against every row of
// the tile while it is in L1; each output is bitwise the single-row dot's, so a tile computes the
// same bits however many activations it gets. Single-threaded; callers split tiles over threads.
void dot_tile(const backend::Weight& w, int64_t o0, int64_t o1, std::span<const void* const> acts,
              std::span<float* const> outs);

}  // namespace strata::cpu
