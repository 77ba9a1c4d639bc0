// A logit's sampling weight e^((x - max) / T), computed by the same IEEE operations on the host
// and in CUDA kernels, so that a row's softmax sum taken where the logits are (Backend::
// sampling_sums) is bitwise the sum the host sampler takes (decode/sampler.cpp). std::exp and
// CUDA's expf differ in the last bit; this is a float exp of our own: x = k ln2 + r with
// |r| <= ln2 / 2, e^r by its Taylor polynomial to r^7 (error below 2^-27), times 2^k. No fused
// multiply-adds: CUDA code uses the _rn intrinsics, which the compiler never contracts, and host
// code is compiled without FMA contraction (ISO C++, x86-64 without -mfma).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::backend {

// A row's softmax sum is taken chunk by chunk: the weights of columns [c * kSumChunk, (c + 1) *
// kSumChunk) in column order, then the chunks' sums in chunk order. A fixed order that a kernel
// can take in parallel and the host takes in one pass.
constexpr int64_t kSumChunk = 256;

namespace sampling_detail {

STRATA_HOST_DEVICE inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
STRATA_HOST_DEVICE inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
STRATA_HOST_DEVICE inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
STRATA_HOST_DEVICE inline float round_to_int(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return std::nearbyint(v);
#endif
}
STRATA_HOST_DEVICE inline float pow2(int k) {
  const uint32_t bits = uint32_t(k + 127) << 23;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
#endif
}

}  // namespace sampling_detail

// e^x for x <= 0; 0 below -86, where the result would leave the normal floats (a token that much
// less likely than the best is never drawn).
STRATA_HOST_DEVICE inline float sampling_exp(float x) {
  using namespace sampling_detail;
  if (!(x >= -86.0f)) return 0.0f;
  const float k = round_to_int(mul(x, 0x1.715476p+0f));
  // ln 2 = 0x1.63p-1 - 0x1.bd0106p-13, split so that k times the first part is exact; the
  // polynomial's coefficients are 1/n! rounded to float.
  const float r = add(add(x, mul(k, -0x1.63p-1f)), mul(k, 0x1.bd0106p-13f));
  float p = 0x1.a01a02p-13f;
  p = add(mul(p, r), 0x1.6c16c2p-10f);
  p = add(mul(p, r), 0x1.111112p-7f);
  p = add(mul(p, r), 0x1.555556p-5f);
  p = add(mul(p, r), 0x1.555556p-3f);
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  return mul(p, pow2(int(k)));
}

// The weight of logit x in a row whose largest non-NaN logit is `max`, at temperature t > 0:
// e^((x - max) / t); 1 for the largest (also when it is infinite), 0 for -inf.
STRATA_HOST_DEVICE inline float sampling_weight(float x, float max, float t) {
  if (x == max) return 1.0f;
  return sampling_exp(sampling_detail::div(sampling_detail::add(x, -max), t));
}

// Plain temperature sampling (no top-k, no nucleus) draws a token from its weights in two steps
// that a kernel can take as the host does. The row's weights are summed per chunk of kSumChunk
// columns in column order (floats, NaN columns weighing 0), sums[0 .. chunks). With total the
// double sum of those in chunk order and target = u * total (u in [0, 1)), the draw is:
//   pick_chunk: the first chunk whose running double sum passes target;
//   pick_column: in it, the first column whose running double sum (continuing from the chunks
//   before) passes target.
// Where rounding leaves target at or past every running sum, the last chunk (column) of positive
// weight is taken.
struct ChunkPick {
  int64_t chunk;  // -1: every weight is 0 (an all-NaN row)
  double target, before;  // before: the double sum of the chunks before `chunk`
};

STRATA_HOST_DEVICE inline ChunkPick pick_chunk(const float* sums, int64_t chunks, float u) {
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += double(sums[c]);
  const double target = double(u) * total;
  ChunkPick last{-1, target, 0};
  double cum = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    if (sums[c] > 0.0f) {
      if (target < cum + double(sums[c])) return {c, target, cum};
      last = {c, target, cum};
    }
    cum += double(sums[c]);
  }
  return last;
}

// The column (0 .. n) of the picked chunk, whose weights are w[0 .. n); -1 when all are 0.
STRATA_HOST_DEVICE inline int64_t pick_column(const float* w, int64_t n, const ChunkPick& pick) {
  double cum = pick.before;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (w[i] > 0.0f) {
      cum += double(w[i]);
      last = i;
      if (pick.target < cum) return i;
    }
  }
  return last;
}

// The draw over a whole row's weights w[0 .. cols) on the host (0 for NaN columns): its chunk
// sums, then the two picks. The column, or -1 when every weight is 0.
inline int64_t draw_row(const float* w, int64_t cols, float u) {
  const int64_t chunks = (cols + kSumChunk - 1) / kSumChunk;
  std::vector<float> sums(size_t(chunks), 0.0f);
  for (int64_t c = 0; c < cols; ++c) sums[size_t(c / kSumChunk)] += w[c];
  const ChunkPick pick = pick_chunk(sums.data(), chunks, u);
  if (pick.chunk < 0) return -1;
  const int64_t first = pick.chunk * kSumChunk;
  const int64_t i = pick_column(w + first, cols - first < kSumChunk ? cols - first : kSumChunk, pick);
  return i < 0 ? -1 : first + i;
}

// A softmax sum in kSumChunk's order on the host: weights added in ascending column order.
class ChunkedSum {
 public:
  void add(int64_t column, float weight) {
    const int64_t chunk = column / kSumChunk;
    if (chunk != chunk_) {
      total_ += part_;
      part_ = 0.0f;
      chunk_ = chunk;
    }
    part_ += weight;
  }
  float total() const { return total_ + part_; }

 private:
  int64_t chunk_ = -1;
  float part_ = 0.0f, total_ = 0.0f;
};

}  // namespace strata::backend
