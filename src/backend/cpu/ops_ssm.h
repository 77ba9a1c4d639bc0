// The recurrent ops of the Gated DeltaNet layers: the short causal conv and the delta rule.
// Both carry state from window to window and walk the window's rows in order, so a T-row
// window leaves the same outputs and the same state as T one-row windows.
#pragma once

#include "backend/cpu/ops_common.h"

namespace strata::cpu {

// x, y: [T, C]; w: F32 with rows = C and cols = kernel (the GGUF ssm_conv1d layout, ne = [kernel,
// C]); state: [(kernel - 1) * dilation, C], row 0 the oldest of the previous inputs (zeros at the
// start).
//   y[t, c] = silu(sum_{j = 0..kernel-1} w[c, j] * in[t - (kernel - 1 - j) * dilation, c])
// where in[] is the state rows followed by x's rows; the sum runs j ascending from 0 (product,
// then add). Afterwards the state holds the last (kernel - 1) * dilation rows of in[]. y must not
// overlap x.
void conv1d_silu(ThreadPool& pool, const Tensor& x, Tensor state, const Weight& w, int64_t dilation,
                 Tensor y);

// The recurrent gated delta rule (torch_recurrent_gated_delta_rule), per value head h:
//   q, k: [T, qk_heads * dk]  — l2-normed, and q already scaled by 1/sqrt(dk): the op does not
//                                scale q (the reference does it inside its kernel; here the model
//                                code does). qk_heads divides n_heads; value head h reads q/k
//                                head backend::qk_head_map(repeat, ...) of h (the reference's
//                                repeat_interleave or tile, without the copies).
//   v, y: [T, n_heads * dv]
//   g, beta: [T, n_heads]     — g the log decay (<= 0), beta the write strength (sigmoid done)
//   state: [n_heads * dk, dv], contiguous; rows h*dk .. h*dk+dk-1 are head h's S, S[i][j] with
//          i over key dims and j over value dims (the reference's [dk, dv] per head).
// Each token: S *= exp(g); kv = S^T k; delta = (v - kv) * beta; S += k delta^T; y = S^T q,
// with the fma order of VecKernels::delta_rule_step. One task per head. y must not overlap
// the inputs.
// The shape checks of gated_delta_rule (every backend's), and the q/k head map they imply.
backend::QkHeadMap check_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& g, const Tensor& beta, const Tensor& state,
                                    int64_t n_heads, backend::HeadRepeat repeat, const Tensor& y);
void gated_delta_rule(ThreadPool& pool, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& g, const Tensor& beta, Tensor state, int64_t n_heads,
                      backend::HeadRepeat repeat, Tensor y);

// g[t, h] = ssm_a[h] * softplus(a[t, h] + dt_bias[h]), softplus(z) = z > 20 ? z : log1p(exp(z))
// (torch's threshold); ssm_a and dt_bias: F32 vectors of a.cols values.
void ssm_decay(const Tensor& a, const Weight& dt_bias, const Weight& ssm_a, Tensor g);

}  // namespace strata::cpu
