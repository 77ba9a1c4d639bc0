// F32 weights: plain floats, dotted with an fp32 activation.
#include <cstring>

#include "quant/formats/blocks.h"
#include "quant/formats/formats.h"

namespace strata::quant {

namespace {

// An empty range may come with null pointers (an empty vector's data()), which memcpy must not
// be given even for zero bytes.
void dequantize(const void* blocks, float* out, int64_t n) {
  if (n > 0) std::memcpy(out, blocks, size_t(n) * sizeof(float));
}

void quantize(const float* in, void* blocks, int64_t n) {
  if (n > 0) std::memcpy(blocks, in, size_t(n) * sizeof(float));
}

// Random sign, exponent in [2^-30, 2^0], random mantissa: |x| < 2.
void random_blocks(Rng& rng, void* blocks, int64_t n) {
  auto* out = static_cast<uint32_t*>(blocks);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = rng.next();
    const uint32_t exp = 97 + uint32_t((r >> 32) % 31);
    out[i] = (uint32_t(r >> 63) << 31) | (exp << 23) | uint32_t(r & 0x7fffff);
  }
}

float dot_ref(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  return dot_lanes32([x](int64_t i) { return x[i]; }, static_cast<const float*>(a), n);
}

}  // namespace

const FormatKernels kF32Kernels = {Type::F32,     ActFormat::F32, dequantize,   quantize,
                                   random_blocks, dot_ref,        dot_f32_avx2, 0.0f};

}  // namespace strata::quant
