// Causal softmax attention over a layer's KV cache, grouped-query.
#pragma once

#include <span>

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

// k_cache / v_cache: one row per position, [n_head_kv * head_dim] columns. Row r of k and v is
// written at row positions[r].
void kv_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v,
              std::span<const int32_t> positions);

// For row r and head h (kv head h / (n_head / n_head_kv)), over cache positions
// p = 0..positions[r] in increasing order:
//   s_p = dot(q, k_p) * scale            (dot in the fixed lane order of ops_vec.h)
//   online softmax: when s_p > m, the accumulator and the running sum l are rescaled by
//   c = exp(m - s_p) (acc = fma(1, v_p, acc * c), l = l * c + 1) and m = s_p; otherwise
//   e = exp(s_p - m), acc = fma(e, v_p, acc), l = l + e
//   y = acc * (1 / l)
// One task per (row, head), each writing only its own output, so results depend on neither the
// window size nor the thread count. y must not overlap q.
void attention(ThreadPool& pool, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
               std::span<const int32_t> positions, int64_t n_head, int64_t n_head_kv,
               int64_t head_dim, float scale, Tensor y);

// The same over the positions selected[r * selected_cols + i], i < counts[r], of row r, in that
// order (QSA's sparse attention).
void attention_selected(ThreadPool& pool, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, const int32_t* selected, int64_t selected_cols,
                        std::span<const int32_t> counts, int64_t n_head, int64_t n_head_kv,
                        int64_t head_dim, float scale, Tensor y);

}  // namespace strata::cpu
