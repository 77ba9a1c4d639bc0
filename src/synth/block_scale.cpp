#include "synth/block_scale.h"

#include <cstring>

#include "util/error.h"
#include "util/half.h"

namespace strata::synth {

namespace {

// Where a block keeps its scale fields (byte offsets in ggml's block structs): an fp16 d, an
// optional fp16 dmin (-1: none), or an fp32 scale (FP8).
struct ScaleFields {
  quant::Type type;
  int d;
  int dmin;
  bool fp32;
};

constexpr ScaleFields kFields[] = {
    {quant::Type::Q4_0, 0, -1, false},     // d, qs[16]
    {quant::Type::Q8_0, 0, -1, false},     // d, qs[32]
    {quant::Type::Q2_K, 80, 82, false},    // scales[16], qs[64], d, dmin
    {quant::Type::Q3_K, 108, -1, false},   // hmask[32], qs[64], scales[12], d
    {quant::Type::Q4_K, 0, 2, false},      // d, dmin, scales[12], qs[128]
    {quant::Type::Q5_K, 0, 2, false},      // d, dmin, scales[12], qh[32], qs[128]
    {quant::Type::Q6_K, 208, -1, false},   // ql[128], qh[64], scales[16], d
    {quant::Type::IQ2_XXS, 0, -1, false},  // d, qs[32]
    {quant::Type::IQ2_XS, 0, -1, false},   // d, qs[32], scales[8]
    {quant::Type::IQ3_XXS, 0, -1, false},  // d, qs[96]
    {quant::Type::IQ4_XS, 0, -1, false},   // d, scales_h, scales_l[4], qs[128]
    {quant::Type::FP8_E4M3, 0, -1, true},  // fp32 scale, 32 e4m3
};

const ScaleFields* find(quant::Type t) {
  for (const auto& f : kFields)
    if (f.type == t) return &f;
  return nullptr;
}

void scale_half(uint8_t* p, float s) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  h = fp32_to_fp16(fp16_to_fp32(h) * s);
  std::memcpy(p, &h, 2);
}

}  // namespace

bool can_scale_blocks(quant::Type t) { return find(t) != nullptr; }

void scale_blocks(quant::Type t, void* blocks, int64_t nblocks, float s) {
  const ScaleFields* f = find(t);
  if (!f) fail("synth: cannot rescale blocks of type ", quant::type_name(t));
  const size_t bb = quant::type_info(t).block_bytes;
  auto* p = static_cast<uint8_t*>(blocks);
  for (int64_t b = 0; b < nblocks; ++b, p += bb) {
    if (f->fp32) {
      float v;
      std::memcpy(&v, p + f->d, 4);
      v *= s;
      std::memcpy(p + f->d, &v, 4);
      continue;
    }
    scale_half(p + f->d, s);
    if (f->dmin >= 0) scale_half(p + f->dmin, s);
  }
}

}  // namespace strata::synth
