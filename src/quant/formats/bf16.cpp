// BF16 weights: the top half of an fp32, widened exactly and dotted with an fp32 activation.
#include "quant/formats/blocks.h"
#include "quant/formats/formats.h"

namespace strata::quant {

namespace {

void dequantize(const void* blocks, float* out, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(blocks);
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_fp32(h[i]);
}

void quantize(const float* in, void* blocks, int64_t n) {
  auto* h = static_cast<uint16_t*>(blocks);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(in[i]);
}

// Random sign, exponent in [2^-30, 2^0], random 7-bit mantissa: |x| < 2.
void random_blocks(Rng& rng, void* blocks, int64_t n) {
  auto* h = static_cast<uint16_t*>(blocks);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t r = rng.next_u32();
    const uint32_t exp = 97 + (r >> 8) % 31;
    h[i] = uint16_t((r >> 31) << 15 | exp << 7 | (r & 0x7f));
  }
}

float dot_ref(const void* w, const void* a, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(w);
  return dot_lanes32([h](int64_t i) { return bf16_to_fp32(h[i]); }, static_cast<const float*>(a),
                     n);
}

}  // namespace

const FormatKernels kBF16Kernels = {Type::BF16,    ActFormat::F32, dequantize,    quantize,
                                    random_blocks, dot_ref,        dot_bf16_avx2, 0.0f};

}  // namespace strata::quant
