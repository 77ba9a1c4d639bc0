// The one list of formats with kernels, and the run-time choice between the reference, AVX2 and
// AVX-512 kernels.
#include <vector>

#include "quant/formats/formats.h"
#include "quant/kernels.h"
#include "util/cpu.h"
#include "util/error.h"

namespace strata::quant {

namespace {
const FormatKernels* const kAll[] = {
    &kF32Kernels,   &kF16Kernels,     &kBF16Kernels,   &kQ8_0Kernels,   &kQ4_0Kernels,
    &kQ2_KKernels,  &kQ3_KKernels,    &kQ4_KKernels,   &kQ5_KKernels,   &kQ6_KKernels,
    // IQ formats and FP8
    &kIQ2_XXSKernels, &kIQ2_XSKernels, &kIQ3_XXSKernels, &kIQ4_XSKernels, &kFP8_E4M3Kernels,
};

const FormatKernels* find(Type t) {
  for (const FormatKernels* k : kAll)
    if (k->type == t) return k;
  return nullptr;
}
}  // namespace

bool has_kernels(Type t) { return find(t) != nullptr; }

const FormatKernels& kernels(Type t) {
  if (const FormatKernels* k = find(t)) return *k;
  fail("no kernels for tensor type ", type_info(t).name);
}

DotRows dot_rows_kernel(Type t) {
  const FormatKernels& k = kernels(t);
  const CpuFeatures& cpu = cpu_features();
  if (k.dot_avx512 && cpu.avx512) return {k.dot_avx512, k.dot_rows_avx512};
  if (k.dot_avx2 && cpu.avx2) return {k.dot_avx2, k.dot_rows_avx2};
  return {k.dot_ref, nullptr};
}

DotFn dot_kernel(Type t) { return dot_rows_kernel(t).dot; }

void matvec(Type t, const void* w, size_t row_stride, int64_t rows, int64_t cols, const float* x,
            float* y, void* act_scratch) {
  const FormatKernels& k = kernels(t);
  quantize_act(k.act, x, act_scratch, cols);
  const DotFn dot = dot_kernel(t);
  const auto* base = static_cast<const uint8_t*>(w);
  for (int64_t r = 0; r < rows; ++r) y[r] = dot(base + size_t(r) * row_stride, act_scratch, cols);
}

void dequantize(Type t, const void* blocks, float* out, int64_t n) {
  kernels(t).dequantize(blocks, out, n);
}

}  // namespace strata::quant
