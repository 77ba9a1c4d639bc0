// CudaBackend's element-wise, norm, rope, attention, QSA and recurrent ops: the CPU backend's
// shape checks (same messages, so a bad call fails the same way on either backend), host spans
// staged to the device, then one launch (ops.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops_ssm.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend_impl.h"

namespace strata::backend {

namespace detail = cuda::detail;

namespace {

// Ids with one value per row of a tensor of `rows` rows (the values are device memory: the
// kernels keep out-of-range positions from touching memory outside the cache).
void check_row_ids(const char* op, const char* name, const Ids& ids, int64_t rows) {
  require(ids.size() == rows && (ids.data || rows == 0), op, name, " [", ids.rows, " x ", ids.cols,
          "] should hold one value per each of ", rows, " rows");
}

void check_f32_weight(const char* op, const Weight& w) {
  require(w.type == quant::Type::F32 && w.data, op, "the weight must be F32 with data");
}

// An element-wise op of one input: y has x's shape.
void check_unary(const char* op, const Tensor& x, const Tensor& y) {
  check_tensor(op, "x", x);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
}

// A norm of x's groups of `group` columns into y of x's shape.
void check_norm_groups(const char* op, const Tensor& x, int64_t group, const Tensor& y) {
  check_unary(op, x, y);
  require(group > 0 && x.cols % group == 0, op, "group ", group, " does not divide the ", x.cols,
          " columns of x");
}

// y = x * sigmoid(gate) and y += x * sigmoid(gate): gate has x's shape or one column.
void check_sigmoid_gate(const char* op, const Tensor& x, const Tensor& gate, const Tensor& y) {
  check_tensor(op, "x", x);
  check_tensor(op, "gate", gate);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  require(gate.rows == x.rows && (gate.cols == x.cols || gate.cols == 1), op, "gate ", shape(gate),
          " must be ", shape(x), " or [", x.rows, " x 1]");
}

// The gain of a norm over all of a row's `cols` columns: F32, one value a column, on this device.
void check_wide_norm_gain(const char* op, const CudaBackend::Impl& impl, const Weight& w,
                          int64_t cols) {
  check_f32_weight(op, w);
  require(w.rows * w.cols == cols, op, "the weight has ", w.rows * w.cols, " values but the rows have ",
          cols, " columns");
  impl.check_device_weight(op, "the weight", w);
}

// g = ssm_a * softplus(a + dt_bias): a and g [T, heads], dt_bias and ssm_a F32 [heads].
void check_decay(const char* op, const CudaBackend::Impl& impl, const Tensor& a,
                 const Weight& dt_bias, const Weight& ssm_a, const Tensor& g) {
  check_tensor(op, "a", a);
  check_tensor(op, "g", g);
  check_same_shape(op, "a", a, "g", g);
  for (const Weight* w : {&dt_bias, &ssm_a}) {
    check_f32_weight(op, *w);
    require(w->rows * w->cols == a.cols, op, "dt_bias and ssm_a need ", a.cols,
            " values (one per head), not ", w->rows * w->cols);
    impl.check_device_weight(op, w == &dt_bias ? "dt_bias" : "ssm_a", *w);
  }
}

}  // namespace

void CudaBackend::rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "rms_norm";
  check_norm_groups(op, x, group, y);
  const float* wf = nullptr;
  int64_t w_step = 0;  // 0: one gain for every group; group: a gain per column
  if (w) {
    check_f32_weight(op, *w);
    const int64_t values = w->rows * w->cols;
    require(values == group || values == x.cols, op, "the weight has ", values,
            " values but the group is ", group, " and x has ", x.cols, " columns");
    impl_->check_device_weight(op, "the weight", *w);
    wf = static_cast<const float*>(w->data);
    w_step = values == group ? 0 : group;
  }
  detail::launch_rms_norm(impl_->ctx, x, wf, w_step, group, eps, y);
}

void CudaBackend::l2_norm(const Tensor& x, int64_t group, float eps, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "l2_norm";
  check_norm_groups(op, x, group, y);
  detail::launch_l2_norm(impl_->ctx, x, group, eps, y);
}

void CudaBackend::qk_l2_norm(const Tensor& x, int64_t group, float eps, int64_t q_cols,
                             float q_scale, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "qk_l2_norm";
  check_norm_groups(op, x, group, y);
  require(q_cols >= 0 && q_cols <= x.cols, op, q_cols, " columns of q in x ", shape(x));
  detail::launch_l2_norm(impl_->ctx, x, group, eps, y, q_cols, q_scale);
}

void CudaBackend::rms_norm_gated(Tensor x, const Weight& w, int64_t group, float eps,
                                 const Tensor& gate, OutputGate kind) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "rms_norm_gated";
  check_norm_groups(op, x, group, x);
  check_tensor(op, "gate", gate);
  check_same_shape(op, "x", x, "gate", gate);
  check_no_overlap(op, "x", x, "gate", gate);
  check_f32_weight(op, w);
  require(w.rows * w.cols == group, op, "the weight has ", w.rows * w.cols,
          " values but the group is ", group);
  impl_->check_device_weight(op, "the weight", w);
  detail::launch_rms_norm(impl_->ctx, x, static_cast<const float*>(w.data), 0, group, eps, x,
                          {gate.data, gate.stride, kind});
}

void CudaBackend::signed_sqrt_dot(const Tensor& a, const Tensor& b, int64_t group, float scale,
                                  Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "signed_sqrt_dot";
  check_tensor(op, "a", a);
  check_tensor(op, "b", b);
  check_tensor(op, "y", y);
  check_same_shape(op, "a", a, "b", b);
  require(group > 0 && a.cols % group == 0 && y.rows == a.rows && y.cols == a.cols / group, op,
          "y ", shape(y), " should have one column per group of ", group, " of a ", shape(a));
  check_no_overlap(op, "a", a, "y", y);
  check_no_overlap(op, "b", b, "y", y);
  detail::launch_signed_sqrt_dot(impl_->ctx, a, b, group, scale, y);
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "add";
  check_tensor(op, "a", a);
  check_tensor(op, "b", b);
  check_tensor(op, "y", y);
  check_same_shape(op, "a", a, "b", b);
  check_same_shape(op, "a", a, "y", y);
  detail::launch_add(impl_->ctx, a, b, y);
}

void CudaBackend::add_rms_norm(Tensor x, const Tensor& delta, const Weight& w, float eps,
                               Tensor y) {
  if (!detail::fuses_wide_rms_norm(x.cols)) return Backend::add_rms_norm(x, delta, w, eps, y);
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "add_rms_norm";
  check_tensor(op, "x", x);
  check_tensor(op, "delta", delta);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "delta", delta);
  check_same_shape(op, "x", x, "y", y);
  check_wide_norm_gain(op, *impl_, w, x.cols);
  detail::launch_add_rms_norm(impl_->ctx, x, delta, static_cast<const float*>(w.data), eps, y);
}

void CudaBackend::scale(const Tensor& x, float s, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_unary("scale", x, y);
  detail::launch_scale(impl_->ctx, x, s, y);
}

void CudaBackend::mul_sigmoid(const Tensor& x, const Tensor& gate, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "mul_sigmoid";
  check_sigmoid_gate(op, x, gate, y);
  detail::launch_mul_sigmoid(impl_->ctx, x, gate, y);
}

void CudaBackend::add_mul_sigmoid(Tensor y, Tensor x, const Tensor& gate) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_sigmoid_gate("add_mul_sigmoid", x, gate, y);
  detail::launch_add_mul_sigmoid(impl_->ctx, y, x, gate);
}

void CudaBackend::add_mul_sigmoid_residual(Tensor residual, Tensor y, Tensor x, const Tensor& gate) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "add_mul_sigmoid_residual";
  check_sigmoid_gate(op, x, gate, y);
  check_tensor(op, "residual", residual);
  check_same_shape(op, "residual", residual, "y", y);
  check_no_overlap(op, "residual", residual, "y", y);
  check_no_overlap(op, "residual", residual, "x", x);
  detail::launch_add_mul_sigmoid(impl_->ctx, y, x, gate, &residual);
}

void CudaBackend::add_mul_sigmoid_residual_rms_norm(Tensor residual, Tensor y, Tensor x,
                                                    const Tensor& gate, const Weight& w, float eps,
                                                    Tensor normed) {
  if (!detail::fuses_wide_rms_norm(residual.cols))
    return Backend::add_mul_sigmoid_residual_rms_norm(residual, y, x, gate, w, eps, normed);
  if (impl_->graphs.replaying()) return;
  const std::optional<Impl::PendingCombine> combine = impl_->take_combine(y);
  impl_->graphs.count_op(__func__);
  constexpr const char* op = "add_mul_sigmoid_residual_rms_norm";
  check_sigmoid_gate(op, x, gate, y);
  check_tensor(op, "residual", residual);
  check_tensor(op, "normed", normed);
  check_same_shape(op, "residual", residual, "y", y);
  check_same_shape(op, "residual", residual, "normed", normed);
  check_no_overlap(op, "residual", residual, "y", y);
  check_no_overlap(op, "residual", residual, "x", x);
  // normed may be the residual itself (the norm in place), but no other operand
  if (normed.data != residual.data || normed.stride != residual.stride)
    check_no_overlap(op, "normed", normed, "residual", residual);
  check_no_overlap(op, "normed", normed, "y", y);
  check_no_overlap(op, "normed", normed, "x", x);
  check_no_overlap(op, "normed", normed, "gate", gate);
  check_wide_norm_gain(op, *impl_, w, residual.cols);
  if (combine)
    for (const Tensor* t : {&residual, &normed})
      check_no_overlap(op, "the MoE's outputs", combine->out, "an output", *t);
  detail::launch_add_mul_sigmoid_rms_norm(impl_->ctx, residual, y, x, gate,
                                          static_cast<const float*>(w.data), eps, normed,
                                          combine ? combine->weights : nullptr,
                                          combine ? combine->top_k : 0,
                                          combine ? combine->out : Tensor{});
}

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "swiglu";
  check_tensor(op, "gate", gate);
  check_tensor(op, "up", up);
  check_tensor(op, "y", y);
  check_same_shape(op, "gate", gate, "up", up);
  check_same_shape(op, "gate", gate, "y", y);
  detail::launch_swiglu(impl_->ctx, gate, up, y);
}

void CudaBackend::scaled_silu(const Tensor& x, float s, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_unary("scaled_silu", x, y);
  detail::launch_scaled_silu(impl_->ctx, x, s, y);
}

void CudaBackend::mean_mul_sigmoid_streams(const Tensor& x, Tensor gate, int64_t streams,
                                           Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "mean_mul_sigmoid_streams";
  check_tensor(op, "x", x);
  check_tensor(op, "gate", gate);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "gate", gate);
  require(streams >= 1 && y.cols >= 1 && y.rows == x.rows && x.cols == streams * y.cols, op, "y ",
          shape(y), " is not one of the ", streams, " streams of ", shape(x));
  check_no_overlap(op, "x", x, "y", y);
  check_no_overlap(op, "gate", gate, "y", y);
  detail::launch_mean_mul_sigmoid_streams(impl_->ctx, x, gate, streams, y);
}

void CudaBackend::inject_streams(Tensor x, const Tensor& out, Tensor logits, float logit_scale) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "inject_streams";
  check_tensor(op, "x", x);
  check_tensor(op, "out", out);
  check_tensor(op, "logits", logits);
  const int64_t streams = logits.cols;
  require(streams >= 1 && out.cols >= 1 && out.rows == x.rows && x.cols == streams * out.cols, op,
          "out ", shape(out), " is not one of the ", streams, " streams of ", shape(x));
  require(logits.rows == x.rows, op, "logits ", shape(logits), " need one row per row of x ",
          shape(x));
  check_no_overlap(op, "x", x, "out", out);
  check_no_overlap(op, "x", x, "logits", logits);
  detail::launch_inject_streams(impl_->ctx, x, out, logits, logit_scale);
}

void CudaBackend::split_groups(const Tensor& x, int64_t n_groups, std::span<const int64_t> widths,
                               std::span<Tensor> outs) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "split_groups";
  check_tensor(op, "x", x);
  require(widths.size() == outs.size() && !widths.empty(), op, widths.size(), " widths for ",
          outs.size(), " outputs");
  require(widths.size() <= size_t(detail::kMaxSplitParts), op, widths.size(),
          " parts; the CUDA backend splits into at most ", detail::kMaxSplitParts);
  require(n_groups > 0, op, "n_groups must be positive, not ", n_groups);
  int64_t group = 0;
  detail::SplitParts parts;
  parts.n = int(widths.size());
  for (size_t i = 0; i < widths.size(); ++i) {
    require(widths[i] > 0, op, "width ", i, " is ", widths[i]);
    check_tensor(op, "an output", outs[i]);
    require(outs[i].rows == x.rows && outs[i].cols == n_groups * widths[i], op, "output ", i, " ",
            shape(outs[i]), " should be [", x.rows, " x ", n_groups * widths[i], "]");
    require(!overlaps(x, outs[i]), op, "output ", i, " overlaps x");
    group += widths[i];
    parts.width[i] = widths[i];
    parts.out[i] = outs[i].data;
    parts.out_stride[i] = outs[i].stride;
  }
  require(group * n_groups == x.cols, op, n_groups, " groups of ", group, " columns do not make x ",
          shape(x));
  detail::launch_split_groups(impl_->ctx, x, n_groups, parts);
}

void CudaBackend::rope_neox(Tensor x, const Ids& positions, int64_t head_dim, int64_t rope_dim,
                            float theta) {
  constexpr const char* op = "rope_neox";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "x", x);
  check_row_ids(op, "positions", positions, x.rows);
  require(head_dim > 0 && x.cols % head_dim == 0, op, "head_dim ", head_dim,
          " does not divide the ", x.cols, " columns of x");
  require(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= head_dim, op, "rope_dim ", rope_dim,
          " must be even and within head_dim ", head_dim);
  require(theta > 0.0f, op, "theta must be positive, not ", theta);
  detail::launch_rope_neox(impl_->ctx, x, positions.data, impl_->rope_inv_freq(theta, rope_dim),
                           head_dim, rope_dim);
}

const float* CudaBackend::Impl::rope_inv_freq(float theta, int64_t rope_dim) {
  auto it = rope_tables.find({theta, rope_dim});
  if (it != rope_tables.end()) return it->second.as<float>();
  // The CPU's own fp32 inverse frequencies (ops_rope.cpp).
  std::vector<float> inv_freq(size_t(rope_dim / 2));
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    const float exponent = float(2 * i) / float(rope_dim);
    inv_freq[size_t(i)] = 1.0f / float(std::pow(double(theta), double(exponent)));
  }
  cuda::DeviceBuffer table(inv_freq.size() * sizeof(float));
  device.upload(table.data(), inv_freq.data(), inv_freq.size() * sizeof(float));
  return rope_tables.emplace(std::make_pair(theta, rope_dim), std::move(table))
      .first->second.as<float>();
}

void CudaBackend::set_rows(const Tensor& src, const Ids& rows, Tensor dst) {
  constexpr const char* op = "set_rows";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "src", src);
  check_tensor(op, "dst", dst);
  require(src.cols == dst.cols, op, "src ", shape(src), " and dst ", shape(dst), " differ in width");
  check_row_ids(op, "rows", rows, src.rows);
  check_no_overlap(op, "src", src, "dst", dst);
  detail::launch_set_rows(impl_->ctx, src, rows.data, dst);
}

namespace {

// The checks of kv_write on one sequence's rows and caches.
void check_kv_write(const char* op, const Tensor& k_cache, const Tensor& v_cache, const Tensor& k,
                    const Tensor& v, const Ids& positions) {
  check_tensor(op, "k_cache", k_cache);
  check_tensor(op, "v_cache", v_cache);
  check_tensor(op, "k", k);
  check_tensor(op, "v", v);
  require(k.cols == k_cache.cols, op, "k ", shape(k), " and k_cache ", shape(k_cache),
          " differ in width");
  require(v.cols == v_cache.cols, op, "v ", shape(v), " and v_cache ", shape(v_cache),
          " differ in width");
  require(k.rows == v.rows, op, "k has ", k.rows, " rows, v ", v.rows);
  check_row_ids(op, "positions", positions, k.rows);
}

}  // namespace

void CudaBackend::kv_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v,
                           const Ids& positions) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_kv_write("kv_write", k_cache, v_cache, k, v, positions);
  const SequenceCache whole[] = {{0, k.rows, k_cache, v_cache}};
  detail::launch_kv_write(impl_->ctx, whole, k, v, positions.data);
}

void CudaBackend::kv_write_sequences(std::span<const SequenceCache> sequences, const Tensor& k,
                                     const Tensor& v, const Ids& positions) {
  constexpr const char* op = "kv_write_sequences";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_sequences(op, k.rows, sequences);
  check_row_ids(op, "positions", positions, k.rows);
  for (const SequenceCache& s : sequences)
    check_kv_write(op, s.k_cache, s.v_cache, k.rows_view(s.first, s.rows), v.rows_view(s.first, s.rows),
                   positions.rows_view(s.first, s.rows));
  detail::launch_kv_write(impl_->ctx, sequences, k, v, positions.data);
}

namespace {

void check_attention(const char* op, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     int64_t n_head, int64_t n_head_kv, int64_t head_dim, const Tensor& y) {
  check_tensor(op, "q", q);
  check_tensor(op, "k_cache", k_cache);
  check_tensor(op, "v_cache", v_cache);
  check_tensor(op, "y", y);
  require(n_head > 0 && n_head_kv > 0 && head_dim > 0 && n_head % n_head_kv == 0, op, "n_head ",
          n_head, " must be a positive multiple of n_head_kv ", n_head_kv, " (head_dim ", head_dim,
          ")");
  require(head_dim <= detail::kMaxHeadDim, op, "head_dim ", head_dim,
          " exceeds the CUDA backend's ", detail::kMaxHeadDim);
  require(q.cols == n_head * head_dim, op, "q ", shape(q), " should have ", n_head, " x ", head_dim,
          " columns");
  require(k_cache.cols == n_head_kv * head_dim && v_cache.cols == k_cache.cols, op, "k_cache ",
          shape(k_cache), " and v_cache ", shape(v_cache), " should have ", n_head_kv, " x ",
          head_dim, " columns");
  check_same_shape(op, "q", q, "y", y);
  check_no_overlap(op, "q", q, "y", y);
  check_no_overlap(op, "k_cache", k_cache, "y", y);
  check_no_overlap(op, "v_cache", v_cache, "y", y);
}

}  // namespace

void CudaBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                            const Ids& positions, int64_t n_head, int64_t n_head_kv,
                            int64_t head_dim, float scale, Tensor y) {
  constexpr const char* op = "attention";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_row_ids(op, "positions", positions, q.rows);
  check_attention(op, q, k_cache, v_cache, n_head, n_head_kv, head_dim, y);
  detail::AttendRows rows;
  rows.positions = positions.data;
  const SequenceCache whole[] = {{0, q.rows, k_cache, v_cache}};
  detail::launch_attention(impl_->ctx, q, whole, rows, n_head, n_head_kv, head_dim, scale, y);
}

void CudaBackend::attention_sequences(const Tensor& q, std::span<const SequenceCache> sequences,
                                      const Ids& positions, int64_t n_head, int64_t n_head_kv,
                                      int64_t head_dim, float scale, Tensor y) {
  constexpr const char* op = "attention_sequences";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_sequences(op, q.rows, sequences);
  check_row_ids(op, "positions", positions, q.rows);
  for (const SequenceCache& s : sequences)
    check_attention(op, q.rows_view(s.first, s.rows), s.k_cache, s.v_cache, n_head, n_head_kv,
                    head_dim, y.rows_view(s.first, s.rows));
  detail::AttendRows rows;
  rows.positions = positions.data;
  detail::launch_attention(impl_->ctx, q, sequences, rows, n_head, n_head_kv, head_dim, scale, y);
}

void CudaBackend::attention_selected(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                     const Ids& selected, const Ids& counts, int64_t n_head,
                                     int64_t n_head_kv, int64_t head_dim, float scale, Tensor y) {
  constexpr const char* op = "attention_selected";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_row_ids(op, "counts", counts, q.rows);
  require(selected.rows == q.rows && (selected.data || q.rows == 0), op, "selected [",
          selected.rows, " x ", selected.cols, "] should have one row per each of ", q.rows,
          " rows");
  check_attention(op, q, k_cache, v_cache, n_head, n_head_kv, head_dim, y);
  detail::AttendRows rows;
  rows.selected = selected.data;
  rows.stride = selected.cols;
  rows.counts = counts.data;
  const SequenceCache whole[] = {{0, q.rows, k_cache, v_cache}};
  detail::launch_attention(impl_->ctx, q, whole, rows, n_head, n_head_kv, head_dim, scale, y);
}

void CudaBackend::block_scores(const Tensor& q, const Tensor& keys, const Ids& positions,
                               int64_t block, int64_t n_head, int64_t head_dim, float scale,
                               Tensor y) {
  constexpr const char* op = "block_scores";
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_tensor(op, "q", q);
  check_tensor(op, "keys", keys);
  check_tensor(op, "y", y);
  require(n_head > 0 && head_dim > 0 && q.cols == n_head * head_dim && keys.cols == head_dim, op,
          "q ", shape(q), " and keys ", shape(keys), " do not fit ", n_head, " heads of ",
          head_dim);
  require(block > 0, op, "block size ", block);
  require(y.rows == q.rows, op, "y ", shape(y), " for ", q.rows, " rows");
  check_row_ids(op, "positions", positions, q.rows);
  require(keys.rows >= y.cols, op, "y has ", y.cols, " columns but there are only ", keys.rows,
          " keys");
  check_no_overlap(op, "q", q, "y", y);
  check_no_overlap(op, "keys", keys, "y", y);
  detail::launch_block_scores(impl_->ctx, q, keys, nullptr, positions.data, block, n_head,
                              head_dim, scale, y);
}

void CudaBackend::block_mean(const Tensor& x, const Ids& firsts, int64_t block, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "block_mean";
  check_tensor(op, "x", x);
  check_tensor(op, "y", y);
  require(block > 0 && x.cols == y.cols, op, "x ", shape(x), " and y ", shape(y),
          " do not fit blocks of ", block);
  check_row_ids(op, "firsts", firsts, y.rows);
  check_no_overlap(op, "x", x, "y", y);
  detail::launch_block_mean(impl_->ctx, x, firsts.data, block, y);
}

void CudaBackend::qsa_select(const Tensor& scores, const Ids& positions, int64_t block,
                             int64_t top_blocks, Ids selected, Ids counts) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "qsa_select";
  check_tensor(op, "scores", scores);
  const int64_t T = scores.rows;
  require(block > 0 && top_blocks >= 0, op, "block ", block, " and top_blocks ", top_blocks,
          " must be positive");
  require(positions.data && positions.size() == T && counts.data && counts.size() == T, op,
          "positions [", positions.rows, " x ", positions.cols, "] and counts [", counts.rows,
          " x ", counts.cols, "] should hold one value per row of scores ", shape(scores));
  require(selected.data && selected.rows == T && selected.cols >= top_blocks * block + block - 1,
          op, "selected [", selected.rows, " x ", selected.cols, "] should be [", T, " x >= ",
          top_blocks * block + block - 1, "]");
  detail::launch_qsa_select(impl_->ctx, scores, positions.data, block, top_blocks, selected.data,
                            selected.cols, counts.data);
}

void CudaBackend::conv1d_silu(const Tensor& x, Tensor state, const Weight& w, Tensor y) {
  conv1d_dilated_silu(x, state, w, 1, y);
}

namespace {

// The checks of conv1d_dilated_silu on x and one state.
void check_conv_state(const CudaBackend::Impl& impl, const char* op, const Tensor& x,
                      const Tensor& state, const Weight& w, int64_t dilation) {
  require(dilation >= 1, op, "dilation ", dilation, " must be >= 1");
  check_tensor(op, "x", x);
  check_tensor(op, "state", state);
  check_f32_weight(op, w);
  require(w.rows == x.cols && w.cols >= 1, op, "the weight [", w.rows, " x ", w.cols,
          "] should have one row per channel of x ", shape(x));
  require(w.row_stride == size_t(w.cols) * 4, op, "the weight rows must be contiguous");
  impl.check_device_weight(op, "the weight", w);
  const int64_t S = (w.cols - 1) * dilation;
  require(state.rows == S && state.cols == x.cols, op, "state ", shape(state), " should be [", S,
          " x ", x.cols, "]");
  check_no_overlap(op, "state", state, "x", x);
}

// ... and on y.
void check_conv(const CudaBackend::Impl& impl, const char* op, const Tensor& x, const Tensor& state,
                const Weight& w, int64_t dilation, const Tensor& y) {
  check_conv_state(impl, op, x, state, w, dilation);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  check_no_overlap(op, "x", x, "y", y);
  check_no_overlap(op, "state", state, "y", y);
}

// The checks of gated_delta_rule on one state: how value heads read q/k heads.
QkHeadMap check_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                     const Tensor& beta, const Tensor& state, int64_t n_heads, HeadRepeat repeat,
                     const Tensor& y) {
  const QkHeadMap map = cpu::check_delta_rule(q, k, v, g, beta, state, n_heads, repeat, y);
  for (const Tensor* in : std::initializer_list<const Tensor*>{&q, &k, &v, &g, &beta})
    require(!overlaps(*in, state), "gated_delta_rule", "the state overlaps an input");
  return map;
}

}  // namespace

void CudaBackend::conv1d_dilated_silu(const Tensor& x, Tensor state, const Weight& w,
                                      int64_t dilation, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_conv(*impl_, "conv1d_silu", x, state, w, dilation, y);
  const SequenceState whole[] = {{0, x.rows, state}};
  detail::launch_conv1d_silu(impl_->ctx, x, whole, static_cast<const float*>(w.data), w.cols,
                             dilation, y);
}

void CudaBackend::conv1d_silu_sequences(const Tensor& x, std::span<const SequenceState> sequences,
                                        const Weight& w, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "conv1d_silu_sequences";
  check_sequences(op, x.rows, sequences);
  for (const SequenceState& s : sequences)
    check_conv(*impl_, op, x.rows_view(s.first, s.rows), s.state, w, 1, y.rows_view(s.first, s.rows));
  detail::launch_conv1d_silu(impl_->ctx, x, sequences, static_cast<const float*>(w.data), w.cols, 1, y);
}

void CudaBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& g, const Tensor& beta, Tensor state,
                                   int64_t n_heads, HeadRepeat repeat, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  const QkHeadMap map = check_rule(q, k, v, g, beta, state, n_heads, repeat, y);
  const SequenceState whole[] = {{0, q.rows, state}};
  detail::launch_gated_delta_rule(impl_->ctx, q, k, v, g, beta, whole, n_heads, map.div, map.mod, y);
}

void CudaBackend::gated_delta_rule_sequences(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& g, const Tensor& beta,
                                             std::span<const SequenceState> sequences,
                                             int64_t n_heads, HeadRepeat repeat, Tensor y) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_sequences("gated_delta_rule_sequences", q.rows, sequences);
  QkHeadMap map{};
  for (const SequenceState& s : sequences) {
    const auto rows = [&s](const Tensor& t) { return t.rows_view(s.first, s.rows); };
    map = check_rule(rows(q), rows(k), rows(v), rows(g), rows(beta), s.state, n_heads, repeat, rows(y));
  }
  detail::launch_gated_delta_rule(impl_->ctx, q, k, v, g, beta, sequences, n_heads, map.div,
                                  map.mod, y);
}

void CudaBackend::ssm_decay(const Tensor& a, const Weight& dt_bias, const Weight& ssm_a, Tensor g) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  check_decay("ssm_decay", *impl_, a, dt_bias, ssm_a, g);
  detail::launch_ssm_decay(impl_->ctx, a, static_cast<const float*>(dt_bias.data),
                           static_cast<const float*>(ssm_a.data), g);
}

void CudaBackend::ssm_gates(const Tensor& b, const Tensor& a, const Weight& dt_bias,
                            const Weight& ssm_a, Tensor beta, Tensor g) {
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "ssm_gates";
  check_decay(op, *impl_, a, dt_bias, ssm_a, g);
  check_tensor(op, "b", b);
  check_tensor(op, "beta", beta);
  check_same_shape(op, "a", a, "b", b);
  check_same_shape(op, "a", a, "beta", beta);
  detail::launch_ssm_gates(impl_->ctx, b, a, static_cast<const float*>(dt_bias.data),
                           static_cast<const float*>(ssm_a.data), beta, g);
}

namespace {

// STRATA_CUDA_DELTA_NET_KERNEL=0 runs the recurrence op by op (A/B in one binary).
bool delta_net_kernel_enabled() {
  static const bool enabled = detail::env_switch_on("STRATA_CUDA_DELTA_NET_KERNEL");
  return enabled;
}

}  // namespace

void CudaBackend::delta_net_recurrence(const DeltaNetRecurrence& r, Tensor y) {
  const int64_t key_dim = (r.qkv.cols - y.cols) / 2;
  int64_t most_rows = 0;
  for (const SequenceState& s : r.ssm_states) most_rows = std::max(most_rows, s.rows);
  // The choice depends on shapes alone, so a recorded window's replay takes the branch its
  // capture took (the ops one by one allocate their intermediates).
  if (!delta_net_kernel_enabled() || r.n_heads <= 0 || y.cols != r.n_heads * r.state ||
      !detail::delta_net_recurrence_fits(r.state, key_dim, r.n_heads, most_rows))
    return Backend::delta_net_recurrence(r, y);
  if (impl_->graphs.replaying()) return;
  impl_->begin_op(__func__);
  constexpr const char* op = "delta_net_recurrence";
  const int64_t T = r.qkv.rows;
  check_tensor(op, "qkv", r.qkv);
  check_tensor(op, "y", y);
  require(y.rows == T && 2 * key_dim + y.cols == r.qkv.cols, op, "qkv ", shape(r.qkv),
          " is not q, k and the values of y ", shape(y));
  check_tensor(op, "z", r.z);
  check_same_shape(op, "y", y, "z", r.z);
  // Split from ba, b and a are checked as the views of its first and last n_heads columns (each
  // as long and as far apart as theirs, and between them all of ba).
  const int64_t per_group = r.ba_groups > 0 ? r.n_heads / r.ba_groups : r.n_heads;
  check_delta_net_ba(r, T);
  const Tensor b = r.ba_groups > 0 ? r.ba.cols_view(0, r.n_heads) : r.b;
  const Tensor a = r.ba_groups > 0 ? r.ba.cols_view(r.n_heads, r.n_heads) : r.a;
  check_decay(op, *impl_, a, *r.dt_bias, *r.ssm_a, b);
  require(a.rows == T && a.cols == r.n_heads, op, "a ", shape(a), " should be [", T, " x ",
          r.n_heads, "]");
  check_f32_weight(op, *r.norm);
  require(r.norm->rows * r.norm->cols == r.state, op, "the norm has ", r.norm->rows * r.norm->cols,
          " values but the state is ", r.state);
  impl_->check_device_weight(op, "the norm", *r.norm);
  check_sequences(op, T, r.ssm_states);
  check_sequences(op, T, r.conv_states);
  require(r.conv_states.size() == r.ssm_states.size(), op, r.conv_states.size(), " conv states for ",
          r.ssm_states.size(), " sequences");
  std::vector<detail::DeltaNetSequence> sequences;
  for (size_t i = 0; i < r.ssm_states.size(); ++i) {
    const SequenceState& c = r.conv_states[i];
    const SequenceState& s = r.ssm_states[i];
    require(c.first == s.first && c.rows == s.rows, op, "sequence ", i, "'s conv and delta-rule rows differ");
    require(c.state.stride == r.conv_states[0].state.stride, op, "sequence ", i,
            "'s conv state has another row stride than the first's");
    const auto rows = [&s](const Tensor& t) { return t.rows_view(s.first, s.rows); };
    // The checks of the ops this one stands for, on tensors of their operands' shapes.
    check_conv_state(*impl_, op, rows(r.qkv), c.state, *r.conv, 1);
    check_rule(rows(r.qkv).cols_view(0, key_dim), rows(r.qkv).cols_view(key_dim, key_dim),
               rows(r.qkv).cols_view(2 * key_dim, y.cols), rows(a), rows(b), s.state, r.n_heads,
               r.repeat, rows(y));
    require(!overlaps(c.state, y) && !overlaps(c.state, r.z) && !overlaps(s.state, r.z), op,
            "a state overlaps y or z");
    sequences.push_back({s.first, s.rows, c.state.data, s.state.data});
  }
  for (const Tensor* in : {&r.qkv, &b, &a, &r.z})
    require(!overlaps(*in, y), op, "y overlaps an input");
  detail::DeltaNetLaunch p;
  p.qkv = r.qkv.data, p.qkv_stride = r.qkv.stride, p.key_dim = key_dim;
  p.conv = static_cast<const float*>(r.conv->data), p.taps = r.conv->cols;
  p.conv_stride = r.conv_states.empty() ? 0 : r.conv_states[0].state.stride;
  p.b = b.data, p.b_stride = b.stride, p.a = r.ba_groups > 0 ? r.ba.data + per_group : a.data;
  p.a_stride = a.stride;
  p.gate_group = per_group, p.gate_group_stride = r.ba_groups > 0 ? 2 * per_group : per_group;
  p.dt_bias = static_cast<const float*>(r.dt_bias->data);
  p.ssm_a = static_cast<const float*>(r.ssm_a->data);
  p.n_heads = r.n_heads, p.state = r.state, p.interleaved = r.repeat == HeadRepeat::Interleaved;
  p.l2_eps = r.l2_eps, p.q_scale = r.q_scale;
  p.norm = static_cast<const float*>(r.norm->data), p.norm_eps = r.norm_eps;
  p.z = r.z.data, p.z_stride = r.z.stride, p.gate = r.gate;
  p.y = y.data, p.y_stride = y.stride;
  detail::launch_delta_net_recurrence(impl_->ctx, p, sequences);
}

}  // namespace strata::backend
