// The CPU backend: activations in host memory, ops on a fixed thread pool, AVX2 kernels where
// the CPU has them (docs/BACKEND.md lists every op's definition and error bound).
//
// Every op writes each output from one task with a fixed reduction order, so results are
// bitwise the same for any thread count, any window size (a T-row window equals T one-row
// windows) and both instruction sets. Not thread-safe: one caller at a time.
#pragma once

#include <unordered_set>

#include "backend/backend.h"
#include "backend/cpu/ops_common.h"
#include "backend/cpu/thread_pool.h"

namespace strata::backend {

class CpuBackend : public Backend {
 public:
  // n_threads <= 0: one per hardware thread.
  explicit CpuBackend(int n_threads = 0);
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  const char* name() const override { return "cpu"; }
  int threads() const { return pool_.size(); }

  Tensor alloc(int64_t rows, int64_t cols) override;
  void release(Tensor t) override;
  void upload(const float* host, Tensor dst) override;
  void download(const Tensor& src, float* host) override;
  void fill(Tensor t, float value) override;
  void copy(const Tensor& src, Tensor dst) override;
  void set_rows(const Tensor& src, const Ids& rows, Tensor dst) override;
  Ids alloc_ids(int64_t rows, int64_t cols) override;
  void release_ids(Ids t) override;
  void upload_ids(const int32_t* host, Ids dst) override;
  void download_ids(const Ids& src, int32_t* host) override;
  // 1-D tensors (norm weights, biases) are one row; 2-D a matrix; 3-D a stack of matrices.
  Weight weight(const gguf::TensorInfo& tensor, int64_t slice = 0) override;

  void get_rows(const Weight& table, const Ids& ids, Tensor y) override;
  // madvise(MADV_WILLNEED) on the pages of the rows (row_prefetch.cpp).
  void prefetch_rows(const Weight& table, std::span<const int32_t> ids) override;
  void matmul(const Weight& w, const Tensor& x, Tensor y) override;
  void rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor y) override;
  void l2_norm(const Tensor& x, int64_t group, float eps, Tensor y) override;
  void signed_sqrt_dot(const Tensor& a, const Tensor& b, int64_t group, float scale,
                       Tensor y) override;
  void add(const Tensor& a, const Tensor& b, Tensor y) override;
  void scale(const Tensor& x, float s, Tensor y) override;
  void mul_sigmoid(const Tensor& x, const Tensor& gate, Tensor y) override;
  void swiglu(const Tensor& gate, const Tensor& up, Tensor y) override;
  void split_groups(const Tensor& x, int64_t n_groups, std::span<const int64_t> widths,
                    std::span<Tensor> outs) override;
  void rope_neox(Tensor x, const Ids& positions, int64_t head_dim, int64_t rope_dim,
                 float theta) override;
  void kv_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v,
                const Ids& positions) override;
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 const Ids& positions, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                 float scale, Tensor y) override;
  void attention_selected(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                          const Ids& selected, const Ids& counts, int64_t n_head,
                          int64_t n_head_kv, int64_t head_dim, float scale, Tensor y) override;
  void block_scores(const Tensor& q, const Tensor& keys, const Ids& positions, int64_t block,
                    int64_t n_head, int64_t head_dim, float scale, Tensor y) override;
  void block_mean(const Tensor& x, const Ids& firsts, int64_t block, Tensor y) override;
  void qsa_select(const Tensor& scores, const Ids& positions, int64_t block, int64_t top_blocks,
                  Ids selected, Ids counts) override;
  void conv1d_silu(const Tensor& x, Tensor state, const Weight& w, Tensor y) override;
  void conv1d_dilated_silu(const Tensor& x, Tensor state, const Weight& w, int64_t dilation,
                           Tensor y) override;
  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                        const Tensor& beta, Tensor state, int64_t n_heads,
                        backend::HeadRepeat repeat, Tensor y) override;
  void ssm_decay(const Tensor& a, const Weight& dt_bias, const Weight& ssm_a, Tensor g) override;
  void route_softmax_topk(const Tensor& logits, bool renormalize, Ids experts,
                          Tensor weights) override;
  void moe_experts(const Tensor& x, const Ids& experts, const Tensor& weights,
                   std::span<const ExpertWeights> table, Tensor y) override;
  void moe_expert_outputs(const Tensor& x, const Ids& experts, std::span<const int64_t> pairs,
                          std::span<const ExpertWeights> table, Tensor out) override;
  void moe_combine(const Tensor& weights, const Tensor& out, Tensor y) override;
  void argmax(const Tensor& x, Ids index, Tensor prob) override;
  void top_k(const Tensor& x, Ids index, Tensor values) override;
  void sampling_sums(const Tensor& x, float temperature, Tensor sums) override;
  void draw(const Tensor& x, float temperature, const Tensor& uniforms, Ids index) override;

 private:
  cpu::ThreadPool pool_;
  cpu::Workspace ws_;
  std::unordered_set<void*> allocations_;
};

}  // namespace strata::backend
