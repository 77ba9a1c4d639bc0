// CUDA backend: device query, and per weight format GPU dequantize == CPU reference bit for bit,
// GPU mat-vec within its stated bound of an exact (double) sum, and both deterministic. Skipped
// with "no CUDA device" where there is no GPU (CI builds the backend with nvcc but has none).
#include <gtest/gtest.h>

#ifdef STRATA_HAVE_CUDA

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "quant/fp8.h"
#include "quant/kernels.h"
#include "util/error.h"
#include "util/half.h"
#include "util/rng.h"

namespace strata {
namespace {

using quant::Type;

#define REQUIRE_CUDA_DEVICE()                                                  \
  do {                                                                         \
    if (cuda::device_count() == 0) GTEST_SKIP() << cuda::unavailable_reason(); \
  } while (0)

// One device for the whole binary: creating one costs a context and the table upload.
cuda::Device& device() {
  static cuda::Device dev(0);
  return dev;
}

TEST(CudaDevice, QueryOrClearError) {
  if (cuda::device_count() == 0) {
    EXPECT_NE(cuda::unavailable_reason().find("no CUDA device: "), std::string::npos);
    try {
      cuda::query_device(0);
      FAIL() << "query_device succeeded without a device";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("no CUDA device: ", 0), 0u) << e.what();
    }
    GTEST_SKIP() << cuda::unavailable_reason();
  }
  const cuda::DeviceInfo info = cuda::query_device(0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GE(info.cc_major, 5);
  EXPECT_GT(info.total_bytes, 0u);
  EXPECT_LE(info.free_bytes, info.total_bytes);
  EXPECT_TRUE(cuda::unavailable_reason().empty());
  std::printf("[ device   ] %s: %d SMs, cc %d.%d, %.1f GiB (%.1f free), L2 %.0f MiB\n",
              info.name.c_str(), info.sm_count, info.cc_major, info.cc_minor,
              double(info.total_bytes) / (1 << 30), double(info.free_bytes) / (1 << 30),
              double(info.l2_bytes) / (1 << 20));
  EXPECT_THROW(cuda::query_device(cuda::device_count()), Error);
}

constexpr Type kWeightFormats[] = {
    Type::F32,     Type::F16,    Type::BF16,    Type::Q8_0,   Type::Q4_0,
    Type::Q2_K,    Type::Q3_K,   Type::Q4_K,    Type::Q5_K,   Type::Q6_K,
    Type::IQ2_XXS, Type::IQ2_XS, Type::IQ3_XXS, Type::IQ4_XS, Type::FP8_E4M3,
};

TEST(CudaDevice, SupportsEveryWeightFormat) {
  for (Type t : kWeightFormats) EXPECT_TRUE(cuda::supports(t)) << quant::type_name(t);
  EXPECT_FALSE(cuda::supports(Type::Q8_K));
  EXPECT_FALSE(cuda::supports(Type::I32));
}

// Random valid blocks holding n elements of t (the format's own generator).
std::vector<uint8_t> random_weights(Type t, int64_t n, uint64_t seed) {
  const quant::TypeInfo& info = quant::type_info(t);
  std::vector<uint8_t> w(quant::row_bytes(info, n));
  Rng rng(seed);
  quant::kernels(t).random_blocks(rng, w.data(), n / info.block_elems);
  return w;
}

std::vector<float> gpu_dequantize(Type t, const std::vector<uint8_t>& blocks, int64_t n) {
  cuda::Device& dev = device();
  cuda::DeviceBuffer src(blocks.size()), out(size_t(n) * sizeof(float));
  dev.upload(src.data(), blocks.data(), blocks.size());
  dev.dequantize(t, src.data(), out.as<float>(), n);
  std::vector<float> y(n);
  dev.download(y.data(), out.data(), out.size());
  return y;
}

// Index of the first element whose bits differ, or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return int64_t(i);
  return -1;
}

class CudaFormat : public ::testing::TestWithParam<Type> {
 protected:
  void SetUp() override {
    REQUIRE_CUDA_DEVICE();
    if (!quant::has_kernels(GetParam()))
      GTEST_SKIP() << "no CPU reference yet for " << quant::type_name(GetParam());
  }
};

TEST_P(CudaFormat, DequantizeMatchesReferenceBitwise) {
  const Type t = GetParam();
  // 2048 blocks of the K/IQ formats, many more of the small ones: every code path many times.
  const int64_t n = 256 * 2048;
  const std::vector<uint8_t> blocks = random_weights(t, n, 1234 + uint32_t(t));
  std::vector<float> ref(n);
  quant::kernels(t).dequantize(blocks.data(), ref.data(), n);
  const std::vector<float> gpu = gpu_dequantize(t, blocks, n);
  const int64_t bad = first_bit_difference(gpu, ref);
  EXPECT_EQ(bad, -1) << quant::type_name(t) << " element " << bad << ": gpu "
                     << (bad >= 0 ? gpu[bad] : 0.0f) << " ref " << (bad >= 0 ? ref[bad] : 0.0f);
  EXPECT_EQ(first_bit_difference(gpu_dequantize(t, blocks, n), gpu), -1) << "not deterministic";
}

struct MatvecCase {
  int64_t rows, cols;
  size_t pad;  // extra bytes between rows (a multiple of 16 keeps every format's alignment)
};

TEST_P(CudaFormat, MatvecWithinBoundOfExactSumAndDeterministic) {
  const Type t = GetParam();
  const quant::TypeInfo& info = quant::type_info(t);
  cuda::Device& dev = device();
  const int64_t blk = info.block_elems < 8 ? 8 : info.block_elems;
  const MatvecCase cases[] = {
      {1, blk, 0},               // one block: most lanes idle
      {77, 2560, 0},             // the flagship's hidden size, rows not a multiple of the warps
      {64, 2560 + 8 * blk, 16},  // groups not a multiple of 32, padded rows
      {9, 16384, 0},             // long rows
  };
  for (const MatvecCase& c : cases) {
    SCOPED_TRACE(testing::Message() << quant::type_name(t) << " " << c.rows << "x" << c.cols);
    const size_t row_bytes = quant::row_bytes(info, c.cols), stride = row_bytes + c.pad;
    std::vector<uint8_t> w(stride * c.rows, 0);
    std::vector<float> wf(size_t(c.rows) * c.cols);
    for (int64_t r = 0; r < c.rows; ++r) {
      const std::vector<uint8_t> row = random_weights(t, c.cols, 99 * uint64_t(r) + uint32_t(t));
      std::memcpy(w.data() + r * stride, row.data(), row_bytes);
      quant::kernels(t).dequantize(row.data(), wf.data() + r * c.cols, c.cols);
    }
    std::vector<float> x(c.cols);
    Rng rng(7 + c.cols);
    for (float& v : x) v = rng.normal();

    cuda::DeviceBuffer dw(w.size()), dx(x.size() * sizeof(float)), dy(c.rows * sizeof(float));
    dev.upload(dw.data(), w.data(), w.size());
    dev.upload(dx.data(), x.data(), dx.size());
    std::vector<float> y(c.rows), again(c.rows);
    dev.matvec(t, dw.data(), stride, c.rows, c.cols, dx.as<float>(), dy.as<float>());
    dev.download(y.data(), dy.data(), dy.size());
    dev.matvec(t, dw.data(), stride, c.rows, c.cols, dx.as<float>(), dy.as<float>());
    dev.download(again.data(), dy.data(), dy.size());
    EXPECT_EQ(first_bit_difference(y, again), -1) << "not deterministic";

    // The bound cuda_backend.h states: (cols/32 + 5) * 2^-24 * sum |w x|, 1% slack for the
    // higher-order terms of the error series.
    const double bound_factor = (double(c.cols) / 32 + 5) * std::ldexp(1.0, -24) * 1.01;
    for (int64_t r = 0; r < c.rows; ++r) {
      double exact = 0, magnitude = 0;
      for (int64_t i = 0; i < c.cols; ++i) {
        const double p = double(wf[r * c.cols + i]) * x[i];
        exact += p;
        magnitude += std::fabs(p);
      }
      ASSERT_LE(std::fabs(y[r] - exact), bound_factor * magnitude)
          << "row " << r << ": gpu " << y[r] << " exact " << exact;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightFormats, CudaFormat, ::testing::ValuesIn(kWeightFormats),
                         [](const auto& p) { return std::string(quant::type_name(p.param)); });

// Every fp16 and bf16 bit pattern (NaNs, infinities, subnormals) converts as util/half.h does.
TEST(CudaConvert, EveryHalfAndBfloatPattern) {
  REQUIRE_CUDA_DEVICE();
  std::vector<uint8_t> bits(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) std::memcpy(bits.data() + 2 * i, &i, 2);
  const std::vector<float> f16 = gpu_dequantize(Type::F16, bits, 65536);
  const std::vector<float> bf16 = gpu_dequantize(Type::BF16, bits, 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const float a = fp16_to_fp32(uint16_t(i)), b = bf16_to_fp32(uint16_t(i));
    ASSERT_EQ(std::memcmp(&f16[i], &a, 4), 0) << "fp16 0x" << std::hex << i;
    ASSERT_EQ(std::memcmp(&bf16[i], &b, 4), 0) << "bf16 0x" << std::hex << i;
  }
}

// Every E4M3FN code, through eight blocks with scale 1: bitwise equal to the reference except the
// NaN codes, which only have to stay NaN (the GPU's multiply returns its canonical NaN; the
// format's generators and converters never write those codes).
TEST(CudaConvert, EveryE4M3Code) {
  REQUIRE_CUDA_DEVICE();
  std::vector<quant::BlockFP8> blocks(256 / quant::kFP8BlockElems);
  for (int c = 0; c < 256; ++c)
    blocks[c / quant::kFP8BlockElems].q[c % quant::kFP8BlockElems] = uint8_t(c);
  for (quant::BlockFP8& b : blocks) b.scale = 1.0f;
  std::vector<uint8_t> bytes(sizeof(quant::BlockFP8) * blocks.size());
  std::memcpy(bytes.data(), blocks.data(), bytes.size());
  const std::vector<float> gpu = gpu_dequantize(Type::FP8_E4M3, bytes, 256);
  for (int c = 0; c < 256; ++c) {
    const float want = quant::kE4M3Values[c];
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(gpu[c])) << "code " << c;
    } else {
      EXPECT_EQ(std::memcmp(&gpu[c], &want, 4), 0)
          << "code " << c << ": " << gpu[c] << " vs " << want;
    }
  }
}

TEST(CudaConvert, RejectsBadShapesWithClearErrors) {
  REQUIRE_CUDA_DEVICE();
  cuda::Device& dev = device();
  cuda::DeviceBuffer w(4096), x(4096), y(4096);
  EXPECT_THROW(dev.dequantize(Type::Q4_K, w.data(), y.as<float>(), 100), Error);
  EXPECT_THROW(dev.matvec(Type::Q4_K, w.data(), 144, 1, 100, x.as<float>(), y.as<float>()), Error);
  EXPECT_THROW(dev.matvec(Type::Q4_K, w.data(), 100, 1, 256, x.as<float>(), y.as<float>()), Error);
  EXPECT_THROW(dev.matvec(Type::I32, w.data(), 32, 1, 8, x.as<float>(), y.as<float>()), Error);
}

}  // namespace
}  // namespace strata

#else

TEST(CudaDevice, QueryOrClearError) {
  GTEST_SKIP() << "no CUDA device: strata was built without the CUDA backend (no nvcc)";
}

#endif
