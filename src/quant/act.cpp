// Activation layouts: fp32 as is, or quantized to ggml's block_q8_0 / block_q8_K once per mat-vec,
// by ggml's x86 rule (act_rule.h), bit for bit the same as act_avx2.cpp and act_avx512.cpp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "quant/act_rule.h"
#include "quant/formats/blocks.h"
#include "quant/kernels.h"
#include "util/cpu.h"
#include "util/half.h"

namespace strata::quant {

namespace {

uint32_t abs_bits(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

// The n codes of one block for multiplier `mul` (zero codes for a zero block).
void write_codes(const float* x, int8_t* q, int n, const ActScale& s) {
  if (s.zero) {
    std::memset(q, 0, size_t(n));
    return;
  }
  for (int i = 0; i < n; ++i) q[i] = int8_t(std::nearbyint(x[i] * s.mul));
}

void quantize_q8_0_block(const float* x, BlockQ8_0& y) {
  uint32_t amax = 0;
  for (int i = 0; i < kQK; ++i) amax = std::max(amax, abs_bits(x[i]));
  const ActScale s = q8_0_scale(amax);
  y.d = fp32_to_fp16(s.d);
  write_codes(x, y.qs, kQK, s);
}

void quantize_q8_k_block(const float* x, BlockQ8_K& y) {
  uint32_t amax = 0;
  int first = 0;  // the first element of largest |x|
  for (int i = 0; i < kQK_K; ++i) {
    if (abs_bits(x[i]) > amax) {
      amax = abs_bits(x[i]);
      first = i;
    }
  }
  const ActScale s = q8_k_scale(amax, x[first]);
  y.d = s.d;
  write_codes(x, y.qs, kQK_K, s);
  for (int g = 0; g < kQK_K / 16; ++g) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += y.qs[g * 16 + i];
    y.bsums[g] = int16_t(sum);
  }
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
      for (int64_t b = 0; b < n / kQK; ++b) quantize_q8_0_block(x + b * kQK, y[b]);
      return;
    }
    case ActFormat::Q8_K: {
      auto* y = static_cast<BlockQ8_K*>(out);
      for (int64_t b = 0; b < n / kQK_K; ++b) quantize_q8_k_block(x + b * kQK_K, y[b]);
      return;
    }
  }
}

void quantize_act(ActFormat f, const float* x, void* out, int64_t n) {
  const CpuFeatures& cpu = cpu_features();
  if (cpu.avx512)
    quantize_act_avx512(f, x, out, n);
  else if (cpu.avx2)
    quantize_act_avx2(f, x, out, n);
  else
    quantize_act_ref(f, x, out, n);
}

}  // namespace strata::quant
