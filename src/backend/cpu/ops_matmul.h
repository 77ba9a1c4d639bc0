// Quantized weight products: y = x W^T, and table lookups (embeddings).
#pragma once

#include <span>

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

// y[r, o] = dot_kernel(w.type)(W row o, quantize_act(x row r)): one dot call per output on the
// row's own activation bytes, so a T-row product equals T one-row products bit for bit.
void matmul(ThreadPool& pool, Workspace& ws, const Weight& w, const Tensor& x, Tensor y);

// y[r] = dequantized row ids[r] of the table (reference dequantizer).
void get_rows(const Weight& table, std::span<const int32_t> ids, Tensor y);

// Shape checks shared with the MoE op: a weight with storage and kernels, cols a whole number
// of its blocks and of its activation blocks.
void check_weight(const char* op, const char* name, const Weight& w);

}  // namespace strata::cpu
