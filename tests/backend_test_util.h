// Helpers of the backend test suites: host <-> backend tensors, weights uploaded through the
// backend's own weight() (so every backend gets memory it can read), error checks, and the list
// of backends the parameterized suites run on.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "gguf/gguf.h"
#include "quant/kernels.h"
#include "util/error.h"
#include "util/rng.h"

#ifdef STRATA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace strata::backend::testing {

using Floats = std::vector<float>;

inline Floats normal_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  Floats v(n);
  for (float& x : v) x = rng.normal() * scale;
  return v;
}

// T rows each routed to K distinct experts of E (a partial Fisher-Yates shuffle), with weights in
// [0.05, max_weight).
inline Routing random_routing(Rng& rng, int64_t T, int64_t E, int64_t K, float max_weight = 0.6f) {
  Routing r;
  r.top_k = K;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> ids(static_cast<size_t>(E));
    std::iota(ids.begin(), ids.end(), 0);
    for (int64_t j = 0; j < K; ++j) {
      std::swap(ids[size_t(j)], ids[size_t(j + rng.below(uint32_t(E - j)))]);
      r.experts.push_back(ids[size_t(j)]);
      r.weights.push_back(rng.uniform(0.05f, max_weight));
    }
  }
  return r;
}

inline Tensor make(Backend& be, int64_t rows, int64_t cols, const Floats& host) {
  Tensor t = be.alloc(rows, cols);
  be.upload(host.data(), t);
  return t;
}

// Ids [values / cols, cols] in backend memory holding `values` (released with the backend).
inline Ids ids_of(Backend& be, const std::vector<int32_t>& values, int64_t cols = 1) {
  return make_ids(be, values, int64_t(values.size()) / cols, cols);
}

inline Floats read(Backend& be, const Tensor& t) {
  Floats out(size_t(t.rows * t.cols));
  be.download(t, out.data());
  return out;
}

inline bool same_bits(const Floats& a, const Floats& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// |got - want| <= rel * |want| + abs, element by element (the first 5 failures reported).
inline void expect_close(const Floats& got, const Floats& want, double rel, double abs,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    if (!(err <= rel * std::fabs(double(want[i])) + abs) && reported++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: " << got[i] << " vs " << want[i];
  }
}

inline void expect_bitwise(const Floats& got, const Floats& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": first difference at " << i << ": " << got[i] << " vs "
                    << want[i];
      return;
    }
}

inline void expect_throws_naming(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A file tensor held by the test: bytes plus the TensorInfo a backend's weight() takes.
struct HostTensor {
  std::vector<uint8_t> bytes;
  gguf::TensorInfo info;

  HostTensor(std::string name, quant::Type type, std::vector<int64_t> shape,
             std::vector<uint8_t> data)
      : bytes(std::move(data)) {
    info.name = std::move(name);
    info.type = type;
    info.shape = std::move(shape);
    info.nbytes = bytes.size();
    info.data = bytes.data();
  }
};

// Random valid blocks: `slices` matrices of [rows, cols] in type t.
inline HostTensor random_tensor(const std::string& name, quant::Type t, int64_t rows, int64_t cols,
                                int64_t slices, uint64_t seed) {
  const int64_t n = rows * cols * slices;
  std::vector<uint8_t> w(quant::row_bytes(t, n));
  Rng rng(seed);
  quant::kernels(t).random_blocks(rng, w.data(), n / quant::type_info(t).block_elems);
  std::vector<int64_t> shape = {cols, rows};
  if (slices > 1) shape.push_back(slices);
  return HostTensor(name, t, shape, std::move(w));
}

inline HostTensor f32_tensor(const std::string& name, std::vector<int64_t> shape,
                             const Floats& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return HostTensor(name, quant::Type::F32, std::move(shape), std::move(bytes));
}

// Backends the parameterized suites run on: the CPU always, CUDA where it is compiled in.
inline std::vector<std::string> backend_names() {
#ifdef STRATA_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

// Why `name` cannot run here (empty when it can).
inline std::string unavailable(const std::string& name) {
#ifdef STRATA_HAVE_CUDA
  if (name == "cuda") return cuda::unavailable_reason();
#endif
  return {};
}

inline std::unique_ptr<Backend> make_backend(const std::string& name) {
#ifdef STRATA_HAVE_CUDA
  if (name == "cuda") return cuda::make_cuda_backend(0);
#endif
  return std::make_unique<CpuBackend>(2);
}

// The fixture of the parameterized suites: `be` is the backend under test, `ref` the CPU backend
// it is compared with. Skips (printing the reason) where the backend cannot run.
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string why = unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << why;
    be_ = make_backend(GetParam());
  }
  Backend& be() { return *be_; }
  CpuBackend& ref() { return ref_; }
  bool is_cpu() const { return GetParam() == "cpu"; }

 private:
  std::unique_ptr<Backend> be_;
  CpuBackend ref_{1};
};

}  // namespace strata::backend::testing
