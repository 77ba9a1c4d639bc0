// Rescales quantized blocks in place so they dequantize to s times their old values, without
// re-quantizing: every ggml block format here is linear in its super-scale(s), so multiplying
// the fp16 d (and dmin, for the formats with a min) or FP8's fp32 scale by s is exact up to the
// rounding of that one field. This lets synth draw valid blocks of any format once (the format's
// random_blocks, which covers every code path) and give them any magnitude.
#pragma once

#include <cstdint>

#include "quant/types.h"

namespace strata::synth {

// True for the block formats scale_blocks handles (every quantized weight format strata knows).
bool can_scale_blocks(quant::Type t);
// Throws strata::Error for a format it does not handle.
void scale_blocks(quant::Type t, void* blocks, int64_t nblocks, float s);

}  // namespace strata::synth
