// Kernel tables of each weight format, one file group per format in this folder (NAME.cpp:
// reference and quantizer; NAME_avx2.cpp: the AVX2 dot; NAME_avx512.cpp, where it exists: the
// AVX-512 dot), listed in registry.cpp.
#pragma once

#include "quant/kernels.h"

namespace strata::quant {

extern const FormatKernels kF32Kernels;
extern const FormatKernels kF16Kernels;
extern const FormatKernels kBF16Kernels;
extern const FormatKernels kQ8_0Kernels;
extern const FormatKernels kQ4_0Kernels;
extern const FormatKernels kQ2_KKernels;
extern const FormatKernels kQ3_KKernels;
extern const FormatKernels kQ4_KKernels;
extern const FormatKernels kQ5_KKernels;
extern const FormatKernels kQ6_KKernels;
// IQ formats and FP8
extern const FormatKernels kIQ2_XXSKernels;
extern const FormatKernels kIQ2_XSKernels;
extern const FormatKernels kIQ3_XXSKernels;
extern const FormatKernels kIQ4_XSKernels;
extern const FormatKernels kFP8_E4M3Kernels;

}  // namespace strata::quant
