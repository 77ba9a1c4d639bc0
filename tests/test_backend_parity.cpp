// Every backend against the CPU backend, op by op, as ggml's test-backend-ops does: random shapes
// (three draws per op), each op run on the backend under test and on a CpuBackend and compared
// within the op's stated limit (docs/CUDA.md, "Error limits against the CPU"; bitwise where the op
// is pure data movement or reduces in the CPU's lane order), plus the determinism contract on the
// backend under test: a T-row call equals T one-row calls bit for bit. The "cpu" instance checks
// the CPU backend against a second CPU backend of another thread count; "cuda" skips without a
// device, printing why. Weight ops are in test_backend_parity_moe.cpp; the CPU backend's checks
// against naive references stay in test_backend_ops*.cpp.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend_test_util.h"

namespace strata::backend::testing {
namespace {

using Ops = BackendTest;

// The three random draws every op runs.
constexpr uint64_t kDraws[] = {11, 12, 13};

int64_t pick(Rng& rng, int64_t lo, int64_t hi) { return lo + int64_t(rng.below(uint32_t(hi - lo + 1))); }

TEST_P(Ops, MemoryUploadDownloadViewsAndIds) {
  Backend& b = be();
  Tensor t = b.alloc(5, 7);
  for (float v : read(b, t)) ASSERT_EQ(v, 0.0f);
  b.fill(t.cols_view(2, 3), 1.5f);
  Floats got = read(b, t);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 7; ++c) ASSERT_EQ(got[r * 7 + c], c >= 2 && c < 5 ? 1.5f : 0.0f);
  const Floats host = normal_floats(4 * 3, 1);
  b.upload(host.data(), t.rows_view(1, 4).cols_view(3, 3));
  got = read(b, t.rows_view(1, 4).cols_view(3, 3));
  expect_bitwise(got, host, "strided upload/download");
  Tensor dst = b.alloc(4, 3);
  b.copy(t.rows_view(1, 4).cols_view(3, 3), dst);
  expect_bitwise(read(b, dst), host, "copy of a view");
  expect_throws_naming([&] { b.copy(t, dst); }, "copy");
  expect_throws_naming([&] { b.release(t.rows_view(1, 1)); }, "release");
  b.release(t);
  expect_throws_naming([&] { b.release(t); }, "release");
  b.release(dst);

  Ids ids = b.alloc_ids(3, 4);
  std::vector<int32_t> back(12, -1);
  b.download_ids(ids, back.data());
  for (int32_t v : back) ASSERT_EQ(v, 0);
  std::vector<int32_t> vals(12);
  std::iota(vals.begin(), vals.end(), -5);
  b.upload_ids(vals.data(), ids);
  b.download_ids(ids, back.data());
  EXPECT_EQ(back, vals);
  std::vector<int32_t> row(4);
  b.download_ids(ids.rows_view(2, 1), row.data());
  EXPECT_EQ(row, std::vector<int32_t>(vals.begin() + 8, vals.end()));
  expect_throws_naming([&] { b.release_ids(ids.rows_view(1, 1)); }, "release_ids");
  b.release_ids(ids);
}

TEST_P(Ops, WeightsAndSlices) {
  HostTensor stack = random_tensor("blk.0.ffn_gate_exps.weight", quant::Type::Q8_0, 6, 64, 3, 5);
  Weight w = be().weight(stack.info, 2);
  EXPECT_EQ(w.cols, 64);
  EXPECT_EQ(w.rows, 6);
  EXPECT_EQ(w.row_stride, quant::row_bytes(quant::Type::Q8_0, 64));
  // Slice 2 row 4 is the stack's row 16.
  Tensor y = be().alloc(1, 64);
  be().get_rows(w, ids_of(be(), {4}), y);
  Floats want(64);
  quant::dequantize(quant::Type::Q8_0, stack.bytes.data() + 16 * w.row_stride, want.data(), 64);
  expect_bitwise(read(be(), y), want, "slice 2, row 4");
  expect_throws_naming([&] { be().weight(stack.info, 3); }, "blk.0.ffn_gate_exps.weight");
  expect_throws_naming([&] { be().weight(stack.info, -1); }, "slice");
  HostTensor bad = stack;
  bad.info.shape = {4, 2, 2, 3};
  expect_throws_naming([&] { be().weight(bad.info); }, "blk.0.ffn_gate_exps.weight");
  bad.info.shape = {64, 6};
  bad.info.data = nullptr;
  expect_throws_naming([&] { be().weight(bad.info); }, "no data");
}

// A row-wise op on the backend under test and on the CPU: the T-row result, the same call row by
// row on the backend under test (must be bitwise the T-row result), and the CPU's T-row result.
struct RowwiseResult {
  Floats window, rows, cpu;
};

RowwiseResult run_rowwise(Backend& be, Backend& cpu, int64_t T,
                          const std::vector<std::pair<int64_t, Floats>>& inputs, int64_t out_cols,
                          const std::function<void(Backend&, std::vector<Tensor>&, Tensor)>& op) {
  auto run = [&](Backend& b, bool one_row) {
    std::vector<Tensor> in;
    for (const auto& [cols, host] : inputs) in.push_back(make(b, T, cols, host));
    Tensor out = b.alloc(T, out_cols);
    if (one_row) {
      for (int64_t r = 0; r < T; ++r) {
        std::vector<Tensor> row;
        for (Tensor& t : in) row.push_back(t.rows_view(r, 1));
        op(b, row, out.rows_view(r, 1));
      }
    } else {
      op(b, in, out);
    }
    Floats got = read(b, out);
    for (Tensor& t : in) b.release(t);
    b.release(out);
    return got;
  };
  return {run(be, false), run(be, true), run(cpu, false)};
}

TEST_P(Ops, ElementWise) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t T = pick(rng, 1, 9), C = pick(rng, 1, 3000);
    SCOPED_TRACE(::testing::Message() << "T " << T << " C " << C);
    const Floats a = normal_floats(size_t(T * C), draw * 10 + 1, 4.0f);
    const Floats b = normal_floats(size_t(T * C), draw * 10 + 2, 4.0f);
    const Floats g1 = normal_floats(size_t(T), draw * 10 + 3, 4.0f);
    struct Case {
      const char* name;
      std::vector<std::pair<int64_t, Floats>> in;
      std::function<void(Backend&, std::vector<Tensor>&, Tensor)> op;
      double rel;  // 0: bitwise
    };
    const Case cases[] = {
        {"add", {{C, a}, {C, b}}, [](Backend& k, std::vector<Tensor>& i, Tensor o) { k.add(i[0], i[1], o); }, 0},
        {"scale", {{C, a}}, [](Backend& k, std::vector<Tensor>& i, Tensor o) { k.scale(i[0], 0.3f, o); }, 0},
        {"mul_sigmoid", {{C, a}, {C, b}}, [](Backend& k, std::vector<Tensor>& i, Tensor o) { k.mul_sigmoid(i[0], i[1], o); }, 2e-6},
        {"mul_sigmoid per row", {{C, a}, {1, g1}}, [](Backend& k, std::vector<Tensor>& i, Tensor o) { k.mul_sigmoid(i[0], i[1], o); }, 2e-6},
        {"swiglu", {{C, a}, {C, b}}, [](Backend& k, std::vector<Tensor>& i, Tensor o) { k.swiglu(i[0], i[1], o); }, 2e-6},
    };
    for (const Case& c : cases) {
      const RowwiseResult r = run_rowwise(be(), ref(), T, c.in, C, c.op);
      expect_bitwise(r.rows, r.window, std::string(c.name) + ": T rows vs one-row calls");
      if (c.rel == 0)
        expect_bitwise(r.window, r.cpu, std::string(c.name) + " vs cpu");
      else
        expect_close(r.window, r.cpu, c.rel, 1e-30, std::string(c.name) + " vs cpu");
    }
  }
  Tensor at = make(be(), 2, 8, normal_floats(16, 1)), yt = be().alloc(2, 8);
  expect_throws_naming([&] { be().add(at, at.cols_view(0, 5), yt); }, "add");
  expect_throws_naming([&] { be().mul_sigmoid(at, at.cols_view(0, 2), yt); }, "mul_sigmoid");
  expect_throws_naming([&] { be().swiglu(at, at, yt.rows_view(0, 1)); }, "swiglu");
  expect_throws_naming([&] { be().scale(at, 2.0f, yt.rows_view(0, 1)); }, "scale");
}

// Fused element-wise pairs: bitwise the two ops they replace on the same backend, the CPU's
// within the sigmoid's limit, and T-row windows equal one-row calls.
TEST_P(Ops, FusedGatesEqualTheOpsTheyReplace) {
  using Op = std::function<void(Backend&, std::vector<Tensor>&, Tensor)>;
  auto expect_fused = [&](const char* name, int64_t T, const std::vector<std::pair<int64_t, Floats>>& in,
                          int64_t out_cols, double abs, const Op& fused, const Op& parts) {
    const RowwiseResult f = run_rowwise(be(), ref(), T, in, out_cols, fused);
    const RowwiseResult p = run_rowwise(be(), ref(), T, in, out_cols, parts);
    expect_bitwise(f.rows, f.window, std::string(name) + ": T rows vs one-row calls");
    expect_bitwise(f.window, p.window, std::string(name) + " vs its two ops");
    expect_close(f.window, f.cpu, 2e-6, abs, std::string(name) + " vs cpu");
  };
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t T = pick(rng, 1, 9), C = pick(rng, 1, 3000), H = pick(rng, 1, 64);
    SCOPED_TRACE(::testing::Message() << "T " << T << " C " << C << " H " << H);
    const Floats y = normal_floats(size_t(T * C), draw * 10 + 1, 4.0f);
    const Floats x = normal_floats(size_t(T * C), draw * 10 + 2, 4.0f);
    const Floats gate = normal_floats(size_t(T * C), draw * 10 + 3, 4.0f);
    // The sum may cancel: its bound is the product's (x * sigmoid within 2e-6 of |x| < 5 sigma).
    for (const int64_t gate_cols : {C, int64_t(1)})
      expect_fused(
          gate_cols == 1 ? "add_mul_sigmoid per row" : "add_mul_sigmoid", T,
          {{C, y}, {C, x}, {gate_cols, gate}}, C, 2e-6 * 20,
          [](Backend& k, std::vector<Tensor>& i, Tensor o) {
            k.copy(i[0], o);
            k.add_mul_sigmoid(o, i[1], i[2]);
          },
          [](Backend& k, std::vector<Tensor>& i, Tensor o) {
            k.copy(i[0], o);
            k.mul_sigmoid(i[1], i[2], i[1]);
            k.add(o, i[1], o);
          });
    // ssm_gates: beta in the first H columns of the output, g in the next H.
    const Floats b = normal_floats(size_t(T * H), draw * 10 + 4, 4.0f);
    const Floats a = normal_floats(size_t(T * H), draw * 10 + 5, 8.0f);
    HostTensor dt = f32_tensor("ssm_dt.bias", {H}, normal_floats(size_t(H), draw * 10 + 6));
    HostTensor sa = f32_tensor("ssm_a", {H}, normal_floats(size_t(H), draw * 10 + 7));
    const Weight dt_b = be().weight(dt.info), sa_b = be().weight(sa.info);
    const Weight dt_r = ref().weight(dt.info), sa_r = ref().weight(sa.info);
    auto weights = [&](Backend& k) {
      return &k == &ref() ? std::pair{&dt_r, &sa_r} : std::pair{&dt_b, &sa_b};
    };
    expect_fused(
        "ssm_gates", T, {{H, b}, {H, a}}, 2 * H, 1e-30,
        [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
          const auto [d, s] = weights(k);
          k.ssm_gates(i[0], i[1], *d, *s, o.cols_view(0, H), o.cols_view(H, H));
        },
        [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
          const auto [d, s] = weights(k);
          k.fill(o.cols_view(0, H), 1.0f);
          k.mul_sigmoid(o.cols_view(0, H), i[0], o.cols_view(0, H));
          k.ssm_decay(i[1], *d, *s, o.cols_view(H, H));
        });
  }
  // The DeltaNet's fused norms and the MoE's residual add, each against the ops it stands for.
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t T = pick(rng, 1, 9), group = pick(rng, 1, 200), heads = pick(rng, 1, 8);
    const int64_t C = group * heads, q_cols = group * pick(rng, 0, heads);
    SCOPED_TRACE(::testing::Message() << "T " << T << " group " << group << " heads " << heads);
    const Floats x = normal_floats(size_t(T * C), draw * 10 + 1, 4.0f);
    const Floats z = normal_floats(size_t(T * C), draw * 10 + 2, 4.0f);
    const float q_scale = 1.0f / std::sqrt(float(group));
    expect_fused(
        "qk_l2_norm", T, {{C, x}}, C, 1e-30,
        [&](Backend& k, std::vector<Tensor>& i, Tensor o) { k.qk_l2_norm(i[0], group, 1e-6f, q_cols, q_scale, o); },
        [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
          k.l2_norm(i[0], group, 1e-6f, o);
          k.scale(o.cols_view(0, q_cols), q_scale, o.cols_view(0, q_cols));
        });
    HostTensor gain = f32_tensor("ssm_norm.weight", {group}, normal_floats(size_t(group), draw * 10 + 3));
    const Weight gain_b = be().weight(gain.info), gain_r = ref().weight(gain.info);
    for (const OutputGate kind : {OutputGate::Silu, OutputGate::Sigmoid})
      expect_fused(
          kind == OutputGate::Silu ? "rms_norm_gated silu" : "rms_norm_gated sigmoid", T,
          {{C, x}, {C, z}}, C, 1e-30,
          [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
            k.copy(i[0], o);
            k.rms_norm_gated(o, &k == &ref() ? gain_r : gain_b, group, 1e-6f, i[1], kind);
          },
          [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
            k.copy(i[0], o);
            k.rms_norm(o, &k == &ref() ? &gain_r : &gain_b, group, 1e-6f, o);
            if (kind == OutputGate::Silu)
              k.swiglu(i[1], o, o);
            else
              k.mul_sigmoid(o, i[1], o);
          });
    const Floats y = normal_floats(size_t(T * C), draw * 10 + 4, 4.0f);
    const Floats g1 = normal_floats(size_t(T), draw * 10 + 5, 4.0f);
    expect_fused(
        "add_mul_sigmoid_residual", T, {{C, x}, {C, y}, {C, z}, {1, g1}}, C, 2e-6 * 40,
        [](Backend& k, std::vector<Tensor>& i, Tensor o) {
          k.copy(i[0], o);
          k.add_mul_sigmoid_residual(o, i[1], i[2], i[3]);
        },
        [](Backend& k, std::vector<Tensor>& i, Tensor o) {
          k.copy(i[0], o);
          k.add_mul_sigmoid(i[1], i[2], i[3]);
          k.add(o, i[1], o);
        });
  }
  // The hyper-connection ops (qwen4exp), each against the ops it stands for: streams of n columns.
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t T = pick(rng, 1, 9), n = pick(rng, 1, 3000), S = pick(rng, 1, 5);
    SCOPED_TRACE(::testing::Message() << "T " << T << " n " << n << " streams " << S);
    const Floats x = normal_floats(size_t(T * S * n), draw * 10 + 1, 4.0f);
    const Floats g = normal_floats(size_t(T * S * n), draw * 10 + 2, 4.0f);
    const Floats out = normal_floats(size_t(T * n), draw * 10 + 3, 4.0f);
    const Floats logits = normal_floats(size_t(T * S), draw * 10 + 4, 8.0f);
    const float inv = 1.0f / float(S);
    // The stream sum may cancel: its bound is its terms' (x * sigmoid within 2e-6 of |x| < 5 sigma).
    expect_fused(
        "mean_mul_sigmoid_streams", T, {{S * n, x}, {S * n, g}}, n, 2e-6 * 20,
        [&](Backend& k, std::vector<Tensor>& i, Tensor o) { k.mean_mul_sigmoid_streams(i[0], i[1], S, o); },
        [&](Backend& k, std::vector<Tensor>& i, Tensor o) { k.Backend::mean_mul_sigmoid_streams(i[0], i[1], S, o); });
    expect_fused(
        "inject_streams", T, {{S * n, x}, {n, out}, {S, logits}}, S * n, 2e-6 * 20,
        [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
          k.copy(i[0], o);
          k.inject_streams(o, i[1], i[2], inv);
        },
        [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
          k.copy(i[0], o);
          k.Backend::inject_streams(o, i[1], i[2], inv);
        });
    expect_fused(
        "scaled_silu", T, {{n, out}}, n, 1e-30,
        [&](Backend& k, std::vector<Tensor>& i, Tensor o) { k.scaled_silu(i[0], inv, o); },
        [&](Backend& k, std::vector<Tensor>& i, Tensor o) { k.Backend::scaled_silu(i[0], inv, o); });
  }
  Tensor at = be().alloc(2, 8), yt = be().alloc(2, 8);
  expect_throws_naming([&] { be().mean_mul_sigmoid_streams(at, yt, 3, at.cols_view(0, 2)); },
                       "mean_mul_sigmoid_streams");
  expect_throws_naming([&] { be().inject_streams(at, yt.cols_view(0, 3), yt.cols_view(3, 2), 1.0f); },
                       "inject_streams");
  expect_throws_naming([&] { be().scaled_silu(at, 1.0f, yt.rows_view(0, 1)); }, "scale");
  expect_throws_naming([&] { be().qk_l2_norm(at, 4, 1e-6f, 9, 1.0f, yt); }, "qk_l2_norm");
  HostTensor gain = f32_tensor("ssm_norm.weight", {4}, normal_floats(4, 1));
  const Weight gain_w = be().weight(gain.info);
  expect_throws_naming([&] { be().rms_norm_gated(at, gain_w, 4, 1e-6f, yt.cols_view(0, 4), OutputGate::Silu); },
                       "gate");
  expect_throws_naming([&] { be().add_mul_sigmoid_residual(at.rows_view(0, 1), yt, at, at); }, "add");
  expect_throws_naming([&] { be().add_mul_sigmoid(yt, at, at.cols_view(0, 2)); }, "mul_sigmoid");
  HostTensor dt = f32_tensor("ssm_dt.bias", {8}, normal_floats(8, 1));
  const Weight dtw = be().weight(dt.info);
  expect_throws_naming([&] { be().ssm_gates(at, at.cols_view(0, 4), dtw, dtw, yt, yt); }, "ssm_");
}

TEST_P(Ops, SplitGroups) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t T = pick(rng, 1, 6), groups = pick(rng, 1, 8);
    std::vector<int64_t> widths(size_t(pick(rng, 1, 4)));
    for (int64_t& w : widths) w = pick(rng, 1, 40);
    const int64_t group = std::accumulate(widths.begin(), widths.end(), int64_t(0));
    const Floats x = normal_floats(size_t(T * groups * group), draw);
    auto run = [&](Backend& b) {
      Tensor xt = make(b, T, groups * group, x);
      std::vector<Tensor> outs;
      for (int64_t w : widths) outs.push_back(b.alloc(T, groups * w));
      b.split_groups(xt, groups, widths, outs);
      Floats all;
      for (Tensor& o : outs) {
        const Floats part = read(b, o);
        all.insert(all.end(), part.begin(), part.end());
      }
      return all;
    };
    expect_bitwise(run(be()), run(ref()), "split_groups vs cpu");
  }
  Tensor xt = be().alloc(2, 24);
  std::vector<Tensor> outs = {be().alloc(2, 12), be().alloc(2, 12)};
  const std::vector<int64_t> bad = {6, 5};
  expect_throws_naming([&] { be().split_groups(xt, 2, bad, outs); }, "split_groups");
}

TEST_P(Ops, Norms) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    // The CUDA backend gives a group of 1024 or more (a hidden state) a block of its own.
    const int64_t T = pick(rng, 1, 7),
                  group = draw == 11 ? 2053 : draw == 12 ? 1024 : 16 * pick(rng, 1, 40) + pick(rng, 0, 15),
                  C = group * pick(rng, 1, 6);
    SCOPED_TRACE(::testing::Message() << "T " << T << " group " << group << " C " << C);
    const Floats x = normal_floats(size_t(T * C), draw, 3.0f), b = normal_floats(size_t(T * C), draw + 7);
    HostTensor gain = f32_tensor("norm.weight", {group}, normal_floats(size_t(group), draw + 1));
    const Weight wb = be().weight(gain.info), wr = ref().weight(gain.info);
    RowwiseResult r = run_rowwise(be(), ref(), T, {{C, x}}, C,
                                  [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
                                    k.rms_norm(i[0], &k == &ref() ? &wr : &wb, group, 1e-6f, o);
                                  });
    expect_bitwise(r.rows, r.window, "rms_norm: T rows vs one-row calls");
    expect_bitwise(r.window, r.cpu, "rms_norm vs cpu");
    r = run_rowwise(be(), ref(), T, {{C, x}}, C, [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
      k.rms_norm(i[0], nullptr, group, 1e-5f, o);
    });
    expect_bitwise(r.window, r.cpu, "rms_norm without a gain vs cpu");
    r = run_rowwise(be(), ref(), T, {{C, x}}, C, [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
      k.l2_norm(i[0], group, 1e-6f, o);
    });
    expect_bitwise(r.rows, r.window, "l2_norm: T rows vs one-row calls");
    expect_bitwise(r.window, r.cpu, "l2_norm vs cpu");
    r = run_rowwise(be(), ref(), T, {{C, x}, {C, b}}, C / group,
                    [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
                      k.signed_sqrt_dot(i[0], i[1], group, 0.125f, o);
                    });
    expect_bitwise(r.rows, r.window, "signed_sqrt_dot: T rows vs one-row calls");
    expect_bitwise(r.window, r.cpu, "signed_sqrt_dot vs cpu");
  }
  // A gain per column (qwen4exp's streams): every group with its own slice of the gains, the bits
  // of one call per group with that slice, at a narrow and a wide (one block a group) width.
  for (const int64_t group : {int64_t(40), int64_t(2560)}) {
    const int64_t T = 3, streams = 4, C = streams * group;
    SCOPED_TRACE(::testing::Message() << "gain per column, group " << group);
    const Floats x = normal_floats(size_t(T * C), uint64_t(group), 3.0f);
    const Floats gains = normal_floats(size_t(C), uint64_t(group) + 1);
    HostTensor gain = f32_tensor("hc_norm.weight", {C}, gains);
    const Weight wb = be().weight(gain.info), wr = ref().weight(gain.info);
    const RowwiseResult r = run_rowwise(be(), ref(), T, {{C, x}}, C,
                                        [&](Backend& k, std::vector<Tensor>& i, Tensor o) {
                                          k.rms_norm(i[0], &k == &ref() ? &wr : &wb, group, 1e-6f, o);
                                        });
    expect_bitwise(r.rows, r.window, "rms_norm, gain per column: T rows vs one-row calls");
    expect_bitwise(r.window, r.cpu, "rms_norm, gain per column vs cpu");
    std::vector<HostTensor> slices;
    for (int64_t s = 0; s < streams; ++s)
      slices.push_back(f32_tensor("hc_norm." + std::to_string(s) + ".weight", {group},
                                  Floats(gains.begin() + s * group, gains.begin() + (s + 1) * group)));
    Tensor xt = make(be(), T, C, x), yt = be().alloc(T, C);
    for (int64_t s = 0; s < streams; ++s) {
      const Weight ws = be().weight(slices[size_t(s)].info);
      be().rms_norm(xt.cols_view(s * group, group), &ws, group, 1e-6f, yt.cols_view(s * group, group));
    }
    expect_bitwise(read(be(), yt), r.window, "rms_norm, gain per column vs group by group");
    Tensor narrow = be().alloc(T, C / 2);
    expect_throws_naming([&] { be().rms_norm(xt.cols_view(0, C / 2), &wb, group, 1e-6f, narrow); },
                         "values but the group");
  }
  // In place, narrow and wide groups.
  for (const int64_t group : {32, 2048}) {
    const Floats x = normal_floats(size_t(3 * 2 * group), 5);
    Tensor xt = make(be(), 3, 2 * group, x), yt = be().alloc(3, 2 * group);
    be().rms_norm(xt, nullptr, group, 1e-6f, yt);
    be().rms_norm(xt, nullptr, group, 1e-6f, xt);
    expect_bitwise(read(be(), xt), read(be(), yt), "rms_norm in place");
  }
  Tensor xt = be().alloc(3, 64), yt = be().alloc(3, 64);
  expect_throws_naming([&] { be().rms_norm(xt, nullptr, 30, 1e-6f, yt); }, "rms_norm");
  expect_throws_naming([&] { be().l2_norm(xt, 32, 1e-6f, yt.cols_view(0, 10)); }, "l2_norm");
  expect_throws_naming([&] { be().signed_sqrt_dot(xt, xt, 48, 1.0f, yt); }, "signed_sqrt_dot");
}

// The residual add and the norm after it, in one op: x and y bitwise add then rms_norm on the CPU,
// at widths the CUDA backend fuses (1024-8192) and at widths it runs as the two ops.
TEST_P(Ops, AddRmsNormIsAddThenRmsNorm) {
  for (const int64_t C : {int64_t(300), int64_t(1024), int64_t(2048), int64_t(2053), int64_t(8192),
                          int64_t(9000)}) {
    const int64_t T = 3;
    SCOPED_TRACE(::testing::Message() << "C " << C);
    const Floats x = normal_floats(size_t(T * C), uint64_t(C), 3.0f);
    const Floats d = normal_floats(size_t(T * C), uint64_t(C) + 1);
    HostTensor gain = f32_tensor("norm.weight", {C}, normal_floats(size_t(C), uint64_t(C) + 2));
    const Weight wb = be().weight(gain.info), wr = ref().weight(gain.info);
    Tensor xr = make(ref(), T, C, x), dr = make(ref(), T, C, d), yr = ref().alloc(T, C);
    ref().add(xr, dr, xr);
    ref().rms_norm(xr, &wr, C, 1e-6f, yr);
    Tensor xb = make(be(), T, C, x), db = make(be(), T, C, d), yb = be().alloc(T, C);
    be().add_rms_norm(xb, db, wb, 1e-6f, yb);
    expect_bitwise(read(be(), xb), read(ref(), xr), "add_rms_norm: x + delta vs cpu");
    expect_bitwise(read(be(), yb), read(ref(), yr), "add_rms_norm: the norm vs cpu");
    // T one-row calls give the window's bits.
    Tensor x1 = make(be(), T, C, x), y1 = be().alloc(T, C);
    for (int64_t t = 0; t < T; ++t)
      be().add_rms_norm(x1.rows_view(t, 1), db.rows_view(t, 1), wb, 1e-6f, y1.rows_view(t, 1));
    expect_bitwise(read(be(), x1), read(be(), xb), "add_rms_norm: x, T rows vs one-row calls");
    expect_bitwise(read(be(), y1), read(be(), yb), "add_rms_norm: y, T rows vs one-row calls");
  }
  HostTensor gain = f32_tensor("norm.weight", {2048}, normal_floats(2048, 3));
  const Weight wb = be().weight(gain.info);
  Tensor xt = be().alloc(2, 2048), yt = be().alloc(2, 2048);
  expect_throws_naming([&] { be().add_rms_norm(xt, xt.rows_view(0, 1), wb, 1e-6f, yt); }, "add");
  expect_throws_naming([&] { be().add_rms_norm(xt, xt, wb, 1e-6f, yt.cols_view(0, 1024)); },
                       "rms_norm");
}

// The block's gated shared-expert add, the residual add and the next layer's input norm in one
// op: y, the residual and the norm bitwise the two ops on the same backend (whose sigmoid may
// differ from the CPU's in expf's last bit: against the CPU within that), at widths the CUDA
// backend fuses and at widths it runs as the ops, with a per-row and a per-element gate; T rows
// give the bits of T one-row calls.
TEST_P(Ops, AddMulSigmoidResidualRmsNormIsItsOps) {
  for (const int64_t C : {int64_t(300), int64_t(2048), int64_t(2053)}) {
    for (const int64_t gate_cols : {int64_t(1), C}) {
      const int64_t T = 3;
      SCOPED_TRACE(::testing::Message() << "C " << C << " gate columns " << gate_cols);
      const Floats r0 = normal_floats(size_t(T * C), uint64_t(C), 3.0f),
                   y0 = normal_floats(size_t(T * C), uint64_t(C) + 1),
                   x0 = normal_floats(size_t(T * C), uint64_t(C) + 2),
                   g0 = normal_floats(size_t(T * gate_cols), uint64_t(C) + 3, 2.0f);
      HostTensor gain = f32_tensor("norm.weight", {C}, normal_floats(size_t(C), uint64_t(C) + 4));
      // residual, y, normed
      auto run = [&](Backend& k, bool one_op, bool row_by_row) {
        const Weight wk = k.weight(gain.info);
        Tensor r = make(k, T, C, r0), y = make(k, T, C, y0), x = make(k, T, C, x0),
               g = make(k, T, gate_cols, g0), n = k.alloc(T, C);
        for (int64_t t = row_by_row ? 0 : -1; t < (row_by_row ? T : 0); ++t) {
          const auto rows = [&](const Tensor& a) { return t < 0 ? a : a.rows_view(t, 1); };
          if (one_op) {
            k.add_mul_sigmoid_residual_rms_norm(rows(r), rows(y), rows(x), rows(g), wk, 1e-6f, rows(n));
          } else {
            k.add_mul_sigmoid_residual(rows(r), rows(y), rows(x), rows(g));
            k.rms_norm(rows(r), &wk, C, 1e-6f, rows(n));
          }
        }
        return std::vector<Floats>{read(k, r), read(k, y), read(k, n)};
      };
      const std::vector<Floats> got = run(be(), true, false), ops = run(be(), false, false),
                                rows = run(be(), true, true), cpu = run(ref(), false, false);
      const char* what[] = {"residual", "y", "normed"};
      for (size_t i = 0; i < got.size(); ++i) {
        expect_bitwise(got[i], ops[i], std::string(what[i]) + ": one op vs its ops");
        expect_bitwise(rows[i], got[i], std::string(what[i]) + ": T rows vs one-row calls");
        expect_close(got[i], cpu[i], 1e-5, 1e-5, std::string(what[i]) + " vs cpu");
      }
    }
  }
  HostTensor gain = f32_tensor("norm.weight", {2048}, normal_floats(2048, 3));
  const Weight wb = be().weight(gain.info);
  Tensor a = be().alloc(2, 2048), b = be().alloc(2, 2048), c = be().alloc(2, 2048),
         n = be().alloc(2, 2048), g = be().alloc(2, 3);
  expect_throws_naming(
      [&] { be().add_mul_sigmoid_residual_rms_norm(a, b, c, g.cols_view(0, 1), wb, 1e-6f, n.rows_view(0, 1)); },
      "rms_norm");
  expect_throws_naming([&] { be().add_mul_sigmoid_residual_rms_norm(a, b, c, g, wb, 1e-6f, n); },
                       "sigmoid");
}

TEST_P(Ops, RopeNeox) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t T = pick(rng, 1, 8), heads = pick(rng, 1, 6), head_dim = 2 * pick(rng, 4, 64),
                  rope_dim = 2 * pick(rng, 1, head_dim / 2);
    const float theta = draw == 11 ? 1e7f : 1e4f;
    SCOPED_TRACE(::testing::Message() << "T " << T << " head_dim " << head_dim << " rope " << rope_dim);
    const Floats x = normal_floats(size_t(T * heads * head_dim), draw, 4.0f);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int32_t& p : pos) p = int32_t(rng.below(262144));
    auto run = [&](Backend& b, bool one_row) {
      Tensor t = make(b, T, heads * head_dim, x);
      const Ids p = ids_of(b, pos);
      if (one_row) {
        for (int64_t r = 0; r < T; ++r)
          b.rope_neox(t.rows_view(r, 1), p.rows_view(r, 1), head_dim, rope_dim, theta);
      } else {
        b.rope_neox(t, p, head_dim, rope_dim, theta);
      }
      return read(b, t);
    };
    const Floats got = run(be(), false);
    expect_bitwise(run(be(), true), got, "rope_neox: T rows vs one-row calls");
    expect_close(got, run(ref(), false), 0, 1e-6, "rope_neox vs cpu");
  }
  Tensor t = be().alloc(2, 64);
  const Ids pos = ids_of(be(), {0, 1});
  expect_throws_naming([&] { be().rope_neox(t, pos.rows_view(0, 1), 32, 32, 1e4f); }, "rope_neox");
  expect_throws_naming([&] { be().rope_neox(t, pos, 32, 34, 1e4f); }, "rope_dim");
}

// kv_write then attention (dense) and attention_selected over random subsets, prefix in the cache.
TEST_P(Ops, AttentionAndSelected) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t n_kv = pick(rng, 1, 3), n_head = n_kv * pick(rng, 1, 4),
                  hd = std::vector<int64_t>{32, 64, 80, 128, 256, 512}[rng.below(6)],
                  prefix = pick(rng, 0, 70), T = pick(rng, 1, 7), cache_rows = prefix + T + 3;
    const float scale = 1.0f / std::sqrt(float(hd));
    SCOPED_TRACE(::testing::Message() << "heads " << n_head << "/" << n_kv << " hd " << hd
                                      << " prefix " << prefix << " T " << T);
    const Floats kpre = normal_floats(size_t(prefix * n_kv * hd), draw + 1),
                 vpre = normal_floats(size_t(prefix * n_kv * hd), draw + 2),
                 q = normal_floats(size_t(T * n_head * hd), draw + 3, 2.0f),
                 k = normal_floats(size_t(T * n_kv * hd), draw + 4),
                 v = normal_floats(size_t(T * n_kv * hd), draw + 5);
    std::vector<int32_t> pre_pos(static_cast<size_t>(prefix)), pos(static_cast<size_t>(T));
    std::iota(pre_pos.begin(), pre_pos.end(), 0);
    std::iota(pos.begin(), pos.end(), int32_t(prefix));
    // Row r's positions: selected[r * cap .. r * cap + counts[r]).
    const int64_t cap = prefix + T;
    std::vector<int32_t> selected(size_t(T * cap), 0), counts(static_cast<size_t>(T), 0);
    for (int64_t r = 0; r < T; ++r)
      for (int32_t p = 0; p <= pos[size_t(r)]; ++p)
        if (p == pos[size_t(r)] || rng.below(3) == 0)
          selected[size_t(r * cap + counts[size_t(r)]++)] = p;
    // Outputs: dense, selected; computed in one window or row by row.
    auto run = [&](Backend& b, bool one_row) {
      Tensor kc = b.alloc(cache_rows, n_kv * hd), vc = b.alloc(cache_rows, n_kv * hd);
      if (prefix > 0)
        b.kv_write(kc, vc, make(b, prefix, n_kv * hd, kpre), make(b, prefix, n_kv * hd, vpre),
                   ids_of(b, pre_pos));
      Tensor qt = make(b, T, n_head * hd, q), kt = make(b, T, n_kv * hd, k),
             vt = make(b, T, n_kv * hd, v), y = b.alloc(T, n_head * hd), ys = b.alloc(T, n_head * hd);
      const Ids pt = ids_of(b, pos), sel = ids_of(b, selected, cap), cnt = ids_of(b, counts);
      if (one_row) {
        for (int64_t r = 0; r < T; ++r) {
          const Ids p = pt.rows_view(r, 1);
          b.kv_write(kc, vc, kt.rows_view(r, 1), vt.rows_view(r, 1), p);
          b.attention(qt.rows_view(r, 1), kc, vc, p, n_head, n_kv, hd, scale, y.rows_view(r, 1));
          b.attention_selected(qt.rows_view(r, 1), kc, vc, sel.rows_view(r, 1),
                               cnt.rows_view(r, 1), n_head, n_kv, hd, scale, ys.rows_view(r, 1));
        }
      } else {
        b.kv_write(kc, vc, kt, vt, pt);
        b.attention(qt, kc, vc, pt, n_head, n_kv, hd, scale, y);
        b.attention_selected(qt, kc, vc, sel, cnt, n_head, n_kv, hd, scale, ys);
      }
      return std::vector<Floats>{read(b, y), read(b, ys), read(b, kc), read(b, vc)};
    };
    const std::vector<Floats> got = run(be(), false), rows = run(be(), true), cpu = run(ref(), false);
    for (size_t i = 0; i < got.size(); ++i)
      expect_bitwise(rows[i], got[i], "T rows vs one-row calls, output " + std::to_string(i));
    expect_close(got[0], cpu[0], 0, 4e-6, "attention vs cpu");
    expect_close(got[1], cpu[1], 0, 4e-6, "attention_selected vs cpu");
    expect_bitwise(got[2], cpu[2], "k cache vs cpu");
    expect_bitwise(got[3], cpu[3], "v cache vs cpu");
  }
  // Shapes are checked on every backend; position values only where they are host memory (the
  // CPU: test_backend_ops.cpp), the CUDA kernels keep them inside the cache instead.
  Tensor kc = be().alloc(8, 64), vc = be().alloc(8, 64), qt = be().alloc(2, 128), yt = be().alloc(2, 128);
  const Ids ok = ids_of(be(), {0, 1});
  expect_throws_naming([&] { be().attention(qt, kc, vc, ok.rows_view(0, 1), 2, 1, 64, 1.0f, yt); },
                       "attention");
  expect_throws_naming([&] { be().attention(qt, kc, vc, ok, 2, 3, 64, 1.0f, yt); }, "attention");
  expect_throws_naming([&] { be().attention(qt, kc, vc, ok, 2, 1, 64, 1.0f, qt); }, "overlap");
  expect_throws_naming([&] { be().kv_write(kc, vc, qt, qt, ok); }, "kv_write");
  expect_throws_naming([&] { be().attention_selected(qt, kc, vc, ok, ok.rows_view(0, 1), 2, 1, 64, 1.0f, yt); },
                       "counts");
}

TEST_P(Ops, BlockScores) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t T = pick(rng, 1, 6), heads = pick(rng, 1, 5), hd = 16 * pick(rng, 1, 8),
                  blocks = pick(rng, 1, 40);
    const int64_t block = pick(rng, 1, 8);
    std::vector<int32_t> pos(static_cast<size_t>(T));  // each row sees 0..blocks complete blocks
    for (int32_t& p : pos) p = int32_t(rng.below(uint32_t((blocks + 1) * block)));
    const Floats q = normal_floats(size_t(T * heads * hd), draw), keys = normal_floats(size_t(blocks * hd), draw + 1);
    const float scale = 1.0f / std::sqrt(float(hd));
    auto run = [&](Backend& b, bool one_row) {
      Tensor qt = make(b, T, heads * hd, q), kt = make(b, blocks, hd, keys), y = b.alloc(T, blocks);
      b.fill(y, 7.0f);
      const Ids p = ids_of(b, pos);
      if (one_row) {
        for (int64_t r = 0; r < T; ++r)
          b.block_scores(qt.rows_view(r, 1), kt, p.rows_view(r, 1), block, heads, hd, scale,
                         y.rows_view(r, 1));
      } else {
        b.block_scores(qt, kt, p, block, heads, hd, scale, y);
      }
      return read(b, y);
    };
    const Floats got = run(be(), false);
    expect_bitwise(run(be(), true), got, "block_scores: T rows vs one-row calls");
    expect_bitwise(got, run(ref(), false), "block_scores vs cpu");
  }
  Tensor qt = be().alloc(1, 64), kt = be().alloc(3, 32), yt = be().alloc(1, 3);
  const Ids p = ids_of(be(), {3});
  expect_throws_naming([&] { be().block_scores(qt, kt, p, 1, 2, 16, 1.0f, yt); }, "block_scores");
  expect_throws_naming([&] { be().block_scores(qt, kt, p, 1, 2, 32, 1.0f, be().alloc(2, 3)); },
                       "block_scores");
}

// QSA's pooled block keys at per-row block starts (negative: a row of zeros), and set_rows
// storing rows at ids (negative: skipped): pure data movement and an in-order sum, so bitwise.
TEST_P(Ops, BlockMeanAndSetRows) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t T = pick(rng, 1, 9), block = pick(rng, 1, 8), rows = block * pick(rng, 1, 12),
                  cols = pick(rng, 1, 300);
    std::vector<int32_t> firsts(static_cast<size_t>(T)), to(static_cast<size_t>(T));
    for (int32_t& f : firsts) f = rng.below(3) == 0 ? -1 : int32_t(rng.below(uint32_t(rows - block + 1)));
    // distinct destinations, some skipped
    for (int64_t t = 0; t < T; ++t) to[size_t(t)] = rng.below(4) == 0 ? -1 : int32_t(t * 2);
    const Floats x = normal_floats(size_t(rows * cols), draw), init = normal_floats(size_t(2 * T * cols), draw + 1);
    auto run = [&](Backend& b, bool one_row) {
      Tensor xt = make(b, rows, cols, x), y = b.alloc(T, cols), dst = make(b, 2 * T, cols, init);
      b.fill(y, 7.0f);
      const Ids f = ids_of(b, firsts), d = ids_of(b, to);
      for (int64_t r = 0; r < (one_row ? T : 1); ++r) {
        const int64_t first = one_row ? r : 0, n = one_row ? 1 : T;
        b.block_mean(xt, f.rows_view(first, n), block, y.rows_view(first, n));
        b.set_rows(y.rows_view(first, n), d.rows_view(first, n), dst);
      }
      Floats out = read(b, y);
      const Floats stored = read(b, dst);
      out.insert(out.end(), stored.begin(), stored.end());
      return out;
    };
    const Floats got = run(be(), false);
    expect_bitwise(run(be(), true), got, "block_mean + set_rows: T rows vs one-row calls");
    expect_bitwise(got, run(ref(), false), "block_mean + set_rows vs cpu");
    for (int64_t t = 0; t < T; ++t) {
      if (firsts[size_t(t)] >= 0) continue;
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(got[size_t(t * cols + c)], 0.0f) << "row " << t;
    }
  }
  Tensor x = be().alloc(8, 4), y = be().alloc(2, 4);
  expect_throws_naming([&] { be().block_mean(x, ids_of(be(), {0}), 4, y); }, "block_mean");
  expect_throws_naming([&] { be().set_rows(y, ids_of(be(), {0}), x); }, "set_rows");
  expect_throws_naming([&] { be().set_rows(y, ids_of(be(), {0, 1}), be().alloc(4, 3)); }, "set_rows");
}

TEST_P(Ops, Conv1dCarriesState) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t T = pick(rng, 1, 12), C = pick(rng, 1, 700), K = pick(rng, 2, 5),
                  D = draw == 11 ? 1 : pick(rng, 1, 4), S = (K - 1) * D;
    SCOPED_TRACE(::testing::Message() << "T " << T << " C " << C << " K " << K << " D " << D);
    const Floats x = normal_floats(size_t(T * C), draw), s0 = normal_floats(size_t(S * C), draw + 2);
    HostTensor w = f32_tensor("conv.weight", {K, C}, normal_floats(size_t(C * K), draw + 1));
    auto run = [&](Backend& b, bool one_row) {
      const Weight wt = b.weight(w.info);
      Tensor xt = make(b, T, C, x), st = make(b, S, C, s0), y = b.alloc(T, C);
      auto conv = [&](const Tensor& in, Tensor out) {
        if (D == 1)
          b.conv1d_silu(in, st, wt, out);
        else
          b.conv1d_dilated_silu(in, st, wt, D, out);
      };
      if (one_row) {
        for (int64_t r = 0; r < T; ++r) conv(xt.rows_view(r, 1), y.rows_view(r, 1));
      } else {
        conv(xt, y);
      }
      return std::vector<Floats>{read(b, y), read(b, st)};
    };
    const std::vector<Floats> got = run(be(), false), rows = run(be(), true), cpu = run(ref(), false);
    expect_bitwise(rows[0], got[0], "conv: T rows vs one-row calls");
    expect_bitwise(rows[1], got[1], "conv state: T rows vs one-row calls");
    expect_close(got[0], cpu[0], 1e-6, 1e-7, "conv vs cpu");
    expect_bitwise(got[1], cpu[1], "conv state vs cpu");
  }
  HostTensor w = f32_tensor("conv.weight", {4, 8}, normal_floats(32, 1));
  const Weight wt = be().weight(w.info);
  Tensor xt = be().alloc(2, 8), st = be().alloc(4, 8), y = be().alloc(2, 8);
  expect_throws_naming([&] { be().conv1d_silu(xt, st, wt, y); }, "state");
  expect_throws_naming([&] { be().conv1d_dilated_silu(xt, st, wt, 0, y); }, "dilation");
}

TEST_P(Ops, GatedDeltaRuleCarriesState) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    // The CUDA backend keeps the state in registers for heads of 64 and 128 (the models' sizes).
    const int64_t T = pick(rng, 1, 8), H = pick(rng, 1, 6),
                  dk = draw == 11 ? 128 : draw == 12 ? 64 : 16 * pick(rng, 1, 8),
                  dv = 16 * pick(rng, 1, 8);
    SCOPED_TRACE(::testing::Message() << "T " << T << " H " << H << " dk " << dk << " dv " << dv);
    Floats q = normal_floats(size_t(T * H * dk), draw), k = normal_floats(size_t(T * H * dk), draw + 1),
           v = normal_floats(size_t(T * H * dv), draw + 2), g(size_t(T * H)), beta(size_t(T * H)),
           s0 = normal_floats(size_t(H * dk * dv), draw + 3, 0.1f);
    for (int64_t i = 0; i < T * H; ++i) {
      g[size_t(i)] = -rng.uniform(0.0f, 1.0f);
      beta[size_t(i)] = rng.uniform(0.0f, 1.0f);
      for (Floats* f : {&q, &k}) {  // l2-normed, q also scaled: what the model passes
        double ss = 0;
        for (int64_t j = 0; j < dk; ++j) ss += double((*f)[size_t(i * dk + j)]) * (*f)[size_t(i * dk + j)];
        const double s = (f == &q ? 1.0 / std::sqrt(double(dk)) : 1.0) / std::sqrt(ss);
        for (int64_t j = 0; j < dk; ++j) (*f)[size_t(i * dk + j)] = float((*f)[size_t(i * dk + j)] * s);
      }
    }
    auto run = [&](Backend& b, bool one_row) {
      Tensor qt = make(b, T, H * dk, q), kt = make(b, T, H * dk, k), vt = make(b, T, H * dv, v),
             gt = make(b, T, H, g), bt = make(b, T, H, beta), st = make(b, H * dk, dv, s0),
             y = b.alloc(T, H * dv);
      if (one_row) {
        for (int64_t r = 0; r < T; ++r)
          b.gated_delta_rule(qt.rows_view(r, 1), kt.rows_view(r, 1), vt.rows_view(r, 1),
                             gt.rows_view(r, 1), bt.rows_view(r, 1), st, H,
                             HeadRepeat::Interleaved, y.rows_view(r, 1));
      } else {
        b.gated_delta_rule(qt, kt, vt, gt, bt, st, H, HeadRepeat::Interleaved, y);
      }
      return std::vector<Floats>{read(b, y), read(b, st)};
    };
    const std::vector<Floats> got = run(be(), false), rows = run(be(), true), cpu = run(ref(), false);
    expect_bitwise(rows[0], got[0], "delta rule: T rows vs one-row calls");
    expect_bitwise(rows[1], got[1], "delta rule state: T rows vs one-row calls");
    expect_close(got[0], cpu[0], 1e-5, 1e-6, "delta rule vs cpu");
    expect_close(got[1], cpu[1], 1e-5, 1e-6, "delta rule state vs cpu");
  }
  Tensor qt = be().alloc(2, 64), vt = be().alloc(2, 64), gt = be().alloc(2, 2), st = be().alloc(64, 32),
         y = be().alloc(2, 64);
  const HeadRepeat rep = HeadRepeat::Interleaved;
  expect_throws_naming(
      [&] { be().gated_delta_rule(qt, qt, vt, gt, gt, st.rows_view(0, 8), 2, rep, y); }, "state");
  expect_throws_naming([&] { be().gated_delta_rule(qt, qt, vt, gt, gt, st, 2, rep, vt); },
                       "overlap");
  // q with 3 heads of the state's 32 key dims cannot be shared by 2 value heads.
  expect_throws_naming(
      [&] { be().gated_delta_rule(qt.cols_view(0, 48), qt.cols_view(0, 48), vt, gt, gt, st, 2, rep, y); },
      "q [2 x 48]");
}

// q and k with fewer heads than the values, shared as repeat_interleave or tile would lay them
// out: bitwise the op on q and k copied out to every value head (what the model did before).
TEST_P(Ops, GatedDeltaRuleSharesQkHeads) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t T = pick(rng, 1, 6), Hk = pick(rng, 1, 3), r = pick(rng, 2, 3), H = Hk * r,
                  dk = draw == 11 ? 128 : draw == 12 ? 64 : 16 * pick(rng, 1, 4),
                  dv = 16 * pick(rng, 1, 4);
    SCOPED_TRACE(::testing::Message() << "T " << T << " Hk " << Hk << " H " << H << " dk " << dk);
    const Floats q = normal_floats(size_t(T * Hk * dk), draw, 0.2f),
                 k = normal_floats(size_t(T * Hk * dk), draw + 1, 0.2f),
                 v = normal_floats(size_t(T * H * dv), draw + 2), s0 = normal_floats(size_t(H * dk * dv), draw + 3, 0.1f);
    Floats g(size_t(T * H)), beta(size_t(T * H));
    for (int64_t i = 0; i < T * H; ++i) g[size_t(i)] = -rng.uniform(0.0f, 1.0f), beta[size_t(i)] = rng.uniform(0.0f, 1.0f);
    for (HeadRepeat repeat : {HeadRepeat::Interleaved, HeadRepeat::Tiled}) {
      const QkHeadMap map = qk_head_map(repeat, H, Hk);
      auto expand = [&](const Floats& x) {  // [T, Hk*dk] -> [T, H*dk]
        Floats out(size_t(T * H * dk));
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h)
            std::copy_n(x.begin() + (t * Hk + h / map.div % map.mod) * dk, dk,
                        out.begin() + (t * H + h) * dk);
        return out;
      };
      auto run = [&](const Floats& qq, const Floats& kk) {
        const int64_t qk = int64_t(qq.size()) / (T * dk);
        Tensor qt = make(be(), T, qk * dk, qq), kt = make(be(), T, qk * dk, kk),
               vt = make(be(), T, H * dv, v), gt = make(be(), T, H, g), bt = make(be(), T, H, beta),
               st = make(be(), H * dk, dv, s0), y = be().alloc(T, H * dv);
        be().gated_delta_rule(qt, kt, vt, gt, bt, st, H, repeat, y);
        return std::vector<Floats>{read(be(), y), read(be(), st)};
      };
      const std::vector<Floats> shared = run(q, k), copied = run(expand(q), expand(k));
      expect_bitwise(shared[0], copied[0], "delta rule with shared q/k heads: output");
      expect_bitwise(shared[1], copied[1], "delta rule with shared q/k heads: state");
    }
  }
}

// The conv and the delta rule over a window of several sequences, each with its own state (what a
// window of --parallel streams runs): bitwise the op on each sequence's rows and state in turn, on
// every backend; against the CPU within the ops' limits. 40 sequences exceed one launch's table.
TEST_P(Ops, StatefulOpsOverSequencesEqualEachSequenceAlone) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t n = draw == 13 ? 40 : pick(rng, 2, 6), C = pick(rng, 1, 300), K = 4, H = pick(rng, 1, 3),
                  Hk = draw == 12 ? 1 : H, dk = draw == 11 ? 128 : draw == 12 ? 64 : 32, dv = 16 * pick(rng, 1, 4);
    std::vector<SequenceState> seqs;
    int64_t T = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t rows = pick(rng, 1, 3);
      seqs.push_back({T, rows, {}});
      T += rows;
    }
    SCOPED_TRACE(::testing::Message() << n << " sequences, T " << T << " C " << C << " H " << H << " dk " << dk);
    const Floats x = normal_floats(size_t(T * C), draw), conv0 = normal_floats(size_t(n * (K - 1) * C), draw + 1);
    HostTensor w = f32_tensor("conv.weight", {K, C}, normal_floats(size_t(C * K), draw + 2));
    Floats q = normal_floats(size_t(T * Hk * dk), draw + 3, 0.1f), k = normal_floats(size_t(T * Hk * dk), draw + 4, 0.1f),
           v = normal_floats(size_t(T * H * dv), draw + 5), g(size_t(T * H)), beta(size_t(T * H)),
           ssm0 = normal_floats(size_t(n * H * dk * dv), draw + 6, 0.1f);
    for (int64_t i = 0; i < T * H; ++i) g[size_t(i)] = -rng.uniform(0.0f, 1.0f), beta[size_t(i)] = rng.uniform(0.0f, 1.0f);
    // y of the conv, y of the rule, then every sequence's two states.
    auto run = [&](Backend& b, bool together) {
      const Weight wt = b.weight(w.info);
      Tensor xt = make(b, T, C, x), cy = b.alloc(T, C), qt = make(b, T, Hk * dk, q), kt = make(b, T, Hk * dk, k),
             vt = make(b, T, H * dv, v), gt = make(b, T, H, g), bt = make(b, T, H, beta), ry = b.alloc(T, H * dv);
      Tensor conv_all = make(b, n * (K - 1), C, conv0), ssm_all = make(b, n * H * dk, dv, ssm0);
      std::vector<SequenceState> conv = seqs, ssm = seqs;
      for (int64_t i = 0; i < n; ++i) {
        conv[size_t(i)].state = conv_all.rows_view(i * (K - 1), K - 1);
        ssm[size_t(i)].state = ssm_all.rows_view(i * H * dk, H * dk);
      }
      if (together) {
        b.conv1d_silu_sequences(xt, conv, wt, cy);
        b.gated_delta_rule_sequences(qt, kt, vt, gt, bt, ssm, H, HeadRepeat::Tiled, ry);
      } else {
        for (size_t i = 0; i < seqs.size(); ++i) {
          const auto rows = [&](const Tensor& t) { return t.rows_view(seqs[i].first, seqs[i].rows); };
          b.conv1d_silu(rows(xt), conv[i].state, wt, rows(cy));
          b.gated_delta_rule(rows(qt), rows(kt), rows(vt), rows(gt), rows(bt), ssm[i].state, H,
                             HeadRepeat::Tiled, rows(ry));
        }
      }
      return std::vector<Floats>{read(b, cy), read(b, ry), read(b, conv_all), read(b, ssm_all)};
    };
    const std::vector<Floats> got = run(be(), true), alone = run(be(), false), cpu = run(ref(), true);
    const char* what[] = {"conv", "delta rule", "conv states", "delta rule states"};
    for (size_t i = 0; i < got.size(); ++i) {
      expect_bitwise(got[i], alone[i], std::string(what[i]) + ": sequences together vs each alone");
      expect_close(got[i], cpu[i], 1e-5, 1e-6, std::string(what[i]) + " vs cpu");
    }
  }
  HostTensor w = f32_tensor("conv.weight", {4, 8}, normal_floats(32, 1));
  const Weight wt = be().weight(w.info);
  Tensor x = be().alloc(4, 8), y = be().alloc(4, 8), states = be().alloc(9, 8);
  const SequenceState overlapping[] = {{0, 2, states.rows_view(0, 3)}, {1, 2, states.rows_view(3, 3)}};
  expect_throws_naming([&] { be().conv1d_silu_sequences(x, overlapping, wt, y); }, "overlaps the one before");
  const SequenceState shared[] = {{0, 2, states.rows_view(0, 3)}, {2, 2, states.rows_view(0, 3)}};
  expect_throws_naming([&] { be().conv1d_silu_sequences(x, shared, wt, y); }, "share one state");
  const SequenceState past_end[] = {{0, 2, states.rows_view(0, 3)}, {2, 3, states.rows_view(3, 3)}};
  expect_throws_naming([&] { be().conv1d_silu_sequences(x, past_end, wt, y); }, "outside the window's 4 rows");
  const SequenceState short_state[] = {{0, 2, states.rows_view(0, 3)}, {2, 2, states.rows_view(3, 2)}};
  expect_throws_naming([&] { be().conv1d_silu_sequences(x, short_state, wt, y); }, "differs in shape");
}

// The DeltaNet's recurrence as one op (CUDA: one kernel for windows of up to
// kDeltaNetMaxRows rows a sequence) against its ops one by one on the same backend, bitwise: y and
// every sequence's conv and delta-rule states; against the CPU within the delta rule's limit.
// Draws: state 128 with three value heads a key head and sigmoid gates (the flagship's), state 64
// interleaved with b and a in in_proj_ba's groups (Qwen3-Next's), and rows past the one-kernel
// bound (the ops one by one, the grouped b and a split first).
TEST_P(Ops, DeltaNetRecurrenceEqualsItsOps) {
  struct Draw {
    int64_t state, key_heads, heads_per_key, max_rows, sequences;
    HeadRepeat repeat;
    OutputGate gate;
    bool ba;  // b and a as one tensor, a group a key head
  };
  const Draw draws[] = {{128, 2, 3, 2, 3, HeadRepeat::Tiled, OutputGate::Sigmoid, false},
                        {64, 3, 2, 1, 1, HeadRepeat::Interleaved, OutputGate::Silu, true},
                        {128, 2, 2, 8, 2, HeadRepeat::Interleaved, OutputGate::Silu, false},
                        {64, 2, 3, 12, 2, HeadRepeat::Interleaved, OutputGate::Silu, true},
                        {64, 1, 1, 12, 2, HeadRepeat::Tiled, OutputGate::Silu, false}};
  uint64_t seed = 40;
  for (const Draw& d : draws) {
    Rng rng(++seed);
    const int64_t s = d.state, H = d.key_heads * d.heads_per_key, kd = d.key_heads * s, vd = H * s;
    const int64_t C = 2 * kd + vd, K = 4, n = d.sequences;
    std::vector<SequenceState> seqs;
    int64_t T = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t rows = i == 0 ? d.max_rows : pick(rng, 1, d.max_rows);
      seqs.push_back({T, rows, {}});
      T += rows;
    }
    SCOPED_TRACE(::testing::Message() << n << " sequences, T " << T << " state " << s << " heads " << H);
    const Floats qkv = normal_floats(size_t(T * C), seed), z = normal_floats(size_t(T * vd), seed + 1),
                 b = normal_floats(size_t(T * H), seed + 2, 2.0f), a = normal_floats(size_t(T * H), seed + 3, 2.0f),
                 conv0 = normal_floats(size_t(n * (K - 1) * C), seed + 4),
                 ssm0 = normal_floats(size_t(n * H * s * s), seed + 5, 0.1f);
    HostTensor conv_w = f32_tensor("conv.weight", {K, C}, normal_floats(size_t(C * K), seed + 6, 0.5f));
    HostTensor dt = f32_tensor("ssm_dt.bias", {H}, normal_floats(size_t(H), seed + 7));
    Floats neg(static_cast<size_t>(H));
    for (float& v : neg) v = -rng.uniform(0.1f, 2.0f);
    HostTensor sa = f32_tensor("ssm_a", {H}, neg);
    HostTensor norm = f32_tensor("ssm_norm.weight", {s}, normal_floats(size_t(s), seed + 8));
    const float q_scale = 1.0f / std::sqrt(float(s));
    // ba: per row and key head, its value heads' b, then their a
    Floats ba(size_t(T * 2 * H));
    const int64_t r = d.heads_per_key;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        ba[size_t(t * 2 * H + h / r * 2 * r + h % r)] = b[size_t(t * H + h)];
        ba[size_t(t * 2 * H + h / r * 2 * r + r + h % r)] = a[size_t(t * H + h)];
      }
    // y, then the conv states, then the delta-rule states.
    auto run = [&](Backend& k, bool one_op) {
      const Weight cw = k.weight(conv_w.info), dtw = k.weight(dt.info), saw = k.weight(sa.info),
                   nw = k.weight(norm.info);
      Tensor qkv_t = make(k, T, C, qkv), z_t = make(k, T, vd, z), b_t = make(k, T, H, b), a_t = make(k, T, H, a);
      Tensor conv_all = make(k, n * (K - 1), C, conv0), ssm_all = make(k, n * H * s, s, ssm0), y = k.alloc(T, vd);
      std::vector<SequenceState> conv = seqs, ssm = seqs;
      for (int64_t i = 0; i < n; ++i) {
        conv[size_t(i)].state = conv_all.rows_view(i * (K - 1), K - 1);
        ssm[size_t(i)].state = ssm_all.rows_view(i * H * s, H * s);
      }
      if (one_op) {
        DeltaNetRecurrence op{qkv_t, conv, &cw, b_t, a_t, {}, 0, &dtw, &saw, ssm, H, s, d.repeat,
                              1e-6f, q_scale, &nw, 1e-6f, z_t, d.gate};
        if (d.ba) op.b = op.a = {}, op.ba = make(k, T, 2 * H, ba), op.ba_groups = d.key_heads;
        k.delta_net_recurrence(op, y);
      } else {
        Tensor cy = k.alloc(T, C), beta = k.alloc(T, H), g = k.alloc(T, H), qk = k.alloc(T, 2 * kd);
        k.conv1d_silu_sequences(qkv_t, conv, cw, cy);
        k.ssm_gates(b_t, a_t, dtw, saw, beta, g);
        k.qk_l2_norm(cy.cols_view(0, 2 * kd), s, 1e-6f, kd, q_scale, qk);
        k.gated_delta_rule_sequences(qk.cols_view(0, kd), qk.cols_view(kd, kd), cy.cols_view(2 * kd, vd),
                                     g, beta, ssm, H, d.repeat, y);
        k.rms_norm_gated(y, nw, s, 1e-6f, z_t, d.gate);
      }
      return std::vector<Floats>{read(k, y), read(k, conv_all), read(k, ssm_all)};
    };
    const std::vector<Floats> got = run(be(), true), ops = run(be(), false), cpu = run(ref(), true);
    const char* what[] = {"y", "conv states", "delta rule states"};
    for (size_t i = 0; i < got.size(); ++i) {
      expect_bitwise(got[i], ops[i], std::string(what[i]) + ": one op vs its ops");
      expect_close(got[i], cpu[i], 1e-4, 1e-5, std::string(what[i]) + " vs cpu");
    }
  }
}

// The cache write and attention over a window of several sequences, each at its own position
// with its own caches: bitwise the ops on each sequence's rows in turn; against the CPU within
// attention's limit. 40 sequences exceed one launch's table.
TEST_P(Ops, AttentionOverSequencesEqualsEachSequenceAlone) {
  for (uint64_t draw : kDraws) {
    Rng rng(draw);
    const int64_t n = draw == 13 ? 40 : pick(rng, 2, 6), n_kv = pick(rng, 1, 2), n_head = n_kv * pick(rng, 1, 3),
                  hd = draw == 11 ? 256 : draw == 12 ? 128 : 64, cache_rows = 48;
    std::vector<SequenceCache> seqs;
    std::vector<int32_t> pos, past;  // pos: the window's rows; past: each sequence's filled prefix
    int64_t T = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t rows = pick(rng, 1, 3), prefix = pick(rng, 0, 40);
      seqs.push_back({T, rows, {}, {}});
      past.push_back(int32_t(prefix));
      for (int64_t r = 0; r < rows; ++r) pos.push_back(int32_t(prefix + r));
      T += rows;
    }
    SCOPED_TRACE(::testing::Message() << n << " sequences, T " << T << " heads " << n_head << "/" << n_kv << " hd " << hd);
    const float scale = 1.0f / std::sqrt(float(hd));
    const Floats cache0 = normal_floats(size_t(n * cache_rows * n_kv * hd), draw),
                 q = normal_floats(size_t(T * n_head * hd), draw + 1, 2.0f),
                 k = normal_floats(size_t(T * n_kv * hd), draw + 2), v = normal_floats(size_t(T * n_kv * hd), draw + 3);
    auto run = [&](Backend& b, bool together) {
      // Every sequence's caches start as random rows (what its prefix left there).
      Tensor kc = make(b, n * cache_rows, n_kv * hd, cache0), vc = make(b, n * cache_rows, n_kv * hd, cache0);
      std::vector<SequenceCache> caches = seqs;
      for (int64_t i = 0; i < n; ++i) {  // contexts of 48 and 44 positions: caches may differ in rows
        caches[size_t(i)].k_cache = kc.rows_view(i * cache_rows, cache_rows - i % 2 * 4);
        caches[size_t(i)].v_cache = vc.rows_view(i * cache_rows, cache_rows - i % 2 * 4);
      }
      Tensor qt = make(b, T, n_head * hd, q), kt = make(b, T, n_kv * hd, k), vt = make(b, T, n_kv * hd, v),
             y = b.alloc(T, n_head * hd);
      const Ids pt = ids_of(b, pos);
      if (together) {
        b.kv_write_sequences(caches, kt, vt, pt);
        b.attention_sequences(qt, caches, pt, n_head, n_kv, hd, scale, y);
      } else {
        for (const SequenceCache& s : caches) {
          const auto rows = [&s](const Tensor& t) { return t.rows_view(s.first, s.rows); };
          b.kv_write(s.k_cache, s.v_cache, rows(kt), rows(vt), pt.rows_view(s.first, s.rows));
          b.attention(rows(qt), s.k_cache, s.v_cache, pt.rows_view(s.first, s.rows), n_head, n_kv, hd,
                      scale, rows(y));
        }
      }
      return std::vector<Floats>{read(b, y), read(b, kc), read(b, vc)};
    };
    const std::vector<Floats> got = run(be(), true), alone = run(be(), false), cpu = run(ref(), true);
    const char* what[] = {"attention", "k caches", "v caches"};
    for (size_t i = 0; i < got.size(); ++i)
      expect_bitwise(got[i], alone[i], std::string(what[i]) + ": sequences together vs each alone");
    expect_close(got[0], cpu[0], 0, 4e-6, "attention vs cpu");
    expect_bitwise(got[1], cpu[1], "k caches vs cpu");
    expect_bitwise(got[2], cpu[2], "v caches vs cpu");
  }
  Tensor q = be().alloc(2, 64), kc = be().alloc(8, 64), vc = be().alloc(8, 64), y = be().alloc(2, 64);
  const Ids pt = ids_of(be(), std::vector<int32_t>{0, 1});
  const SequenceCache shared[] = {{0, 1, kc, vc}, {1, 1, kc, vc}};
  expect_throws_naming([&] { be().attention_sequences(q, shared, pt, 1, 1, 64, 1.0f, y); }, "share one state");
  const SequenceCache narrow[] = {{0, 1, kc, vc}, {1, 1, be().alloc(8, 32), be().alloc(8, 32)}};
  expect_throws_naming([&] { be().kv_write_sequences(narrow, q, q, pt); }, "differs in shape");
}

INSTANTIATE_TEST_SUITE_P(Backends, Ops, ::testing::ValuesIn(backend_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::backend::testing
