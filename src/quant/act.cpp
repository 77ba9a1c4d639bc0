// Activation layouts: fp32 as is, or quantized to ggml's block_q8_0 / block_q8_K once per mat-vec.
//
// Quantization rule, shared bit for bit with act_avx2.cpp: amax = max |x| over the block (taken on
// the bit patterns, so the result does not depend on the order of a SIMD reduction), d = amax /
// 127; a block with d below FLT_MIN (zero, tiny, or holding a nan) becomes d = 0 and all-zero
// codes, as 1 / d would overflow; otherwise v = x * (1 / d) clamped to [-127, 127] (maxps/minps
// semantics) and rounded to nearest, ties to even. q is therefore always in [-127, 127].
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "quant/formats/blocks.h"
#include "quant/kernels.h"
#include "util/cpu.h"
#include "util/half.h"

namespace strata::quant {

namespace {

// Returns d and writes the n codes of one block.
float quantize_block(const float* x, int8_t* q, int n) {
  uint32_t amax_bits = 0;
  for (int i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu;
    if (b > amax_bits) amax_bits = b;
  }
  const float d = std::bit_cast<float>(amax_bits) / 127.0f;
  if (!(d >= FLT_MIN)) {
    std::memset(q, 0, size_t(n));
    return 0.0f;
  }
  const float id = 1.0f / d;
  for (int i = 0; i < n; ++i) {
    float v = x[i] * id;
    v = v > -127.0f ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    q[i] = int8_t(std::nearbyint(v));
  }
  return d;
}

}  // namespace

int64_t act_block_elems(ActFormat f) {
  switch (f) {
    case ActFormat::F32:
      return 1;
    case ActFormat::Q8_0:
      return kQK;
    case ActFormat::Q8_K:
      return kQK_K;
  }
  return 1;
}

size_t act_bytes(ActFormat f, int64_t n) {
  switch (f) {
    case ActFormat::F32:
      return size_t(n) * sizeof(float);
    case ActFormat::Q8_0:
      return size_t(n / kQK) * sizeof(BlockQ8_0);
    case ActFormat::Q8_K:
      return size_t(n / kQK_K) * sizeof(BlockQ8_K);
  }
  return 0;
}

void quantize_act_ref(ActFormat f, const float* x, void* out, int64_t n) {
  switch (f) {
    case ActFormat::F32:
      std::memcpy(out, x, size_t(n) * sizeof(float));
      return;
    case ActFormat::Q8_0: {
      auto* y = static_cast<BlockQ8_0*>(out);
      for (int64_t b = 0; b < n / kQK; ++b)
        y[b].d = fp32_to_fp16(quantize_block(x + b * kQK, y[b].qs, kQK));
      return;
    }
    case ActFormat::Q8_K: {
      auto* y = static_cast<BlockQ8_K*>(out);
      for (int64_t b = 0; b < n / kQK_K; ++b) {
        y[b].d = quantize_block(x + b * kQK_K, y[b].qs, kQK_K);
        for (int g = 0; g < 16; ++g) {
          int s = 0;
          for (int i = 0; i < 16; ++i) s += y[b].qs[g * 16 + i];
          y[b].bsums[g] = int16_t(s);
        }
      }
      return;
    }
  }
}

void quantize_act(ActFormat f, const float* x, void* out, int64_t n) {
  if (cpu_features().avx2)
    quantize_act_avx2(f, x, out, n);
  else
    quantize_act_ref(f, x, out, n);
}

}  // namespace strata::quant
