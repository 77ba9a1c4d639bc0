#include "backend/cpu/ops_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/ops_vec.h"

namespace strata::cpu {

void kv_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v,
              std::span<const int32_t> positions) {
  constexpr const char* op = "kv_write";
  check_tensor(op, "k_cache", k_cache);
  check_tensor(op, "v_cache", v_cache);
  check_tensor(op, "k", k);
  check_tensor(op, "v", v);
  require(k.cols == k_cache.cols, op, "k ", shape(k), " and k_cache ", shape(k_cache),
          " differ in width");
  require(v.cols == v_cache.cols, op, "v ", shape(v), " and v_cache ", shape(v_cache),
          " differ in width");
  require(k.rows == v.rows && int64_t(positions.size()) == k.rows, op, "k has ", k.rows,
          " rows, v ", v.rows, ", positions ", positions.size());
  for (size_t r = 0; r < positions.size(); ++r) {
    const int64_t p = positions[r];
    require(p >= 0 && p < k_cache.rows && p < v_cache.rows, op, "position ", p,
            " is outside the cache of ", std::min(k_cache.rows, v_cache.rows), " rows");
    std::memcpy(k_cache.data + p * k_cache.stride, k.data + r * k.stride, size_t(k.cols) * 4);
    std::memcpy(v_cache.data + p * v_cache.stride, v.data + r * v.stride, size_t(v.cols) * 4);
  }
}

namespace {

// The checks and the loop both attention ops share; position(r, i) is row r's i-th attended
// cache position, count(r) how many there are.
template <class Count, class Position>
void attend(const char* op, ThreadPool& pool, const Tensor& q, const Tensor& k_cache,
            const Tensor& v_cache, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
            float scale, Tensor y, Count count, Position position) {
  check_tensor(op, "q", q);
  check_tensor(op, "k_cache", k_cache);
  check_tensor(op, "v_cache", v_cache);
  check_tensor(op, "y", y);
  require(n_head > 0 && n_head_kv > 0 && head_dim > 0 && n_head % n_head_kv == 0, op, "n_head ",
          n_head, " must be a positive multiple of n_head_kv ", n_head_kv, " (head_dim ", head_dim,
          ")");
  require(q.cols == n_head * head_dim, op, "q ", shape(q), " should have ", n_head, " x ", head_dim,
          " columns");
  require(k_cache.cols == n_head_kv * head_dim && v_cache.cols == k_cache.cols, op, "k_cache ",
          shape(k_cache), " and v_cache ", shape(v_cache), " should have ", n_head_kv, " x ",
          head_dim, " columns");
  check_same_shape(op, "q", q, "y", y);
  int64_t work = 0;
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t i = 0; i < count(r); ++i) {
      const int64_t p = position(r, i);
      require(p >= 0 && p < k_cache.rows && p < v_cache.rows, op, "position ", p,
              " is outside the cache of ", std::min(k_cache.rows, v_cache.rows), " rows");
    }
    work += count(r) * n_head * head_dim * 2;
  }
  check_no_overlap(op, "q", q, "y", y);
  check_no_overlap(op, "k_cache", k_cache, "y", y);
  check_no_overlap(op, "v_cache", v_cache, "y", y);

  const VecKernels& v = vec();
  const int64_t group = n_head / n_head_kv;
  for_tasks(pool, q.rows * n_head, work, [&](int64_t task) {
    const int64_t r = task / n_head;
    const int64_t h = task % n_head;
    const int64_t kv_off = (h / group) * head_dim;
    const float* qh = q.data + r * q.stride + h * head_dim;
    float* acc = y.data + r * y.stride + h * head_dim;
    for (int64_t i = 0; i < head_dim; ++i) acc[i] = 0.0f;
    float m = -std::numeric_limits<float>::infinity();
    float l = 0.0f;
    for (int64_t i = 0, n = count(r); i < n; ++i) {
      const int64_t p = position(r, i);
      const float s = v.dot(qh, k_cache.data + p * k_cache.stride + kv_off, head_dim) * scale;
      const float* vp = v_cache.data + p * v_cache.stride + kv_off;
      if (s > m) {
        const float c = std::exp(m - s);
        v.rescale_axpy(c, 1.0f, vp, acc, head_dim);
        l = l * c + 1.0f;
        m = s;
      } else {
        const float e = std::exp(s - m);
        v.axpy(e, vp, acc, head_dim);
        l = l + e;
      }
    }
    v.scale_mul(acc, 1.0f / l, nullptr, acc, head_dim);
  });
}

}  // namespace

void attention(ThreadPool& pool, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
               std::span<const int32_t> positions, int64_t n_head, int64_t n_head_kv,
               int64_t head_dim, float scale, Tensor y) {
  constexpr const char* op = "attention";
  require(int64_t(positions.size()) == q.rows, op, positions.size(), " positions for ", q.rows,
          " rows");
  attend(
      op, pool, q, k_cache, v_cache, n_head, n_head_kv, head_dim, scale, y,
      [&](int64_t r) { return int64_t(positions[size_t(r)]) + 1; },
      [](int64_t, int64_t i) { return i; });
}

void attention_selected(ThreadPool& pool, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, const int32_t* selected, int64_t selected_cols,
                        std::span<const int32_t> counts, int64_t n_head, int64_t n_head_kv,
                        int64_t head_dim, float scale, Tensor y) {
  constexpr const char* op = "attention_selected";
  require(int64_t(counts.size()) == q.rows, op, counts.size(), " counts for ", q.rows, " rows");
  for (size_t r = 0; r < counts.size(); ++r)
    require(counts[r] >= 0 && counts[r] <= selected_cols, op, "row ", r, " selects ", counts[r],
            " positions; selected has room for ", selected_cols);
  attend(
      op, pool, q, k_cache, v_cache, n_head, n_head_kv, head_dim, scale, y,
      [&](int64_t r) { return int64_t(counts[size_t(r)]); },
      [&](int64_t r, int64_t i) { return int64_t(selected[r * selected_cols + i]); });
}

}  // namespace strata::cpu
