// CudaBackend's weight ops: get_rows, matmul, the router, the routed experts, and the greedy
// choice over the logits. Checks are the CPU backend's (cpu::check_weight: a format with kernels,
// whole blocks of the weight and of its activation layout), plus that every weight is device
// memory from weight().
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>

#include "backend/cpu/ops_matmul.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "quant/kernels.h"

namespace strata::backend {

namespace detail = cuda::detail;

namespace {

// Routing in device memory: expert ids and/or weights [rows, top_k], contiguous.
void check_routing(const char* op, int64_t rows, const Ids* experts, const Tensor* weights) {
  if (experts)
    require(experts->cols >= 1 && experts->rows == rows && (experts->data || rows == 0), op,
            "experts [", experts->rows, " x ", experts->cols, "] do not route ", rows, " rows");
  if (weights) {
    check_tensor(op, "weights", *weights);
    require(weights->cols >= 1 && weights->rows == rows && weights->stride == weights->cols, op,
            "weights ", shape(*weights), " are not contiguous [", rows, " x top_k]");
  }
  if (experts && weights)
    require(experts->cols == weights->cols, op, "experts [", experts->rows, " x ", experts->cols,
            "] and weights ", shape(*weights), " differ in top_k");
}

// down's row is n_ff, or n_ff zero-padded to whole blocks of down's type (the CPU's rule).
bool down_cols_fit(const Weight& down, int64_t n_ff) {
  const int64_t block = quant::type_info(down.type).block_elems;
  return down.cols == n_ff || (n_ff % block != 0 && down.cols == (n_ff + block - 1) / block * block);
}

bool rows_aligned(const Tensor& x) {
  return reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && x.stride % 4 == 0;
}

// y = x W^T: the weight's and the tensors' shapes, y apart from x, the weight on this device.
void check_matmul(const CudaBackend::Impl& impl, const char* op, const Weight& w, const Tensor& x,
                  const Tensor& y) {
  cpu::check_weight(op, "weight", w);
  check_tensor(op, "x", x);
  check_tensor(op, "y", y);
  require(x.cols == w.cols, op, "x ", shape(x), " has ", x.cols, " columns but the weight has ",
          w.cols, " [", w.rows, " x ", w.cols, "]");
  require(y.rows == x.rows && y.cols == w.rows, op, "y ", shape(y), " should be [", x.rows, " x ",
          w.rows, "]");
  check_no_overlap(op, "x", x, "y", y);
  impl.check_device_weight(op, "weight", w);
}

}  // namespace

void CudaBackend::get_rows(const Weight& table, const Ids& ids, Tensor y) {
  constexpr const char* op = "get_rows";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  require(table.data != nullptr, op, "table has no data");
  check_tensor(op, "y", y);
  require(y.rows == ids.size() && y.cols == table.cols, op, "y ", shape(y), " should be [",
          ids.size(), " x ", table.cols, "]");
  impl_->check_device_weight(op, "table", table);
  // The ids are device values: the kernel leaves a row whose id is outside the table zero.
  detail::launch_get_rows(impl_->ctx, table.type, table.data, table.row_stride, table.cols,
                          ids.data, table.rows, y);
}

void CudaBackend::matmul(const Weight& w, const Tensor& x, Tensor y) {
  if (impl_->graphs.replaying()) return;
  const Impl::MatmulX this_x{x.data, x.rows, x.cols, x.stride};
  // Nothing but matmuls of this x (whose outputs do not overlap it) ran since x was quantized.
  const bool after_matmul_of_x =
      impl_->graphs.ops() == impl_->matmul_ops && impl_->matmul_x == this_x;
  if (!after_matmul_of_x) impl_->end_matmul_chain();
  impl_->begin_op(__func__);
  check_matmul(*impl_, "matmul", w, x, y);
  if (x.rows == 0) return;
  impl_->matmul_x = this_x;
  impl_->matmul_ops = impl_->graphs.ops();
  const quant::ActFormat fmt = quant::kernels(w.type).act;
  // The integer mat-vec: bitwise the CPU backend's matmul, up to kMaxMatvecTokens rows a call,
  // or every row in one call where the format has tensor-core tiles.
  if (cuda::has_matvec_q(w.type) && x.stride == x.cols && y.stride == y.cols &&
      reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && x.rows <= INT_MAX) {
    Impl::MatmulX quantized = this_x;
    quantized.format = int(fmt);
    cuda::MatvecQOptions options;
    options.x_unchanged = impl_->quantized_x == quantized;
    const int64_t per_call = cuda::has_matmul_tiles(w.type) ? x.rows : cuda::kMaxMatvecTokens;
    for (int64_t r = 0; r < x.rows; r += per_call) {
      const int n = int(std::min(per_call, x.rows - r));
      impl_->device.matvec_q(w.type, w.data, w.row_stride, w.rows, w.cols, x.data + r * x.cols,
                             y.data + r * y.cols, n, options);
    }
    // (More rows than one call takes leave only the last call's in the scratch.)
    if (fmt != quant::ActFormat::F32 && x.rows <= per_call) impl_->quantized_x = quantized;
    return;
  }
  if (fmt == quant::ActFormat::F32 && rows_aligned(x)) {
    detail::launch_matmul(impl_->ctx, w.type, w.data, w.row_stride, w.rows, w.cols, x.data,
                          x.stride, y);
    return;
  }
  const Scratch act(impl_->ctx.stream, size_t(x.rows * x.cols) * sizeof(float));
  detail::launch_quantize_act(impl_->ctx, fmt, x, act.as<float>());
  detail::launch_matmul(impl_->ctx, w.type, w.data, w.row_stride, w.rows, w.cols, act.as<float>(),
                        x.cols, y);
}

void CudaBackend::matmuls(std::span<const Weight* const> ws, const Tensor& x,
                          std::span<Tensor> ys) {
  // One launch where one kernel takes them all: the integer mat-vec (up to kMaxMatvecTokens rows
  // of x, contiguous outputs) or the fp32 matmul, for weights of one type.
  const auto same_type = [&](const Weight* w) { return w->type == ws[0]->type; };
  const bool one_type = ws.size() > 1 && ws.size() <= size_t(cuda::kMaxMatvecQMatrices) &&
                        ws.size() == ys.size() && std::all_of(ws.begin(), ws.end(), same_type);
  const quant::Type t = one_type ? ws[0]->type : quant::Type::F32;
  const quant::ActFormat fmt = quant::kernels(t).act;
  const auto contiguous = [](const Tensor& y) { return y.stride == y.cols; };
  const bool integer = one_type && cuda::has_matvec_q(t) && x.rows >= 1 &&
                       x.rows <= cuda::kMaxMatvecTokens && x.stride == x.cols &&
                       std::all_of(ys.begin(), ys.end(), contiguous) &&
                       reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
  const bool fp32 =
      one_type && !cuda::has_matvec_q(t) && fmt == quant::ActFormat::F32 && rows_aligned(x);
  if (!integer && !fp32) return Backend::matmuls(ws, x, ys);
  if (impl_->graphs.replaying()) return;
  const Impl::MatmulX this_x{x.data, x.rows, x.cols, x.stride};
  if (!(impl_->graphs.ops() == impl_->matmul_ops && impl_->matmul_x == this_x))
    impl_->end_matmul_chain();
  impl_->begin_op(__func__);
  for (size_t i = 0; i < ws.size(); ++i) check_matmul(*impl_, "matmuls", *ws[i], x, ys[i]);
  impl_->matmul_x = this_x;
  impl_->matmul_ops = impl_->graphs.ops();
  if (x.rows == 0) return;
  if (fp32) {
    detail::MatmulMatrix matrices[cuda::kMaxMatvecQMatrices];
    for (size_t i = 0; i < ws.size(); ++i)
      matrices[i] = {ws[i]->data, ws[i]->row_stride, ws[i]->rows, ys[i]};
    detail::launch_matmuls(impl_->ctx, t, {matrices, ws.size()}, x.cols, x.data, x.stride);
    return;
  }
  cuda::MatvecQMatrix matrices[cuda::kMaxMatvecQMatrices];
  for (size_t i = 0; i < ws.size(); ++i)
    matrices[i] = {ws[i]->data, ws[i]->row_stride, ws[i]->rows, ys[i].data};
  Impl::MatmulX quantized = this_x;
  quantized.format = int(fmt);
  cuda::MatvecQOptions options;
  options.x_unchanged = impl_->quantized_x == quantized;
  impl_->device.matvec_q(t, {matrices, ws.size()}, x.cols, x.data, int(x.rows), options);
  if (fmt != quant::ActFormat::F32) impl_->quantized_x = quantized;
}

void CudaBackend::route_softmax_topk(const Tensor& logits, bool renormalize, Ids experts,
                                     Tensor weights) {
  constexpr const char* op = "route_softmax_topk";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "logits", logits);
  const int64_t top_k = experts.cols;
  require(top_k >= 1 && top_k <= logits.cols, op, "top_k ", top_k, " is outside 1..", logits.cols,
          " experts");
  check_routing(op, logits.rows, &experts, &weights);
  if (logits.rows == 0) return;
  detail::launch_route_softmax_topk(impl_->ctx, logits, top_k, renormalize, experts.data,
                                    weights.data);
}

void CudaBackend::argmax(const Tensor& x, Ids index, Tensor prob) {
  constexpr const char* op = "argmax";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "x", x);
  check_tensor(op, "prob", prob);
  require(index.size() == x.rows && (index.data || x.rows == 0) &&
              (prob.rows == 0 || (prob.rows == x.rows && prob.cols == 1)),
          op, "x ", shape(x), " needs one index and a prob [", x.rows, " x 1], got [", index.rows,
          " x ", index.cols, "] and ", shape(prob));
  detail::launch_argmax(impl_->ctx, x, index.data, prob);
}

void CudaBackend::top_k(const Tensor& x, Ids index, Tensor values) {
  constexpr const char* op = "top_k";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "x", x);
  check_tensor(op, "values", values);
  require(values.rows == x.rows && values.cols >= 1 && values.cols <= kMaxTopK && index.rows == x.rows &&
              index.cols == values.cols && (index.data || x.rows == 0),
          op, "x ", shape(x), " needs index and values [", x.rows, " x k] with 1 <= k <= ", kMaxTopK,
          ", got [", index.rows, " x ", index.cols, "] and ", shape(values));
  detail::launch_top_k(impl_->ctx, x, values.cols, index.data, values);
}

void CudaBackend::sampling_sums(const Tensor& x, float temperature, Tensor sums) {
  constexpr const char* op = "sampling_sums";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "x", x);
  check_tensor(op, "sums", sums);
  require(sums.rows == x.rows && sums.cols == 1, op, "x ", shape(x), " needs sums [", x.rows, " x 1], got ",
          shape(sums));
  require(temperature > 0 && std::isfinite(temperature), op, "temperature must be > 0, got ", temperature);
  require(x.cols <= detail::sampling_sums_max_cols(), op, "x ", shape(x), " has more than ",
          detail::sampling_sums_max_cols(), " columns");
  detail::launch_sampling_sums(impl_->ctx, x, temperature, sums);
}

void CudaBackend::draw(const Tensor& x, float temperature, const Tensor& uniforms, Ids index) {
  constexpr const char* op = "draw";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "x", x);
  check_tensor(op, "uniforms", uniforms);
  require(uniforms.rows == x.rows && uniforms.cols == 1, op, "x ", shape(x), " needs uniforms [", x.rows,
          " x 1], got ", shape(uniforms));
  require(index.rows == x.rows && index.cols == 1 && (index.data || x.rows == 0), op, "x ", shape(x),
          " needs index [", x.rows, " x 1], got [", index.rows, " x ", index.cols, "]");
  require(temperature > 0 && std::isfinite(temperature), op, "temperature must be > 0, got ", temperature);
  require(x.cols <= detail::sampling_sums_max_cols(), op, "x ", shape(x), " has more than ",
          detail::sampling_sums_max_cols(), " columns");
  detail::launch_draw(impl_->ctx, x, temperature, uniforms, index.data);
}

ExpertTable& CudaBackend::Impl::expert_table(std::span<const ExpertWeights> experts) {
  std::vector<detail::ExpertEntry> host(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    const Weight* m[3] = {&experts[e].gate, &experts[e].up, &experts[e].down};
    detail::ExpertEntry& en = host[e];
    std::memset(&en, 0, sizeof(en));
    for (int i = 0; i < 3; ++i) {
      en.w[i] = m[i]->data;
      en.row_stride[i] = m[i]->row_stride;
      en.rows[i] = int32_t(m[i]->rows);
      en.cols[i] = int32_t(m[i]->cols);
      en.type[i] = int32_t(m[i]->type);
      en.act[i] = quant::has_kernels(m[i]->type)
                      ? int32_t(detail::act_quant(quant::kernels(m[i]->type).act))
                      : 0;
    }
  }
  ExpertTable& table = expert_tables[experts.data()];
  const size_t bytes = host.size() * sizeof(detail::ExpertEntry);
  if (table.device && table.host.size() == host.size() &&
      std::memcmp(table.host.data(), host.data(), bytes) == 0)
    return table;
  // New or changed: rebuild. The old copy is freed stream-ordered: queued kernels still read it.
  if (table.device) STRATA_CUDA_CHECK(cudaFreeAsync(table.device, ctx.stream));
  table = ExpertTable{};
  table.host = std::move(host);
  STRATA_CUDA_CHECK(cudaMallocAsync(&table.device, std::max<size_t>(bytes, 16), ctx.stream));
  STRATA_CUDA_CHECK(cudaMemcpyAsync(table.device, staging.put(table.host.data(), bytes), bytes,
                                    cudaMemcpyDeviceToDevice, ctx.stream));
  auto add_type = [](std::vector<quant::Type>& v, int32_t t) {
    if (std::find(v.begin(), v.end(), quant::Type(t)) == v.end()) v.push_back(quant::Type(t));
  };
  for (const detail::ExpertEntry& en : table.host) {
    if (!en.w[0]) continue;  // an expert the window cannot route to (absent from the table)
    add_type(table.gate_up_types, en.type[0]);
    add_type(table.gate_up_types, en.type[1]);
    add_type(table.down_types, en.type[2]);
    table.act_used[en.act[0]] = table.act_used[en.act[1]] = true;
    table.max_ff = std::max<int64_t>({table.max_ff, en.rows[0], en.rows[1]});
    table.max_cols = std::max<int64_t>(table.max_cols, en.cols[2]);
  }
  return table;
}

namespace {

// The checks of moe_experts / moe_expert_outputs on every expert the table holds (the routing is
// in device memory, so any of them may be chosen); done once per table and activation width.
void check_experts(const char* op, const CudaBackend::Impl& impl, const Tensor& x,
                   std::span<const ExpertWeights> experts, ExpertTable& table) {
  if (table.checked_cols == x.cols) return;
  for (size_t e = 0; e < experts.size(); ++e) {
    const ExpertWeights& ew = experts[e];
    if (!ew.gate.data && !ew.up.data && !ew.down.data) continue;  // not in this group
    cpu::check_weight(op, "gate", ew.gate);
    cpu::check_weight(op, "up", ew.up);
    cpu::check_weight(op, "down", ew.down);
    require(ew.gate.cols == x.cols && ew.up.cols == x.cols && ew.down.rows == x.cols &&
                ew.gate.rows == ew.up.rows && down_cols_fit(ew.down, ew.gate.rows),
            op, "expert ", e, " shapes gate [", ew.gate.rows, " x ", ew.gate.cols, "], up [",
            ew.up.rows, " x ", ew.up.cols, "], down [", ew.down.rows, " x ", ew.down.cols,
            "] do not fit x ", shape(x));
    for (const Weight* w : {&ew.gate, &ew.up, &ew.down}) {
      const char* name = w == &ew.gate ? "gate" : w == &ew.up ? "up" : "down";
      impl.check_device_weight(op, name, *w);
      const size_t align = detail::weight_alignment(w->type);
      require(align > 0 && reinterpret_cast<uintptr_t>(w->data) % align == 0 &&
                  w->row_stride % align == 0,
              op, "expert ", e, " ", name, ": the CUDA decoder of ", quant::type_name(w->type),
              " needs ", align, "-byte aligned rows");
    }
  }
  table.checked_cols = x.cols;
}

// One scratch allocation for the MoE kernels: the grouping (`slots` experts, none when 0), x in
// each layout the table needs, gate/up/hidden rows of n_listed pairs.
struct MoeScratch {
  MoeScratch(const CudaBackend::Impl& impl, const Tensor& x, const ExpertTable& table,
             int64_t n_experts, int64_t n_listed, int64_t slots) {
    const int64_t ff_stride = (std::max(table.max_ff, table.max_cols) + 3) / 4 * 4;
    const size_t ints = slots > 0 ? size_t(2 + 5 * slots + n_listed + n_experts) : 0;
    size_t bytes = (ints * 4 + 15) / 16 * 16;
    size_t x_off[3] = {};
    const bool x_direct = rows_aligned(x);
    for (int a = 0; a < 3; ++a)
      if (table.act_used[a] && !(a == 0 && x_direct)) {
        x_off[a] = bytes;
        bytes += size_t(x.rows * x.cols) * 4;
      }
    const size_t ff_off = bytes;
    bytes += 3 * size_t(n_listed * ff_stride) * 4;
    scratch.emplace(impl.ctx.stream, bytes);
    auto* base = scratch->as<uint8_t>();
    if (slots > 0) {
      auto* i32 = reinterpret_cast<int32_t*>(base);
      buf.n_active = i32;
      buf.n_chunks = i32 + 1;
      buf.active = i32 + 2;
      buf.first = buf.active + slots;
      buf.count = buf.first + slots;
      buf.chunk_first = buf.count + slots;
      buf.cursor = buf.chunk_first + slots;
      buf.items = buf.cursor + slots;
      buf.slot_of = buf.items + n_listed;
    }
    for (int a = 0; a < 3; ++a) {
      if (!table.act_used[a]) continue;
      const bool direct = a == 0 && x_direct;
      buf.x_act[a] = direct ? x.data : reinterpret_cast<float*>(base + x_off[a]);
      buf.x_act_stride[a] = direct ? x.stride : x.cols;
    }
    buf.gate = reinterpret_cast<float*>(base + ff_off);
    buf.up = buf.gate + n_listed * ff_stride;
    buf.hidden = buf.up + n_listed * ff_stride;
    buf.ff_stride = ff_stride;
  }
  std::optional<Scratch> scratch;
  detail::MoeBuffers buf{};
};

// Whether the MoE of this table and x runs on the integer mat-vec (every gate, up and down type
// has one). Then every window, whatever its rows, takes the same path: each pair's output is
// bitwise the CPU's, so T-row windows equal one-row windows.
bool integer_moe(const ExpertTable& table, const Tensor& x) {
  auto all_integer = [](const std::vector<quant::Type>& types) {
    return std::all_of(types.begin(), types.end(), cuda::has_matvec_q);
  };
  return rows_aligned(x) && all_integer(table.gate_up_types) && all_integer(table.down_types);
}

// out rows of the listed pairs (all pairs when `listed` is empty and `all` is set).
void expert_outputs(CudaBackend::Impl& impl, const Tensor& x, const Ids& routed,
                    std::span<const int64_t> pairs, bool all, const ExpertTable& table,
                    int64_t n_experts, Tensor out) {
  const int64_t n_listed = all ? routed.size() : int64_t(pairs.size());
  if (n_listed == 0) return;
  const int32_t* listed = nullptr;
  if (!all) {
    std::vector<int32_t> p32(pairs.begin(), pairs.end());
    listed = impl.staging.put(std::span<const int32_t>(p32));
  }
  const auto* entries = static_cast<const detail::ExpertEntry*>(table.device);
  if (integer_moe(table, x)) {
    const bool grouped = n_listed > detail::kMoeByPairMaxPairs;
    const MoeScratch s(impl, x, table, n_experts, n_listed,
                       grouped ? std::min(n_experts, n_listed) : 0);
    detail::launch_moe_expert_outputs_q(
        impl.ctx, entries, n_experts, routed.data, routed.cols, listed, n_listed, x,
        table.gate_up_types.data(), int(table.gate_up_types.size()), table.down_types.data(),
        int(table.down_types.size()), table.max_ff, table.max_cols, s.buf, out);
    return;
  }
  const MoeScratch s(impl, x, table, n_experts, n_listed, std::min(n_experts, n_listed));
  detail::launch_moe_expert_outputs(
      impl.ctx, entries, n_experts, routed.data, routed.cols, listed, n_listed, x,
      table.gate_up_types.data(), int(table.gate_up_types.size()), table.down_types.data(),
      int(table.down_types.size()), table.max_ff, s.buf, out);
}

}  // namespace

void CudaBackend::moe_expert_outputs(const Tensor& x, const Ids& experts,
                                     std::span<const int64_t> pairs,
                                     std::span<const ExpertWeights> table, Tensor out) {
  constexpr const char* op = "moe_expert_outputs";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "x", x);
  check_tensor(op, "out", out);
  check_routing(op, x.rows, &experts, nullptr);
  const int64_t n_pairs = x.rows * experts.cols;
  require(out.rows == n_pairs && out.cols == x.cols, op, "out ", shape(out), " is not [", n_pairs,
          " x ", x.cols, "] (one row per routed pair)");
  check_no_overlap(op, "x", x, "out", out);
  for (size_t i = 0; i < pairs.size(); ++i)
    require(pairs[i] >= 0 && pairs[i] < n_pairs && (i == 0 || pairs[i] > pairs[i - 1]), op,
            "pair ", pairs[i], " at position ", i, " is outside 0..", n_pairs - 1,
            " or not above the one before");
  ExpertTable& device_table = impl_->expert_table(table);
  check_experts(op, *impl_, x, table, device_table);
  expert_outputs(*impl_, x, experts, pairs, false, device_table, int64_t(table.size()), out);
}

void CudaBackend::moe_combine(const Tensor& weights, const Tensor& out, Tensor y) {
  constexpr const char* op = "moe_combine";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "out", out);
  check_tensor(op, "y", y);
  check_routing(op, y.rows, nullptr, &weights);
  const int64_t K = weights.cols;
  require(out.rows == y.rows * K && out.cols == y.cols, op, "out ", shape(out), " is not [",
          y.rows * K, " x ", y.cols, "] for y ", shape(y));
  check_no_overlap(op, "out", out, "y", y);
  impl_->combine(weights.data, K, out, y);
}

void CudaBackend::Impl::combine(const float* weights, int64_t top_k, const Tensor& out, Tensor y,
                                std::unique_ptr<Scratch> out_memory) {
  flush_combine();
  if (graphs.profiling()) return detail::launch_moe_combine(ctx, weights, top_k, out, y);
  pending_combine = PendingCombine{weights, top_k, out, y, std::move(out_memory)};
}

void CudaBackend::Impl::flush_combine() {
  if (!pending_combine) return;
  PendingCombine c = std::move(*pending_combine);
  pending_combine.reset();
  detail::launch_moe_combine(ctx, c.weights, c.top_k, c.out, c.y);
}

std::optional<CudaBackend::Impl::PendingCombine> CudaBackend::Impl::take_combine(const Tensor& y) {
  const bool same_y = pending_combine && pending_combine->y.data == y.data &&
                      pending_combine->y.rows == y.rows && pending_combine->y.cols == y.cols &&
                      pending_combine->y.stride == y.stride;
  if (!same_y) {
    flush_combine();
    return std::nullopt;
  }
  std::optional<PendingCombine> c = std::move(pending_combine);
  pending_combine.reset();
  return c;
}

void CudaBackend::moe_experts(const Tensor& x, const Ids& experts, const Tensor& weights,
                              std::span<const ExpertWeights> table, Tensor y) {
  constexpr const char* op = "moe_experts";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "x", x);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  check_no_overlap(op, "x", x, "y", y);
  check_routing(op, x.rows, &experts, &weights);
  if (x.rows == 0) return;
  ExpertTable& device_table = impl_->expert_table(table);
  check_experts(op, *impl_, x, table, device_table);
  const int64_t n_pairs = x.rows * experts.cols;
  // Decode windows of the fp32-decoding kernels: each pair on its own and the combine fused into
  // down (the same bits as the grouped kernels).
  if (x.rows <= detail::kMoeByPairMaxRows && device_table.down_types.size() == 1 &&
      !integer_moe(device_table, x)) {
    const MoeScratch s(*impl_, x, device_table, int64_t(table.size()), n_pairs, 0);
    detail::launch_moe_experts_by_pair(
        impl_->ctx, static_cast<const detail::ExpertEntry*>(device_table.device),
        int64_t(table.size()), experts.data, weights.data, experts.cols, x,
        device_table.gate_up_types.data(), int(device_table.gate_up_types.size()),
        device_table.down_types[0], device_table.max_ff, s.buf, y);
    return;
  }
  auto out = std::make_unique<Scratch>(impl_->ctx.stream, size_t(n_pairs * x.cols) * sizeof(float));
  const Tensor out_t{out->as<float>(), n_pairs, x.cols, x.cols};
  expert_outputs(*impl_, x, experts, {}, true, device_table, int64_t(table.size()), out_t);
  impl_->combine(weights.data, experts.cols, out_t, y, std::move(out));
}

}  // namespace strata::backend
