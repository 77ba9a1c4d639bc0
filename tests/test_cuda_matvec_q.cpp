// CUDA integer mat-vec (Device::matvec_q) and activation quantizer (Device::quantize_act): the
// quantized activation is byte for byte quant::quantize_act_ref, every y is bit for bit the CPU's
// dot_ref of the row with that activation, for odd shapes, padded and 2-byte aligned strides,
// several rows per warp and several activations per call; bad shapes throw clear errors. Skipped
// with "no CUDA device" where there is no GPU.
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_CUDA

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "quant/kernels.h"
#include "util/error.h"
#include "util/rng.h"

namespace strata {
namespace {

using quant::ActFormat;
using quant::Type;

#define REQUIRE_CUDA_DEVICE()                                                  \
  do {                                                                         \
    if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason(); \
  } while (0)

cuda::Device& device() {
  static cuda::Device dev(0);
  return dev;
}

template <typename T>
cuda::DeviceBuffer to_device(const std::vector<T>& v) {
  cuda::DeviceBuffer b(v.size() * sizeof(T));
  device().upload(b.data(), v.data(), b.size());
  return b;
}

template <typename T>
std::vector<T> from_device(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  device().download(v.data(), b.data(), n * sizeof(T));
  return v;
}

// Index of the first float whose bits differ, or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return int64_t(i);
  return -1;
}

// Activation rows with every path of the quantizer: ordinary blocks of varied magnitude, and per
// token one all-zero block, one of subnormals, one of exact rounding ties (amax 127 makes d = 1)
// and, with `nonfinite`, one with an infinity and one with a NaN (the quantizer test only: through
// a dot product they make NaNs, whose bits CPU and GPU need not share).
std::vector<float> activation_rows(int64_t cols, int tokens, uint64_t seed, int64_t block,
                                   bool nonfinite = false) {
  std::vector<float> x(size_t(cols) * tokens);
  Rng rng(seed);
  for (float& v : x) v = rng.normal() * std::ldexp(1.0f, int(rng.next() % 9) - 4);
  const int64_t nblocks = cols / block;
  for (int t = 0; t < tokens; ++t) {
    float* row = x.data() + size_t(t) * cols;
    const auto fill = [&](int64_t b, auto value) {
      if (b >= nblocks) return;
      for (int64_t i = 0; i < block; ++i) row[b * block + i] = value(i);
    };
    fill(1, [](int64_t) { return 0.0f; });
    fill(2, [](int64_t i) { return float(i + 1) * 1e-41f; });
    fill(3, [](int64_t i) { return i == 0 ? 127.0f : float(int(i % 9) - 4) + 0.5f; });
    if (!nonfinite) continue;
    fill(4, [](int64_t i) { return i == 5 ? std::numeric_limits<float>::infinity() : 1.0f; });
    fill(5, [](int64_t i) { return i == 7 ? std::numeric_limits<float>::quiet_NaN() : -2.0f; });
  }
  return x;
}

void expect_act_matches_reference(ActFormat f, int64_t cols, int tokens) {
  SCOPED_TRACE(testing::Message() << "act format " << int(f) << ", " << tokens << " x " << cols);
  const int64_t block = f == ActFormat::F32 ? 32 : quant::act_block_elems(f);
  const std::vector<float> x = activation_rows(cols, tokens, 11 + cols, block, true);
  const size_t stride = cuda::quantized_act_stride(f, cols), bytes = quant::act_bytes(f, cols);
  ASSERT_EQ(stride % 16, 0u);
  ASSERT_GE(stride, bytes);
  cuda::DeviceBuffer dx = to_device(x), dout(stride * tokens);
  device().quantize_act(f, dx.as<float>(), dout.data(), cols, tokens);
  const std::vector<uint8_t> gpu = from_device<uint8_t>(dout, stride * tokens);
  std::vector<uint8_t> ref(bytes);
  for (int t = 0; t < tokens; ++t) {
    quant::quantize_act_ref(f, x.data() + size_t(t) * cols, ref.data(), cols);
    for (size_t i = 0; i < bytes; ++i)
      ASSERT_EQ(gpu[t * stride + i], ref[i]) << "token " << t << " byte " << i;
  }
}

TEST(CudaActQuant, MatchesReferenceBytewise) {
  REQUIRE_CUDA_DEVICE();
  for (ActFormat f : {ActFormat::Q8_0, ActFormat::Q8_K, ActFormat::F32}) {
    expect_act_matches_reference(f, 256, 1);
    expect_act_matches_reference(f, 2560, 3);
    expect_act_matches_reference(f, 16384, 8);
  }
}

// Weights: `rows` rows of random valid blocks `stride` bytes apart (padding bytes random too).
std::vector<uint8_t> weight_rows(Type t, int64_t rows, int64_t cols, size_t stride, uint64_t seed) {
  const quant::TypeInfo& info = quant::type_info(t);
  std::vector<uint8_t> w(stride * rows);
  Rng rng(seed);
  for (uint8_t& b : w) b = uint8_t(rng.next() >> 56);
  std::vector<uint8_t> row(quant::row_bytes(info, cols));
  for (int64_t r = 0; r < rows; ++r) {
    quant::kernels(t).random_blocks(rng, row.data(), cols / info.block_elems);
    std::memcpy(w.data() + r * stride, row.data(), row.size());
  }
  return w;
}

// y[t * rows + r] = dot_ref(row r, quantize_act_ref(x_t)): what quant::matvec computes.
std::vector<float> cpu_reference(Type t, const std::vector<uint8_t>& w, size_t stride, int64_t rows,
                                 int64_t cols, const std::vector<float>& x, int tokens) {
  const quant::FormatKernels& k = quant::kernels(t);
  std::vector<uint8_t> act(quant::act_bytes(k.act, cols));
  std::vector<float> y(size_t(rows) * tokens);
  for (int tok = 0; tok < tokens; ++tok) {
    quant::quantize_act_ref(k.act, x.data() + size_t(tok) * cols, act.data(), cols);
    for (int64_t r = 0; r < rows; ++r)
      y[size_t(tok) * rows + r] = k.dot_ref(w.data() + r * stride, act.data(), cols);
  }
  return y;
}

// The block the format's activation is quantized in (32 for an fp32 activation).
int64_t act_block(Type t) {
  const int64_t b = quant::act_block_elems(quant::kernels(t).act);
  return b == 1 ? 32 : b;
}

struct Shape {
  int64_t rows, cols;
  size_t pad;  // bytes between rows: 16 keeps 16-byte alignment, 2 leaves only 2
};

std::vector<float> gpu_matvec_q(Type t, const cuda::DeviceBuffer& w, size_t stride, int64_t rows,
                                int64_t cols, const cuda::DeviceBuffer& x, int tokens,
                                const cuda::MatvecQOptions& options = {}) {
  cuda::DeviceBuffer y(size_t(rows) * tokens * sizeof(float));
  device().matvec_q(t, w.data(), stride, rows, cols, x.as<float>(), y.as<float>(), tokens, options);
  return from_device<float>(y, size_t(rows) * tokens);
}

class CudaMatvecQ : public ::testing::TestWithParam<Type> {
 protected:
  void SetUp() override { REQUIRE_CUDA_DEVICE(); }
};

void expect_bitwise(const std::vector<float>& gpu, const std::vector<float>& ref, int64_t rows,
                    const char* what) {
  const int64_t bad = first_bit_difference(gpu, ref);
  EXPECT_EQ(bad, -1) << what << ": token " << (bad < 0 ? 0 : bad / rows) << " row "
                     << (bad < 0 ? 0 : bad % rows) << ": gpu " << (bad < 0 ? 0.0f : gpu[bad])
                     << " cpu " << (bad < 0 ? 0.0f : ref[bad]);
}

std::vector<Shape> matvec_shapes(Type t) {
  const int64_t blk = quant::type_info(t).block_elems;
  return {
      {1, blk, 0},               // one block: most lanes idle
      {77, 2560, 0},             // rows not a multiple of the rows per warp
      {64, 2560 + 8 * blk, 16},  // padded rows
      {9, 16384, 0},             // long rows
      {5, 3 * blk, 2},           // rows only 2-byte aligned
      {300, 4096, 0},            // many warps
      // Long rows in few row groups (Q8_0 takes them a few rows a CTA at 1 and 2 activations):
      {320, 10240, 0},  // a hyper-connection mixer's down projection
      {4, 10240, 2},    // its inject, 2-byte aligned
      {1000, 6144, 16}, // an out-projection's kind, padded
  };
}

TEST_P(CudaMatvecQ, EqualsCpuDotBitwiseAndDeterministic) {
  const Type t = GetParam();
  ASSERT_TRUE(cuda::has_matvec_q(t));
  for (const Shape& s : matvec_shapes(t)) {
    SCOPED_TRACE(testing::Message()
                 << quant::type_name(t) << " " << s.rows << " x " << s.cols << " pad " << s.pad);
    const size_t stride = quant::row_bytes(t, s.cols) + s.pad;
    const std::vector<uint8_t> w = weight_rows(t, s.rows, s.cols, stride, 5 + s.rows + s.cols);
    const std::vector<float> x = activation_rows(s.cols, 1, 3 + s.cols, act_block(t));
    const cuda::DeviceBuffer dw = to_device(w), dx = to_device(x);
    const std::vector<float> ref = cpu_reference(t, w, stride, s.rows, s.cols, x, 1);
    const std::vector<float> gpu = gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, 1);
    expect_bitwise(gpu, ref, s.rows, "matvec_q vs dot_ref");
    expect_bitwise(gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, 1), gpu, s.rows, "second run");
    for (int rpw : {4, 8}) {
      cuda::MatvecQOptions o;
      o.rows_per_warp = rpw;
      expect_bitwise(gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, 1, o), ref, s.rows,
                     rpw == 4 ? "4 rows per warp" : "8 rows per warp");
    }
    // x was just quantized into the device's copy (the calls above name their kernels): a call
    // that may reuse it reads that copy where the default call quantizes x in its own CTAs.
    cuda::MatvecQOptions reuse;
    reuse.x_unchanged = true;
    expect_bitwise(gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, 1, reuse), ref, s.rows,
                   "from the quantized copy");
  }
}

// A call with T activations gives each the bits of a one-activation call (and of the CPU), on
// every shape above (Q8_0 runs 2 to 8 activations on the tensor cores, its warps split by chain:
// partial steps and rows off the 16-row tile matter there).
TEST_P(CudaMatvecQ, TokensEqualSingleActivations) {
  const Type t = GetParam();
  for (const Shape& s : matvec_shapes(t)) {
    const size_t stride = quant::row_bytes(t, s.cols) + s.pad;
    const std::vector<uint8_t> w = weight_rows(t, s.rows, s.cols, stride, 77 + s.rows);
    const cuda::DeviceBuffer dw = to_device(w);
    for (int tokens : {2, 3, 4, 5, 8}) {
      SCOPED_TRACE(testing::Message() << quant::type_name(t) << " " << s.rows << " x " << s.cols
                                      << " pad " << s.pad << ", " << tokens << " activations");
      const std::vector<float> x = activation_rows(s.cols, tokens, 100 + tokens, act_block(t));
      const cuda::DeviceBuffer dx = to_device(x);
      const std::vector<float> many = gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, tokens);
      expect_bitwise(many, cpu_reference(t, w, stride, s.rows, s.cols, x, tokens), s.rows,
                     "vs CPU");
      expect_bitwise(gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, tokens), many, s.rows,
                     "second run");
      cuda::MatvecQOptions rows4, reuse;
      rows4.rows_per_warp = 4;
      reuse.x_unchanged = true;
      expect_bitwise(gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, tokens, rows4), many, s.rows,
                     "the row-group kernels");
      expect_bitwise(gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, tokens, reuse), many, s.rows,
                     "from the quantized copy");
      std::vector<float> singles;
      for (int k = 0; k < tokens; ++k) {
        const std::vector<float> xk(x.begin() + k * s.cols, x.begin() + (k + 1) * s.cols);
        const cuda::DeviceBuffer dxk = to_device(xk);
        const std::vector<float> yk = gpu_matvec_q(t, dw, stride, s.rows, s.cols, dxk, 1);
        singles.insert(singles.end(), yk.begin(), yk.end());
      }
      expect_bitwise(many, singles, s.rows, "vs one activation at a time");
    }
  }
}

// Several matrices of one activation in one call (Backend::matmuls: a mixer's down and inject
// projections) give each matrix the CPU's bits, at 1 and 2 activations.
TEST_P(CudaMatvecQ, SeveralMatricesEqualCpuDotBitwise) {
  const Type t = GetParam();
  const int64_t cols = 10240;
  const Shape shapes[] = {{320, cols, 0}, {4, cols, 2}, {77, cols, 16}};
  std::vector<std::vector<uint8_t>> w;
  std::vector<cuda::DeviceBuffer> dw, dy;
  for (const Shape& s : shapes) {
    w.push_back(weight_rows(t, s.rows, s.cols, quant::row_bytes(t, cols) + s.pad, 11 + s.rows));
    dw.push_back(to_device(w.back()));
  }
  for (int tokens : {1, 2}) {
    SCOPED_TRACE(testing::Message() << quant::type_name(t) << ", " << tokens << " activations");
    const std::vector<float> x = activation_rows(cols, tokens, 40 + tokens, act_block(t));
    const cuda::DeviceBuffer dx = to_device(x);
    std::vector<cuda::MatvecQMatrix> matrices;
    dy.clear();
    for (size_t i = 0; i < std::size(shapes); ++i) {
      dy.emplace_back(size_t(shapes[i].rows) * tokens * sizeof(float));
      matrices.push_back({dw[i].data(), quant::row_bytes(t, cols) + shapes[i].pad, shapes[i].rows,
                          dy.back().as<float>()});
    }
    device().matvec_q(t, matrices, cols, dx.as<float>(), tokens);
    for (size_t i = 0; i < std::size(shapes); ++i) {
      const Shape& s = shapes[i];
      expect_bitwise(from_device<float>(dy[i], size_t(s.rows) * tokens),
                     cpu_reference(t, w[i], quant::row_bytes(t, cols) + s.pad, s.rows, cols, x, tokens),
                     s.rows, "matrix of a several-matrix call vs CPU");
    }
  }
}

// A call that quantizes x in its own CTAs leaves the device's quantized copy behind: after x
// changes, a call that vouches x is unchanged since that call must not read the old copy.
TEST(CudaMatvecQReuse, ACallQuantizingInItsCtasLeavesNoStaleCopy) {
  REQUIRE_CUDA_DEVICE();
  const Type t = Type::Q8_0;
  for (const Shape& s : {Shape{320, 10240, 0}, Shape{640, 320, 0}}) {
    SCOPED_TRACE(testing::Message() << s.rows << " x " << s.cols);
    const size_t stride = quant::row_bytes(t, s.cols);
    const std::vector<uint8_t> w = weight_rows(t, s.rows, s.cols, stride, 9);
    const std::vector<float> x0 = activation_rows(s.cols, 1, 1, 32),
                             x1 = activation_rows(s.cols, 1, 2, 32);
    const cuda::DeviceBuffer dw = to_device(w);
    cuda::DeviceBuffer dx = to_device(x0);
    cuda::MatvecQOptions rows4, reuse;
    rows4.rows_per_warp = 4;
    reuse.x_unchanged = true;
    gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, 1, rows4);  // the copy holds x0
    device().upload(dx.data(), x1.data(), dx.size());
    const std::vector<float> ref = cpu_reference(t, w, stride, s.rows, s.cols, x1, 1);
    expect_bitwise(gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, 1), ref, s.rows, "x changed");
    expect_bitwise(gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, 1, reuse), ref, s.rows,
                   "unchanged since the last call");
  }
}

INSTANTIATE_TEST_SUITE_P(IntegerFormats, CudaMatvecQ,
                         ::testing::Values(Type::Q8_0, Type::Q4_K, Type::IQ2_XS, Type::FP8_E4M3),
                         [](const auto& p) { return std::string(quant::type_name(p.param)); });

// More than kMaxMatvecTokens activations of a format with tensor-core tiles (Q8_0) run in one
// call on the tiles: every y the CPU's dot_ref bit for bit (so a window equals its rows one at a
// time), for row and token counts off the tiles' multiples, rows of a partial last step, padded
// and 2-byte aligned strides. Runs repeat bit for bit.
TEST(CudaMatmulTiles, EqualCpuDotBitwise) {
  REQUIRE_CUDA_DEVICE();
  const Type t = Type::Q8_0;
  ASSERT_TRUE(cuda::has_matmul_tiles(t));
  EXPECT_FALSE(cuda::has_matmul_tiles(Type::IQ2_XS));
  struct TileShape {
    Shape s;
    int tokens;
  };
  const TileShape shapes[] = {
      {{1, 32, 0}, 9},       // one block, one row
      {{77, 352, 0}, 37},    // 11 blocks: a partial last step; rows and tokens off the tiles
      {{64, 2048, 16}, 32},  // exactly one tile, padded rows
      {{130, 1024, 2}, 100}, // rows only 2-byte aligned
      {{300, 4096, 0}, 512}, // many tiles both ways
  };
  for (const TileShape& ts : shapes) {
    const Shape& s = ts.s;
    SCOPED_TRACE(testing::Message() << s.rows << " x " << s.cols << " pad " << s.pad << ", "
                                    << ts.tokens << " tokens");
    const size_t stride = quant::row_bytes(t, s.cols) + s.pad;
    const std::vector<uint8_t> w = weight_rows(t, s.rows, s.cols, stride, 15 + s.rows);
    const std::vector<float> x = activation_rows(s.cols, ts.tokens, 21 + ts.tokens, 32);
    const cuda::DeviceBuffer dw = to_device(w), dx = to_device(x);
    const std::vector<float> ref = cpu_reference(t, w, stride, s.rows, s.cols, x, ts.tokens);
    const std::vector<float> gpu = gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, ts.tokens);
    expect_bitwise(gpu, ref, s.rows, "tiles vs dot_ref");
    expect_bitwise(gpu_matvec_q(t, dw, stride, s.rows, s.cols, dx, ts.tokens), gpu, s.rows,
                   "second run");
  }
}

// Every kernel launch is checked against the hardware's limits before it is made (no device
// needed: the check is the host's).
TEST(CudaLaunchGuard, GridsAndBlocksPastTheLimitsAreNamed) {
  EXPECT_EQ(cuda::launch_out_of_range(1, 1, 1, 32, 1, 1), "");
  EXPECT_EQ(cuda::launch_out_of_range(2147483647, 65535, 65535, 1024, 1, 1), "");
  EXPECT_EQ(cuda::launch_out_of_range(1, 1, 1, 32, 8, 4), "");
  const struct {
    uint64_t g[3], b[3];
    const char* named;
  } bad[] = {
      {{0, 1, 1}, {32, 1, 1}, "grid [0 x 1 x 1]"},
      {{2147483648ull, 1, 1}, {32, 1, 1}, "grid [2147483648 x 1 x 1]"},
      {{1, 65536, 1}, {32, 1, 1}, "grid [1 x 65536 x 1]"},
      {{1, 1, 65536}, {32, 1, 1}, "grid [1 x 1 x 65536]"},
      {{1, 1, 1}, {1025, 1, 1}, "blocks [1025 x 1 x 1]"},
      {{1, 1, 1}, {8, 2, 65}, "blocks [8 x 2 x 65]"},
      {{1, 1, 1}, {32, 0, 1}, "blocks [32 x 0 x 1]"},
  };
  for (const auto& c : bad) {
    const std::string why =
        cuda::launch_out_of_range(c.g[0], c.g[1], c.g[2], c.b[0], c.b[1], c.b[2]);
    EXPECT_NE(why.find(c.named), std::string::npos) << why;
    EXPECT_NE(why.find("outside the device's launch limits"), std::string::npos) << why;
  }
}

// A shape whose grid would pass the limits is refused by its launcher with the shape named, and
// the device goes on working: Q8_0 tiles put a CTA row per 64 weight rows in grid y.
TEST(CudaLaunchGuard, ATooTallTiledMatmulIsAClearErrorNotALaunch) {
  REQUIRE_CUDA_DEVICE();
  const Type t = Type::Q8_0;
  const int64_t rows = 65535 * 64 + 1, cols = 32;
  const int tokens = 9;
  const size_t stride = quant::row_bytes(t, cols);
  const cuda::DeviceBuffer w(size_t(rows) * stride);
  const cuda::DeviceBuffer x = to_device(activation_rows(cols, tokens, 5, 32));
  try {
    gpu_matvec_q(t, w, stride, rows, cols, x, tokens);
    FAIL() << "a grid of 65536 rows of tiles was launched";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("matmul q8_0"), std::string::npos) << what;
    EXPECT_NE(what.find("4194241 rows, at most 4194240"), std::string::npos) << what;
  }
  const int64_t small = 100;
  const std::vector<uint8_t> ws = weight_rows(t, small, cols, stride, 3);
  const std::vector<float> xs = activation_rows(cols, tokens, 6, 32);
  const cuda::DeviceBuffer dws = to_device(ws), dxs = to_device(xs);
  expect_bitwise(gpu_matvec_q(t, dws, stride, small, cols, dxs, tokens),
                 cpu_reference(t, ws, stride, small, cols, xs, tokens), small, "after the refusal");
}

// Every shared-memory codebook layout gives the same bits.
TEST(CudaMatvecQIQ2XS, EveryGridCopyCountEqualsCpu) {
  REQUIRE_CUDA_DEVICE();
  const int64_t rows = 70, cols = 4096;
  const size_t stride = quant::row_bytes(Type::IQ2_XS, cols);
  const std::vector<uint8_t> w = weight_rows(Type::IQ2_XS, rows, cols, stride, 9);
  const std::vector<float> x = activation_rows(cols, 1, 10, 256);
  const cuda::DeviceBuffer dw = to_device(w), dx = to_device(x);
  const std::vector<float> ref = cpu_reference(Type::IQ2_XS, w, stride, rows, cols, x, 1);
  for (int copies : {1, 8, 32}) {
    cuda::MatvecQOptions o;
    o.grid_copies = copies;
    expect_bitwise(gpu_matvec_q(Type::IQ2_XS, dw, stride, rows, cols, dx, 1, o), ref, rows,
                   ("grid copies " + std::to_string(copies)).c_str());
  }
}

// Formats without an integer kernel run the fp32 mat-vec once per activation.
TEST(CudaMatvecQFallback, OtherFormatsUseTheFloatKernel) {
  REQUIRE_CUDA_DEVICE();
  const Type t = Type::Q6_K;
  EXPECT_FALSE(cuda::has_matvec_q(t));
  const int64_t rows = 33, cols = 1024;
  const size_t stride = quant::row_bytes(t, cols);
  const cuda::DeviceBuffer dw = to_device(weight_rows(t, rows, cols, stride, 4));
  const std::vector<float> x = activation_rows(cols, 2, 6, 32);
  const cuda::DeviceBuffer dx = to_device(x);
  const std::vector<float> both = gpu_matvec_q(t, dw, stride, rows, cols, dx, 2);
  cuda::DeviceBuffer y(rows * sizeof(float));
  for (int k = 0; k < 2; ++k) {
    device().matvec(t, dw.data(), stride, rows, cols, dx.as<float>() + k * cols, y.as<float>());
    const std::vector<float> one = from_device<float>(y, rows);
    const std::vector<float> part(both.begin() + k * rows, both.begin() + (k + 1) * rows);
    expect_bitwise(part, one, rows, "fallback vs matvec");
  }
}

// The message of the strata::Error fn throws ("" if none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaMatvecQErrors, RejectsBadShapesWithClearErrors) {
  REQUIRE_CUDA_DEVICE();
  cuda::Device& dev = device();
  cuda::DeviceBuffer w(1 << 16), x(1 << 16), y(1 << 16);
  const auto mv = [&](Type t, size_t stride, int64_t rows, int64_t cols, const float* xp,
                      int tokens, cuda::MatvecQOptions o = {}, const void* wp = nullptr) {
    return error_of([&] {
      dev.matvec_q(t, wp ? wp : w.data(), stride, rows, cols, xp, y.as<float>(), tokens, o);
    });
  };
  const float* xs = x.as<float>();
  EXPECT_NE(mv(Type::Q4_K, 144, 1, 100, xs, 1).find("not a positive multiple of the block"),
            std::string::npos);
  EXPECT_NE(mv(Type::IQ2_XS, 74, 1, 0, xs, 1).find("columns"), std::string::npos);
  EXPECT_NE(mv(Type::Q8_0, 30, 1, 32, xs, 1).find("shorter than a row"), std::string::npos);
  EXPECT_NE(mv(Type::Q8_0, 34, -1, 32, xs, 1).find("negative row count"), std::string::npos);
  EXPECT_NE(mv(Type::Q8_0, 34, 1, 32, xs, 0).find("activations, expected 1 to 8"),
            std::string::npos);
  EXPECT_NE(mv(Type::IQ2_XS, 74, 1, 256, xs, 9).find("activations, expected 1 to 8"),
            std::string::npos);
  EXPECT_NE(mv(Type::Q8_0, 34, 1, 32, xs + 1, 1).find("alignment"), std::string::npos);
  EXPECT_NE(mv(Type::FP8_E4M3, 36, 1, 32, xs, 1, {}, w.as<uint8_t>() + 1).find("alignment"),
            std::string::npos);
  EXPECT_NE(mv(Type::Q8_0, 35, 2, 32, xs, 1).find("alignment"), std::string::npos);
  cuda::MatvecQOptions bad_rows;
  bad_rows.rows_per_warp = 3;
  EXPECT_NE(mv(Type::Q8_0, 34, 1, 32, xs, 1, bad_rows).find("rows_per_warp"), std::string::npos);
  cuda::MatvecQOptions bad_copies;
  bad_copies.grid_copies = 5;
  EXPECT_NE(mv(Type::IQ2_XS, 74, 1, 256, xs, 1, bad_copies).find("grid_copies"), std::string::npos);
  EXPECT_NE(mv(Type::Q6_K, 210, 1, 100, xs, 1).find("q6_K"), std::string::npos);
  EXPECT_NE(error_of([&] {
              dev.quantize_act(ActFormat::Q8_K, xs, y.data(), 100, 1);
            }).find("not a positive multiple of the block"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              dev.quantize_act(ActFormat::Q8_0, xs + 2, y.data(), 64, 1);
            }).find("alignment"),
            std::string::npos);
}

}  // namespace
}  // namespace strata

#else

TEST(CudaMatvecQ, Skipped) {
  GTEST_SKIP() << "no CUDA device: strata was built without the CUDA backend (no nvcc)";
}

#endif
