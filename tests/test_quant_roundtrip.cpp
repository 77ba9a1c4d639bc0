// Quantizers: per-element error bounds (Q8_0, Q4_0), relative RMSE bounds (K-quants, measured on
// Gaussian data with outliers), exact float round trips, and re-quantizing dequantized random
// blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "test_quant_util.h"

namespace strata::quant {
namespace {

std::vector<float> round_trip(Type t, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size());
  std::vector<uint8_t> blocks(row_bytes(t, n));
  kernels(t).quantize(x.data(), blocks.data(), n);
  std::vector<float> y(x.size());
  kernels(t).dequantize(blocks.data(), y.data(), n);
  return y;
}

double relative_rmse(const std::vector<float>& x, const std::vector<float>& y) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    ref += double(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

TEST(QuantRoundTrip, FloatFormats) {
  const auto x = testing::random_floats(1000, 1);
  EXPECT_EQ(round_trip(Type::F32, x), x);
  const auto h = round_trip(Type::F16, x), b = round_trip(Type::BF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_LE(std::fabs(h[i] - x[i]), std::fabs(x[i]) * 0x1p-11f + 0x1p-25f);
    EXPECT_LE(std::fabs(b[i] - x[i]), std::fabs(x[i]) * 0x1p-8f);
  }
}

// Q8_0: |error| <= d / 2 for d = amax / 127, plus fp16's rounding of d (relative 2^-11) times
// |q| <= 127, i.e. amax * 2^-11.
TEST(QuantRoundTrip, Q8_0ElementBound) {
  const auto x = testing::random_floats(4096, 2);
  const auto y = round_trip(Type::Q8_0, x);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    for (int j = 0; j < 32; ++j)
      EXPECT_LE(std::fabs(y[b * 32 + j] - x[b * 32 + j]), amax / 127 / 2 + amax * 0x1p-11f);
  }
}

// Q4_0: step d = amax / 8; the side of the extreme reaches -8 d but the other side only 7 d, so an
// element there can be off by up to a full step (plus fp16 rounding of d times |q - 8| <= 8).
TEST(QuantRoundTrip, Q4_0ElementBound) {
  const auto x = testing::random_floats(4096, 3);
  const auto y = round_trip(Type::Q4_0, x);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    for (int j = 0; j < 32; ++j)
      EXPECT_LE(std::fabs(y[b * 32 + j] - x[b * 32 + j]), amax / 8 + amax * 0x1p-10f);
  }
}

struct RmseCase {
  Type type;
  double bound;  // measured value plus about 15% margin
};

class QuantRmse : public ::testing::TestWithParam<RmseCase> {};

TEST_P(QuantRmse, GaussianData) {
  const auto x = testing::random_floats(256 * 64, 4);
  const double e = relative_rmse(x, round_trip(GetParam().type, x));
  RecordProperty("relative_rmse", std::to_string(e));
  EXPECT_LE(e, GetParam().bound) << type_name(GetParam().type);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantRmse,
                         ::testing::Values(RmseCase{Type::Q8_0, 0.0095},
                                           RmseCase{Type::Q4_0, 0.145}, RmseCase{Type::Q4_K, 0.105},
                                           RmseCase{Type::Q5_K, 0.053}, RmseCase{Type::Q6_K, 0.029},
                                           RmseCase{Type::Q2_K, 0.36}, RmseCase{Type::Q3_K, 0.235}),
                         [](const auto& info) { return std::string(type_name(info.param.type)); });

// Values a format can represent exactly come back close: dequantize random blocks, quantize the
// result, dequantize again.
class QuantRequantize : public ::testing::TestWithParam<RmseCase> {};

TEST_P(QuantRequantize, RandomBlocks) {
  const Type t = GetParam().type;
  const int64_t n = 256 * 32;
  const auto w = testing::random_weights(t, n, 11);
  std::vector<float> x(static_cast<size_t>(n));
  kernels(t).dequantize(w.data(), x.data(), n);
  const double e = relative_rmse(x, round_trip(t, x));
  EXPECT_LE(e, GetParam().bound) << type_name(t);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantRequantize,
                         ::testing::Values(RmseCase{Type::Q8_0, 0.004}, RmseCase{Type::Q4_0, 0.028},
                                           RmseCase{Type::Q4_K, 0.013}, RmseCase{Type::Q5_K, 0.012},
                                           RmseCase{Type::Q6_K, 0.0095},
                                           RmseCase{Type::Q2_K, 0.032},
                                           RmseCase{Type::Q3_K, 0.016}),
                         [](const auto& info) { return std::string(type_name(info.param.type)); });

}  // namespace
}  // namespace strata::quant
