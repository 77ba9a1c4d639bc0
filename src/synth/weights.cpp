#include "synth/weights.h"

#include <cmath>
#include <cstring>

#include "quant/kernels.h"
#include "synth/block_scale.h"
#include "util/error.h"
#include "util/half.h"
#include "util/rng.h"

namespace strata::synth {

namespace {

// Blocks (elements, for f32/f16/bf16) per pool: large enough that rows rarely coincide, small
// enough to draw in milliseconds.
constexpr int64_t kPoolBlocks = 16384;
constexpr int64_t kPlainPoolElems = 1 << 18;

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool is_plain(quant::Type t) {
  return t == quant::Type::F32 || t == quant::Type::F16 || t == quant::Type::BF16;
}

void store(quant::Type t, float v, uint8_t* dst) {
  if (t == quant::Type::F32) {
    std::memcpy(dst, &v, 4);
  } else {
    const uint16_t h = t == quant::Type::F16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
    std::memcpy(dst, &h, 2);
  }
}

int64_t rows_of(const model::TensorSpec& s) {
  int64_t r = 1;
  for (size_t i = 1; i < s.shape.size(); ++i) r *= s.shape[i];
  return r;
}

}  // namespace

float WeightSource::matrix_rms(const model::TensorSpec& s) {
  return 1.0f / std::sqrt(float(s.shape[0]));
}

WeightSource::WeightSource(uint64_t seed, const std::vector<model::TensorSpec>& specs,
                           const std::vector<quant::Type>& types)
    : seed_(seed), specs_(specs), types_(types) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].init != model::Init::Matrix) continue;
    const auto& info = quant::type_info(types[i]);
    Pool& p = pools_[{types[i], matrix_rms(specs[i])}];
    p.max_row = std::max(p.max_row, specs[i].shape[0] / info.block_elems);
  }
  for (auto& [key, pool] : pools_) build_pool(key, pool);
}

void WeightSource::build_pool(const PoolKey& key, Pool& pool) const {
  const auto [type, rms] = key;
  const auto& info = quant::type_info(type);
  pool.nblocks = std::max(is_plain(type) ? kPlainPoolElems : kPoolBlocks, pool.max_row);
  pool.bytes.resize(size_t(pool.nblocks + pool.max_row) * info.block_bytes);
  uint32_t rms_bits;
  std::memcpy(&rms_bits, &rms, 4);
  Rng rng(mix(mix(seed_, uint64_t(type)), rms_bits));
  if (is_plain(type)) {
    for (int64_t i = 0; i < pool.nblocks; ++i)
      store(type, rng.normal() * rms, pool.bytes.data() + size_t(i) * info.block_bytes);
  } else {
    if (!quant::has_kernels(type) || !can_scale_blocks(type))
      fail("synth: no block generator for type ", info.name);
    quant::kernels(type).random_blocks(rng, pool.bytes.data(), pool.nblocks);
    // Measure what the format's generator gave and rescale to the wanted rms exactly.
    std::vector<float> values(size_t(pool.nblocks * info.block_elems));
    quant::dequantize(type, pool.bytes.data(), values.data(), int64_t(values.size()));
    double sum = 0;
    for (float v : values) sum += double(v) * v;
    const double have = std::sqrt(sum / double(values.size()));
    if (!(have > 0) || !std::isfinite(have))
      fail("synth: random ", info.name, " blocks dequantize to rms ", have);
    scale_blocks(type, pool.bytes.data(), pool.nblocks, float(rms / have));
  }
  // The wrap-around copy lets any row start anywhere in the pool and still be one memcpy.
  std::memcpy(pool.bytes.data() + size_t(pool.nblocks) * info.block_bytes, pool.bytes.data(),
              size_t(pool.max_row) * info.block_bytes);
}

void WeightSource::fill_direct(size_t index, uint8_t* dst) const {
  const model::TensorSpec& s = specs_[index];
  const quant::Type t = types_[index];
  const size_t eb = quant::type_info(t).block_bytes;
  Rng rng(mix(seed_, 0x5eed0000ull + index));
  const int64_t n = s.shape[0] * rows_of(s);
  for (int64_t i = 0; i < n; ++i) {
    float v = 0;
    switch (s.init) {
      case model::Init::Norm: v = 1.0f + 0.02f * rng.normal(); break;
      case model::Init::SsmA: v = -rng.uniform(0.01f, 16.0f); break;
      case model::Init::SsmDt: v = 1.0f + 0.1f * rng.normal(); break;
      case model::Init::Matrix: break;
    }
    store(t, v, dst + size_t(i) * eb);
  }
}

void WeightSource::fill_rows(size_t index, int64_t row0, int64_t nrows, uint8_t* dst) {
  const model::TensorSpec& s = specs_[index];
  const quant::Type t = types_[index];
  if (s.init != model::Init::Matrix) {
    if (!is_plain(t)) fail("synth: ", s.name, " must be f32, f16 or bf16");
    // Vectors (one row) and the rare small 2-D tensor of this kind are drawn whole.
    if (row0 != 0 || nrows != rows_of(s))
      fail("internal error: synth: ", s.name, " is drawn in one piece");
    fill_direct(index, dst);
    return;
  }
  const auto& info = quant::type_info(t);
  const Pool& pool = pools_.at({t, matrix_rms(s)});
  const int64_t nb = s.shape[0] / info.block_elems;
  const size_t row_bytes = size_t(nb) * info.block_bytes;
  const uint64_t tensor_seed = mix(seed_, index);
  for (int64_t r = 0; r < nrows; ++r) {
    const uint64_t start = mix(tensor_seed, uint64_t(row0 + r)) % uint64_t(pool.nblocks);
    std::memcpy(dst + size_t(r) * row_bytes, pool.bytes.data() + start * info.block_bytes, row_bytes);
  }
}

}  // namespace strata::synth
