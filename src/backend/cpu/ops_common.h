// What every CPU op file shares: shape checks that name the op and the operand, the scratch
// memory the backend lends to ops, and the one rule for when an op is worth a parallel step.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"
#include "util/error.h"

namespace strata::cpu {

using backend::Tensor;
using backend::Weight;

// Reusable buffers, grown on demand; one set per backend (ops of one backend never overlap).
struct Workspace {
  std::vector<uint8_t> act;   // quantized activations
  std::vector<uint8_t> act2;  // a second activation set (MoE: the hidden layer)
  std::vector<float> f32;     // fp32 intermediates
  std::vector<float> f32_out;  // MoE: one expert output row per routed pair
};

inline std::string shape(const Tensor& t) { return cat("[", t.rows, " x ", t.cols, "]"); }

// Throws "op: what" unless ok.
template <typename... Parts>
void require(bool ok, const char* op, Parts&&... what) {
  if (!ok) fail(op, ": ", std::forward<Parts>(what)...);
}

// A usable tensor: non-negative shape, rows at least cols apart, storage if non-empty.
inline void check_tensor(const char* op, const char* name, const Tensor& t) {
  if (!(t.rows >= 0 && t.cols >= 0 && t.stride >= t.cols))  // (shape() formats only here)
    fail(op, ": ", name, " has a bad layout ", shape(t), " stride ", t.stride);
  require(t.data != nullptr || t.rows == 0 || t.cols == 0, op, name, " has no storage");
}

inline void check_same_shape(const char* op, const char* a_name, const Tensor& a,
                             const char* b_name, const Tensor& b) {
  require(a.rows == b.rows && a.cols == b.cols, op, a_name, " ", shape(a), " and ", b_name, " ",
          shape(b), " differ in shape");
}

// Whether the memory two tensors span intersects (ops that read rows after writing others
// cannot run in place).
inline bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.rows == 0 || a.cols == 0 || b.rows == 0 || b.cols == 0) return false;
  const float* a_end = a.data + (a.rows - 1) * a.stride + a.cols;
  const float* b_end = b.data + (b.rows - 1) * b.stride + b.cols;
  return a.data < b_end && b.data < a_end;
}

inline void check_no_overlap(const char* op, const char* a_name, const Tensor& a,
                             const char* b_name, const Tensor& b) {
  require(!overlaps(a, b), op, a_name, " and ", b_name, " overlap; this op cannot run in place");
}

inline float row_at(const Tensor& t, int64_t r, int64_t c) { return t.data[r * t.stride + c]; }

// silu(g) * u, the gate of every SwiGLU in the models, as torch computes silu: g / (1 + e^-g).
inline float swiglu_value(float g, float u) { return (g / (1.0f + std::exp(-g))) * u; }

// Below this many elements of work a parallel step costs more than it saves.
inline constexpr int64_t kMinParallelWork = 1 << 14;

// Runs fn(i) for i in [0, n): on the pool when `work` (elements touched) is worth it, else
// inline. Either way every task writes its own outputs, so the bits are the same.
template <typename Fn>
void for_tasks(ThreadPool& pool, int64_t n, int64_t work, Fn&& fn) {
  if (n <= 1 || work < kMinParallelWork || pool.size() == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  } else {
    pool.parallel_for(n, fn);
  }
}

}  // namespace strata::cpu
