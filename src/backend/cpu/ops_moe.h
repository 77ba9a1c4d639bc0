// The routed mixture of experts: the router's top-k and the experts' SwiGLU FFNs.
#pragma once

#include <span>

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

// Per row: p = softmax(logits) in fp32 (max subtracted, exp, sum in column order, divide);
// the top_k experts by p, ties to the lower id; weights p, or p / (sum of the chosen p in rank
// order) when renormalize.
backend::Routing route_softmax_topk(const Tensor& logits, int64_t top_k, bool renormalize);

// y[r] += sum over rank j of w[r, j] * down(swiglu(gate x_r, up x_r)) of expert experts[r, j]:
// y[r][i] = fma(w[r, j], out_j[i], y[r][i]) for j = 0, 1, ... in rank order. Each gate, up and
// down output is one dot call on its row's own activation bytes (as in matmul), so the result
// of a row does not depend on the other rows of the window. The work is grouped by expert so
// each chosen expert's weights stream once per window. y must not overlap x.
// It is moe_expert_outputs over every pair, then moe_combine.
void moe_experts(ThreadPool& pool, Workspace& ws, const Tensor& x, const backend::Routing& routing,
                 std::span<const backend::ExpertWeights> experts, Tensor y);

// out[p] = down(swiglu(gate x_r, up x_r)) of expert experts[p] for every listed pair
// p = r * top_k + j (ascending, each once); other rows of out [rows * top_k, n_embd] are left
// as they are. A pair's row is bitwise the same whatever other pairs share the call, so a window
// whose experts cannot all be resident at once is computed in chunks of pairs.
void moe_expert_outputs(ThreadPool& pool, Workspace& ws, const Tensor& x,
                        const backend::Routing& routing, std::span<const int64_t> pairs,
                        std::span<const backend::ExpertWeights> experts, Tensor out);

// y[r][i] = fma(w[r, j], out[r * top_k + j][i], y[r][i]) for j = 0, 1, ... in rank order.
void moe_combine(ThreadPool& pool, const backend::Routing& routing, const Tensor& out, Tensor y);

}  // namespace strata::cpu
