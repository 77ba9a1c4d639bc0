#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/ops_argmax.h"
#include "backend/cpu/ops_sampling_sums.h"
#include "backend/cpu/ops_top_k.h"
#include "backend/cpu/ops_attention.h"
#include "backend/cpu/ops_elementwise.h"
#include "backend/cpu/ops_matmul.h"
#include "backend/cpu/ops_moe.h"
#include "backend/cpu/ops_norm.h"
#include "backend/cpu/ops_qsa.h"
#include "backend/cpu/ops_rope.h"
#include "backend/cpu/ops_ssm.h"
#include "gguf/gguf.h"
#include "util/error.h"

namespace strata::backend {

namespace {

constexpr size_t kAlign = 64;

void* alloc_zeroed(size_t bytes, const char* what, int64_t rows, int64_t cols) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) fail(what, ": out of memory for [", rows, " x ", cols, "] (", bytes, " bytes)");
  std::memset(p, 0, rounded);
  return p;
}

std::span<const int32_t> values(const Ids& ids) { return {ids.data, size_t(ids.size())}; }

// The host Routing the CPU MoE ops take, from the routing in backend (here: host) memory: the
// experts, the weights (null: the op reads none), or both.
Routing host_routing(const char* op, const Ids& experts, const Tensor* weights) {
  if (weights) cpu::check_tensor(op, "weights", *weights);
  if (weights && experts.data && (weights->rows != experts.rows || weights->cols != experts.cols))
    fail(op, ": experts [", experts.rows, " x ", experts.cols, "] and weights ",
         cpu::shape(*weights), " differ in shape");
  Routing r;
  r.top_k = weights ? weights->cols : experts.cols;
  if (experts.data) r.experts.assign(experts.data, experts.data + experts.size());
  if (weights)
    for (int64_t i = 0; i < weights->rows; ++i)
      r.weights.insert(r.weights.end(), weights->data + i * weights->stride,
                       weights->data + i * weights->stride + weights->cols);
  return r;
}

}  // namespace

CpuBackend::CpuBackend(int n_threads) : pool_(n_threads) {}

CpuBackend::~CpuBackend() {
  for (void* p : allocations_) std::free(p);
}

Tensor CpuBackend::alloc(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) fail("alloc: bad shape [", rows, " x ", cols, "]");
  auto* p = static_cast<float*>(
      alloc_zeroed(size_t(rows) * size_t(cols) * sizeof(float), "alloc", rows, cols));
  allocations_.insert(p);
  return {p, rows, cols, cols};
}

Ids CpuBackend::alloc_ids(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) fail("alloc_ids: bad shape [", rows, " x ", cols, "]");
  auto* p = static_cast<int32_t*>(
      alloc_zeroed(size_t(rows) * size_t(cols) * sizeof(int32_t), "alloc_ids", rows, cols));
  allocations_.insert(p);
  return {p, rows, cols};
}

void CpuBackend::release_ids(Ids t) {
  if (allocations_.erase(t.data) == 0)
    fail("release_ids: ids [", t.rows, " x ", t.cols,
         "] were not allocated by this backend (or are a view)");
  std::free(t.data);
}

void CpuBackend::upload_ids(const int32_t* host, Ids dst) {
  if (dst.size() > 0) std::memcpy(dst.data, host, size_t(dst.size()) * sizeof(int32_t));
}

void CpuBackend::download_ids(const Ids& src, int32_t* host) {
  if (src.size() > 0) std::memcpy(host, src.data, size_t(src.size()) * sizeof(int32_t));
}

void CpuBackend::release(Tensor t) {
  if (allocations_.erase(t.data) == 0)
    fail("release: tensor ", cpu::shape(t), " was not allocated by this backend (or is a view)");
  std::free(t.data);
}

void CpuBackend::upload(const float* host, Tensor dst) {
  cpu::check_tensor("upload", "dst", dst);
  for (int64_t r = 0; r < dst.rows; ++r)
    std::memcpy(dst.data + r * dst.stride, host + r * dst.cols, size_t(dst.cols) * 4);
}

void CpuBackend::download(const Tensor& src, float* host) {
  cpu::check_tensor("download", "src", src);
  for (int64_t r = 0; r < src.rows; ++r)
    std::memcpy(host + r * src.cols, src.data + r * src.stride, size_t(src.cols) * 4);
}

void CpuBackend::fill(Tensor t, float value) { cpu::fill(t, value); }
void CpuBackend::copy(const Tensor& src, Tensor dst) { cpu::copy(src, dst); }
void CpuBackend::set_rows(const Tensor& src, const Ids& rows, Tensor dst) {
  cpu::set_rows(src, values(rows), dst);
}

Weight CpuBackend::weight(const gguf::TensorInfo& tensor, int64_t slice) {
  const size_t dims = tensor.shape.size();
  if (dims < 1 || dims > 3)
    fail("weight ", tensor.name, ": shape ", tensor.shape_string(),
         " is not a vector, a matrix or a stack of matrices");
  if (!tensor.data) fail("weight ", tensor.name, ": the tensor has no data (not mapped)");
  const int64_t n_slices = dims == 3 ? tensor.shape[2] : 1;
  if (slice < 0 || slice >= n_slices)
    fail("weight ", tensor.name, ": slice ", slice, " is outside ", tensor.shape_string(), " (",
         n_slices, " slice", n_slices == 1 ? "" : "s", ")");
  Weight w;
  w.type = tensor.type;
  w.cols = tensor.shape[0];
  w.rows = dims >= 2 ? tensor.shape[1] : 1;
  w.row_stride = tensor.row_stride();
  w.data = tensor.data + size_t(slice) * size_t(w.rows) * w.row_stride;
  return w;
}

void CpuBackend::get_rows(const Weight& table, const Ids& ids, Tensor y) {
  cpu::get_rows(table, values(ids), y);
}
void CpuBackend::matmul(const Weight& w, const Tensor& x, Tensor y) {
  cpu::matmul(pool_, ws_, w, x, y);
}
void CpuBackend::rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor y) {
  cpu::rms_norm(pool_, x, w, group, eps, y);
}
void CpuBackend::l2_norm(const Tensor& x, int64_t group, float eps, Tensor y) {
  cpu::l2_norm(pool_, x, group, eps, y);
}
void CpuBackend::signed_sqrt_dot(const Tensor& a, const Tensor& b, int64_t group, float scale,
                                 Tensor y) {
  cpu::signed_sqrt_dot(pool_, a, b, group, scale, y);
}
void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor y) { cpu::add(a, b, y); }
void CpuBackend::scale(const Tensor& x, float s, Tensor y) { cpu::scale(x, s, y); }
void CpuBackend::mul_sigmoid(const Tensor& x, const Tensor& gate, Tensor y) {
  cpu::mul_sigmoid(x, gate, y);
}
void CpuBackend::swiglu(const Tensor& gate, const Tensor& up, Tensor y) {
  cpu::swiglu(pool_, gate, up, y);
}
void CpuBackend::split_groups(const Tensor& x, int64_t n_groups, std::span<const int64_t> widths,
                              std::span<Tensor> outs) {
  cpu::split_groups(x, n_groups, widths, outs);
}
void CpuBackend::rope_neox(Tensor x, const Ids& positions, int64_t head_dim, int64_t rope_dim,
                           float theta) {
  cpu::rope_neox(x, values(positions), head_dim, rope_dim, theta);
}
void CpuBackend::kv_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v,
                          const Ids& positions) {
  cpu::kv_write(k_cache, v_cache, k, v, values(positions));
}
void CpuBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           const Ids& positions, int64_t n_head, int64_t n_head_kv,
                           int64_t head_dim, float scale, Tensor y) {
  cpu::attention(pool_, q, k_cache, v_cache, values(positions), n_head, n_head_kv, head_dim,
                 scale, y);
}
void CpuBackend::attention_selected(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                    const Ids& selected, const Ids& counts, int64_t n_head,
                                    int64_t n_head_kv, int64_t head_dim, float scale, Tensor y) {
  if (selected.rows != q.rows)
    fail("attention_selected: selected has ", selected.rows, " rows for ", q.rows, " queries");
  cpu::attention_selected(pool_, q, k_cache, v_cache, selected.data, selected.cols,
                          values(counts), n_head, n_head_kv, head_dim, scale, y);
}
void CpuBackend::block_scores(const Tensor& q, const Tensor& keys, const Ids& positions,
                              int64_t block, int64_t n_head, int64_t head_dim, float scale,
                              Tensor y) {
  cpu::block_scores(pool_, q, keys, values(positions), block, n_head, head_dim, scale, y);
}
void CpuBackend::block_mean(const Tensor& x, const Ids& firsts, int64_t block, Tensor y) {
  cpu::block_mean(x, values(firsts), block, y);
}
void CpuBackend::qsa_select(const Tensor& scores, const Ids& positions, int64_t block,
                            int64_t top_blocks, Ids selected, Ids counts) {
  if (selected.rows != scores.rows)
    fail("qsa_select: selected has ", selected.rows, " rows for ", scores.rows, " rows of scores");
  cpu::qsa_select(scores, values(positions), block, top_blocks, selected.data, selected.cols,
                  {counts.data, size_t(counts.size())});
}
void CpuBackend::conv1d_silu(const Tensor& x, Tensor state, const Weight& w, Tensor y) {
  cpu::conv1d_silu(pool_, x, state, w, 1, y);
}
void CpuBackend::conv1d_dilated_silu(const Tensor& x, Tensor state, const Weight& w,
                                     int64_t dilation, Tensor y) {
  cpu::conv1d_silu(pool_, x, state, w, dilation, y);
}
void CpuBackend::gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& g, const Tensor& beta, Tensor state,
                                  int64_t n_heads, HeadRepeat repeat, Tensor y) {
  cpu::gated_delta_rule(pool_, q, k, v, g, beta, state, n_heads, repeat, y);
}
void CpuBackend::ssm_decay(const Tensor& a, const Weight& dt_bias, const Weight& ssm_a,
                          Tensor g) {
  cpu::ssm_decay(a, dt_bias, ssm_a, g);
}
void CpuBackend::route_softmax_topk(const Tensor& logits, bool renormalize, Ids experts,
                                    Tensor weights) {
  if (experts.rows != logits.rows || weights.rows != logits.rows || weights.cols != experts.cols)
    fail("route_softmax_topk: experts [", experts.rows, " x ", experts.cols, "] and weights ",
         cpu::shape(weights), " do not fit ", logits.rows, " rows");
  const Routing r = cpu::route_softmax_topk(logits, experts.cols, renormalize);
  upload_ids(r.experts.data(), experts);
  upload(r.weights.data(), weights);
}
void CpuBackend::moe_experts(const Tensor& x, const Ids& experts, const Tensor& weights,
                             std::span<const ExpertWeights> table, Tensor y) {
  cpu::moe_experts(pool_, ws_, x, host_routing("moe_experts", experts, &weights), table, y);
}
void CpuBackend::moe_expert_outputs(const Tensor& x, const Ids& experts,
                                    std::span<const int64_t> pairs,
                                    std::span<const ExpertWeights> table, Tensor out) {
  cpu::moe_expert_outputs(pool_, ws_, x, host_routing("moe_expert_outputs", experts, nullptr),
                          pairs, table, out);
}
void CpuBackend::moe_combine(const Tensor& weights, const Tensor& out, Tensor y) {
  cpu::moe_combine(pool_, host_routing("moe_combine", Ids{}, &weights), out, y);
}
void CpuBackend::argmax(const Tensor& x, Ids index, Tensor prob) {
  cpu::require(index.data || index.size() == 0, "argmax", "index has no storage");
  cpu::argmax(x, {index.data, size_t(index.size())}, prob);
}

void CpuBackend::top_k(const Tensor& x, Ids index, Tensor values) {
  cpu::require(index.data || index.size() == 0, "top_k", "index has no storage");
  cpu::require(index.rows == values.rows && index.cols == values.cols, "top_k", "index [", index.rows, " x ",
               index.cols, "] and values ", cpu::shape(values), " differ in shape");
  cpu::top_k(x, {index.data, size_t(index.size())}, values);
}

void CpuBackend::sampling_sums(const Tensor& x, float temperature, Tensor sums) {
  cpu::sampling_sums(x, temperature, sums);
}

void CpuBackend::draw(const Tensor& x, float temperature, const Tensor& uniforms, Ids index) {
  cpu::require(index.data || index.size() == 0, "draw", "index has no storage");
  cpu::draw(x, temperature, uniforms, {index.data, size_t(index.size())});
}

}  // namespace strata::backend
