// FP8_E4M3, strata's own tensor type for native FP8 checkpoints (docs/FORMATS.md defines it).
//
// A row is a run of 36-byte blocks, each 32 consecutive elements of the row: an fp32 scale (the
// dequant multiplier of the 128x128 tile holding the block, a checkpoint's weight_scale_inv), then
// 32 OCP E4M3FN codes. Element = scale * e4m3(code). 128 is a multiple of 32, so every block lies
// inside one tile and the checkpoint is held exactly, while any row width that is a multiple of 32
// (the 160-wide PLE n-gram rows, 640...) is whole blocks.
//
// E4M3FN: sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (m * 2^-9);
// no infinities; 0x7F and 0xFF are NaN; the largest finite value is 448 (0x7E).
#pragma once

#include <array>
#include <cstdint>
#include <limits>

namespace strata::quant {

inline constexpr int64_t kFP8BlockElems = 32;
// Side of the square tiles that share one scale in native FP8 checkpoints and in the quantizers.
inline constexpr int64_t kFP8TileElems = 128;

struct BlockFP8 {
  float scale;
  uint8_t q[kFP8BlockElems];
};
static_assert(sizeof(BlockFP8) == 36);

inline constexpr float kE4M3Max = 448.0f;

// The 256 E4M3FN values, computed from the definition at compile time.
inline constexpr std::array<float, 256> kE4M3Values = [] {
  std::array<float, 256> v{};
  for (int c = 0; c < 256; ++c) {
    const int e = (c >> 3) & 15, m = c & 7;
    float mag;
    if (e == 15 && m == 7) {
      mag = std::numeric_limits<float>::quiet_NaN();
    } else {
      // Subnormal: m * 2^-9; normal: (8 + m) * 2^(e - 10). Both exact in fp32.
      mag = float(e == 0 ? m : 8 + m);
      for (int k = 0; k < (e == 0 ? 9 : 10 - e); ++k) mag *= 0.5f;
      for (int k = 0; k < e - 10; ++k) mag *= 2.0f;
    }
    v[c] = c & 0x80 ? -mag : mag;
  }
  return v;
}();

inline float e4m3_to_float(uint8_t code) { return kE4M3Values[code]; }

// Nearest E4M3FN code to v, ties to even; saturates beyond +-448 (infinities included), NaN becomes
// 0x7F.
uint8_t float_to_e4m3(float v);

// Quantizes a rows x cols fp32 matrix (row-major, cols a multiple of 32) into rows of FP8_E4M3
// blocks, dst holding rows * cols / 32 blocks. Scales are per 128x128 tile (the last tile row and
// tile column may be shorter), written into every block of the tile: scale = amax(tile) / 448, 1
// for an all-zero tile, so the result is what a native FP8 checkpoint with those tile scales would
// hold.
void quantize_fp8_e4m3_2d(const float* src, int64_t rows, int64_t cols, void* dst);

}  // namespace strata::quant
