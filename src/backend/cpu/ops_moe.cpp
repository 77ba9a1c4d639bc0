#include "backend/cpu/ops_moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/matvec.h"
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

// Weight bytes per task: a tile of an expert's rows stays in L1 while each group of activations
// passes over it. Sized by bytes, not rows: 16-row tiles of down's 148-byte IQ2_XS rows were
// 2.4 KB tasks. With the pointer lists below built once per op instead of per tile, a window's
// experts ran 5-8% faster on two threads (BM_MoeWindow, docs/PERFORMANCE.md).
constexpr size_t kTileBytes = size_t(8) << 10;
constexpr int64_t kMinTileRows = 16;

int64_t tile_rows(const Weight& w) {
  return std::max<int64_t>(kMinTileRows, int64_t(kTileBytes / std::max<size_t>(w.row_stride, 1)));
}

// One chosen expert of the window, the (row, rank) pairs routed to it, and what its tiles read
// and write for them (built once per op, not per tile).
struct Unit {
  int32_t expert;
  std::vector<int64_t> pairs;  // positions in the op's list of pairs, ascending
  std::vector<const void*> gate_acts, up_acts, down_acts;
  std::vector<float*> gate_outs, up_outs, down_outs;
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

namespace {

// down's row is n_ff, or n_ff zero-padded to whole blocks of down's type (qwen4exp stores its
// down stack so when the block does not divide n_ff); the padded columns meet h = 0.
bool down_cols_fit(const Weight& down, int64_t n_ff) {
  const int64_t block = quant::type_info(down.type).block_elems;
  return down.cols == n_ff || (n_ff % block != 0 && down.cols == (n_ff + block - 1) / block * block);
}

// The parts of the routing an op reads: its experts, its weights, or both.
enum class Uses { Experts, Weights, Both };

void check_routing(const char* op, const Tensor& x, const backend::Routing& routing, Uses uses) {
  const int64_t T = x.rows;
  const int64_t K = routing.top_k;
  const bool experts_ok = uses == Uses::Weights || int64_t(routing.experts.size()) == T * K;
  const bool weights_ok = uses == Uses::Experts || int64_t(routing.weights.size()) == T * K;
  require(K >= 1 && experts_ok && weights_ok, op, "routing has ", routing.experts.size(),
          " experts and ", routing.weights.size(), " weights for ", T, " rows of top ", K);
}

// out row pairs[i] = the expert FFN of pair pairs[i] (ascending pair indices r * top_k + j).
void expert_outputs(const char* op, ThreadPool& pool, Workspace& ws, const Tensor& x,
                    const backend::Routing& routing, std::span<const int64_t> pairs,
                    std::span<const backend::ExpertWeights> experts, Tensor out) {
  const int64_t K = routing.top_k;
  const int64_t n_pairs = int64_t(pairs.size());
  if (n_pairs == 0) return;

  // Group the pairs by expert and check each chosen expert once.
  std::vector<int32_t> order;
  for (int64_t p : pairs) order.push_back(routing.experts[size_t(p)]);
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
                ew.gate.rows == ew.up.rows && down_cols_fit(ew.down, ew.gate.rows),
            op, "expert ", e, " shapes gate [", ew.gate.rows, " x ", ew.gate.cols, "], up [",
            ew.up.rows, " x ", ew.up.cols, "], down [", ew.down.rows, " x ", ew.down.cols,
            "] do not fit x ", shape(x));
    unit_of[e] = int64_t(units.size());
    units.emplace_back().expert = e;
  }
  for (int64_t i = 0; i < n_pairs; ++i)
    units[unit_of[routing.experts[size_t(pairs[i])]]].pairs.push_back(i);

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

  // Per listed pair: offsets of its gate/up/h values (n_ff floats each) and of its quantized
  // hidden layer.
  std::vector<int64_t> ff_off(size_t(n_pairs) + 1, 0);
  std::vector<size_t> h_off(size_t(n_pairs) + 1, 0);
  for (int64_t i = 0; i < n_pairs; ++i) {
    const Weight& down = experts[routing.experts[size_t(pairs[i])]].down;
    ff_off[i + 1] = ff_off[i] + down.cols;
    h_off[i + 1] = h_off[i] + quant::act_bytes(quant::kernels(down.type).act, down.cols);
  }
  ws.f32.resize(size_t(2 * ff_off[n_pairs]));
  float* gate_v = ws.f32.data();
  float* up_v = gate_v + ff_off[n_pairs];
  ws.act2.resize(h_off[n_pairs]);
  uint8_t* h_act = ws.act2.data();

  for (Unit& u : units) {
    const backend::ExpertWeights& ew = experts[u.expert];
    for (int64_t i : u.pairs) {
      u.gate_acts.push_back(x_act_of(ew.gate, pairs[i] / K));
      u.up_acts.push_back(x_act_of(ew.up, pairs[i] / K));
      u.gate_outs.push_back(gate_v + ff_off[i]);
      u.up_outs.push_back(up_v + ff_off[i]);
      u.down_acts.push_back(h_act + h_off[i]);
      u.down_outs.push_back(out.data + pairs[i] * out.stride);
    }
  }

  // Tasks of (unit, tile of output rows); a unit's tile dots every pair routed to it.
  auto run_tiles = [&](auto weight_of, auto body) {
    std::vector<std::pair<int64_t, int64_t>> tasks;
    for (size_t u = 0; u < units.size(); ++u) {
      const Weight& w = weight_of(experts[units[u].expert]);
      for (int64_t o = 0; o < w.rows; o += tile_rows(w)) tasks.push_back({int64_t(u), o});
    }
    pool.parallel_for(int64_t(tasks.size()), [&](int64_t i) {
      const Unit& u = units[tasks[i].first];
      const Weight& w = weight_of(experts[u.expert]);
      const int64_t o0 = tasks[i].second;
      body(u, experts[u.expert], o0, std::min(w.rows, o0 + tile_rows(w)));
    });
  };

  // gate and up rows for every pair.
  run_tiles([](const backend::ExpertWeights& ew) -> const Weight& { return ew.gate; },
            [](const Unit& u, const backend::ExpertWeights& ew, int64_t o0, int64_t o1) {
              dot_tile(ew.gate, o0, o1, u.gate_acts, u.gate_outs);
              dot_tile(ew.up, o0, o1, u.up_acts, u.up_outs);
            });

  // h = silu(gate) * up, quantized for the pair's down weight; a padded down row's extra columns
  // get h = 0 (the workspace is reused: they hold stale values until then).
  for_tasks(pool, n_pairs, ff_off[n_pairs] * 8, [&](int64_t i) {
    const backend::ExpertWeights& ew = experts[routing.experts[size_t(pairs[i])]];
    float* h = gate_v + ff_off[i];
    const int64_t n_ff = ew.gate.rows, cols = ew.down.cols;
    for (int64_t k = 0; k < n_ff; ++k) h[k] = swiglu_value(h[k], up_v[ff_off[i] + k]);
    std::fill(h + n_ff, h + cols, 0.0f);
    quant::quantize_act(quant::kernels(ew.down.type).act, h, h_act + h_off[i], cols);
  });

  // down rows for every pair.
  run_tiles([](const backend::ExpertWeights& ew) -> const Weight& { return ew.down; },
            [](const Unit& u, const backend::ExpertWeights& ew, int64_t o0, int64_t o1) {
              dot_tile(ew.down, o0, o1, u.down_acts, u.down_outs);
            });
}

}  // namespace

void moe_expert_outputs(ThreadPool& pool, Workspace& ws, const Tensor& x,
                        const backend::Routing& routing, std::span<const int64_t> pairs,
                        std::span<const backend::ExpertWeights> experts, Tensor out) {
  constexpr const char* op = "moe_expert_outputs";
  check_tensor(op, "x", x);
  check_tensor(op, "out", out);
  check_routing(op, x, routing, Uses::Experts);
  const int64_t n_pairs = x.rows * routing.top_k;
  require(out.rows == n_pairs && out.cols == x.cols, op, "out ", shape(out), " is not [", n_pairs,
          " x ", x.cols, "] (one row per routed pair)");
  check_no_overlap(op, "x", x, "out", out);
  for (size_t i = 0; i < pairs.size(); ++i)
    require(pairs[i] >= 0 && pairs[i] < n_pairs && (i == 0 || pairs[i] > pairs[i - 1]), op,
            "pair ", pairs[i], " at position ", i, " is outside 0..", n_pairs - 1,
            " or not above the one before");
  expert_outputs(op, pool, ws, x, routing, pairs, experts, out);
}

void moe_combine(ThreadPool& pool, const backend::Routing& routing, const Tensor& out, Tensor y) {
  constexpr const char* op = "moe_combine";
  check_tensor(op, "out", out);
  check_tensor(op, "y", y);
  check_routing(op, y, routing, Uses::Weights);
  const int64_t T = y.rows;
  const int64_t K = routing.top_k;
  const int64_t n_embd = y.cols;
  require(out.rows == T * K && out.cols == n_embd, op, "out ", shape(out), " is not [", T * K,
          " x ", n_embd, "] for y ", shape(y));
  check_no_overlap(op, "out", out, "y", y);
  const VecKernels& vk = vec();
  for_tasks(pool, T, T * K * n_embd, [&](int64_t r) {
    float* yr = y.data + r * y.stride;
    for (int64_t j = 0; j < K; ++j)
      vk.axpy(routing.weights[r * K + j], out.data + (r * K + j) * out.stride, yr, n_embd);
  });
}

void moe_experts(ThreadPool& pool, Workspace& ws, const Tensor& x, const backend::Routing& routing,
                 std::span<const backend::ExpertWeights> experts, Tensor y) {
  constexpr const char* op = "moe_experts";
  check_tensor(op, "x", x);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  check_no_overlap(op, "x", x, "y", y);
  check_routing(op, x, routing, Uses::Both);
  if (x.rows == 0) return;
  const int64_t n_pairs = x.rows * routing.top_k;
  std::vector<int64_t> pairs(static_cast<size_t>(n_pairs));
  std::iota(pairs.begin(), pairs.end(), 0);
  ws.f32_out.resize(size_t(n_pairs * x.cols));
  const Tensor out{ws.f32_out.data(), n_pairs, x.cols, x.cols};
  expert_outputs(op, pool, ws, x, routing, pairs, experts, out);
  moe_combine(pool, routing, out, y);
}

}  // namespace strata::cpu
