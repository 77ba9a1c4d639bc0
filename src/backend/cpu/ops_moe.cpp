#include "backend/cpu/ops_moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/ops_matmul.h"
#include "backend/cpu/ops_vec.h"
#include "quant/kernels.h"

namespace strata::cpu {

backend::Routing route_softmax_topk(const Tensor& logits, int64_t top_k, bool renormalize) {
  constexpr const char* op = "route_softmax_topk";
  check_tensor(op, "logits", logits);
  require(top_k >= 1 && top_k <= logits.cols, op, "top_k ", top_k, " is outside 1..", logits.cols,
          " experts");
  const int64_t n = logits.cols;
  backend::Routing out;
  out.top_k = top_k;
  out.experts.resize(size_t(logits.rows * top_k));
  out.weights.resize(size_t(logits.rows * top_k));
  std::vector<float> p(static_cast<size_t>(n));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t r = 0; r < logits.rows; ++r) {
    const float* l = logits.data + r * logits.stride;
    const float mx = *std::max_element(l, l + n);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      p[i] = std::exp(l[i] - mx);
      sum += p[i];
    }
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] / sum;
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + top_k, ids.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float chosen = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) chosen += p[ids[j]];
    for (int64_t j = 0; j < top_k; ++j) {
      out.experts[r * top_k + j] = ids[j];
      out.weights[r * top_k + j] = renormalize ? p[ids[j]] / chosen : p[ids[j]];
    }
  }
  return out;
}

namespace {

// Output rows per task, as in matmul.
constexpr int64_t kRowTile = 16;

// One chosen expert of the window and the (row, rank) pairs routed to it.
struct Unit {
  int32_t expert;
  std::vector<int64_t> pairs;  // pair index r * top_k + j, ascending
};

// Quantizes every row of x in format f into buf (one activation after another).
void quantize_rows(ThreadPool& pool, quant::ActFormat f, const Tensor& x,
                   std::vector<uint8_t>& buf) {
  const size_t bytes = quant::act_bytes(f, x.cols);
  buf.resize(size_t(x.rows) * bytes);
  for_tasks(pool, x.rows, x.rows * x.cols, [&](int64_t r) {
    quant::quantize_act(f, x.data + r * x.stride, buf.data() + size_t(r) * bytes, x.cols);
  });
}

}  // namespace

void moe_experts(ThreadPool& pool, Workspace& ws, const Tensor& x, const backend::Routing& routing,
                 std::span<const backend::ExpertWeights> experts, Tensor y) {
  constexpr const char* op = "moe_experts";
  check_tensor(op, "x", x);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  check_no_overlap(op, "x", x, "y", y);
  const int64_t T = x.rows;
  const int64_t K = routing.top_k;
  require(K >= 1 && int64_t(routing.experts.size()) == T * K &&
              int64_t(routing.weights.size()) == T * K,
          op, "routing has ", routing.experts.size(), " experts and ", routing.weights.size(),
          " weights for ", T, " rows of top ", K);
  if (T == 0) return;

  // Group the pairs by expert and check each chosen expert once.
  std::vector<int32_t> order(routing.experts.begin(), routing.experts.end());
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  std::vector<Unit> units;
  std::vector<int64_t> unit_of(size_t(experts.size()), -1);
  for (int32_t e : order) {
    require(e >= 0 && size_t(e) < experts.size(), op, "expert id ", e, " is outside the ",
            experts.size(), " experts");
    const backend::ExpertWeights& ew = experts[e];
    check_weight(op, "gate", ew.gate);
    check_weight(op, "up", ew.up);
    check_weight(op, "down", ew.down);
    require(ew.gate.cols == x.cols && ew.up.cols == x.cols && ew.down.rows == x.cols &&
                ew.gate.rows == ew.up.rows && ew.down.cols == ew.gate.rows,
            op, "expert ", e, " shapes gate [", ew.gate.rows, " x ", ew.gate.cols, "], up [",
            ew.up.rows, " x ", ew.up.cols, "], down [", ew.down.rows, " x ", ew.down.cols,
            "] do not fit x ", shape(x));
    unit_of[e] = int64_t(units.size());
    units.push_back({e, {}});
  }
  for (int64_t p = 0; p < T * K; ++p) units[unit_of[routing.experts[p]]].pairs.push_back(p);

  // Activations of x in every format the chosen gate and up weights take.
  constexpr int kFormats = 3;
  bool need[kFormats] = {};
  for (const Unit& u : units) {
    need[int(quant::kernels(experts[u.expert].gate.type).act)] = true;
    need[int(quant::kernels(experts[u.expert].up.type).act)] = true;
  }
  std::vector<uint8_t> x_act[kFormats];
  for (int f = 0; f < kFormats; ++f)
    if (need[f]) quantize_rows(pool, quant::ActFormat(f), x, x_act[f]);
  auto x_act_of = [&](const Weight& w, int64_t row) {
    const quant::ActFormat f = quant::kernels(w.type).act;
    return x_act[int(f)].data() + size_t(row) * quant::act_bytes(f, x.cols);
  };

  // Per pair: offsets of its gate/up/h values (n_ff floats each), its quantized hidden layer,
  // and its down output (n_embd floats).
  const int64_t n_pairs = T * K;
  std::vector<int64_t> ff_off(size_t(n_pairs) + 1, 0);
  std::vector<size_t> h_off(size_t(n_pairs) + 1, 0);
  for (int64_t p = 0; p < n_pairs; ++p) {
    const Weight& down = experts[routing.experts[p]].down;
    ff_off[p + 1] = ff_off[p] + down.cols;
    h_off[p + 1] = h_off[p] + quant::act_bytes(quant::kernels(down.type).act, down.cols);
  }
  const int64_t n_embd = x.cols;
  ws.f32.resize(size_t(2 * ff_off[n_pairs] + n_pairs * n_embd));
  float* gate_v = ws.f32.data();
  float* up_v = gate_v + ff_off[n_pairs];
  float* out_v = up_v + ff_off[n_pairs];
  ws.act2.resize(h_off[n_pairs]);
  uint8_t* h_act = ws.act2.data();

  // Tasks of (unit, tile of output rows); a unit's tile dots every pair routed to it.
  auto run_tiles = [&](auto rows_of, auto body) {
    std::vector<std::pair<int64_t, int64_t>> tasks;
    for (size_t u = 0; u < units.size(); ++u) {
      const int64_t rows = rows_of(experts[units[u].expert]);
      for (int64_t o = 0; o < rows; o += kRowTile) tasks.push_back({int64_t(u), o});
    }
    pool.parallel_for(int64_t(tasks.size()), [&](int64_t i) {
      const Unit& u = units[tasks[i].first];
      const backend::ExpertWeights& ew = experts[u.expert];
      const int64_t o0 = tasks[i].second;
      body(u, ew, o0, std::min(rows_of(ew), o0 + kRowTile));
    });
  };

  // gate and up rows for every pair.
  run_tiles([](const backend::ExpertWeights& ew) { return ew.gate.rows; },
            [&](const Unit& u, const backend::ExpertWeights& ew, int64_t o0, int64_t o1) {
              const quant::DotFn gdot = quant::dot_kernel(ew.gate.type);
              const quant::DotFn udot = quant::dot_kernel(ew.up.type);
              const auto* gw = static_cast<const uint8_t*>(ew.gate.data);
              const auto* uw = static_cast<const uint8_t*>(ew.up.data);
              for (int64_t p : u.pairs) {
                const uint8_t* ga = x_act_of(ew.gate, p / K);
                const uint8_t* ua = x_act_of(ew.up, p / K);
                for (int64_t o = o0; o < o1; ++o) {
                  gate_v[ff_off[p] + o] = gdot(gw + size_t(o) * ew.gate.row_stride, ga, x.cols);
                  up_v[ff_off[p] + o] = udot(uw + size_t(o) * ew.up.row_stride, ua, x.cols);
                }
              }
            });

  // h = silu(gate) * up, quantized for the pair's down weight.
  for_tasks(pool, n_pairs, ff_off[n_pairs] * 8, [&](int64_t p) {
    float* h = gate_v + ff_off[p];
    const int64_t n_ff = ff_off[p + 1] - ff_off[p];
    for (int64_t i = 0; i < n_ff; ++i) h[i] = swiglu_value(h[i], up_v[ff_off[p] + i]);
    quant::quantize_act(quant::kernels(experts[routing.experts[p]].down.type).act, h,
                        h_act + h_off[p], n_ff);
  });

  // down rows for every pair.
  run_tiles([](const backend::ExpertWeights& ew) { return ew.down.rows; },
            [&](const Unit& u, const backend::ExpertWeights& ew, int64_t o0, int64_t o1) {
              const quant::DotFn ddot = quant::dot_kernel(ew.down.type);
              const auto* dw = static_cast<const uint8_t*>(ew.down.data);
              for (int64_t p : u.pairs) {
                const uint8_t* ha = h_act + h_off[p];
                for (int64_t o = o0; o < o1; ++o)
                  out_v[p * n_embd + o] =
                      ddot(dw + size_t(o) * ew.down.row_stride, ha, ew.down.cols);
              }
            });

  // Combine in rank order, per row.
  const VecKernels& vk = vec();
  for_tasks(pool, T, T * K * n_embd, [&](int64_t r) {
    float* yr = y.data + r * y.stride;
    for (int64_t j = 0; j < K; ++j)
      vk.axpy(routing.weights[r * K + j], out_v + (r * K + j) * n_embd, yr, n_embd);
  });
}

}  // namespace strata::cpu
