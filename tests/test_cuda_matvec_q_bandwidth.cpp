// Weight bandwidth of the integer mat-vec (Device::matvec_q) against the fp32 one (Device::matvec)
// and the card's device-to-device copy, over about 1 GiB of weights per format, in the style of
// llm.c's dev/cuda: every version is first checked bit for bit against the CPU on the first rows,
// then timed. A measurement, not a check, so it is disabled by default:
//   strata_tests --gtest_also_run_disabled_tests --gtest_filter='CudaMatvecQBandwidth.*'
// One JSON object per line ("[ json ]" prefix), then a summary table. docs/CUDA.md records the
// H200 figures.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_CUDA

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_bench_util.h"
#include "quant/kernels.h"
#include "util/rng.h"

namespace strata {
namespace {

using quant::Type;

constexpr size_t kTarget = size_t(1) << 30;
constexpr int kCheckedRows = 64;

struct Version {
  std::string name;
  bool integer;  // matvec_q (else the fp32 matvec)
  int tokens;
  cuda::MatvecQOptions options;
};

std::vector<Version> versions(Type t) {
  std::vector<Version> v = {{"fp32", false, 1, {}}, {"int", true, 1, {}}};
  for (int r : {4, 8}) {
    cuda::MatvecQOptions o;
    o.rows_per_warp = r;
    v.push_back({"int_r" + std::to_string(r), true, 1, o});
  }
  if (t == Type::IQ2_XS) {
    for (int c : {1, 8, 32}) {
      cuda::MatvecQOptions o;
      o.grid_copies = c;
      v.push_back({"int_r4_grid" + std::to_string(c), true, 1, o});
    }
  }
  v.push_back({"int_t8", true, 8, {}});
  return v;
}

struct Summary {
  std::string format;
  int64_t cols;
  double old_gbs, new_gbs, best_gbs;
  std::string best;
};

TEST(CudaMatvecQBandwidth, DISABLED_OldVersusNew) {
  if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason();
  cuda::Device dev(0);
  std::printf("[ bw       ] %s, %d SMs\n", dev.info().name.c_str(), dev.info().sm_count);

  const cuda_bench::CopyRate copy = cuda_bench::copy_rate(dev, kTarget);
  const double copy_gbs = copy.gbs;
  std::printf("[ json ] {\"copy_mib\": %zu, \"ms\": %.4f, \"gbs\": %.1f}\n", kTarget >> 20,
              copy.seconds * 1e3, copy_gbs);

  std::vector<Summary> summary;
  for (const int64_t cols : {int64_t(4096), int64_t(2560)}) {
    for (Type t : {Type::IQ2_XS, Type::Q4_K, Type::Q8_0, Type::FP8_E4M3}) {
      const quant::FormatKernels& k = quant::kernels(t);
      const size_t row_bytes = quant::row_bytes(t, cols);
      const int64_t rows = int64_t(kTarget / row_bytes);
      const size_t bytes = size_t(rows) * row_bytes;
      constexpr int kTokens = 8;
      cuda::DeviceBuffer w(bytes), x(size_t(cols) * kTokens * sizeof(float)),
          y(size_t(rows) * kTokens * sizeof(float));

      // 16 MiB of random rows repeated to fill the matrix: every byte a distinct address, far more
      // than the L2 holds.
      const int64_t chunk_rows = int64_t((size_t(16) << 20) / row_bytes);
      std::vector<uint8_t> chunk(chunk_rows * row_bytes);
      Rng rng(42);
      k.random_blocks(rng, chunk.data(), chunk_rows * cols / quant::type_info(t).block_elems);
      dev.upload(w.data(), chunk.data(), chunk.size());
      for (size_t off = chunk.size(); off < bytes; off += chunk.size())
        dev.copy(w.as<uint8_t>() + off, w.data(), std::min(chunk.size(), bytes - off));
      std::vector<float> xs(size_t(cols) * kTokens);
      for (float& v : xs) v = rng.normal();
      dev.upload(x.data(), xs.data(), x.size());

      // The CPU's results for the first rows of every activation.
      std::vector<uint8_t> act(quant::act_bytes(k.act, cols));
      std::vector<float> ref(size_t(kCheckedRows) * kTokens);
      for (int tok = 0; tok < kTokens; ++tok) {
        quant::quantize_act_ref(k.act, xs.data() + size_t(tok) * cols, act.data(), cols);
        for (int r = 0; r < kCheckedRows; ++r)
          ref[size_t(tok) * kCheckedRows + r] =
              k.dot_ref(chunk.data() + size_t(r) * row_bytes, act.data(), cols);
      }

      Summary s{quant::type_name(t), cols, 0, 0, 0, ""};
      for (const Version& v : versions(t)) {
        const auto call = [&] {
          if (v.integer)
            dev.matvec_q(t, w.data(), row_bytes, rows, cols, x.as<float>(), y.as<float>(), v.tokens,
                         v.options);
          else
            dev.matvec(t, w.data(), row_bytes, rows, cols, x.as<float>(), y.as<float>());
        };
        // Check: bitwise for the integer versions (the fp32 one has its own test and bound).
        bool exact = true;
        if (v.integer) {
          call();
          for (int tok = 0; tok < v.tokens; ++tok) {
            std::vector<float> got(kCheckedRows);
            dev.download(got.data(), y.as<float>() + size_t(tok) * rows,
                         got.size() * sizeof(float));
            exact = exact && std::memcmp(got.data(), ref.data() + size_t(tok) * kCheckedRows,
                                         got.size() * sizeof(float)) == 0;
          }
          EXPECT_TRUE(exact) << quant::type_name(t) << " " << v.name << " differs from the CPU";
        }
        const double sec = cuda_bench::seconds_per_call(dev, call);
        const double gbs = double(bytes) / sec / 1e9;
        std::printf(
            "[ json ] {\"format\": \"%s\", \"cols\": %lld, \"rows\": %lld, \"version\": \"%s\", "
            "\"tokens\": %d, \"ms\": %.4f, \"weight_gbs\": %.1f, \"of_copy\": %.3f, "
            "\"bitwise_cpu\": %s}\n",
            quant::type_name(t), (long long)cols, (long long)rows, v.name.c_str(), v.tokens,
            sec * 1e3, gbs, gbs / copy_gbs, v.integer ? (exact ? "true" : "false") : "null");
        if (!v.integer) s.old_gbs = gbs;
        if (v.name == "int") s.new_gbs = gbs;
        if (v.integer && v.tokens == 1 && gbs > s.best_gbs) {
          s.best_gbs = gbs;
          s.best = v.name;
        }
      }
      summary.push_back(s);
    }
  }

  std::printf("[ bw       ] copy %.0f GB/s (read + write)\n", copy_gbs);
  std::printf("[ bw       ] %-9s %5s %9s %9s %7s  %s\n", "format", "cols", "fp32 GB/s", "int GB/s",
              "of copy", "best version");
  for (const Summary& s : summary)
    std::printf("[ bw       ] %-9s %5lld %9.0f %9.0f %6.0f%%  %s %.0f GB/s (%.0f%%)\n",
                s.format.c_str(), (long long)s.cols, s.old_gbs, s.new_gbs,
                100 * s.new_gbs / copy_gbs, s.best.c_str(), s.best_gbs,
                100 * s.best_gbs / copy_gbs);
}

}  // namespace
}  // namespace strata

#endif
