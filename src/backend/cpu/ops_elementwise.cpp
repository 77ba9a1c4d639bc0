#include "backend/cpu/ops_elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace strata::cpu {

void fill(Tensor t, float value) {
  check_tensor("fill", "t", t);
  for (int64_t r = 0; r < t.rows; ++r) {
    float* row = t.data + r * t.stride;
    for (int64_t c = 0; c < t.cols; ++c) row[c] = value;
  }
}

void copy(const Tensor& src, Tensor dst) {
  constexpr const char* op = "copy";
  check_tensor(op, "src", src);
  check_tensor(op, "dst", dst);
  check_same_shape(op, "src", src, "dst", dst);
  for (int64_t r = 0; r < src.rows; ++r)
    std::memmove(dst.data + r * dst.stride, src.data + r * src.stride, size_t(src.cols) * 4);
}

void set_rows(const Tensor& src, std::span<const int32_t> rows, Tensor dst) {
  constexpr const char* op = "set_rows";
  check_tensor(op, "src", src);
  check_tensor(op, "dst", dst);
  require(src.cols == dst.cols && int64_t(rows.size()) == src.rows, op, "src ", shape(src), ", ",
          rows.size(), " row ids and dst ", shape(dst), " do not fit");
  for (int32_t r : rows)
    require(r < dst.rows, op, "row id ", r, " is past the ", dst.rows, " rows of dst");
  check_no_overlap(op, "src", src, "dst", dst);
  for (int64_t t = 0; t < src.rows; ++t)
    if (rows[size_t(t)] >= 0)
      std::memcpy(dst.data + rows[size_t(t)] * dst.stride, src.data + t * src.stride,
                  size_t(src.cols) * sizeof(float));
}

void add(const Tensor& a, const Tensor& b, Tensor y) {
  constexpr const char* op = "add";
  check_tensor(op, "a", a);
  check_tensor(op, "b", b);
  check_tensor(op, "y", y);
  check_same_shape(op, "a", a, "b", b);
  check_same_shape(op, "a", a, "y", y);
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* ar = a.data + r * a.stride;
    const float* br = b.data + r * b.stride;
    float* yr = y.data + r * y.stride;
    for (int64_t c = 0; c < a.cols; ++c) yr[c] = ar[c] + br[c];
  }
}

void scale(const Tensor& x, float s, Tensor y) {
  constexpr const char* op = "scale";
  check_tensor(op, "x", x);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.data + r * x.stride;
    float* yr = y.data + r * y.stride;
    for (int64_t c = 0; c < x.cols; ++c) yr[c] = xr[c] * s;
  }
}

void mul_sigmoid(const Tensor& x, const Tensor& gate, Tensor y) {
  constexpr const char* op = "mul_sigmoid";
  check_tensor(op, "x", x);
  check_tensor(op, "gate", gate);
  check_tensor(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  require(gate.rows == x.rows && (gate.cols == x.cols || gate.cols == 1), op, "gate ", shape(gate),
          " must be ", shape(x), " or [", x.rows, " x 1]");
  const bool per_row = gate.cols == 1 && x.cols != 1;
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.data + r * x.stride;
    const float* gr = gate.data + r * gate.stride;
    float* yr = y.data + r * y.stride;
    if (per_row) {
      const float s = 1.0f / (1.0f + std::exp(-gr[0]));
      for (int64_t c = 0; c < x.cols; ++c) yr[c] = xr[c] * s;
    } else {
      for (int64_t c = 0; c < x.cols; ++c) yr[c] = xr[c] * (1.0f / (1.0f + std::exp(-gr[c])));
    }
  }
}

void swiglu(ThreadPool& pool, const Tensor& gate, const Tensor& up, Tensor y) {
  constexpr const char* op = "swiglu";
  check_tensor(op, "gate", gate);
  check_tensor(op, "up", up);
  check_tensor(op, "y", y);
  check_same_shape(op, "gate", gate, "up", up);
  check_same_shape(op, "gate", gate, "y", y);
  // exp dominates, so even one row is worth splitting into column chunks.
  constexpr int64_t kChunk = 1024;
  const int64_t chunks = (gate.cols + kChunk - 1) / kChunk;
  for_tasks(pool, gate.rows * chunks, gate.rows * gate.cols * 8, [&](int64_t i) {
    const int64_t r = i / chunks;
    const int64_t c0 = (i % chunks) * kChunk;
    const int64_t c1 = std::min(gate.cols, c0 + kChunk);
    const float* g = gate.data + r * gate.stride;
    const float* u = up.data + r * up.stride;
    float* yr = y.data + r * y.stride;
    for (int64_t c = c0; c < c1; ++c) yr[c] = swiglu_value(g[c], u[c]);
  });
}

void split_groups(const Tensor& x, int64_t n_groups, std::span<const int64_t> widths,
                  std::span<Tensor> outs) {
  constexpr const char* op = "split_groups";
  check_tensor(op, "x", x);
  require(widths.size() == outs.size() && !widths.empty(), op, widths.size(), " widths for ",
          outs.size(), " outputs");
  require(n_groups > 0, op, "n_groups must be positive, not ", n_groups);
  int64_t group = 0;
  for (size_t i = 0; i < widths.size(); ++i) {
    require(widths[i] > 0, op, "width ", i, " is ", widths[i]);
    check_tensor(op, "an output", outs[i]);
    require(outs[i].rows == x.rows && outs[i].cols == n_groups * widths[i], op, "output ", i, " ",
            shape(outs[i]), " should be [", x.rows, " x ", n_groups * widths[i], "]");
    require(!overlaps(x, outs[i]), op, "output ", i, " overlaps x");
    group += widths[i];
  }
  require(group * n_groups == x.cols, op, n_groups, " groups of ", group, " columns do not make x ",
          shape(x));
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* src = x.data + r * x.stride;
    for (int64_t g = 0; g < n_groups; ++g) {
      for (size_t i = 0; i < widths.size(); ++i) {
        std::memcpy(outs[i].data + r * outs[i].stride + g * widths[i], src, size_t(widths[i]) * 4);
        src += widths[i];
      }
    }
  }
}

}  // namespace strata::cpu
