// The weight ops of every backend against the CPU backend (see test_backend_parity.cpp): matmul
// per weight format, get_rows, the router, and the routed experts with random expert ids, plus the
// determinism contract on the backend under test (a T-row window equals T one-row windows, the
// two-step MoE equals the one-step one however the pairs are chunked, and the MoE equals its own
// per-pair composition from the backend's matmul and swiglu, bit for bit).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "backend_test_util.h"
#include "decode/sampler.h"
#include "test_quant_util.h"

namespace strata::backend::testing {
namespace {

using WeightOps = BackendTest;

constexpr quant::Type kFormats[] = {
    quant::Type::F32,  quant::Type::F16,     quant::Type::BF16,     quant::Type::Q8_0,
    quant::Type::Q4_0, quant::Type::Q2_K,    quant::Type::Q3_K,     quant::Type::Q4_K,
    quant::Type::Q5_K, quant::Type::Q6_K,    quant::Type::IQ2_XXS,  quant::Type::IQ2_XS,
    quant::Type::IQ3_XXS, quant::Type::IQ4_XS, quant::Type::FP8_E4M3,
};

int64_t pick(Rng& rng, int64_t lo, int64_t hi) { return lo + int64_t(rng.below(uint32_t(hi - lo + 1))); }

// Columns come in whole blocks of the weight and of its activation layout, and in groups of 8
// (the CUDA decoders' unit; the float formats' rows too).
int64_t block_of(quant::Type t) {
  return std::max({quant::type_info(t).block_elems,
                   quant::act_block_elems(quant::kernels(t).act), int64_t(8)});
}

// The matmul limit against the CPU: both compute the exact sum of the same weights times the same
// quantized activation values, within float rounding: the GPU's per-lane fma chains and butterfly
// ((cols/32 + 5) * 2^-24 relative to sum |w a|), the CPU's per-block scaling of exact integer sums
// (about 2 roundings per block) and its fast dot's tolerance.
double matmul_limit(quant::Type t, int64_t cols, double magnitude) {
  const double blocks = double(cols) / double(quant::type_info(t).block_elems);
  return (double(cols) / 32 + 2 * blocks + 16) * 0x1p-24 * magnitude +
         quant::kernels(t).dot_tolerance * magnitude;
}

TEST_P(WeightOps, MatmulEveryFormat) {
  Rng rng(21);
  for (quant::Type t : kFormats) {
    SCOPED_TRACE(quant::type_name(t));
    const int64_t block = block_of(t), T = pick(rng, 1, 19), rows = pick(rng, 1, 150),
                  cols = block * pick(rng, 1, 2048 / block + 1);
    SCOPED_TRACE(::testing::Message() << "T " << T << " rows " << rows << " cols " << cols);
    HostTensor w = random_tensor("w", t, rows, cols, 1, 100 + uint64_t(t));
    Floats x = normal_floats(size_t(T * cols), 200 + uint64_t(t));
    for (size_t i = 0; i < x.size(); i += 37) x[i] *= 8.0f;  // outliers set block scales
    auto run = [&](Backend& b, bool one_row) {
      const Weight wt = b.weight(w.info);
      Tensor xt = make(b, T, cols, x), y = b.alloc(T, rows);
      if (one_row) {
        for (int64_t r = 0; r < T; ++r) b.matmul(wt, xt.rows_view(r, 1), y.rows_view(r, 1));
      } else {
        b.matmul(wt, xt, y);
      }
      return read(b, y);
    };
    const Floats got = run(be(), false), cpu = run(ref(), false);
    expect_bitwise(run(be(), true), got, "matmul: T rows vs one-row calls");
    // The limit needs sum |w a| over the values the dot products see.
    const quant::FormatKernels& k = quant::kernels(t);
    std::vector<uint8_t> act(quant::act_bytes(k.act, cols));
    Floats wrow(static_cast<size_t>(cols));
    for (int64_t r = 0; r < T; ++r) {
      quant::quantize_act_ref(k.act, x.data() + r * cols, act.data(), cols);
      const Floats a = quant::testing::dequantize_act(k.act, act.data(), cols);
      for (int64_t o = 0; o < rows; ++o) {
        k.dequantize(w.bytes.data() + size_t(o) * quant::row_bytes(t, cols), wrow.data(), cols);
        double mag = 0;
        for (int64_t i = 0; i < cols; ++i) mag += std::fabs(double(wrow[size_t(i)]) * a[size_t(i)]);
        const size_t at = size_t(r * rows + o);
        ASSERT_LE(std::fabs(double(got[at]) - cpu[at]), matmul_limit(t, cols, mag))
            << "row " << r << " output " << o << ": " << got[at] << " vs cpu " << cpu[at];
      }
    }
  }
  HostTensor w = random_tensor("w", quant::Type::Q4_K, 16, 256, 1, 1);
  const Weight wt = be().weight(w.info);
  Tensor x = be().alloc(2, 256), y = be().alloc(2, 16);
  expect_throws_naming([&] { be().matmul(wt, x.cols_view(0, 128), y); }, "matmul");
  expect_throws_naming([&] { be().matmul(wt, x, y.cols_view(0, 8)); }, "matmul");
  Weight bad = wt;
  bad.cols = 200;
  expect_throws_naming([&] { be().matmul(bad, x.cols_view(0, 200), y); }, "multiple of 256");
  bad = wt;
  bad.data = nullptr;
  expect_throws_naming([&] { be().matmul(bad, x, y); }, "no data");
}

// matmuls of one x: bitwise the separate matmuls, for every format (the integer formats in one
// launch on CUDA), one row and several, matrices of odd row counts.
TEST_P(WeightOps, MatmulsOfOneXEqualSeparateMatmuls) {
  Rng rng(22);
  for (quant::Type t : kFormats) {
    SCOPED_TRACE(quant::type_name(t));
    const int64_t cols = block_of(t) * pick(rng, 1, 2048 / block_of(t) + 1);
    const int64_t rows[] = {pick(rng, 1, 700), pick(rng, 1, 40), pick(rng, 1, 3), pick(rng, 1, 9)};
    std::vector<HostTensor> hw;
    for (size_t i = 0; i < 4; ++i)
      hw.push_back(random_tensor(std::string("w").append(std::to_string(i)), t, rows[i], cols, 1,
                                 300 + uint64_t(t) * 4 + i));
    for (const int64_t T : {int64_t(1), int64_t(3), int64_t(8)}) {
      SCOPED_TRACE(::testing::Message() << "T " << T << " cols " << cols);
      const Floats x = normal_floats(size_t(T * cols), 400 + uint64_t(t));
      std::vector<Weight> ws;
      for (size_t i = 0; i < 4; ++i) ws.push_back(be().weight(hw[i].info));
      const Weight* wp[] = {&ws[0], &ws[1], &ws[2], &ws[3]};
      Tensor xt = make(be(), T, cols, x);
      Tensor one[4], each[4];
      for (size_t i = 0; i < 4; ++i) {
        one[i] = be().alloc(T, rows[i]);
        each[i] = be().alloc(T, rows[i]);
      }
      be().matmuls(wp, xt, one);
      for (size_t i = 0; i < 4; ++i) be().matmul(ws[i], xt, each[i]);
      for (size_t i = 0; i < 4; ++i)
        expect_bitwise(read(be(), one[i]), read(be(), each[i]),
                       "matmuls vs matmul, matrix " + std::to_string(i));
    }
  }
  HostTensor w = random_tensor("w", quant::Type::Q8_0, 16, 256, 1, 1);
  const Weight wt = be().weight(w.info);
  const Weight* wp[] = {&wt, &wt};
  Tensor x = be().alloc(1, 256), y = be().alloc(1, 16), y_short = be().alloc(1, 8);
  Tensor ys[] = {y, y_short};
  expect_throws_naming([&] { be().matmuls(wp, x, ys); }, "should be [1 x 16]");
  Tensor one_y[] = {y};
  expect_throws_naming([&] { be().matmuls(wp, x, one_y); }, "2 weights but 1 outputs");
}

TEST_P(WeightOps, GetRowsEveryFormat) {
  Rng rng(22);
  for (quant::Type t : kFormats) {
    SCOPED_TRACE(quant::type_name(t));
    const int64_t rows = pick(rng, 1, 40), cols = quant::type_info(t).block_elems * pick(rng, 1, 6) *
                                                      (quant::type_info(t).block_elems < 8 ? 8 : 1);
    HostTensor table = random_tensor("token_embd.weight", t, rows, cols, 1, 300 + uint64_t(t));
    std::vector<int32_t> ids(size_t(pick(rng, 1, 9)));
    for (int32_t& id : ids) id = int32_t(rng.below(uint32_t(rows)));
    auto run = [&](Backend& b) {
      Tensor y = b.alloc(int64_t(ids.size()), cols);
      b.get_rows(b.weight(table.info), ids_of(b, ids), y);
      return read(b, y);
    };
    expect_bitwise(run(be()), run(ref()), "get_rows vs cpu");
  }
  HostTensor table = random_tensor("t", quant::Type::Q8_0, 10, 64, 1, 7);
  const Weight wt = be().weight(table.info);
  Tensor y = be().alloc(1, 64);
  const Ids bad = ids_of(be(), {10});
  if (is_cpu()) {
    expect_throws_naming([&] { be().get_rows(wt, bad, y); }, "id 10");
  } else {  // device ids are not read on the host: the row of a bad id comes out zero
    be().get_rows(wt, bad, y);
    expect_bitwise(read(be(), y), Floats(64, 0.0f), "get_rows of an id outside the table");
  }
  expect_throws_naming([&] { be().get_rows(wt, bad, be().alloc(2, 64)); }, "get_rows");
}

// The router's choice in backend memory, read back.
Routing route(Backend& b, const Tensor& logits, int64_t K, bool renorm) {
  const Ids experts = b.alloc_ids(logits.rows, K);
  const Tensor weights = b.alloc(logits.rows, K);
  b.route_softmax_topk(logits, renorm, experts, weights);
  return download_routing(b, experts, weights);
}

TEST_P(WeightOps, RouterSoftmaxTopK) {
  for (uint64_t draw : {31, 32, 33}) {
    Rng rng(draw);
    // The CUDA kernel holds 4 to 64 columns a lane: 512 (the flagship's router) and 1500 are two.
    const int64_t T = pick(rng, 1, 9), E = draw == 31 ? 512 : draw == 32 ? 1500 : pick(rng, 4, 512),
                  K = pick(rng, 1, std::min<int64_t>(E, 10));
    SCOPED_TRACE(::testing::Message() << "T " << T << " E " << E << " K " << K);
    Floats logits = normal_floats(size_t(T * E), draw, 2.0f);
    for (int64_t i = 0; i < 5; ++i) logits[size_t(i * 7 % E)] = 9.0f;  // a tie at the top of row 0
    for (bool renorm : {false, true}) {
      Tensor lt = make(be(), T, E, logits), lr = make(ref(), T, E, logits);
      const Routing got = route(be(), lt, K, renorm);
      const Routing want = route(ref(), lr, K, renorm);
      ASSERT_EQ(got.top_k, K);
      EXPECT_EQ(got.experts, want.experts);
      expect_close(got.weights, want.weights, 2e-6, 0, "router weights vs cpu");
      for (int64_t r = 0; r < T; ++r) {  // T rows vs one-row calls
        const Routing one = route(be(), lt.rows_view(r, 1), K, renorm);
        EXPECT_TRUE(std::equal(one.experts.begin(), one.experts.end(), got.experts.begin() + r * K));
        EXPECT_EQ(0, std::memcmp(one.weights.data(), got.weights.data() + r * K, size_t(K) * 4));
      }
    }
  }
  Tensor lt = be().alloc(2, 8);
  expect_throws_naming([&] { route(be(), lt, 9, true); }, "top_k");
}

// Each row's greedy choice in backend memory, read back: the indices and the probabilities.
std::pair<std::vector<int32_t>, Floats> greedy(Backend& b, const Tensor& logits) {
  const Ids index = b.alloc_ids(logits.rows, 1);
  const Tensor prob = b.alloc(logits.rows, 1);
  b.argmax(logits, index, prob);
  std::vector<int32_t> ids(size_t(logits.rows));
  b.download_ids(index, ids.data());
  return {ids, read(b, prob)};
}

TEST_P(WeightOps, Argmax) {
  // 248320: the flagship's vocabulary (the kernel's threads stride it); odd widths leave a
  // partial last stride.
  for (const int64_t V : {int64_t(1), int64_t(37), int64_t(1025), int64_t(248320)}) {
    SCOPED_TRACE(::testing::Message() << "V " << V);
    const int64_t T = 5;
    Floats logits = normal_floats(size_t(T * V), uint64_t(V), 3.0f);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    // Row 1: a tie at the top (the lower column wins); row 2: NaNs around the largest; row 3:
    // all NaN (-1); row 4: an infinity (probability 1).
    for (const int64_t c : {V - 1, V / 2, int64_t(0)}) logits[size_t(V + c)] = 50.0f;
    for (int64_t c = 0; c < V; c += 3) logits[size_t(2 * V + c)] = nan;
    for (int64_t c = 0; c < V; ++c) logits[size_t(3 * V + c)] = nan;
    logits[size_t(4 * V + V / 3)] = inf;
    Tensor lt = make(be(), T, V, logits), lr = make(ref(), T, V, logits);
    const auto [index, prob] = greedy(be(), lt);
    const auto [want_index, want_prob] = greedy(ref(), lr);
    EXPECT_EQ(index, want_index);
    const Ids only = be().alloc_ids(T, 1);  // the index alone (no probability wanted)
    be().argmax(lt, only, Tensor{});
    std::vector<int32_t> only_index(static_cast<size_t>(T));
    be().download_ids(only, only_index.data());
    EXPECT_EQ(only_index, index);
    EXPECT_EQ(index[1], 0);
    EXPECT_EQ(index[3], -1);
    EXPECT_EQ(index[4], V / 3);
    expect_close(prob, want_prob, 2e-6 * std::log2(double(V) + 1), 0, "argmax probability vs cpu");
    for (int64_t r = 0; r < T; ++r) {  // T rows vs one-row calls
      const auto [one, one_prob] = greedy(be(), lt.rows_view(r, 1));
      EXPECT_EQ(one[0], index[size_t(r)]);
      EXPECT_EQ(0, std::memcmp(&one_prob[0], &prob[size_t(r)], 4));
    }
  }
  Tensor lt = be().alloc(2, 8);
  expect_throws_naming([&] { be().argmax(lt, be().alloc_ids(1, 1), be().alloc(2, 1)); }, "argmax");
  expect_throws_naming([&] { be().argmax(lt, be().alloc_ids(2, 1), be().alloc(2, 2)); }, "argmax");
}

// Each row's top-k candidates in backend memory, read back.
std::pair<std::vector<int32_t>, Floats> top(Backend& b, const Tensor& logits, int64_t k) {
  const Ids index = b.alloc_ids(logits.rows, k);
  const Tensor values = b.alloc(logits.rows, k);
  b.top_k(logits, index, values);
  std::vector<int32_t> ids(size_t(logits.rows * k));
  b.download_ids(index, ids.data());
  return {ids, read(b, values)};
}

TEST_P(WeightOps, TopK) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const int64_t V : {int64_t(1), int64_t(37), int64_t(1025), int64_t(248320)}) {
    for (const int64_t k : {int64_t(1), int64_t(20), int64_t(64), Backend::kMaxTopK}) {
      SCOPED_TRACE(::testing::Message() << "V " << V << " k " << k);
      const int64_t T = 6;
      Floats logits = normal_floats(size_t(T * V), uint64_t(V * 7 + k), 3.0f);
      // Row 1: few distinct values (ties across the threshold, the lower columns first) and zeros
      // of both signs; row 2: NaNs; row 3: all NaN; row 4: infinities; row 5: fewer non-NaN
      // values than k.
      for (int64_t c = 0; c < V; ++c) logits[size_t(V + c)] = float(c * 7919 % 5 - 2);
      for (int64_t c = 0; c < V; c += 4) logits[size_t(V + c)] = c % 8 ? 0.0f : -0.0f;
      for (int64_t c = 0; c < V; c += 3) logits[size_t(2 * V + c)] = nan;
      for (int64_t c = 0; c < V; ++c) logits[size_t(3 * V + c)] = nan;
      logits[size_t(4 * V + V / 3)] = inf;
      logits[size_t(4 * V + V / 2)] = -inf;
      for (int64_t c = 0; c < V; ++c)
        if (c % 97 != 5) logits[size_t(5 * V + c)] = nan;
      Tensor lt = make(be(), T, V, logits), lr = make(ref(), T, V, logits);
      const auto [index, values] = top(be(), lt, k);
      const auto [want_index, want_values] = top(ref(), lr, k);
      EXPECT_EQ(index, want_index);
      EXPECT_EQ(0, std::memcmp(values.data(), want_values.data(), values.size() * 4));
      for (int64_t j = 0; j < k; ++j) EXPECT_EQ(index[size_t(3 * k + j)], -1);  // all NaN
      if (V > 1) {
        EXPECT_EQ(index[size_t(4 * k)], V / 3);  // +inf first
      }
      for (int64_t r = 0; r < T; ++r) {                                          // T rows vs one-row calls
        const auto [one, one_values] = top(be(), lt.rows_view(r, 1), k);
        EXPECT_TRUE(std::equal(one.begin(), one.end(), index.begin() + r * k)) << "row " << r;
        EXPECT_EQ(0, std::memcmp(one_values.data(), values.data() + r * k, size_t(k) * 4)) << "row " << r;
      }
    }
  }
  Tensor lt = be().alloc(2, 8);
  expect_throws_naming([&] { be().top_k(lt, be().alloc_ids(2, 0), be().alloc(2, 0)); }, "top_k");
  expect_throws_naming([&] { be().top_k(lt, be().alloc_ids(2, 3), be().alloc(2, 4)); }, "top_k");
  expect_throws_naming([&] { be().top_k(lt, be().alloc_ids(1, 3), be().alloc(1, 3)); }, "top_k");
  const int64_t over = Backend::kMaxTopK + 1;
  expect_throws_naming([&] { be().top_k(lt, be().alloc_ids(2, over), be().alloc(2, over)); }, "top_k");
}

// Each row's softmax sum in backend memory, read back.
Floats row_sums(Backend& b, const Tensor& logits, float temperature) {
  const Tensor sums = b.alloc(logits.rows, 1);
  b.sampling_sums(logits, temperature, sums);
  return read(b, sums);
}

// T >= 6 rows of V logits for the sampling ops: row 0 random; row 1: zeros of both signs as the
// largest; row 2: NaNs; row 3: all NaN; row 4: an infinity at V / 3 and -inf at V / 2; row 5:
// one value (at V / 4) far above the rest; rows past 5 random.
Floats sampling_rows(int64_t T, int64_t V, uint64_t seed) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Floats logits = normal_floats(size_t(T * V), seed, 4.0f);
  for (int64_t c = 0; c < V; ++c) logits[size_t(V + c)] = c % 2 ? -0.0f : -float(c % 7);
  for (int64_t c = 0; c < V; c += 3) logits[size_t(2 * V + c)] = nan;
  for (int64_t c = 0; c < V; ++c) logits[size_t(3 * V + c)] = nan;
  logits[size_t(4 * V + V / 3)] = inf;
  logits[size_t(4 * V + V / 2)] = -inf;
  for (int64_t c = 0; c < V; ++c) logits[size_t(5 * V + c)] = c == V / 4 ? 1e4f : float(c % 100);
  return logits;
}

// Bitwise the CPU's: the sampler's nucleus reads this sum in place of its own over the row.
TEST_P(WeightOps, SamplingSums) {
  for (const int64_t V : {int64_t(1), int64_t(37), int64_t(256), int64_t(1025), int64_t(248320)}) {
    for (const float temperature : {0.05f, 0.7f, 1.0f, 3.0f}) {
      SCOPED_TRACE(::testing::Message() << "V " << V << " temperature " << temperature);
      const int64_t T = 6;
      // Row 3 sums to 0, rows 4 and 5 to 1 (the other weights are 0).
      const Floats logits = sampling_rows(T, V, uint64_t(V * 3 + 1));
      Tensor lt = make(be(), T, V, logits), lr = make(ref(), T, V, logits);
      const Floats sums = row_sums(be(), lt, temperature), want = row_sums(ref(), lr, temperature);
      EXPECT_EQ(0, std::memcmp(sums.data(), want.data(), sums.size() * 4));
      EXPECT_EQ(sums[3], 0.0f);
      if (V > 2) {
        EXPECT_EQ(sums[4], 1.0f);
        EXPECT_EQ(sums[5], 1.0f);
      }
      double exact = 0;  // row 0 against double-precision exps
      const float max = *std::max_element(logits.begin(), logits.begin() + V);
      for (int64_t c = 0; c < V; ++c) exact += std::exp((double(logits[size_t(c)]) - max) / temperature);
      EXPECT_NEAR(sums[0], exact, 1e-5 * exact);
      for (int64_t r = 0; r < T; ++r) {  // T rows vs one-row calls
        const Floats one = row_sums(be(), lt.rows_view(r, 1), temperature);
        EXPECT_EQ(0, std::memcmp(&one[0], &sums[size_t(r)], 4)) << "row " << r;
      }
    }
  }
  Tensor lt = be().alloc(2, 8);
  expect_throws_naming([&] { be().sampling_sums(lt, 0.7f, be().alloc(1, 1)); }, "sampling_sums");
  expect_throws_naming([&] { be().sampling_sums(lt, 0.7f, be().alloc(2, 2)); }, "sampling_sums");
  expect_throws_naming([&] { be().sampling_sums(lt, 0.0f, be().alloc(2, 1)); }, "temperature");
}

// Each row's plain temperature draw in backend memory, read back.
std::vector<int32_t> draws(Backend& b, const Tensor& logits, float temperature, const Floats& uniforms) {
  const Ids index = b.alloc_ids(logits.rows, 1);
  b.draw(logits, temperature, make(b, logits.rows, 1, uniforms), index);
  std::vector<int32_t> ids(size_t(logits.rows));
  b.download_ids(index, ids.data());
  return ids;
}

// Bitwise the CPU's, and the host sampler's token for the same row, temperature and position:
// plain temperature sampling draws where the logits are.
TEST_P(WeightOps, Draw) {
  for (const int64_t V : {int64_t(1), int64_t(37), int64_t(256), int64_t(1025), int64_t(248320)}) {
    for (const float temperature : {0.05f, 0.7f, 1.0f, 3.0f}) {
      SCOPED_TRACE(::testing::Message() << "V " << V << " temperature " << temperature);
      const int64_t T = 7;
      // Row 3 draws -1, rows 4 and 5 their one weight; row 6 is flat (u near 1 lands in the last
      // chunks).
      Floats logits = sampling_rows(T, V, uint64_t(V * 5 + 2));
      for (int64_t c = 0; c < V; ++c) logits[size_t(6 * V + c)] = 0.5f;
      Tensor lt = make(be(), T, V, logits), lr = make(ref(), T, V, logits);
      for (const uint64_t seed : {uint64_t(1), uint64_t(9)}) {
        Floats uniforms(static_cast<size_t>(T));
        for (int64_t r = 0; r < T; ++r) uniforms[size_t(r)] = counter_uniform(seed, uint64_t(100 + r));
        if (seed == 9) uniforms[6] = std::nextafter(1.0f, 0.0f);
        const std::vector<int32_t> got = draws(be(), lt, temperature, uniforms);
        EXPECT_EQ(got, draws(ref(), lr, temperature, uniforms));
        EXPECT_EQ(got[3], -1);
        if (V > 2) {
          EXPECT_EQ(got[4], int32_t(V / 3));
          EXPECT_EQ(got[5], int32_t(V / 4));
        }
        for (int64_t r = 0; r < T; ++r) {
          if (got[size_t(r)] < 0) continue;  // a row of NaNs (row 3; row 2 at V = 1): the sampler refuses it
          if (seed == 9 && r == 6) continue;  // not a counter_uniform value
          decode::Sampler sampler({.temperature = temperature, .seed = seed}, V);
          const std::span<const float> row(logits.data() + r * V, size_t(V));
          EXPECT_EQ(got[size_t(r)], sampler.sample_at(row, {}, uint64_t(100 + r))) << "row " << r;
          const std::vector<int32_t> one =
              draws(be(), lt.rows_view(r, 1), temperature, Floats{uniforms[size_t(r)]});
          EXPECT_EQ(one[0], got[size_t(r)]) << "row " << r << " alone";
        }
      }
    }
  }
  Tensor lt = be().alloc(2, 8);
  expect_throws_naming([&] { be().draw(lt, 0.7f, be().alloc(1, 1), be().alloc_ids(2, 1)); }, "draw");
  expect_throws_naming([&] { be().draw(lt, 0.0f, be().alloc(2, 1), be().alloc_ids(2, 1)); }, "temperature");
}

// Experts of random formats, random routing; owned by the test.
struct Experts {
  std::vector<HostTensor> tensors;  // gate, up, down per expert
  int64_t n_embd, n_ff;
};

// F16 last: the other types have integer dot products on every backend (integer_only leaves it
// out, so that CUDA's integer MoE path runs; with F16 its MoE decodes to fp32).
// Every third expert of a random type, the others Q4_K; every_integer_type: expert e of integer
// type e % 4 (each of the four in one table).
Experts random_experts(Rng& rng, int64_t E, int64_t n_embd, int64_t n_ff, bool integer_only = false,
                       bool every_integer_type = false) {
  const quant::Type types[] = {quant::Type::Q4_K, quant::Type::Q8_0, quant::Type::IQ2_XS,
                               quant::Type::FP8_E4M3, quant::Type::F16};
  Experts ex{{}, n_embd, n_ff};
  for (int64_t e = 0; e < E; ++e) {
    const quant::Type t = every_integer_type ? types[e % 4]
                          : e % 3 == 1       ? types[rng.below(integer_only ? 4 : 5)]
                                             : quant::Type::Q4_K;
    ex.tensors.push_back(random_tensor("gate", t, n_ff, n_embd, 1, rng.next()));
    ex.tensors.push_back(random_tensor("up", t, n_ff, n_embd, 1, rng.next()));
    ex.tensors.push_back(random_tensor("down", t, n_embd, n_ff, 1, rng.next()));
  }
  return ex;
}

std::vector<ExpertWeights> weights_on(Backend& b, const Experts& ex) {
  std::vector<ExpertWeights> out;
  for (size_t i = 0; i < ex.tensors.size(); i += 3)
    out.push_back({b.weight(ex.tensors[i].info), b.weight(ex.tensors[i + 1].info),
                   b.weight(ex.tensors[i + 2].info)});
  return out;
}

// A host routing in backend memory.
struct RoutingTensors {
  Ids experts;
  Tensor weights;
};

RoutingTensors on(Backend& b, const Routing& r) {
  const int64_t rows = int64_t(r.experts.size()) / r.top_k;
  RoutingTensors t{b.alloc_ids(rows, r.top_k), b.alloc(rows, r.top_k)};
  upload_routing(b, r, t.experts, t.weights);
  return t;
}

void moe(Backend& b, const Tensor& x, const Routing& r, std::span<const ExpertWeights> ew, Tensor y) {
  const RoutingTensors t = on(b, r);
  b.moe_experts(x, t.experts, t.weights, ew, y);
}

Routing rows_of(const Routing& r, int64_t first, int64_t n) {
  Routing out;
  out.top_k = r.top_k;
  out.experts.assign(r.experts.begin() + first * r.top_k, r.experts.begin() + (first + n) * r.top_k);
  out.weights.assign(r.weights.begin() + first * r.top_k, r.weights.begin() + (first + n) * r.top_k);
  return out;
}

TEST_P(WeightOps, MoeRandomExperts) {
  // Draws 45 and 46 are prefill-sized windows (80 to 160 pairs, several per expert) with experts
  // of every integer type: on CUDA they run grouped by expert in chunks (IQ2_XS on the tensor
  // cores), the one-row windows pair by pair.
  for (uint64_t draw : {41, 42, 43, 44, 45, 46}) {
    Rng rng(draw);
    const bool long_window = draw >= 45;
    const int64_t E = long_window ? pick(rng, 6, 12) : pick(rng, 3, 12),
                  K = long_window ? 4 : pick(rng, 1, std::min<int64_t>(E, 4)),
                  T = long_window ? pick(rng, 20, 40) : pick(rng, 1, 11),
                  n_embd = 256 * pick(rng, 1, 2), n_ff = 256 * pick(rng, 1, 2);
    SCOPED_TRACE(::testing::Message() << "E " << E << " K " << K << " T " << T << " n_embd "
                                      << n_embd << " n_ff " << n_ff);
    const Experts ex = random_experts(rng, E, n_embd, n_ff, draw >= 44, long_window);
    const Routing routing = random_routing(rng, T, E, K);
    const Floats x = normal_floats(size_t(T * n_embd), draw), y0 = normal_floats(size_t(T * n_embd), draw + 1);

    auto one_step = [&](Backend& b) {
      const std::vector<ExpertWeights> ew = weights_on(b, ex);
      Tensor xt = make(b, T, n_embd, x), y = make(b, T, n_embd, y0);
      moe(b, xt, routing, ew, y);
      return read(b, y);
    };
    const Floats got = one_step(be()), cpu = one_step(ref());

    // Each pair's FFN from the backend's own matmul and swiglu, combined in rank order with fma.
    // On CUDA, F16 experts decode to fp32 in the MoE kernels: there y is held to the CPU instead
    // (below).
    if (is_cpu()) {
      const std::vector<ExpertWeights> ew = weights_on(be(), ex);
      Tensor xt = make(be(), T, n_embd, x);
      Floats want = y0;
      for (int64_t r = 0; r < T; ++r)
        for (int64_t j = 0; j < K; ++j) {
          const ExpertWeights& w = ew[size_t(routing.experts[size_t(r * K + j)])];
          Tensor g = be().alloc(1, n_ff), u = be().alloc(1, n_ff), o = be().alloc(1, n_embd);
          be().matmul(w.gate, xt.rows_view(r, 1), g);
          be().matmul(w.up, xt.rows_view(r, 1), u);
          be().swiglu(g, u, g);
          be().matmul(w.down, g, o);
          const Floats out = read(be(), o);
          const float wt = routing.weights[size_t(r * K + j)];
          for (int64_t i = 0; i < n_embd; ++i)
            want[size_t(r * n_embd + i)] = std::fma(wt, out[size_t(i)], want[size_t(r * n_embd + i)]);
        }
      expect_bitwise(got, want, "moe_experts vs its per-pair composition");
    }
    // T rows vs one-row windows.
    {
      const std::vector<ExpertWeights> ew = weights_on(be(), ex);
      Tensor xt = make(be(), T, n_embd, x), y = make(be(), T, n_embd, y0);
      for (int64_t r = 0; r < T; ++r)
        moe(be(), xt.rows_view(r, 1), rows_of(routing, r, 1), ew, y.rows_view(r, 1));
      expect_bitwise(read(be(), y), got, "moe_experts: T rows vs one-row calls");
    }
    // Two steps, pairs in random chunks.
    {
      const std::vector<ExpertWeights> ew = weights_on(be(), ex);
      Tensor xt = make(be(), T, n_embd, x), y = make(be(), T, n_embd, y0),
             out = be().alloc(T * K, n_embd);
      std::vector<int64_t> all(size_t(T * K));
      std::iota(all.begin(), all.end(), 0);
      std::vector<std::vector<int64_t>> chunks(3);
      for (int64_t p : all) chunks[rng.below(3)].push_back(p);
      const RoutingTensors rt = on(be(), routing);
      for (const auto& c : chunks) be().moe_expert_outputs(xt, rt.experts, c, ew, out);
      be().moe_combine(rt.weights, out, y);
      expect_bitwise(read(be(), y), got, "moe_expert_outputs in chunks + moe_combine");
    }
    // Against the CPU: the hidden layer is quantized before down, and a hidden value an ulp away
    // from a rounding boundary can land one quantization step apart; the limit is relative to
    // the row's largest output.
    for (int64_t r = 0; r < T; ++r) {
      double peak = 0;
      for (int64_t i = 0; i < n_embd; ++i) peak = std::max(peak, std::fabs(double(cpu[size_t(r * n_embd + i)])));
      for (int64_t i = 0; i < n_embd; ++i) {
        const size_t at = size_t(r * n_embd + i);
        ASSERT_LE(std::fabs(double(got[at]) - cpu[at]), 5e-3 * peak) << "row " << r << " col " << i;
      }
    }
  }
  Rng rng(5);
  const Experts ex = random_experts(rng, 4, 256, 256);
  const std::vector<ExpertWeights> ew = weights_on(be(), ex);
  Routing routing = random_routing(rng, 2, 4, 2);
  Tensor xt = be().alloc(2, 256), y = be().alloc(2, 256);
  if (is_cpu()) {  // expert ids are device values elsewhere
    Routing bad = routing;
    bad.experts[1] = 4;
    expect_throws_naming([&] { moe(be(), xt, bad, ew, y); }, "expert id 4");
  }
  const RoutingTensors rt = on(be(), routing);
  expect_throws_naming(
      [&] { be().moe_experts(xt, rt.experts, rt.weights.cols_view(0, 1), ew, y); }, "moe_experts");
  expect_throws_naming([&] { moe(be(), xt, routing, ew, xt); }, "overlap");
  std::vector<ExpertWeights> narrow = ew;
  for (ExpertWeights& w : narrow) w.gate.rows = 128;
  expect_throws_naming([&] { moe(be(), xt, routing, narrow, y); }, "shapes");
}

// The MoE's combine and the block's end (add_mul_sigmoid_residual_rms_norm of its y) in one
// kernel on CUDA, which holds the combine back for it: the residual, y and the norm bitwise the
// MoE and the two ops apart, after moe_experts and after moe_expert_outputs + moe_combine, for a
// decode row and a window of rows.
TEST_P(WeightOps, MoeThenResidualNormEqualsTheOpsApart) {
  Rng rng(61);
  const int64_t E = 6, K = 3, n_embd = 1024, n_ff = 256;
  const Experts ex = random_experts(rng, E, n_embd, n_ff, true);
  HostTensor gain = f32_tensor("norm.weight", {n_embd}, normal_floats(size_t(n_embd), 62));
  for (const int64_t T : {int64_t(1), int64_t(5)}) {
    SCOPED_TRACE(::testing::Message() << "T " << T);
    const Routing routing = random_routing(rng, T, E, K);
    const Floats x = normal_floats(size_t(T * n_embd), 63), r0 = normal_floats(size_t(T * n_embd), 64, 3.0f),
                 s0 = normal_floats(size_t(T * n_embd), 65), g0 = normal_floats(size_t(T), 66, 2.0f);
    // residual, y, normed
    auto run = [&](bool one_op, bool two_step) {
      const std::vector<ExpertWeights> ew = weights_on(be(), ex);
      const Weight wn = be().weight(gain.info);
      Tensor xt = make(be(), T, n_embd, x), y = be().alloc(T, n_embd), res = make(be(), T, n_embd, r0),
             shared = make(be(), T, n_embd, s0), g = make(be(), T, 1, g0), n = be().alloc(T, n_embd);
      const RoutingTensors rt = on(be(), routing);
      if (two_step) {
        std::vector<int64_t> all(size_t(T * K));
        std::iota(all.begin(), all.end(), 0);
        Tensor out = be().alloc(T * K, n_embd);
        be().moe_expert_outputs(xt, rt.experts, all, ew, out);
        be().moe_combine(rt.weights, out, y);
      } else {
        be().moe_experts(xt, rt.experts, rt.weights, ew, y);
      }
      if (one_op) {
        be().add_mul_sigmoid_residual_rms_norm(res, y, shared, g, wn, 1e-6f, n);
      } else {
        be().add_mul_sigmoid_residual(res, y, shared, g);
        be().rms_norm(res, &wn, n_embd, 1e-6f, n);
      }
      return std::vector<Floats>{read(be(), res), read(be(), y), read(be(), n)};
    };
    const std::vector<Floats> apart = run(false, false);
    const char* what[] = {"residual", "y", "normed"};
    for (const bool two_step : {false, true}) {
      const std::vector<Floats> got = run(true, two_step);
      for (size_t i = 0; i < got.size(); ++i)
        expect_bitwise(got[i], apart[i], std::string(what[i]) + (two_step ? ": outputs + combine" : ": moe_experts") +
                                             ", then one op vs the ops apart");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, WeightOps, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::backend::testing
