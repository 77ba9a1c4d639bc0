// Mat-vec weight bandwidth of the CUDA backend against the card's device-to-device copy, over
// about 1 GiB of weights per format. A measurement, not a check, so it is disabled by default:
//   strata_tests --gtest_also_run_disabled_tests --gtest_filter='CudaBandwidth.*'
// docs/CUDA.md records the H200 figures.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_CUDA

#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_bench_util.h"
#include "quant/kernels.h"
#include "util/rng.h"

namespace strata {
namespace {

using quant::Type;

constexpr size_t kTarget = size_t(1) << 30;
TEST(CudaBandwidth, DISABLED_MatvecVersusCopy) {
  if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason();
  cuda::Device dev(0);
  std::printf("[ bw       ] %s, %d SMs\n", dev.info().name.c_str(), dev.info().sm_count);

  const cuda_bench::CopyRate copy = cuda_bench::copy_rate(dev, kTarget);
  const double copy_gbs = copy.gbs;
  std::printf("[ bw       ] copy %zu MiB device to device: %.3f ms, %.0f GB/s (read + write)\n",
              kTarget >> 20, copy.seconds * 1e3, copy_gbs);

  for (const int64_t cols : {int64_t(4096), int64_t(2560)}) {
    for (Type t : {Type::IQ2_XS, Type::Q4_K, Type::Q8_0, Type::FP8_E4M3}) {
      if (!quant::has_kernels(t)) {
        std::printf("[ bw       ] %s: no CPU generator yet, skipped\n", quant::type_name(t));
        continue;
      }
      const size_t row_bytes = quant::row_bytes(t, cols);
      const int64_t rows = int64_t(kTarget / row_bytes);
      const size_t bytes = size_t(rows) * row_bytes;
      cuda::DeviceBuffer w(bytes), x(cols * sizeof(float)), y(rows * sizeof(float));

      // 16 MiB of random rows, repeated on the device to fill the matrix: every byte is still a
      // distinct address, far more than the L2 holds.
      const int64_t chunk_rows = int64_t((size_t(16) << 20) / row_bytes);
      std::vector<uint8_t> chunk(chunk_rows * row_bytes);
      Rng rng(42);
      quant::kernels(t).random_blocks(rng, chunk.data(),
                                      chunk_rows * cols / quant::type_info(t).block_elems);
      dev.upload(w.data(), chunk.data(), chunk.size());
      for (size_t off = chunk.size(); off < bytes; off += chunk.size())
        dev.copy(w.as<uint8_t>() + off, w.data(), std::min(chunk.size(), bytes - off));
      std::vector<float> xs(cols);
      for (float& v : xs) v = rng.normal();
      dev.upload(x.data(), xs.data(), x.size());

      const double s = cuda_bench::seconds_per_call(dev, [&] {
        dev.matvec(t, w.data(), row_bytes, rows, cols, x.as<float>(), y.as<float>());
      });
      const double gbs = double(bytes) / s / 1e9;
      std::printf(
          "[ bw       ] matvec %-13s %lld x %lld (%.0f MiB): %.3f ms, %.0f GB/s of "
          "weights, %.0f%% of copy\n",
          quant::type_name(t), (long long)rows, (long long)cols, double(bytes) / (1 << 20), s * 1e3,
          gbs, 100.0 * gbs / copy_gbs);
    }
  }
}

}  // namespace
}  // namespace strata

#endif
