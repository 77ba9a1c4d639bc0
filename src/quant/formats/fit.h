// Scale searches shared by the K-quant quantizers (round-trip quality, not speed).
#pragma once

#include <cstdint>

namespace strata::quant {

// Affine K-quants (Q2_K, Q4_K, Q5_K): a 256-element super-block in `groups` groups fitted as
// x ~ d * sc * q - dmin * m with q in [0, nmax] and sc, m in [0, smax]. Writes the codes q[256]
// (element order), the fp16 d and dmin, sc[groups] and m[groups].
void fit_affine(const float* x, int groups, int nmax, int smax, uint8_t* q, uint16_t* d,
                uint16_t* dmin, uint8_t* sc, uint8_t* m);

// Packs 8 6-bit scales and mins into the 12 bytes scale_min_k4 reads.
void pack_scale_min_k4(const uint8_t* sc, const uint8_t* m, uint8_t* packed);

// Symmetric K-quants (Q3_K, Q6_K): 16 groups of 16 fitted as x ~ d * sc * q with q in
// [-nmax, nmax - 1] and sc in [-smax, smax - 1]. Writes q[256], the fp16 d and sc[16].
void fit_symmetric(const float* x, int nmax, int smax, int8_t* q, uint16_t* d, int8_t* sc);

}  // namespace strata::quant
