// Timing helpers of the disabled CUDA benchmarks (tests/test_cuda_*bandwidth.cpp).
#pragma once

#ifdef STRATA_HAVE_CUDA

#include <chrono>
#include <cstddef>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda_bench {

// Seconds per call of fn, after `warmup` calls; `iters` calls are queued back to back and timed
// as one span.
template <typename Fn>
double seconds_per_call(cuda::Device& dev, Fn&& fn, int warmup = 3, int iters = 20) {
  for (int i = 0; i < warmup; ++i) fn();
  dev.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  dev.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

// The card's device-to-device copy of `bytes`: seconds per copy and GB/s counting the bytes read
// and the bytes written, the limit the benchmarks' rates are set against.
struct CopyRate {
  double seconds, gbs;
};

inline CopyRate copy_rate(cuda::Device& dev, size_t bytes) {
  cuda::DeviceBuffer a(bytes), b(bytes);
  const double s = seconds_per_call(dev, [&] { dev.copy(b.data(), a.data(), bytes); });
  return {s, 2.0 * double(bytes) / s / 1e9};
}

}  // namespace strata::cuda_bench

#endif
