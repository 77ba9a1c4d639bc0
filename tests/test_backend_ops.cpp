// The CPU backend's element-wise, norm, rope, attention and recurrent ops, each against a naive
// reference written here (double precision where it matters) within a stated bound, plus the
// determinism contract: a T-row window equals T one-row calls and 1, 2 and 3 threads agree, bit
// for bit. Matmul, routing and MoE are in test_backend_ops_moe.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops_vec.h"
#include "gguf/gguf.h"
#include "util/cpu.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata::backend {
namespace {

using Floats = std::vector<float>;

Floats random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  Floats v(n);
  for (float& x : v) x = rng.normal() * scale;
  return v;
}

Tensor make(Backend& be, int64_t rows, int64_t cols, const Floats& host) {
  Tensor t = be.alloc(rows, cols);
  be.upload(host.data(), t);
  return t;
}

// Ids [values / cols, cols] holding `values` (the backend releases them on destruction).
Ids ids_of(Backend& be, const std::vector<int32_t>& values, int64_t cols = 1) {
  return make_ids(be, values, int64_t(values.size()) / cols, cols);
}

Floats read(Backend& be, const Tensor& t) {
  Floats out(size_t(t.rows * t.cols));
  be.download(t, out.data());
  return out;
}

bool same_bits(const Floats& a, const Floats& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// |got - want| <= rel * |want| + abs, element by element.
void expect_near(const Floats& got, const std::vector<double>& want, double rel, double abs,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (err > rel * std::fabs(want[i]) + abs && reported++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: " << got[i] << " vs " << want[i];
  }
}

void expect_throws_naming(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Runs `op` (which uploads its own inputs and returns its outputs) on backends of 1, 2 and 3
// threads and checks the outputs agree bitwise; returns the 1-thread result.
std::vector<Floats> across_threads(const std::function<std::vector<Floats>(Backend&)>& op) {
  std::vector<Floats> first;
  for (int threads = 1; threads <= 3; ++threads) {
    CpuBackend be(threads);
    std::vector<Floats> got = op(be);
    if (threads == 1) {
      first = got;
    } else {
      EXPECT_EQ(got.size(), first.size());
      for (size_t i = 0; i < got.size() && i < first.size(); ++i)
        EXPECT_TRUE(same_bits(got[i], first[i])) << threads << " threads, output " << i;
    }
  }
  return first;
}

TEST(CpuBackend, AllocIsZeroedAlignedAndTracked) {
  CpuBackend be(2);
  Tensor t = be.alloc(3, 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u);
  EXPECT_EQ(t.stride, 5);
  for (float v : read(be, t)) EXPECT_EQ(v, 0.0f);
  be.fill(t, 2.5f);
  for (float v : read(be, t)) EXPECT_EQ(v, 2.5f);
  expect_throws_naming([&] { be.release(t.rows_view(1, 1)); }, "release");
  be.release(t);
  expect_throws_naming([&] { be.release(t); }, "release");
}

TEST(CpuBackend, ViewsUploadDownloadAndCopy) {
  CpuBackend be(1);
  Floats host = random_floats(4 * 6, 1);
  Tensor t = make(be, 4, 6, host);
  Tensor cols = t.cols_view(2, 3);
  Floats got = read(be, cols);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(got[r * 3 + c], host[r * 6 + 2 + c]);
  Tensor dst = be.alloc(4, 3);
  be.copy(cols, dst);
  EXPECT_TRUE(same_bits(read(be, dst), got));
  expect_throws_naming([&] { be.copy(t, dst); }, "copy");
}

TEST(CpuBackend, WeightViewsAndSlices) {
  CpuBackend be(1);
  std::vector<float> data(8 * 4 * 3);
  gguf::TensorInfo info;
  info.name = "blk.0.ffn_gate_exps.weight";
  info.type = quant::Type::F32;
  info.shape = {8, 4, 3};
  info.data = reinterpret_cast<const uint8_t*>(data.data());
  Weight w = be.weight(info, 2);
  EXPECT_EQ(w.cols, 8);
  EXPECT_EQ(w.rows, 4);
  EXPECT_EQ(w.row_stride, 32u);
  EXPECT_EQ(w.data, data.data() + 2 * 32);
  expect_throws_naming([&] { be.weight(info, 3); }, "blk.0.ffn_gate_exps.weight");
  expect_throws_naming([&] { be.weight(info, -1); }, "slice");
  info.shape = {8, 4};
  EXPECT_EQ(be.weight(info).rows, 4);
  expect_throws_naming([&] { be.weight(info, 1); }, "slice 1");
  info.shape = {32};
  EXPECT_EQ(be.weight(info).rows, 1);
  info.shape = {4, 2, 2, 3};
  expect_throws_naming([&] { be.weight(info); }, "blk.0.ffn_gate_exps.weight");
  info.shape = {8, 4};
  info.data = nullptr;
  expect_throws_naming([&] { be.weight(info); }, "no data");
}

// The vector kernels' two builds are one definition: bitwise equal on every length.
TEST(CpuVecKernels, Avx2BuildEqualsBaselineBitwise) {
  if (!hardware_features().avx2) GTEST_SKIP() << "CPU lacks AVX2+FMA+F16C";
  const cpu::VecKernels& a = *cpu::vec_avx2();
  const cpu::VecKernels& b = cpu::kVecBaseline;
  for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 31, 128, 130, 257}) {
    Floats x = random_floats(size_t(n), 10 + n), y = random_floats(size_t(n), 20 + n);
    EXPECT_EQ(std::bit_cast<uint32_t>(a.dot(x.data(), y.data(), n)),
              std::bit_cast<uint32_t>(b.dot(x.data(), y.data(), n)))
        << n;
    EXPECT_EQ(std::bit_cast<uint32_t>(a.sum_squares(x.data(), n)),
              std::bit_cast<uint32_t>(b.sum_squares(x.data(), n)))
        << n;
    Floats ya = y, yb = y;
    a.rescale_axpy(0.75f, 1.3f, x.data(), ya.data(), n);
    b.rescale_axpy(0.75f, 1.3f, x.data(), yb.data(), n);
    EXPECT_TRUE(same_bits(ya, yb)) << n;
  }
  const int64_t dk = 24, dv = 40;
  Floats S = random_floats(dk * dv, 3), q = random_floats(dk, 4), k = random_floats(dk, 5),
         v = random_floats(dv, 6);
  Floats Sa = S, Sb = S, oa(dv), ob(dv), scratch(dv);
  for (int step = 0; step < 3; ++step) {
    a.delta_rule_step(Sa.data(), q.data(), k.data(), v.data(), 0.9f, 0.6f, dk, dv, scratch.data(),
                      oa.data());
    b.delta_rule_step(Sb.data(), q.data(), k.data(), v.data(), 0.9f, 0.6f, dk, dv, scratch.data(),
                      ob.data());
  }
  EXPECT_TRUE(same_bits(Sa, Sb));
  EXPECT_TRUE(same_bits(oa, ob));
}

// Checks a row-wise op: bitwise equal across thread counts, and its T-row result equals T
// one-row calls (on row views of the same tensors). `op(be, in, out)` runs on full tensors.
void check_rowwise(int64_t T, std::vector<std::pair<int64_t, Floats>> inputs, int64_t out_cols,
                   const std::function<void(Backend&, std::vector<Tensor>&, Tensor)>& op,
                   Floats* result) {
  auto run = [&](Backend& be, bool one_row) {
    std::vector<Tensor> in;
    for (auto& [cols, host] : inputs) in.push_back(make(be, T, cols, host));
    Tensor out = be.alloc(T, out_cols);
    if (one_row) {
      for (int64_t r = 0; r < T; ++r) {
        std::vector<Tensor> row;
        for (Tensor& t : in) row.push_back(t.rows_view(r, 1));
        op(be, row, out.rows_view(r, 1));
      }
    } else {
      op(be, in, out);
    }
    return read(be, out);
  };
  *result = across_threads([&](Backend& be) { return std::vector<Floats>{run(be, false)}; })[0];
  CpuBackend be(2);
  EXPECT_TRUE(same_bits(run(be, true), *result)) << "T-row window vs one-row calls";
}

TEST(CpuOps, RmsNormAndL2Norm) {
  const int64_t T = 6, C = 4096, group = 512;
  Floats x = random_floats(T * C, 31, 3.0f);
  Floats w = random_floats(group, 32);
  std::vector<float> wdata = w;
  Weight wt{quant::Type::F32, wdata.data(), group, 1, size_t(group) * 4};
  const float eps = 1e-6f;
  Floats y;
  check_rowwise(
      T, {{C, x}}, C,
      [&](Backend& be, std::vector<Tensor>& in, Tensor out) {
        be.rms_norm(in[0], &wt, group, eps, out);
      },
      &y);
  std::vector<double> want(x.size()), want_l2(x.size());
  for (int64_t g = 0; g < T * C / group; ++g) {
    double ss = 0;
    for (int64_t i = 0; i < group; ++i) ss += double(x[g * group + i]) * x[g * group + i];
    for (int64_t i = 0; i < group; ++i) {
      want[g * group + i] = x[g * group + i] / std::sqrt(ss / group + eps) * w[i];
      want_l2[g * group + i] = x[g * group + i] / std::sqrt(ss + eps);
    }
  }
  expect_near(y, want, 2e-5, 1e-7, "rms_norm");
  Floats y2;
  check_rowwise(
      T, {{C, x}}, C,
      [&](Backend& be, std::vector<Tensor>& in, Tensor out) { be.l2_norm(in[0], group, eps, out); },
      &y2);
  expect_near(y2, want_l2, 2e-5, 1e-9, "l2_norm");

  CpuBackend be(1);
  Tensor xt = make(be, T, C, x), yt = be.alloc(T, C);
  be.rms_norm(xt, nullptr, C, eps, yt);  // in place is allowed too
  be.rms_norm(xt, nullptr, C, eps, xt);
  EXPECT_TRUE(same_bits(read(be, xt), read(be, yt)));
  expect_throws_naming([&] { be.rms_norm(xt, nullptr, 500, eps, yt); }, "rms_norm");
  expect_throws_naming([&] { be.rms_norm(xt, &wt, C, eps, yt); }, "rms_norm");
  expect_throws_naming([&] { be.l2_norm(xt, group, eps, yt.cols_view(0, 10)); }, "l2_norm");
}

TEST(CpuOps, SignedSqrtDot) {
  const int64_t T = 5, C = 256, group = 64;
  const float scale = 0.125f;
  Floats a = random_floats(T * C, 41), b = random_floats(T * C, 42);
  for (int64_t i = 0; i < group; ++i) a[i] = 0.0f;  // d = 0 stays 0
  Floats y;
  check_rowwise(
      T, {{C, a}, {C, b}}, C / group,
      [&](Backend& be, std::vector<Tensor>& in, Tensor out) {
        be.signed_sqrt_dot(in[0], in[1], group, scale, out);
      },
      &y);
  std::vector<double> want(y.size());
  for (int64_t g = 0; g < T * C / group; ++g) {
    double d = 0;
    for (int64_t i = 0; i < group; ++i) d += double(a[g * group + i]) * b[g * group + i];
    d *= scale;
    want[g] = d == 0 ? 0.0 : std::copysign(std::sqrt(std::max(std::fabs(d), 1e-6)), d);
  }
  expect_near(y, want, 1e-5, 1e-7, "signed_sqrt_dot");
  EXPECT_EQ(y[0], 0.0f);
  CpuBackend be(1);
  Tensor at = make(be, T, C, a), yt = be.alloc(T, C / group);
  expect_throws_naming([&] { be.signed_sqrt_dot(at, at, 48, scale, yt); }, "signed_sqrt_dot");
}

TEST(CpuOps, ElementWise) {
  const int64_t T = 5, C = 3000;
  Floats a = random_floats(T * C, 41, 4.0f), b = random_floats(T * C, 42, 4.0f);
  Floats g1 = random_floats(T, 43, 4.0f);
  Floats y;
  check_rowwise(
      T, {{C, a}, {C, b}}, C,
      [](Backend& be, std::vector<Tensor>& in, Tensor out) { be.add(in[0], in[1], out); }, &y);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], a[i] + b[i]);
  check_rowwise(
      T, {{C, a}}, C,
      [](Backend& be, std::vector<Tensor>& in, Tensor out) { be.scale(in[0], 0.3f, out); }, &y);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], a[i] * 0.3f);

  std::vector<double> want(a.size());
  check_rowwise(
      T, {{C, a}, {C, b}}, C,
      [](Backend& be, std::vector<Tensor>& in, Tensor out) { be.mul_sigmoid(in[0], in[1], out); },
      &y);
  for (size_t i = 0; i < a.size(); ++i) want[i] = a[i] / (1.0 + std::exp(-double(b[i])));
  expect_near(y, want, 1e-6, 1e-30, "mul_sigmoid");
  check_rowwise(
      T, {{C, a}, {1, g1}}, C,
      [](Backend& be, std::vector<Tensor>& in, Tensor out) { be.mul_sigmoid(in[0], in[1], out); },
      &y);
  for (size_t i = 0; i < a.size(); ++i) want[i] = a[i] / (1.0 + std::exp(-double(g1[i / C])));
  expect_near(y, want, 1e-6, 1e-30, "mul_sigmoid (per-row gate)");
  check_rowwise(
      T, {{C, a}, {C, b}}, C,
      [](Backend& be, std::vector<Tensor>& in, Tensor out) { be.swiglu(in[0], in[1], out); }, &y);
  for (size_t i = 0; i < a.size(); ++i) want[i] = a[i] / (1.0 + std::exp(-double(a[i]))) * b[i];
  expect_near(y, want, 1e-6, 1e-30, "swiglu");

  CpuBackend be(2);
  Tensor at = make(be, T, C, a), bt = make(be, T, C, b), yt = be.alloc(T, C);
  expect_throws_naming([&] { be.add(at, bt.cols_view(0, 5), yt); }, "add");
  expect_throws_naming([&] { be.mul_sigmoid(at, bt.cols_view(0, 2), yt); }, "mul_sigmoid");
  expect_throws_naming([&] { be.swiglu(at, bt, yt.rows_view(0, 2)); }, "swiglu");
  expect_throws_naming([&] { be.scale(at, 2.0f, yt.rows_view(0, 1)); }, "scale");
}

TEST(CpuOps, SplitGroups) {
  CpuBackend be(1);
  const int64_t T = 3, groups = 4;
  const std::vector<int64_t> widths = {6, 2, 4};
  Floats x = random_floats(T * groups * 12, 51);
  Tensor xt = make(be, T, groups * 12, x);
  std::vector<Tensor> outs = {be.alloc(T, groups * 6), be.alloc(T, groups * 2),
                              be.alloc(T, groups * 4)};
  be.split_groups(xt, groups, widths, outs);
  for (size_t part = 0, first = 0; part < widths.size(); first += widths[part], ++part) {
    Floats got = read(be, outs[part]);
    for (int64_t r = 0; r < T; ++r)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t i = 0; i < widths[part]; ++i)
          ASSERT_EQ(got[(r * groups + g) * widths[part] + i],
                    x[r * groups * 12 + g * 12 + first + i]);
  }
  const std::vector<int64_t> bad = {6, 2, 5};
  expect_throws_naming([&] { be.split_groups(xt, groups, bad, outs); }, "split_groups");
  expect_throws_naming([&] { be.split_groups(xt, groups, std::span(widths).first(2), outs); },
                       "split_groups");
}

TEST(CpuOps, RopeNeox) {
  const int64_t T = 5, head_dim = 64, rope_dim = 32, heads = 3;
  const float theta = 1e7f;
  Floats x = random_floats(T * heads * head_dim, 61);
  const std::vector<int32_t> pos = {0, 1, 17, 4095, 262143};
  auto run = [&](Backend& be, bool one_row) {
    Tensor t = make(be, T, heads * head_dim, x);
    const Ids p = ids_of(be, pos);
    if (one_row) {
      for (int64_t r = 0; r < T; ++r)
        be.rope_neox(t.rows_view(r, 1), p.rows_view(r, 1), head_dim, rope_dim, theta);
    } else {
      be.rope_neox(t, p, head_dim, rope_dim, theta);
    }
    return read(be, t);
  };
  Floats y = across_threads([&](Backend& be) { return std::vector<Floats>{run(be, false)}; })[0];
  CpuBackend be(1);
  EXPECT_TRUE(same_bits(run(be, true), y));
  // The definition: fp32 inv_freq and angle, then exact rotation in double.
  std::vector<double> want(x.size());
  for (int64_t r = 0; r < T; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < head_dim; ++i) {
        const int64_t at = (r * heads + h) * head_dim + i;
        if (i >= rope_dim) {
          want[at] = x[at];
          continue;
        }
        const int64_t k = i % (rope_dim / 2);
        const float inv = 1.0f / float(std::pow(double(theta), double(float(2 * k) / rope_dim)));
        const double angle = float(float(pos[r]) * inv);
        const double a = x[at - i + k], b = x[at - i + k + rope_dim / 2];
        want[at] = i < rope_dim / 2 ? a * std::cos(angle) - b * std::sin(angle)
                                    : b * std::cos(angle) + a * std::sin(angle);
      }
  expect_near(y, want, 0, 1e-6 * 8, "rope_neox");
  Tensor t = make(be, T, heads * head_dim, x);
  const Ids p = ids_of(be, pos);
  expect_throws_naming([&] { be.rope_neox(t, p.rows_view(0, 2), head_dim, 32, theta); },
                       "rope_neox");
  expect_throws_naming([&] { be.rope_neox(t, p, head_dim, 66, theta); }, "rope_dim");
  expect_throws_naming([&] { be.rope_neox(t, p, 50, 32, theta); }, "head_dim");
}

TEST(CpuOps, Attention) {
  const int64_t n_head = 8, n_kv = 2, hd = 64, prefix = 37, T = 6, cache_rows = 64;
  const float scale = 0.125f;
  Floats kpre = random_floats(prefix * n_kv * hd, 71), vpre = random_floats(prefix * n_kv * hd, 72);
  Floats q = random_floats(T * n_head * hd, 73, 2.0f), k = random_floats(T * n_kv * hd, 74),
         v = random_floats(T * n_kv * hd, 75);
  std::vector<int32_t> pre_pos(prefix), pos(T);
  for (int i = 0; i < prefix; ++i) pre_pos[i] = i;
  for (int i = 0; i < T; ++i) pos[i] = prefix + i;
  auto run = [&](Backend& be, bool one_row) {
    Tensor kc = be.alloc(cache_rows, n_kv * hd), vc = be.alloc(cache_rows, n_kv * hd);
    be.kv_write(kc, vc, make(be, prefix, n_kv * hd, kpre), make(be, prefix, n_kv * hd, vpre),
                ids_of(be, pre_pos));
    Tensor qt = make(be, T, n_head * hd, q), kt = make(be, T, n_kv * hd, k),
           vt = make(be, T, n_kv * hd, v), y = be.alloc(T, n_head * hd);
    const Ids pt = ids_of(be, pos);
    if (one_row) {
      for (int64_t r = 0; r < T; ++r) {
        const Ids p = pt.rows_view(r, 1);
        be.kv_write(kc, vc, kt.rows_view(r, 1), vt.rows_view(r, 1), p);
        be.attention(qt.rows_view(r, 1), kc, vc, p, n_head, n_kv, hd, scale, y.rows_view(r, 1));
      }
    } else {
      be.kv_write(kc, vc, kt, vt, pt);
      be.attention(qt, kc, vc, pt, n_head, n_kv, hd, scale, y);
    }
    return read(be, y);
  };
  Floats y = across_threads([&](Backend& be) { return std::vector<Floats>{run(be, false)}; })[0];
  CpuBackend be(2);
  EXPECT_TRUE(same_bits(run(be, true), y)) << "T-row window vs one-row calls";

  Floats kall = kpre, vall = vpre;
  kall.insert(kall.end(), k.begin(), k.end());
  vall.insert(vall.end(), v.begin(), v.end());
  std::vector<double> want(y.size());
  for (int64_t r = 0; r < T; ++r)
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t kvh = h / (n_head / n_kv);
      std::vector<double> s(size_t(pos[r] + 1));
      double mx = -1e300, sum = 0;
      for (int64_t p = 0; p <= pos[r]; ++p) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i)
          d += double(q[(r * n_head + h) * hd + i]) * kall[(p * n_kv + kvh) * hd + i];
        s[p] = d * scale;
        mx = std::max(mx, s[p]);
      }
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t p = 0; p <= pos[r]; ++p) acc += s[p] / sum * vall[(p * n_kv + kvh) * hd + i];
        want[(r * n_head + h) * hd + i] = acc;
      }
    }
  expect_near(y, want, 0, 2e-6, "attention");

  Tensor kc = be.alloc(cache_rows, n_kv * hd), vc = be.alloc(cache_rows, n_kv * hd);
  Tensor qt = make(be, T, n_head * hd, q), yt = be.alloc(T, n_head * hd);
  const Ids pt = ids_of(be, pos), far = ids_of(be, {0, 1, 2, 3, 4, 64});
  expect_throws_naming([&] { be.attention(qt, kc, vc, pt, n_head, 3, hd, scale, yt); },
                       "attention");
  expect_throws_naming([&] { be.attention(qt, kc, vc, pt, n_head, n_kv, 32, scale, yt); },
                       "attention");
  expect_throws_naming([&] { be.attention(qt, kc, vc, far, n_head, n_kv, hd, scale, yt); },
                       "position 64");
  expect_throws_naming([&] { be.attention(qt, kc, vc, pt, n_head, n_kv, hd, scale, qt); },
                       "overlap");
  expect_throws_naming([&] { be.kv_write(kc, vc, qt, qt, pt); }, "kv_write");
}

// QSA: each row attends to its own ascending subset of the cache; selecting every position
// 0..p is attention, bit for bit.
TEST(CpuOps, AttentionSelected) {
  const int64_t n_head = 4, n_kv = 2, hd = 32, P = 40, T = 5;
  const float scale = 0.17f;
  Floats kall = random_floats(P * n_kv * hd, 91), vall = random_floats(P * n_kv * hd, 92),
         q = random_floats(T * n_head * hd, 93, 2.0f);
  // Row r's positions: selected[r * P .. r * P + counts[r]).
  std::vector<int32_t> pos(T), selected(size_t(T * P), 0), counts(T, 0);
  Rng rng(94);
  for (int64_t r = 0; r < T; ++r) {
    pos[r] = int32_t(P - T + r);
    for (int32_t p = 0; p <= pos[r]; ++p)
      if (p == pos[r] || rng.next() % 3 == 0) selected[size_t(r * P + counts[r]++)] = p;
  }
  std::vector<int32_t> all_pos(P);
  for (int i = 0; i < P; ++i) all_pos[i] = i;
  auto cache = [&](Backend& be, Tensor& kc, Tensor& vc) {
    kc = be.alloc(P, n_kv * hd);
    vc = be.alloc(P, n_kv * hd);
    be.kv_write(kc, vc, make(be, P, n_kv * hd, kall), make(be, P, n_kv * hd, vall),
                ids_of(be, all_pos));
  };
  auto run = [&](Backend& be, bool one_row) {
    Tensor kc, vc;
    cache(be, kc, vc);
    Tensor qt = make(be, T, n_head * hd, q), y = be.alloc(T, n_head * hd);
    const Ids sel = ids_of(be, selected, P), cnt = ids_of(be, counts);
    if (!one_row) {
      be.attention_selected(qt, kc, vc, sel, cnt, n_head, n_kv, hd, scale, y);
      return read(be, y);
    }
    for (int64_t r = 0; r < T; ++r)
      be.attention_selected(qt.rows_view(r, 1), kc, vc, sel.rows_view(r, 1), cnt.rows_view(r, 1),
                            n_head, n_kv, hd, scale, y.rows_view(r, 1));
    return read(be, y);
  };
  Floats y = across_threads([&](Backend& be) { return std::vector<Floats>{run(be, false)}; })[0];
  CpuBackend be(2);
  EXPECT_TRUE(same_bits(run(be, true), y)) << "T-row window vs one-row calls";

  std::vector<double> want(y.size());
  for (int64_t r = 0; r < T; ++r)
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t kvh = h / (n_head / n_kv);
      std::vector<double> s;
      double mx = -1e300, sum = 0;
      for (int64_t i = 0; i < counts[r]; ++i) {
        const int64_t p = selected[size_t(r * P + i)];
        double d = 0;
        for (int64_t j = 0; j < hd; ++j)
          d += double(q[(r * n_head + h) * hd + j]) * kall[(p * n_kv + kvh) * hd + j];
        s.push_back(d * scale);
        mx = std::max(mx, s.back());
      }
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t j = 0; j < hd; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < counts[r]; ++i)
          acc += s[i] / sum * vall[(selected[size_t(r * P + i)] * n_kv + kvh) * hd + j];
        want[(r * n_head + h) * hd + j] = acc;
      }
    }
  expect_near(y, want, 0, 2e-6, "attention_selected");

  Tensor kc, vc;
  cache(be, kc, vc);
  Tensor qt = make(be, T, n_head * hd, q), dense = be.alloc(T, n_head * hd), y2 = be.alloc(T, n_head * hd);
  std::vector<int32_t> every(size_t(T * P), 0), every_count(T);
  for (int64_t r = 0; r < T; ++r) {
    for (int32_t p = 0; p <= pos[r]; ++p) every[size_t(r * P + p)] = p;
    every_count[r] = pos[r] + 1;
  }
  be.attention(qt, kc, vc, ids_of(be, pos), n_head, n_kv, hd, scale, dense);
  be.attention_selected(qt, kc, vc, ids_of(be, every, P), ids_of(be, every_count), n_head, n_kv,
                        hd, scale, y2);
  EXPECT_TRUE(same_bits(read(be, dense), read(be, y2))) << "all positions = attention";

  const Ids sel = ids_of(be, selected, P), cnt = ids_of(be, counts);
  expect_throws_naming([&] { be.attention_selected(qt, kc, vc, sel, cnt.rows_view(0, 1), n_head, n_kv, hd, scale, y2); },
                       "counts");
  const Ids too_many = ids_of(be, {1, 1, 1, 1, int32_t(P + 1)});
  expect_throws_naming([&] { be.attention_selected(qt, kc, vc, sel, too_many, n_head, n_kv, hd, scale, y2); },
                       "room for 40");
  std::vector<int32_t> far = selected;
  far[0] = int32_t(P);
  expect_throws_naming([&] { be.attention_selected(qt, kc, vc, ids_of(be, far, P), cnt, n_head, n_kv, hd, scale, y2); },
                       "position 40");
}

// QSA indexer: per row, relu(q_h . key_b) summed over heads for the (p + 1) / block complete
// blocks its position sees.
TEST(CpuOps, BlockScores) {
  const int64_t T = 4, heads = 4, hd = 32, blocks = 9, block = 4;
  const float scale = 1.0f / std::sqrt(32.0f);
  Floats q = random_floats(T * heads * hd, 111), keys = random_floats(blocks * hd, 112);
  const std::vector<int32_t> pos{2, 13, 33, 38};  // 0, 3, 8 and 9 complete blocks
  auto run = [&](Backend& be, bool one_row) {
    Tensor qt = make(be, T, heads * hd, q), kt = make(be, blocks, hd, keys), y = be.alloc(T, blocks);
    const Ids p = ids_of(be, pos);
    be.fill(y, 7.0f);
    if (one_row) {
      for (int64_t r = 0; r < T; ++r)
        be.block_scores(qt.rows_view(r, 1), kt, p.rows_view(r, 1), block, heads, hd, scale,
                        y.rows_view(r, 1));
    } else {
      be.block_scores(qt, kt, p, block, heads, hd, scale, y);
    }
    return read(be, y);
  };
  Floats y = across_threads([&](Backend& be) { return std::vector<Floats>{run(be, false)}; })[0];
  CpuBackend be(2);
  EXPECT_TRUE(same_bits(run(be, true), y)) << "T-row window vs one-row calls";
  std::vector<double> want(y.size(), 0.0);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t b = 0; b < (pos[r] + 1) / block; ++b) {
      double sum = 0;
      for (int64_t h = 0; h < heads; ++h) {
        double d = 0;
        for (int64_t j = 0; j < hd; ++j) d += double(q[(r * heads + h) * hd + j]) * keys[b * hd + j];
        sum += std::max(0.0, d);
      }
      want[r * blocks + b] = sum * scale;
    }
  expect_near(y, want, 1e-5, 1e-6, "block_scores");
  Tensor qt = make(be, T, heads * hd, q), kt = make(be, blocks, hd, keys), yt = be.alloc(T, blocks);
  const Ids too_far = ids_of(be, {0, 0, 0, 40}), p = ids_of(be, pos);
  expect_throws_naming([&] { be.block_scores(qt, kt, too_far, block, heads, hd, scale, yt); },
                       "position 40 sees 10 blocks");
  expect_throws_naming([&] { be.block_scores(qt, kt, p, block, heads, 16, scale, yt); }, "block_scores");
}

// QSA's pooled block keys: the mean of the block starting at each row's first, added in row
// order; zeros where the first is negative.
TEST(CpuOps, BlockMean) {
  const int64_t rows = 20, block = 4, cols = 24;
  const std::vector<int32_t> firsts{0, -1, 13, 16, 8};
  Floats x = random_floats(rows * cols, 113);
  CpuBackend be(1);
  Tensor xt = make(be, rows, cols, x), y = be.alloc(int64_t(firsts.size()), cols);
  be.block_mean(xt, ids_of(be, firsts), block, y);
  const Floats got = read(be, y);
  for (size_t b = 0; b < firsts.size(); ++b)
    for (int64_t c = 0; c < cols; ++c) {
      float sum = 0.0f;
      for (int64_t r = 0; r < block; ++r) sum += firsts[b] < 0 ? 0.0f : x[size_t((firsts[b] + r) * cols + c)];
      ASSERT_EQ(got[b * size_t(cols) + size_t(c)], firsts[b] < 0 ? 0.0f : sum / float(block)) << b << "," << c;
    }
  expect_throws_naming([&] { be.block_mean(xt, ids_of(be, {0, 17, 0, 0, 0}), block, y); },
                       "the block at row 17 runs past the 20 rows of x");
}

// set_rows: row t to row ids[t], negative ids skipped, an id past dst named.
TEST(CpuOps, SetRows) {
  CpuBackend be(1);
  const Floats src = random_floats(3 * 5, 115);
  Tensor dst = be.alloc(6, 5);
  be.set_rows(make(be, 3, 5, src), ids_of(be, {4, -1, 0}), dst);
  const Floats got = read(be, dst);
  for (int64_t c = 0; c < 5; ++c) {
    ASSERT_EQ(got[size_t(4 * 5 + c)], src[size_t(c)]);
    ASSERT_EQ(got[size_t(c)], src[size_t(2 * 5 + c)]);
    for (int64_t r : {1, 2, 3, 5}) ASSERT_EQ(got[size_t(r * 5 + c)], 0.0f);
  }
  expect_throws_naming([&] { be.set_rows(make(be, 3, 5, src), ids_of(be, {0, 6, 1}), dst); },
                       "row id 6 is past the 6 rows of dst");
}

// QSA's choice: the best blocks (ties to the lower block), ascending, then the tail.
TEST(CpuOps, QsaSelect) {
  const int64_t block = 4, top = 3, T = 4, blocks = 8, cap = top * block + block - 1;
  const std::vector<int32_t> pos{2, 9, 30, 31};  // 0, 2, 7 and 8 complete blocks
  Floats scores = random_floats(T * blocks, 114);
  // Row 2: blocks 3 and 6 lead, then blocks 1 and 5 tie for the last place kept.
  for (int64_t b = 0; b < blocks; ++b) scores[size_t(2 * blocks + b)] = -1.0f;
  scores[2 * blocks + 3] = 10.0f;
  scores[2 * blocks + 6] = 9.5f;
  scores[2 * blocks + 1] = scores[2 * blocks + 5] = 9.0f;
  CpuBackend be(1);
  const Ids p = ids_of(be, pos), sel = be.alloc_ids(T, cap), cnt = be.alloc_ids(T, 1);
  be.qsa_select(make(be, T, blocks, scores), p, block, top, sel, cnt);
  std::vector<int32_t> got(size_t(T * cap)), got_n(T);
  be.download_ids(sel, got.data());
  be.download_ids(cnt, got_n.data());
  for (int64_t r = 0; r < T; ++r) {
    const int64_t nb = (pos[r] + 1) / block;
    std::vector<int64_t> order(static_cast<size_t>(nb));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return scores[size_t(r * blocks + a)] > scores[size_t(r * blocks + b)];
    });
    order.resize(size_t(std::min(top, nb)));
    std::sort(order.begin(), order.end());
    std::vector<int32_t> want;
    for (int64_t b : order)
      for (int64_t i = 0; i < block; ++i) want.push_back(int32_t(b * block + i));
    for (int64_t i = nb * block; i <= pos[r]; ++i) want.push_back(int32_t(i));
    ASSERT_EQ(got_n[size_t(r)], int32_t(want.size())) << "row " << r;
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + r * cap)) << "row " << r;
  }
  EXPECT_EQ(got[size_t(2 * cap)], 4) << "of two tied blocks the lower (1, not 5) is kept";
  EXPECT_EQ(got[size_t(2 * cap + 4)], 12);
  EXPECT_EQ(got[size_t(2 * cap + 8)], 24);
  expect_throws_naming([&] { be.qsa_select(make(be, T, blocks, scores), p, block, top,
                                           be.alloc_ids(T, cap - 1), cnt); }, "columns");
  expect_throws_naming([&] { be.qsa_select(make(be, T, 4, scores), p, block, top, sel, cnt); },
                       "position 30 sees 7 blocks");
}

// The delta rule's decay: ssm_a * softplus(a + dt_bias) with torch's threshold at 20.
TEST(CpuOps, SsmDecay) {
  const int64_t T = 3, heads = 4;
  Floats a = {-30.0f, -1.0f, 0.0f, 2.5f, 19.0f, 21.0f, 100.0f, -5.0f, 0.5f, 0.25f, -0.5f, 3.0f};
  const Floats dt = {0.5f, 1.5f, -0.25f, 0.0f}, ssm_a = {-1.0f, -0.5f, -2.0f, -0.125f};
  CpuBackend be(1);
  const Weight w_dt{quant::Type::F32, dt.data(), heads, 1, heads * sizeof(float)};
  const Weight w_a{quant::Type::F32, ssm_a.data(), heads, 1, heads * sizeof(float)};
  Tensor g = be.alloc(T, heads);
  be.ssm_decay(make(be, T, heads, a), w_dt, w_a, g);
  const Floats got = read(be, g);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float z = a[size_t(t * heads + h)] + dt[size_t(h)];
      const float softplus = z > 20.0f ? z : std::log1p(std::exp(z));
      EXPECT_EQ(got[size_t(t * heads + h)], ssm_a[size_t(h)] * softplus) << t << "," << h;
    }
  const Weight short_dt{quant::Type::F32, dt.data(), heads - 1, 1, (heads - 1) * sizeof(float)};
  expect_throws_naming([&] { be.ssm_decay(make(be, T, heads, a), short_dt, w_a, g); }, "dt_bias");
}

// qwen4exp's PLE conv: taps `dilation` rows apart, a state of (K-1)*dilation rows.
TEST(CpuOps, Conv1dDilatedSiluCarriesState) {
  const int64_t T = 11, C = 300, K = 4, D = 3, S = (K - 1) * D;
  Floats x = random_floats(T * C, 101), w = random_floats(C * K, 102), s0 = random_floats(S * C, 103);
  Weight wt{quant::Type::F32, w.data(), K, C, size_t(K) * 4};
  auto run = [&](Backend& be, bool one_row) {
    Tensor xt = make(be, T, C, x), st = make(be, S, C, s0), y = be.alloc(T, C);
    if (one_row) {
      for (int64_t r = 0; r < T; ++r) be.conv1d_dilated_silu(xt.rows_view(r, 1), st, wt, D, y.rows_view(r, 1));
    } else {
      be.conv1d_dilated_silu(xt, st, wt, D, y);
    }
    return std::vector<Floats>{read(be, y), read(be, st)};
  };
  std::vector<Floats> got = across_threads([&](Backend& be) { return run(be, false); });
  CpuBackend be(3);
  std::vector<Floats> rows = run(be, true);
  EXPECT_TRUE(same_bits(rows[0], got[0]) && same_bits(rows[1], got[1]));

  auto in = [&](int64_t t, int64_t c) -> double { return t < 0 ? s0[(S + t) * C + c] : x[t * C + c]; };
  std::vector<double> want(T * C), want_state(S * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) acc += double(w[c * K + j]) * in(t - (K - 1 - j) * D, c);
      want[t * C + c] = acc / (1 + std::exp(-acc));
    }
  for (int64_t s = 0; s < S; ++s)
    for (int64_t c = 0; c < C; ++c) want_state[s * C + c] = in(T - S + s, c);
  expect_near(got[0], want, 1e-5, 1e-6, "conv1d_dilated_silu");
  expect_near(got[1], want_state, 0, 0, "conv1d_dilated_silu state");

  Tensor xt = make(be, T, C, x), st = be.alloc(K - 1, C), y = be.alloc(T, C);
  expect_throws_naming([&] { be.conv1d_dilated_silu(xt, st, wt, D, y); }, "state");
  expect_throws_naming([&] { be.conv1d_dilated_silu(xt, st, wt, 0, y); }, "dilation");
}

TEST(CpuOps, Conv1dSiluCarriesState) {
  const int64_t T = 7, C = 600, K = 4;
  Floats x = random_floats(T * C, 81), w = random_floats(C * K, 82),
         s0 = random_floats((K - 1) * C, 83);
  Weight wt{quant::Type::F32, w.data(), K, C, size_t(K) * 4};
  auto run = [&](Backend& be, bool one_row) {
    Tensor xt = make(be, T, C, x), st = make(be, K - 1, C, s0), y = be.alloc(T, C);
    if (one_row) {
      for (int64_t r = 0; r < T; ++r) be.conv1d_silu(xt.rows_view(r, 1), st, wt, y.rows_view(r, 1));
    } else {
      be.conv1d_silu(xt, st, wt, y);
    }
    return std::vector<Floats>{read(be, y), read(be, st)};
  };
  std::vector<Floats> got = across_threads([&](Backend& be) { return run(be, false); });
  CpuBackend be(3);
  std::vector<Floats> rows = run(be, true);
  EXPECT_TRUE(same_bits(rows[0], got[0]) && same_bits(rows[1], got[1]));

  auto in = [&](int64_t t, int64_t c) -> double {
    return t < 0 ? s0[(K - 1 + t) * C + c] : x[t * C + c];
  };
  std::vector<double> want(T * C), want_state((K - 1) * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) acc += double(w[c * K + j]) * in(t - K + 1 + j, c);
      want[t * C + c] = acc / (1 + std::exp(-acc));
    }
  for (int64_t s = 0; s < K - 1; ++s)
    for (int64_t c = 0; c < C; ++c) want_state[s * C + c] = in(T - K + 1 + s, c);
  expect_near(got[0], want, 1e-5, 1e-6, "conv1d_silu");
  expect_near(got[1], want_state, 0, 0, "conv1d_silu state");

  Tensor xt = make(be, T, C, x), st = be.alloc(K, C), y = be.alloc(T, C);
  expect_throws_naming([&] { be.conv1d_silu(xt, st, wt, y); }, "state");
  expect_throws_naming([&] { be.conv1d_silu(xt, st.rows_view(0, K - 1), wt, xt); }, "overlap");
}

TEST(CpuOps, GatedDeltaRuleCarriesState) {
  const int64_t T = 6, H = 4, dk = 32, dv = 48;
  Rng rng(91);
  Floats q = random_floats(T * H * dk, 92), k = random_floats(T * H * dk, 93),
         v = random_floats(T * H * dv, 94), g(T * H), beta(T * H),
         s0 = random_floats(H * dk * dv, 95, 0.1f);
  for (int64_t i = 0; i < T * H; ++i) {
    g[i] = -rng.uniform(0.0f, 1.0f);
    beta[i] = rng.uniform(0.0f, 1.0f);
    for (Floats* f : {&q, &k}) {  // l2-normed, q also scaled: what the model code passes
      double ss = 0;
      for (int64_t j = 0; j < dk; ++j) ss += double((*f)[i * dk + j]) * (*f)[i * dk + j];
      const double s = (f == &q ? 1.0 / std::sqrt(double(dk)) : 1.0) / std::sqrt(ss);
      for (int64_t j = 0; j < dk; ++j) (*f)[i * dk + j] = float((*f)[i * dk + j] * s);
    }
  }
  auto run = [&](Backend& be, bool one_row) {
    Tensor qt = make(be, T, H * dk, q), kt = make(be, T, H * dk, k), vt = make(be, T, H * dv, v),
           gt = make(be, T, H, g), bt = make(be, T, H, beta), st = make(be, H * dk, dv, s0),
           y = be.alloc(T, H * dv);
    if (one_row) {
      for (int64_t r = 0; r < T; ++r)
        be.gated_delta_rule(qt.rows_view(r, 1), kt.rows_view(r, 1), vt.rows_view(r, 1),
                            gt.rows_view(r, 1), bt.rows_view(r, 1), st, H,
                            HeadRepeat::Interleaved, y.rows_view(r, 1));
    } else {
      be.gated_delta_rule(qt, kt, vt, gt, bt, st, H, HeadRepeat::Interleaved, y);
    }
    return std::vector<Floats>{read(be, y), read(be, st)};
  };
  std::vector<Floats> got = across_threads([&](Backend& be) { return run(be, false); });
  CpuBackend be(2);
  std::vector<Floats> rows = run(be, true);
  EXPECT_TRUE(same_bits(rows[0], got[0]) && same_bits(rows[1], got[1]));

  std::vector<double> S(s0.begin(), s0.end()), want(T * H * dv);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double* Sh = S.data() + h * dk * dv;
      const float* qh = q.data() + (t * H + h) * dk;
      const float* kh = k.data() + (t * H + h) * dk;
      const float* vh = v.data() + (t * H + h) * dv;
      for (int64_t i = 0; i < dk * dv; ++i) Sh[i] *= std::exp(double(g[t * H + h]));
      for (int64_t j = 0; j < dv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < dk; ++i) kv += Sh[i * dv + j] * kh[i];
        const double delta = (vh[j] - kv) * beta[t * H + h];
        for (int64_t i = 0; i < dk; ++i) Sh[i * dv + j] += kh[i] * delta;
      }
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += Sh[i * dv + j] * qh[i];
        want[(t * H + h) * dv + j] = o;
      }
    }
  expect_near(got[0], want, 1e-5, 1e-6, "gated_delta_rule output");
  expect_near(got[1], S, 1e-5, 1e-6, "gated_delta_rule state");

  Tensor qt = make(be, T, H * dk, q), vt = make(be, T, H * dv, v), gt = make(be, T, H, g),
         st = be.alloc(H * dk, dv), y = be.alloc(T, H * dv);
  const HeadRepeat rep = HeadRepeat::Interleaved;
  expect_throws_naming([&] { be.gated_delta_rule(qt, qt, vt, gt, gt, st.rows_view(0, 8), H, rep, y); },
                       "state");
  expect_throws_naming([&] { be.gated_delta_rule(qt, qt, vt, gt.cols_view(0, 3), gt, st, H, rep, y); },
                       "gated_delta_rule");
  expect_throws_naming([&] { be.gated_delta_rule(qt, qt, vt, gt, gt, st, H, rep, vt); }, "overlap");
}

}  // namespace
}  // namespace strata::backend
