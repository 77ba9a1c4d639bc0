// Scale searches shared by the K-quant quantizers (round-trip quality, not speed).
#pragma once

#include <cstdint>

namespace strata::quant {

// Q4_K / Q5_K super-block: 8 groups of 32 fitted as x ~ sc * d * q - m * dmin with q in
// [0, nmax], 6-bit sc and m packed into scales[12] as scale_min_k4 reads them. Writes the codes
// q[256] (element order), the fp16 d and dmin.
void fit_scale_min_k4(const float* x, int nmax, uint8_t* q, uint16_t* d, uint16_t* dmin,
                      uint8_t* scales);

// Q6_K-style super-block: 16 groups of 16 fitted as x ~ d * sc * q with q in [-nmax, nmax - 1]
// and int8 sc. Writes q[256], the fp16 d and sc[16].
void fit_symmetric_16(const float* x, int nmax, int8_t* q, uint16_t* d, int8_t* sc);

}  // namespace strata::quant
