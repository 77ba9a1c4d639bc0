// QSA's indexer (qwen4exp sparse attention): pooled block keys, block scores, and the choice of
// the positions each query attends to (backend.h has the definitions).
#pragma once

#include <span>

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

// y[t] = (x[f] + x[f + 1] + ... + x[f + block - 1]) / block with f = firsts[t], rows added in
// order; zeros where f < 0. x: [>= f + block, C].
void block_mean(const Tensor& x, std::span<const int32_t> firsts, int64_t block, Tensor y);

// y[r, b] = scale * sum over heads h of max(0, dot(q[r, h], keys[b])) for b < (positions[r] + 1)
// / block (dots in the lane order of ops_vec.h, heads summed in order), 0 past it.
// q: [T, n_head * head_dim]; keys: [blocks, head_dim]; y: [T, >= max count].
void block_scores(ThreadPool& pool, const Tensor& q, const Tensor& keys,
                  std::span<const int32_t> positions, int64_t block, int64_t n_head,
                  int64_t head_dim, float scale, Tensor y);

// Per row r at p = positions[r]: the best min(top_blocks, (p + 1) / block) blocks by scores[r]
// (ties: the lower block) in ascending order, each expanded to its positions, then the tail
// (p + 1) / block * block .. p, into selected[r * selected_cols ..]; counts[r] = how many.
void qsa_select(const Tensor& scores, std::span<const int32_t> positions, int64_t block,
                int64_t top_blocks, int32_t* selected, int64_t selected_cols,
                std::span<int32_t> counts);

}  // namespace strata::cpu
