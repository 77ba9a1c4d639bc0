// What only the CUDA backend has: the activation quantization bitwise the CPU's, matmul bitwise
// Device::matvec on that activation, the ops the model still runs on the host today (ssm_decay,
// block_mean, qsa_select) against the model code's own loops, weights uploaded once, and clear
// errors for host pointers and exhausted memory. Without a device every test skips with the
// reason (test_backend_parity*.cpp hold the op-by-op comparison with the CPU backend).
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_CUDA

#include <algorithm>
#include <cfloat>
#include <numeric>

#include "backend_test_util.h"
#include "backend/cuda/cuda_backend.h"
#include "test_quant_util.h"

namespace strata::backend::testing {
namespace {

#define REQUIRE_CUDA_DEVICE()                                                  \
  do {                                                                         \
    if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason(); \
  } while (0)

TEST(CudaBackend, QuantizedActivationIsTheCpuRuleBitwise) {
  REQUIRE_CUDA_DEVICE();
  cuda::Device dev(0);
  const int64_t rows = 5, cols = 1024;
  Floats x = normal_floats(size_t(rows * cols), 3, 2.0f);
  for (int64_t i = 0; i < 256; ++i) x[size_t(i)] = 0.0f;                      // a zero block
  for (int64_t i = 256; i < 512; ++i) x[size_t(i)] = 1e-39f * float(i % 7);   // d below FLT_MIN
  for (int64_t i = 512; i < 768; ++i) x[size_t(i)] = float(i % 9 - 4) * 0.5f;  // ties at .5 codes
  x[900] = 3e30f;
  x[1500] = -1e-3f;
  for (quant::ActFormat f : {quant::ActFormat::Q8_0, quant::ActFormat::Q8_K, quant::ActFormat::F32}) {
    SCOPED_TRACE(int(f));
    cuda::DeviceBuffer in(x.size() * 4), out(x.size() * 4);
    dev.upload(in.data(), x.data(), x.size() * 4);
    dev.act_round_trip(f, in.as<float>(), out.as<float>(), rows, cols);
    Floats got(x.size());
    dev.download(got.data(), out.data(), got.size() * 4);
    Floats want;
    std::vector<uint8_t> act(quant::act_bytes(f, cols));
    for (int64_t r = 0; r < rows; ++r) {
      quant::quantize_act_ref(f, x.data() + r * cols, act.data(), cols);
      const Floats row = quant::testing::dequantize_act(f, act.data(), cols);
      want.insert(want.end(), row.begin(), row.end());
    }
    // A block whose fp16 scale overflows (the 3e30 one, Q8_0) encodes 0 * inf: nan on both sides,
    // with the sign bit of whichever processor multiplied.
    for (size_t i = 0; i < got.size(); ++i)
      if (std::isnan(got[i]) && std::isnan(want[i])) got[i] = want[i] = 0.0f;
    expect_bitwise(got, want, "quantize_act");
  }
  EXPECT_THROW(dev.act_round_trip(quant::ActFormat::Q8_K, nullptr, nullptr, 1, 100), Error);
}

// matmul: the integer mat-vec (bitwise the CPU backend's matmul) for its formats, else the fp32
// mat-vec of the activation as the CPU quantizes it.
TEST(CudaBackend, MatmulIsTheCpuMatmulOrMatvecOfTheQuantizedActivation) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  CpuBackend cpu(1);
  cuda::Device dev(0);
  const int64_t rows = 70, cols = 1024;
  // (one row: the decode path that issues several groups' loads at once)
  for (int64_t T : {1, 11}) {
    for (quant::Type t : {quant::Type::F32, quant::Type::F16, quant::Type::Q8_0,
                          quant::Type::Q4_K, quant::Type::IQ2_XS, quant::Type::FP8_E4M3}) {
      SCOPED_TRACE(cat(quant::type_name(t), ", ", T, " rows"));
      HostTensor w = random_tensor("w", t, rows, cols, 1, 7 + uint64_t(t));
      const Floats x = normal_floats(size_t(T * cols), 8);
      Tensor xt = make(be, T, cols, x), y = be.alloc(T, rows);
      be.matmul(be.weight(w.info), xt, y);
      const Floats got = read(be, y);
      if (cuda::has_matvec_q(t)) {
        Tensor yc = cpu.alloc(T, rows);
        cpu.matmul(cpu.weight(w.info), make(cpu, T, cols, x), yc);
        expect_bitwise(got, read(cpu, yc), "matmul vs the CPU backend");
        continue;
      }
      cuda::DeviceBuffer wd(w.bytes.size()), xd(x.size() * 4), ad(x.size() * 4),
          yd(size_t(rows) * 4);
      dev.upload(wd.data(), w.bytes.data(), w.bytes.size());
      dev.upload(xd.data(), x.data(), x.size() * 4);
      dev.act_round_trip(quant::kernels(t).act, xd.as<float>(), ad.as<float>(), T, cols);
      for (int64_t r = 0; r < T; ++r) {
        dev.matvec(t, wd.data(), quant::row_bytes(t, cols), rows, cols, ad.as<float>() + r * cols,
                   yd.as<float>());
        Floats want(static_cast<size_t>(rows));
        dev.download(want.data(), yd.data(), want.size() * 4);
        expect_bitwise(Floats(got.begin() + r * rows, got.begin() + (r + 1) * rows), want,
                       "row " + std::to_string(r));
      }
    }
  }
}

// Consecutive matmuls of one x quantize it once (CudaBackend keeps the device's quantized copy
// while only matmuls of that x run): every result must still be the CPU's for x as it is then,
// after an op, an upload or a matmul of another format wrote or re-quantized it.
TEST(CudaBackend, MatmulsOfOneActivationShareItsQuantizationUntilXChanges) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  CpuBackend cpu(1);
  const int64_t rows = 48, cols = 512;
  const quant::Type types[] = {quant::Type::Q8_0, quant::Type::Q8_0, quant::Type::Q4_K,
                               quant::Type::FP8_E4M3};
  std::vector<HostTensor> host;
  for (size_t i = 0; i < std::size(types); ++i)
    host.push_back(random_tensor(cat("w", i), types[i], rows, cols, 1, 40 + i));
  for (int64_t T : {1, 3}) {
    SCOPED_TRACE(T);
    const Floats x0 = normal_floats(size_t(T * cols), 9);
    Tensor xg = make(be, T, cols, x0), xc = make(cpu, T, cols, x0);
    Tensor yg = be.alloc(T, rows), yc = cpu.alloc(T, rows);
    int step = 0;
    const auto expect_matmul = [&](size_t i) {
      be.matmul(be.weight(host[i].info), xg, yg);
      cpu.matmul(cpu.weight(host[i].info), xc, yc);
      expect_bitwise(read(be, yg), read(cpu, yc),
                     cat("step ", step++, ", ", quant::type_name(types[i])));
    };
    for (size_t i : {0, 1, 0, 2, 0}) expect_matmul(i);  // shared, then Q8_K over the scratch
    be.scale(xg, 2.0f, xg);
    cpu.scale(xc, 2.0f, xc);
    expect_matmul(1);
    const Floats x1 = normal_floats(size_t(T * cols), 10);
    be.upload(x1.data(), xg);
    cpu.upload(x1.data(), xc);
    expect_matmul(1);
    be.scale(xg, 0.5f, xg);
    cpu.scale(xc, 0.5f, xc);
    expect_matmul(3);  // fp32 activation: quantizes nothing, so it must not vouch for x
    expect_matmul(0);
  }
}

// model/qwen3next.cpp decay(), as it runs on the host today.
Floats decay_reference(const Floats& a, const Floats& dt, const Floats& ssm_a, int64_t T, int64_t H) {
  Floats g = a;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float& v = g[size_t(t * H + h)];
      const float z = v + dt[size_t(h)];
      const float softplus = z > 20.0f ? z : std::log1p(std::exp(z));
      v = ssm_a[size_t(h)] * softplus;
    }
  return g;
}

TEST(CudaBackend, SsmDecayMatchesTheModelsHostLoop) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  const int64_t T = 9, H = 12;
  Floats a = normal_floats(size_t(T * H), 1, 8.0f);
  a[3] = 25.0f;  // past softplus' threshold
  a[4] = 19.9f;
  const Floats dt = normal_floats(size_t(H), 2), ssm_a = normal_floats(size_t(H), 3);
  HostTensor dt_t = f32_tensor("ssm_dt.bias", {H}, dt), a_t = f32_tensor("ssm_a", {H}, ssm_a);
  const Weight dtw = be.weight(dt_t.info), aw = be.weight(a_t.info);
  Tensor at = make(be, T, H, a), g = be.alloc(T, H), g1 = be.alloc(T, H);
  be.ssm_decay(at, dtw, aw, g);
  for (int64_t r = 0; r < T; ++r) be.ssm_decay(at.rows_view(r, 1), dtw, aw, g1.rows_view(r, 1));
  const Floats got = read(be, g);
  expect_bitwise(read(be, g1), got, "T rows vs one-row calls");
  expect_close(got, decay_reference(a, dt, ssm_a, T, H), 1e-6, 0, "ssm_decay vs the model's loop");
  HostTensor short_t = f32_tensor("ssm_a", {H - 1}, Floats(size_t(H - 1)));
  expect_throws_naming([&] { be.ssm_decay(at, dtw, be.weight(short_t.info), g); }, "ssm_decay");
}

TEST(CudaBackend, BlockMeanMatchesTheModelsHostLoop) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  const int64_t B = 4, nb = 7, di = 64;
  const Floats raw = normal_floats(size_t(nb * B * di), 4);
  Floats want(size_t(nb * di));
  std::vector<int32_t> firsts;
  for (int64_t b = 0; b < nb; ++b) {  // model/qsa.cpp update_blocks(): one block per row
    firsts.push_back(b == 3 ? -1 : int32_t(b * B));
    for (int64_t j = 0; j < di; ++j) {
      float sum = 0.0f;
      for (int64_t r = 0; r < B; ++r) sum += raw[size_t((b * B + r) * di + j)];
      want[size_t(b * di + j)] = b == 3 ? 0.0f : sum / float(B);
    }
  }
  Tensor x = make(be, nb * B, di, raw), y = be.alloc(nb, di);
  be.block_mean(x, ids_of(be, firsts), B, y);
  expect_bitwise(read(be, y), want, "block_mean");
  expect_throws_naming([&] { be.block_mean(x, ids_of(be, {0}), B, y.rows_view(0, 2)); }, "block_mean");
}

// model/qsa.cpp select_positions() for one row.
std::vector<int32_t> select_reference(const float* score, int64_t p, int64_t B, int64_t top) {
  const int64_t nb = (p + 1) / B;
  std::vector<int64_t> order(static_cast<size_t>(nb));
  std::iota(order.begin(), order.end(), 0);
  const int64_t keep = std::min(top, nb);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
    return score[a] != score[b] ? score[a] > score[b] : a < b;
  });
  order.resize(static_cast<size_t>(keep));
  std::sort(order.begin(), order.end());
  std::vector<int32_t> out;
  for (int64_t b : order)
    for (int64_t r = 0; r < B; ++r) out.push_back(int32_t(b * B + r));
  for (int64_t r = nb * B; r <= p; ++r) out.push_back(int32_t(r));
  return out;
}

TEST(CudaBackend, QsaSelectMatchesTheModelsHostChoice) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  const int64_t B = 4, top = 3, T = 12, blocks = 40, cap = top * B + B - 1;
  Rng rng(9);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int32_t& p : pos) p = int32_t(rng.below(uint32_t(blocks * B)));
  pos[0] = 2;   // no complete block: the tail alone
  pos[1] = 11;  // exactly three blocks: all kept
  Floats scores = normal_floats(size_t(T * blocks), 10);
  for (int64_t b = 0; b < blocks; b += 3) scores[size_t(4 * blocks + b)] = 1.5f;  // ties
  for (int64_t b = 0; b < blocks; ++b) scores[size_t(5 * blocks + b)] = 0.25f;    // all tied
  Tensor st = make(be, T, blocks, scores);
  Ids pt = be.alloc_ids(T, 1), sel = be.alloc_ids(T, cap), counts = be.alloc_ids(T, 1);
  be.upload_ids(pos.data(), pt);
  be.qsa_select(st, pt, B, top, sel, counts);
  std::vector<int32_t> got(size_t(T * cap)), n(static_cast<size_t>(T));
  be.download_ids(sel, got.data());
  be.download_ids(counts, n.data());
  // One-row calls give the same rows.
  Ids sel1 = be.alloc_ids(T, cap), counts1 = be.alloc_ids(T, 1);
  for (int64_t r = 0; r < T; ++r)
    be.qsa_select(st.rows_view(r, 1), pt.rows_view(r, 1), B, top, sel1.rows_view(r, 1),
                  counts1.rows_view(r, 1));
  std::vector<int32_t> got1(got.size()), n1(n.size());
  be.download_ids(sel1, got1.data());
  be.download_ids(counts1, n1.data());
  EXPECT_EQ(n1, n);
  for (int64_t r = 0; r < T; ++r) {
    const std::vector<int32_t> want = select_reference(scores.data() + r * blocks, pos[size_t(r)], B, top);
    ASSERT_EQ(n[size_t(r)], int32_t(want.size())) << "row " << r;
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + r * cap)) << "row " << r;
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got1.begin() + r * cap)) << "row " << r;
  }
  expect_throws_naming([&] { be.qsa_select(st, pt, B, top, sel.rows_view(0, 2), counts); }, "qsa_select");
  Ids narrow = be.alloc_ids(T, cap - 1);
  expect_throws_naming([&] { be.qsa_select(st, pt, B, top, narrow, counts); }, "selected");
}

TEST(CudaBackend, WeightsUploadOnceAndHostPointersAreRejected) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  HostTensor stack = random_tensor("blk.0.ffn_up_exps.weight", quant::Type::Q4_K, 32, 256, 6, 1);
  for (int64_t s = 0; s < 6; ++s) be.weight(stack.info, s);
  be.weight(stack.info, 3);
  EXPECT_EQ(be.device_bytes_used(), stack.bytes.size());
  const Weight w0 = be.weight(stack.info, 0), w5 = be.weight(stack.info, 5);
  EXPECT_EQ(static_cast<const uint8_t*>(w5.data) - static_cast<const uint8_t*>(w0.data),
            ptrdiff_t(5 * 32 * w0.row_stride));
  Weight host = w0;
  host.data = stack.bytes.data();
  Tensor x = be.alloc(1, 256), y = be.alloc(1, 32);
  expect_throws_naming([&] { be.matmul(host, x, y); }, "not device memory");
  Weight past_end = w5;
  past_end.rows = 33;
  expect_throws_naming([&] { be.matmul(past_end, x, be.alloc(1, 33)); }, "not device memory");

  // A one-row view into a longer row (qwen4exp's per-stream gains) covers its own columns only.
  const Floats gains = normal_floats(4 * 64, 3);
  HostTensor gain = f32_tensor("hc_attn_norm.weight", {256}, gains);
  const Weight whole = be.weight(gain.info);
  const Weight last{whole.type, static_cast<const float*>(whole.data) + 192, 64, 1, whole.row_stride};
  Tensor xs = make(be, 2, 64, normal_floats(128, 4)), ys = be.alloc(2, 64);
  be.rms_norm(xs, &last, 64, 1e-6f, ys);
  CpuBackend cpu(1);
  const Weight cpu_whole = cpu.weight(gain.info);
  const Weight cpu_last{cpu_whole.type, static_cast<const float*>(cpu_whole.data) + 192, 64, 1,
                        cpu_whole.row_stride};
  Tensor xc = make(cpu, 2, 64, read(be, xs)), yc = cpu.alloc(2, 64);
  cpu.rms_norm(xc, &cpu_last, 64, 1e-6f, yc);
  expect_bitwise(read(be, ys), read(cpu, yc), "rms_norm with the last stream's gains");
  Weight beyond = last;
  beyond.data = static_cast<const float*>(whole.data) + 193;
  expect_throws_naming([&] { be.rms_norm(xs, &beyond, 64, 1e-6f, ys); }, "not device memory");
}

// Expert stacks whose rows are only 2-byte aligned (IQ2_XS rows of one and of three blocks: 74 and
// 222 bytes, the flagship's gate/up and padded down) are laid out at a 16-byte stride on the
// device, so the MoE kernels copy their rows with cp.async; the experts' outputs keep their bits:
// equal to the same experts uploaded one matrix at a time, at the file's stride, in decode
// windows (pair by pair) and a prefill window (grouped by expert, on the tensor cores).
TEST(CudaBackend, ExpertStacksOfTwoByteAlignedRowsArePaddedAndKeepTheirBits) {
  REQUIRE_CUDA_DEVICE();
  const quant::Type t = quant::Type::IQ2_XS;
  const int64_t E = 6, K = 4, n_embd = 256, n_ff = 640, down_cols = 768;
  const HostTensor gate = random_tensor("blk.0.ffn_gate_exps.weight", t, n_ff, n_embd, E, 1),
                   up = random_tensor("blk.0.ffn_up_exps.weight", t, n_ff, n_embd, E, 2),
                   down = random_tensor("blk.0.ffn_down_exps.weight", t, n_embd, down_cols, E, 3);
  // The same matrices as 2-D tensors, one per expert.
  std::vector<HostTensor> single;
  for (const HostTensor* stack : {&gate, &up, &down})
    for (int64_t e = 0; e < E; ++e) {
      const int64_t rows = stack->info.shape[1], cols = stack->info.shape[0];
      const size_t bytes = size_t(rows) * quant::row_bytes(t, cols);
      single.emplace_back(stack->info.name + "." + std::to_string(e), t,
                          std::vector<int64_t>{cols, rows},
                          std::vector<uint8_t>(stack->bytes.begin() + e * bytes,
                                               stack->bytes.begin() + (e + 1) * bytes));
    }
  CudaBackend be(0);
  std::vector<ExpertWeights> stacked, apart;
  for (int64_t e = 0; e < E; ++e) {
    stacked.push_back({be.weight(gate.info, e), be.weight(up.info, e), be.weight(down.info, e)});
    apart.push_back({be.weight(single[size_t(e)].info), be.weight(single[size_t(E + e)].info),
                     be.weight(single[size_t(2 * E + e)].info)});
  }
  EXPECT_EQ(stacked[0].gate.row_stride, 80u);
  EXPECT_EQ(stacked[0].down.row_stride, 224u);
  EXPECT_EQ(apart[0].down.row_stride, 222u);
  EXPECT_EQ(static_cast<const uint8_t*>(stacked[1].down.data) -
                static_cast<const uint8_t*>(stacked[0].down.data),
            ptrdiff_t(n_embd * 224));
  Rng rng(4);
  for (const int64_t rows : {1, 3, 24}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    const Routing routing = random_routing(rng, rows, E, K);
    const Floats x = normal_floats(size_t(rows * n_embd), 10 + rows);
    const auto run = [&](std::span<const ExpertWeights> experts) {
      Ids ids = be.alloc_ids(rows, K);
      Tensor weights = be.alloc(rows, K), xt = make(be, rows, n_embd, x), y = be.alloc(rows, n_embd);
      upload_routing(be, routing, ids, weights);
      be.moe_experts(xt, ids, weights, experts, y);
      return read(be, y);
    };
    expect_bitwise(run(stacked), run(apart), "padded stacks vs matrices at the file's stride");
  }
}

// Decode windows (few pairs) run the MoE pair by pair, each down CTA quantizing its hidden row
// itself; prefill windows (pairs grouped by expert) have every hidden row quantized before down.
// Each row of a long window must equal that row alone, for down rows padded past n_ff (IQ2_XS
// 640 -> 768 in Q8_K blocks, Q8_0 80 -> 96 in Q8_0 blocks: the zeros past n_ff inside an
// activation block) and for FP8 downs, which read the hidden rows in fp32.
TEST(CudaBackend, DecodeMoeByPairEqualsTheGroupedPathForPaddedAndFp8Downs) {
  REQUIRE_CUDA_DEVICE();
  const int64_t n_embd = 256, K = 4, rows = 40;  // 160 pairs: grouped; one row: 4 pairs, by pair
  struct Case {
    quant::Type type;
    int64_t n_ff, down_cols;
  };
  for (const Case c : {Case{quant::Type::IQ2_XS, 640, 768}, Case{quant::Type::Q8_0, 80, 96},
                       Case{quant::Type::FP8_E4M3, 64, 64}}) {
    SCOPED_TRACE(quant::type_name(c.type));
    const int64_t E = 6;
    const HostTensor gate = random_tensor("blk.0.ffn_gate_exps.weight", c.type, c.n_ff, n_embd, E, 1),
                     up = random_tensor("blk.0.ffn_up_exps.weight", c.type, c.n_ff, n_embd, E, 2),
                     down = random_tensor("blk.0.ffn_down_exps.weight", c.type, n_embd, c.down_cols, E, 3);
    CudaBackend be(0);
    std::vector<ExpertWeights> experts;
    for (int64_t e = 0; e < E; ++e)
      experts.push_back({be.weight(gate.info, e), be.weight(up.info, e), be.weight(down.info, e)});
    Rng rng(5);
    const Routing routing = random_routing(rng, rows, E, K);
    const Floats x = normal_floats(size_t(rows * n_embd), 11), y0 = normal_floats(size_t(rows * n_embd), 12);
    Ids ids = be.alloc_ids(rows, K);
    Tensor weights = be.alloc(rows, K), xt = make(be, rows, n_embd, x);
    upload_routing(be, routing, ids, weights);
    Tensor whole = make(be, rows, n_embd, y0), each = make(be, rows, n_embd, y0);
    be.moe_experts(xt, ids, weights, experts, whole);
    for (int64_t r = 0; r < rows; ++r) {
      Ids row_ids = be.alloc_ids(1, K);
      Tensor row_weights = be.alloc(1, K);
      Routing one;
      one.top_k = K;
      one.experts.assign(routing.experts.begin() + r * K, routing.experts.begin() + (r + 1) * K);
      one.weights.assign(routing.weights.begin() + r * K, routing.weights.begin() + (r + 1) * K);
      upload_routing(be, one, row_ids, row_weights);
      be.moe_experts(xt.rows_view(r, 1), row_ids, row_weights, experts, each.rows_view(r, 1));
    }
    const Floats got = read(be, each);
    expect_bitwise(got, read(be, whole), "one-row windows vs one grouped window");
    EXPECT_TRUE(std::any_of(got.begin(), got.end(), [&](float v) { return v != 0.0f; }));
  }
}

// weight() recognizes a tensor by address, size, name, type, shape and a sample of its bytes: new
// contents at an old address (another file mapped there) are uploaded again.
TEST(CudaBackend, NewContentsAtAnOldAddressAreUploadedAgain) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  HostTensor table = random_tensor("token_embd.weight", quant::Type::Q8_0, 4, 64, 1, 1);
  const Ids ids = ids_of(be, {2});
  Tensor y = be.alloc(1, 64);
  be.get_rows(be.weight(table.info), ids, y);
  const Floats first = read(be, y);
  const HostTensor other = random_tensor("token_embd.weight", quant::Type::Q8_0, 4, 64, 1, 2);
  std::memcpy(table.bytes.data(), other.bytes.data(), table.bytes.size());
  be.get_rows(be.weight(table.info), ids, y);
  Floats want(64);
  quant::dequantize(quant::Type::Q8_0, other.bytes.data() + 2 * 68, want.data(), 64);
  expect_bitwise(read(be, y), want, "the second contents");
  EXPECT_FALSE(same_bits(first, want));
  EXPECT_EQ(be.device_bytes_used(), 2 * table.bytes.size());
}

TEST(CudaBackend, ExhaustedMemoryIsAClearErrorAndTheBackendGoesOn) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  expect_throws_naming([&] { be.alloc(int64_t(1) << 40, 1024); }, "alloc: out of device memory");
  Tensor t = make(be, 2, 3, Floats{1, 2, 3, 4, 5, 6});
  EXPECT_EQ(read(be, t), (Floats{1, 2, 3, 4, 5, 6}));
}

// Releasing what the backend did not allocate (a view into a tensor, ids twice) names the op, the
// kind and the shape; the backend goes on. (The message is formed only then: a replayed window
// releases ~1000 temporaries, and formatting each description cost ~250 us a token.)
TEST(CudaBackend, ReleasingForeignMemoryNamesItAndTheBackendGoesOn) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  Tensor t = make(be, 4, 3, Floats(12, 1.0f));
  expect_throws_naming([&] { be.release(t.rows_view(1, 2)); },
                       "release: tensor [2 x 3] was not allocated by this backend");
  const Ids ids = be.alloc_ids(2, 5);
  be.release_ids(ids);
  expect_throws_naming([&] { be.release_ids(ids); },
                       "release_ids: ids [2 x 5] was not allocated by this backend");
  EXPECT_EQ(read(be, t), Floats(12, 1.0f));
  be.release(t);
}

// A recorded window whose ops allocate nothing (every tensor made before it) is captured and
// replayed like any other; its capture once zeroed a null arena and failed to instantiate.
TEST(CudaBackend, WindowThatAllocatesNothingIsRecordedAndReplayed) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  const Floats a = normal_floats(64, 1), b = normal_floats(64, 2);
  Tensor at = make(be, 1, 64, a), bt = make(be, 1, 64, b), y = be.alloc(1, 64);
  Floats want(64);
  for (size_t i = 0; i < want.size(); ++i) want[i] = a[i] + b[i];
  const uint64_t replays = be.counters().graph_replays;
  for (int window = 0; window < 5; ++window) {
    be.fill(y, 0.0f);
    be.begin_window(7);
    be.add(at, bt, y);
    be.end_window(true);
    expect_bitwise(read(be, y), want, "window " + std::to_string(window));
  }
  EXPECT_GT(be.counters().graph_replays, replays);
}

// A side branch (Backend::begin_side_branch) runs on the device's side stream with its own
// mat-vec scratch: matmuls of one x there and of another x on the main stream, at once, give the
// bits of issue order, op by op and in a recorded window (captured as a parallel branch, then
// replayed). Rows of 4096 Q8_0 columns quantize x into the scratch, and the repeated matmuls of one
// x reuse it: with one scratch for both streams they would read the other x's.
TEST(CudaBackend, SideBranchGivesTheBitsOfIssueOrder) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  const int64_t n = 4096, rows = 2048;
  const HostTensor wa = random_tensor("a.weight", quant::Type::Q8_0, rows, n, 1, 1),
                   wb = random_tensor("b.weight", quant::Type::Q8_0, rows, n, 1, 2);
  const Weight a = be.weight(wa.info), b = be.weight(wb.info);
  const Tensor xa = make(be, 1, n, normal_floats(size_t(n), 3)), xb = make(be, 1, n, normal_floats(size_t(n), 4));
  Tensor ya = be.alloc(1, rows), yb = be.alloc(1, rows), sum = be.alloc(1, rows);
  be.matmul(a, xa, ya);
  be.matmul(b, xb, yb);
  const Floats want_a = read(be, ya), want_b = read(be, yb);
  Floats want_sum(static_cast<size_t>(rows));
  for (size_t i = 0; i < want_sum.size(); ++i) want_sum[i] = want_a[i] + want_b[i];
  const uint64_t replays = be.counters().graph_replays;
  for (int window = 0; window < 4; ++window) {
    SCOPED_TRACE(::testing::Message() << "window " << window);
    for (Tensor t : {ya, yb, sum}) be.fill(t, 0.0f);
    be.begin_window(9);
    be.begin_side_branch();
    for (int i = 0; i < 6; ++i) be.matmul(a, xa, ya);
    be.end_side_branch();
    for (int i = 0; i < 6; ++i) be.matmul(b, xb, yb);
    be.join_side_branch();
    be.add(ya, yb, sum);
    be.end_window(true);
    expect_bitwise(read(be, ya), want_a, "side branch");
    expect_bitwise(read(be, yb), want_b, "main stream");
    expect_bitwise(read(be, sum), want_sum, "after the join");
  }
  EXPECT_GT(be.counters().graph_replays, replays);
  // A branch left open is joined by the read back.
  be.fill(ya, 0.0f);
  be.begin_side_branch();
  be.matmul(a, xa, ya);
  expect_bitwise(read(be, ya), want_a, "read back from an open branch");
}

// A selected list larger than the staging ring's half (it grows): every position of a long
// window, which must equal dense attention bit for bit.
TEST(CudaBackend, LargeUploadsStageAndAllPositionsEqualAttention) {
  REQUIRE_CUDA_DEVICE();
  CudaBackend be(0);
  const int64_t T = 800, n_head = 2, hd = 32;
  const Floats q = normal_floats(size_t(T * n_head * hd), 1), k = normal_floats(size_t(T * hd), 2),
               v = normal_floats(size_t(T * hd), 3);
  std::vector<int32_t> pos(static_cast<size_t>(T)), all(size_t(T * T), 0);
  std::iota(pos.begin(), pos.end(), 0);
  for (int32_t p : pos)
    for (int32_t i = 0; i <= p; ++i) all[size_t(p) * size_t(T) + size_t(i)] = i;
  std::vector<int32_t> counts(pos.begin(), pos.end());
  for (int32_t& c : counts) ++c;
  ASSERT_GT(all.size() * 4, size_t(1) << 20);  // more than a staging half at once
  Tensor kc = be.alloc(T, hd), vc = be.alloc(T, hd), qt = make(be, T, n_head * hd, q);
  const Ids pt = ids_of(be, pos);
  be.kv_write(kc, vc, make(be, T, hd, k), make(be, T, hd, v), pt);
  Tensor dense = be.alloc(T, n_head * hd), sel = be.alloc(T, n_head * hd);
  be.attention(qt, kc, vc, pt, n_head, 1, hd, 0.2f, dense);
  be.attention_selected(qt, kc, vc, ids_of(be, all, T), ids_of(be, counts), n_head, 1, hd, 0.2f,
                        sel);
  expect_bitwise(read(be, sel), read(be, dense), "all positions selected vs attention");
}

}  // namespace
}  // namespace strata::backend::testing

#else

TEST(CudaBackend, NotCompiled) { GTEST_SKIP() << "the CUDA backend is not compiled in (no nvcc)"; }

#endif
