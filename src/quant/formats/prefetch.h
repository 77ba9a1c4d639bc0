// Software prefetch for the x86 dot kernels (include only from *_avx2.cpp / *_avx512.cpp files).
#pragma once

#include <xmmintrin.h>

namespace strata::quant {

// Weight bytes asked for ahead of the read, in the block-quantized dots that keep up with DRAM
// (q8_0, q6_K). The hardware prefetcher alone left the AMD EPYC box's q8_0 mat-vec at 0.6-0.7 of
// one core's read bandwidth, its misses and its arithmetic taking turns; asking 4 KiB ahead brought
// it to 0.9-1.0. The float formats' kernels do so little per byte that the prefetcher keeps up and
// the extra instructions cost 15-30%, so they ask for nothing (docs/PERFORMANCE.md "Software
// prefetch"). The AVX-512 q8_0 and q6_K kernels ask the same way, not yet measured on a machine
// with AVX-512. A prefetch never faults, so asking past the end of a matrix is harmless.
inline constexpr int kPrefetchAhead = 4096;

// Asks for the cache lines of [p + kPrefetchAhead, p + kPrefetchAhead + bytes).
inline void prefetch_ahead(const void* p, int bytes) {
  const char* ahead = static_cast<const char*>(p) + kPrefetchAhead;
  for (int line = 0; line < bytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
}

}  // namespace strata::quant
