#include "backend/cpu/ops_ssm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops_vec.h"

namespace strata::cpu {

void conv1d_silu(ThreadPool& pool, const Tensor& x, Tensor state, const Weight& w, int64_t dilation,
                 Tensor y) {
  constexpr const char* op = "conv1d_silu";
  require(dilation >= 1, op, "dilation ", dilation, " must be >= 1");
  check_tensor(op, "x", x);
  check_tensor(op, "state", state);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  require(w.type == quant::Type::F32 && w.data, op, "the weight must be F32 with data");
  require(w.rows == x.cols && w.cols >= 1, op, "the weight [", w.rows, " x ", w.cols,
          "] should have one row per channel of x ", shape(x));
  require(w.row_stride == size_t(w.cols) * 4, op, "the weight rows must be contiguous");
  const int64_t K = w.cols;
  const int64_t C = x.cols;
  const int64_t S = (K - 1) * dilation;  // state rows
  require(state.rows == S && state.cols == C, op, "state ", shape(state), " should be [", S, " x ",
          C, "]");
  check_no_overlap(op, "x", x, "y", y);
  check_no_overlap(op, "state", state, "y", y);
  check_no_overlap(op, "state", state, "x", x);
  const int64_t T = x.rows;
  const auto* wf = static_cast<const float*>(w.data);

  // in(t, c) for t in [-S, T): the state rows, then x.
  auto in = [&](int64_t t, int64_t c) {
    return t < 0 ? state.data[(S + t) * state.stride + c] : x.data[t * x.stride + c];
  };
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (C + kChunk - 1) / kChunk;
  for_tasks(pool, chunks, T * C * K, [&](int64_t chunk) {
    const int64_t c0 = chunk * kChunk;
    const int64_t c1 = std::min(C, c0 + kChunk);
    for (int64_t t = 0; t < T; ++t) {
      float* yr = y.data + t * y.stride;
      for (int64_t c = c0; c < c1; ++c) {
        const float* wc = wf + c * K;
        float acc = 0.0f;
        for (int64_t j = 0; j < K; ++j) acc = acc + wc[j] * in(t - (K - 1 - j) * dilation, c);
        yr[c] = acc / (1.0f + std::exp(-acc));
      }
    }
    // The new state is in() rows T-S .. T-1. Shifting in place oldest first is safe: state row
    // s takes in() row T-S+s, which is x or state row T+s >= s, not yet overwritten.
    for (int64_t s = 0; s < S; ++s) {
      float* dst = state.data + s * state.stride;
      for (int64_t c = c0; c < c1; ++c) dst[c] = in(T - S + s, c);
    }
  });
}

backend::QkHeadMap check_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& g, const Tensor& beta, const Tensor& state,
                                    int64_t n_heads, backend::HeadRepeat repeat, const Tensor& y) {
  constexpr const char* op = "gated_delta_rule";
  check_tensor(op, "q", q);
  check_tensor(op, "k", k);
  check_tensor(op, "v", v);
  check_tensor(op, "g", g);
  check_tensor(op, "beta", beta);
  check_tensor(op, "state", state);
  check_tensor(op, "y", y);
  require(n_heads > 0 && state.rows % n_heads == 0 && state.rows > 0 && v.cols % n_heads == 0, op,
          "n_heads ", n_heads, " must divide the state ", shape(state), " and v ", shape(v));
  const int64_t dk = state.rows / n_heads, dv = v.cols / n_heads;
  require(state.cols == dv && state.stride == dv, op, "state ", shape(state),
          " should be a contiguous [", n_heads * dk, " x ", dv, "]");
  require(q.cols % dk == 0 && q.cols > 0 && n_heads % (q.cols / dk) == 0, op, "q ", shape(q),
          " does not fit the state ", shape(state), ": with ", n_heads, " value heads of ", dk,
          " key dims, q needs a whole number of ", dk, "-wide heads dividing ", n_heads);
  check_same_shape(op, "q", q, "k", k);
  check_same_shape(op, "v", v, "y", y);
  const int64_t T = q.rows;
  require(v.rows == T && g.rows == T && beta.rows == T, op, "q, v, g and beta differ in rows (", T,
          ", ", v.rows, ", ", g.rows, ", ", beta.rows, ")");
  require(g.cols == n_heads && beta.cols == n_heads, op, "g ", shape(g), " and beta ", shape(beta),
          " should have one column per head (", n_heads, ")");
  for (const Tensor* in : std::initializer_list<const Tensor*>{&q, &k, &v, &g, &beta, &state})
    require(!overlaps(*in, y), op, "y overlaps an input");
  return backend::qk_head_map(repeat, n_heads, q.cols / dk);
}

void gated_delta_rule(ThreadPool& pool, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& g, const Tensor& beta, Tensor state, int64_t n_heads,
                      backend::HeadRepeat repeat, Tensor y) {
  const backend::QkHeadMap map = check_delta_rule(q, k, v, g, beta, state, n_heads, repeat, y);
  const int64_t T = q.rows;
  const int64_t dk = state.rows / n_heads;
  const int64_t dv = v.cols / n_heads;

  const VecKernels& vk = vec();
  for_tasks(pool, n_heads, T * dk * dv * 4, [&](int64_t h) {
    std::vector<float> scratch(static_cast<size_t>(dv));
    float* S = state.data + h * dk * dv;
    const int64_t hk = h / map.div % map.mod;
    for (int64_t t = 0; t < T; ++t) {
      vk.delta_rule_step(S, q.data + t * q.stride + hk * dk, k.data + t * k.stride + hk * dk,
                         v.data + t * v.stride + h * dv, std::exp(g.data[t * g.stride + h]),
                         beta.data[t * beta.stride + h], dk, dv, scratch.data(),
                         y.data + t * y.stride + h * dv);
    }
  });
}

void ssm_decay(const Tensor& a, const Weight& dt_bias, const Weight& ssm_a, Tensor g) {
  constexpr const char* op = "ssm_decay";
  check_tensor(op, "a", a);
  check_tensor(op, "g", g);
  check_same_shape(op, "a", a, "g", g);
  for (const Weight* w : {&dt_bias, &ssm_a})
    require(w->type == quant::Type::F32 && w->rows == 1 && w->cols == a.cols, op,
            w == &ssm_a ? "ssm_a" : "dt_bias", " must be F32 [", a.cols, "]");
  const auto* dt = static_cast<const float*>(dt_bias.data);
  const auto* scale = static_cast<const float*>(ssm_a.data);
  for (int64_t t = 0; t < a.rows; ++t)
    for (int64_t h = 0; h < a.cols; ++h) {
      const float z = row_at(a, t, h) + dt[h];
      const float softplus = z > 20.0f ? z : std::log1p(std::exp(z));
      g.data[t * g.stride + h] = scale[h] * softplus;
    }
}

}  // namespace strata::cpu
