// The sums of squares run in the fixed lane order of ops_vec.h, so a group's result depends on
// its values alone, never on the row count, the thread count or the instruction set.
#include "backend/cpu/ops_norm.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops_vec.h"

namespace strata::cpu {

namespace {

// Checks shared by both norms; returns the number of groups per row.
int64_t check_groups(const char* op, const Tensor& x, int64_t group, Tensor y) {
  check_tensor(op, "x", x);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  require(group > 0 && x.cols % group == 0, op, "group ", group, " does not divide the ", x.cols,
          " columns of x");
  return x.cols / group;
}

// Runs fn(row, group index) for every group of every row.
template <typename Fn>
void for_groups(ThreadPool& pool, const Tensor& x, int64_t n_groups, Fn&& fn) {
  for_tasks(pool, x.rows * n_groups, x.rows * x.cols,
            [&](int64_t i) { fn(i / n_groups, i % n_groups); });
}

}  // namespace

void rms_norm(ThreadPool& pool, const Tensor& x, const Weight* w, int64_t group, float eps,
              Tensor y) {
  constexpr const char* op = "rms_norm";
  const int64_t n_groups = check_groups(op, x, group, y);
  const float* wf = nullptr;
  int64_t w_step = 0;  // 0: one gain for every group; group: a gain per column
  if (w) {
    require(w->type == quant::Type::F32 && w->data, op, "the weight must be F32 with data");
    const int64_t values = w->rows * w->cols;
    require(values == group || values == x.cols, op, "the weight has ", values,
            " values but the group is ", group, " and x has ", x.cols, " columns");
    wf = static_cast<const float*>(w->data);
    w_step = values == group ? 0 : group;
  }
  const VecKernels& v = vec();
  for_groups(pool, x, n_groups, [&](int64_t r, int64_t g) {
    const float* xg = x.data + r * x.stride + g * group;
    float* yg = y.data + r * y.stride + g * group;
    const float mean = v.sum_squares(xg, group) / float(group);
    v.scale_mul(xg, 1.0f / std::sqrt(mean + eps), wf ? wf + g * w_step : nullptr, yg, group);
  });
}

void l2_norm(ThreadPool& pool, const Tensor& x, int64_t group, float eps, Tensor y) {
  constexpr const char* op = "l2_norm";
  const int64_t n_groups = check_groups(op, x, group, y);
  const VecKernels& v = vec();
  for_groups(pool, x, n_groups, [&](int64_t r, int64_t g) {
    const float* xg = x.data + r * x.stride + g * group;
    float* yg = y.data + r * y.stride + g * group;
    v.scale_mul(xg, 1.0f / std::sqrt(v.sum_squares(xg, group) + eps), nullptr, yg, group);
  });
}

void signed_sqrt_dot(ThreadPool& pool, const Tensor& a, const Tensor& b, int64_t group,
                     float scale, Tensor y) {
  constexpr const char* op = "signed_sqrt_dot";
  check_tensor(op, "a", a);
  check_tensor(op, "b", b);
  check_tensor(op, "y", y);
  check_same_shape(op, "a", a, "b", b);
  require(group > 0 && a.cols % group == 0 && y.rows == a.rows && y.cols == a.cols / group, op,
          "y ", shape(y), " should have one column per group of ", group, " of a ", shape(a));
  check_no_overlap(op, "a", a, "y", y);
  check_no_overlap(op, "b", b, "y", y);
  const VecKernels& v = vec();
  for_groups(pool, a, y.cols, [&](int64_t r, int64_t g) {
    const float d = v.dot(a.data + r * a.stride + g * group, b.data + r * b.stride + g * group, group) * scale;
    const float m = std::sqrt(std::max(std::fabs(d), 1e-6f));
    y.data[r * y.stride + g] = d > 0.0f ? m : d < 0.0f ? -m : 0.0f;
  });
}

}  // namespace strata::cpu
