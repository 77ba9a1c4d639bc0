// The CPU backend's weight ops: matmul over several formats against the format's reference dot,
// get_rows, the router's softmax top-k, and the routed experts, with the same determinism
// checks as test_backend_ops.cpp (T-row window vs one-row calls, 1/2/3 threads, bitwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "quant/kernels.h"
#include "test_quant_util.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::backend {
namespace {

using Floats = std::vector<float>;
using quant::testing::random_floats;
using quant::testing::random_weights;

Tensor make(Backend& be, int64_t rows, int64_t cols, const Floats& host) {
  Tensor t = be.alloc(rows, cols);
  be.upload(host.data(), t);
  return t;
}

Floats read(Backend& be, const Tensor& t) {
  Floats out(size_t(t.rows * t.cols));
  be.download(t, out.data());
  return out;
}

bool same_bits(const Floats& a, const Floats& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_throws_naming(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A weight matrix of random valid blocks, owned by the test.
struct OwnedWeight {
  std::vector<uint8_t> bytes;
  Weight w;
  OwnedWeight(quant::Type t, int64_t rows, int64_t cols, uint64_t seed)
      : bytes(random_weights(t, rows * cols, seed)) {
    w = {t, bytes.data(), cols, rows, quant::row_bytes(t, cols)};
  }
};

TEST(CpuMatmul, EqualsReferenceDotPerFormatAndIsWindowAndThreadInvariant) {
  // 70 rows spans two activation tiles of 64; 100 outputs leave a partial row tile.
  const int64_t T = 70, rows = 100, cols = 512;
  for (quant::Type type : {quant::Type::F32, quant::Type::F16, quant::Type::Q8_0, quant::Type::Q4_K,
                           quant::Type::IQ2_XS}) {
    SCOPED_TRACE(quant::type_info(type).name);
    const quant::FormatKernels& k = quant::kernels(type);
    OwnedWeight ow(type, rows, cols, 100 + int(type));
    Floats x = random_floats(T * cols, 200 + int(type));

    Floats window;
    for (int threads = 1; threads <= 3; ++threads) {
      CpuBackend be(threads);
      Tensor xt = make(be, T, cols, x), y = be.alloc(T, rows);
      be.matmul(ow.w, xt, y);
      Floats got = read(be, y);
      if (threads == 1) window = got;
      EXPECT_TRUE(same_bits(got, window)) << threads << " threads";
    }
    CpuBackend be(2);
    Tensor xt = make(be, T, cols, x), y = be.alloc(T, rows);
    for (int64_t r = 0; r < T; ++r) be.matmul(ow.w, xt.rows_view(r, 1), y.rows_view(r, 1));
    EXPECT_TRUE(same_bits(read(be, y), window)) << "T-row window vs one-row calls";

    std::vector<uint8_t> act(quant::act_bytes(k.act, cols));
    std::vector<float> wrow(cols);
    for (int64_t r = 0; r < T; ++r) {
      quant::quantize_act_ref(k.act, x.data() + r * cols, act.data(), cols);
      const Floats a = quant::testing::dequantize_act(k.act, act.data(), cols);
      for (int64_t o = 0; o < rows; ++o) {
        const uint8_t* row = ow.bytes.data() + o * ow.w.row_stride;
        const float want = k.dot_ref(row, act.data(), cols);
        k.dequantize(row, wrow.data(), cols);
        double mag = 0;
        for (int64_t i = 0; i < cols; ++i) mag += std::fabs(double(wrow[i]) * a[i]);
        const float got = window[r * rows + o];
        if (k.dot_tolerance == 0) {
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << r << "," << o;
        } else {
          ASSERT_LE(std::fabs(double(got) - want), k.dot_tolerance * mag) << r << "," << o;
        }
      }
    }
  }
}

TEST(CpuMatmul, RejectsBadShapes) {
  CpuBackend be(1);
  OwnedWeight ow(quant::Type::Q4_K, 16, 256, 1);
  Tensor x = be.alloc(2, 256), y = be.alloc(2, 16);
  expect_throws_naming([&] { be.matmul(ow.w, x.cols_view(0, 128), y); }, "matmul");
  expect_throws_naming([&] { be.matmul(ow.w, x, y.cols_view(0, 8)); }, "matmul");
  expect_throws_naming([&] { be.matmul(ow.w, x, y.rows_view(0, 1)); }, "matmul");
  Weight bad = ow.w;
  bad.cols = 200;
  expect_throws_naming([&] { be.matmul(bad, x.cols_view(0, 200), y); }, "multiple of 256");
  bad = ow.w;
  bad.data = nullptr;
  expect_throws_naming([&] { be.matmul(bad, x, y); }, "no data");
}

TEST(CpuGetRows, DequantizesTheChosenRows) {
  CpuBackend be(1);
  OwnedWeight table(quant::Type::Q8_0, 10, 64, 7);
  const std::vector<int32_t> ids = {3, 0, 9, 3};
  Tensor y = be.alloc(4, 64);
  const Ids id_tensor = make_ids(be, ids, 4, 1);
  be.get_rows(table.w, id_tensor, y);
  Floats got = read(be, y), want(64);
  for (size_t r = 0; r < ids.size(); ++r) {
    quant::dequantize(quant::Type::Q8_0, table.bytes.data() + ids[r] * table.w.row_stride,
                      want.data(), 64);
    EXPECT_EQ(0, std::memcmp(got.data() + r * 64, want.data(), 64 * 4)) << r;
  }
  const std::vector<int32_t> bad = {10};
  expect_throws_naming([&] { be.get_rows(table.w, make_ids(be, bad, 1, 1), y.rows_view(0, 1)); },
                       "id 10");
  expect_throws_naming([&] { be.get_rows(table.w, id_tensor, y.rows_view(0, 2)); }, "get_rows");
}

TEST(CpuRouter, SoftmaxTopKWithTiesAndRenormalization) {
  CpuBackend be(2);
  const int64_t T = 4, E = 64, K = 6;
  Floats logits = random_floats(T * E, 300);
  for (int64_t i = 0; i < 5; ++i) logits[3 * E + 10 + i * 7] = 9.0f;  // a 5-way tie at the top
  Tensor lt = make(be, T, E, logits);
  for (bool renorm : {false, true}) {
    const Ids ids = be.alloc_ids(T, K);
    const Tensor weights = be.alloc(T, K);
    be.route_softmax_topk(lt, renorm, ids, weights);
    const Routing got = download_routing(be, ids, weights);
    ASSERT_EQ(got.top_k, K);
    ASSERT_EQ(got.experts.size(), size_t(T * K));
    for (int64_t r = 0; r < T; ++r) {
      const float* l = logits.data() + r * E;
      double mx = -1e300, sum = 0;
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(l[e]));
      std::vector<double> p(E);
      for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
      std::vector<int32_t> ids(E);
      for (int32_t e = 0; e < E; ++e) ids[e] = e;
      std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
      double chosen = 0;
      for (int64_t j = 0; j < K; ++j) chosen += p[ids[j]] / sum;
      for (int64_t j = 0; j < K; ++j) {
        EXPECT_EQ(got.experts[r * K + j], ids[j]) << r << "," << j;
        const double want = p[ids[j]] / sum / (renorm ? chosen : 1.0);
        EXPECT_NEAR(got.weights[r * K + j], want, 1e-6 * want) << r << "," << j;
      }
    }
    // Row 3's tie resolves to the lower ids first.
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(got.experts[3 * K + j], 10 + j * 7);
  }
  expect_throws_naming([&] { be.route_softmax_topk(lt, true, be.alloc_ids(T, E + 1), be.alloc(T, E + 1)); },
                       "top_k");
  expect_throws_naming([&] { be.route_softmax_topk(lt, true, be.alloc_ids(T, 0), be.alloc(T, 0)); },
                       "top_k");
  expect_throws_naming([&] { be.route_softmax_topk(lt, true, be.alloc_ids(T, K), be.alloc(T, K + 1)); },
                       "route_softmax_topk");
}

// A host routing in backend memory, as the router leaves it.
struct RoutingTensors {
  Ids experts;
  Tensor weights;
};

RoutingTensors upload(Backend& be, const Routing& routing) {
  const int64_t rows = int64_t(routing.experts.size()) / routing.top_k;
  RoutingTensors t{be.alloc_ids(rows, routing.top_k), be.alloc(rows, routing.top_k)};
  upload_routing(be, routing, t.experts, t.weights);
  return t;
}

// The experts' FFN composed from single-row mat-vecs (quant::matvec, the same dot kernels): what
// moe_experts must equal bit for bit.
Floats moe_by_rows(const Floats& x, const Floats& y0, const Routing& routing,
                   const std::vector<ExpertWeights>& experts, int64_t T, int64_t n_embd) {
  Floats y = y0;
  for (int64_t r = 0; r < T; ++r) {
    for (int64_t j = 0; j < routing.top_k; ++j) {
      const ExpertWeights& ew = experts[routing.experts[r * routing.top_k + j]];
      const int64_t n_ff = ew.gate.rows;
      Floats g(n_ff), u(n_ff), h(n_ff), o(n_embd);
      std::vector<uint8_t> scratch(quant::act_bytes(quant::ActFormat::F32, std::max(n_ff, n_embd)));
      quant::matvec(ew.gate.type, ew.gate.data, ew.gate.row_stride, n_ff, n_embd,
                    x.data() + r * n_embd, g.data(), scratch.data());
      quant::matvec(ew.up.type, ew.up.data, ew.up.row_stride, n_ff, n_embd, x.data() + r * n_embd,
                    u.data(), scratch.data());
      for (int64_t i = 0; i < n_ff; ++i) h[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
      quant::matvec(ew.down.type, ew.down.data, ew.down.row_stride, n_embd, n_ff, h.data(),
                    o.data(), scratch.data());
      const float w = routing.weights[r * routing.top_k + j];
      for (int64_t i = 0; i < n_embd; ++i) y[r * n_embd + i] = std::fma(w, o[i], y[r * n_embd + i]);
    }
  }
  return y;
}

TEST(CpuMoe, EqualsPerRowCompositionAndIsWindowAndThreadInvariant) {
  const int64_t T = 5, n_embd = 256, n_ff = 512, E = 8, K = 3;
  std::vector<OwnedWeight> owned;
  std::vector<ExpertWeights> experts;
  owned.reserve(3 * E);
  for (int64_t e = 0; e < E; ++e) {
    // One expert in another format: experts of a window need not share one.
    const quant::Type t = e == 5 ? quant::Type::Q8_0 : quant::Type::Q4_K;
    owned.emplace_back(t, n_ff, n_embd, 400 + 3 * e);
    owned.emplace_back(t, n_ff, n_embd, 401 + 3 * e);
    owned.emplace_back(t, n_embd, n_ff, 402 + 3 * e);
    experts.push_back({owned[3 * e].w, owned[3 * e + 1].w, owned[3 * e + 2].w});
  }
  Floats x = random_floats(T * n_embd, 500), y0 = random_floats(T * n_embd, 501);
  Routing routing;
  routing.top_k = K;
  routing.experts = {5, 1, 2, 1, 5, 7, 0, 2, 5, 6, 3, 1, 7, 5, 4};
  routing.weights = {0.5f, 0.3f, 0.2f, 0.6f, 0.25f, 0.15f, 0.4f, 0.4f,
                     0.2f, 0.7f, 0.2f, 0.1f, 0.34f, 0.33f, 0.33f};

  Floats window;
  for (int threads = 1; threads <= 3; ++threads) {
    CpuBackend be(threads);
    Tensor xt = make(be, T, n_embd, x), y = make(be, T, n_embd, y0);
    const RoutingTensors rt = upload(be, routing);
    be.moe_experts(xt, rt.experts, rt.weights, experts, y);
    Floats got = read(be, y);
    if (threads == 1) window = got;
    EXPECT_TRUE(same_bits(got, window)) << threads << " threads";
  }
  EXPECT_TRUE(same_bits(window, moe_by_rows(x, y0, routing, experts, T, n_embd)));

  CpuBackend be(2);
  Tensor xt = make(be, T, n_embd, x), y = make(be, T, n_embd, y0);
  const RoutingTensors rt = upload(be, routing);
  for (int64_t r = 0; r < T; ++r)
    be.moe_experts(xt.rows_view(r, 1), rt.experts.rows_view(r, 1), rt.weights.rows_view(r, 1),
                   experts, y.rows_view(r, 1));
  EXPECT_TRUE(same_bits(read(be, y), window)) << "T-row window vs one-row calls";

  Routing bad = routing;
  bad.experts[4] = int32_t(E);
  const RoutingTensors bt = upload(be, bad);
  expect_throws_naming([&] { be.moe_experts(xt, bt.experts, bt.weights, experts, y); },
                       "expert id 8");
  expect_throws_naming(
      [&] { be.moe_experts(xt, rt.experts, rt.weights.cols_view(0, K - 1), experts, y); },
      "moe_experts");
  expect_throws_naming([&] { be.moe_experts(xt, rt.experts, rt.weights, experts, xt); }, "overlap");
  std::vector<ExpertWeights> swapped = experts;
  std::swap(swapped[1].gate, swapped[1].down);
  expect_throws_naming([&] { be.moe_experts(xt, rt.experts, rt.weights, swapped, y); }, "expert 1");
}

}  // namespace
}  // namespace strata::backend
