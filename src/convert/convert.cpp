#include "convert/convert.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "convert/hf_config.h"
#include "convert/safetensors.h"
#include "gguf/gguf.h"
#include "quant/fp8.h"
#include "quant/kernels.h"
#include "tokenizer/vocab.h"
#include "util/error.h"
#include "util/half.h"
#include "util/progress.h"

namespace strata::convert {

namespace {

namespace fs = std::filesystem;
using quant::Type;

// fp32 bytes assembled per chunk: bounds memory whatever the tensor size.
constexpr size_t kChunkBytes = 64u << 20;

float scalar(const StTensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: {
      float v;
      std::memcpy(&v, t.data + 4 * i, 4);
      return v;
    }
    case DType::F16:
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return t.dtype == DType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
    case DType::F8_E4M3: return quant::e4m3_to_float(t.data[i]);
    default: fail("internal error: ", t.name, " is not a float tensor");
  }
}

// The scale of element (row, col) of an FP8 source's 2-D view.
float fp8_scale(const Source& s, int64_t row, int64_t col) {
  const int64_t grid_rows = (s.inner_rows + s.block_rows - 1) / s.block_rows;
  const int64_t grid_cols = (s.cols + s.block_cols - 1) / s.block_cols;
  const int64_t outer = row / s.inner_rows, inner = row % s.inner_rows;
  return scalar(*s.scale, (outer * grid_rows + inner / s.block_rows) * grid_cols + col / s.block_cols);
}

// n elements of source row `row` from column col0, as fp32.
void load(const Source& s, int64_t row, int64_t col0, int64_t n, float* out) {
  const StTensor& t = *s.weight;
  const int64_t base = row * s.cols + col0;
  if (t.dtype == DType::F32) {
    std::memcpy(out, t.data + 4 * base, size_t(n) * 4);
  } else if (t.dtype == DType::F8_E4M3) {
    for (int64_t i = 0; i < n; ++i) out[i] = quant::e4m3_to_float(t.data[base + i]) * fp8_scale(s, row, col0 + i);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = scalar(t, base + i);
  }
}

// Output rows [r0, r0 + nr) of a plan as fp32, transform applied.
void assemble(const TensorPlan& p, int64_t r0, int64_t nr, float* out) {
  for (const Piece& pc : p.pieces) {
    const int64_t lo = std::max(r0, pc.dst_row), hi = std::min(r0 + nr, pc.dst_row + pc.nrows);
    for (int64_t r = lo; r < hi; ++r)
      load(p.sources[pc.src], pc.src_row + (r - pc.dst_row), pc.src_col, pc.ncols, out + (r - r0) * p.cols + pc.dst_col);
  }
  const size_t n = size_t(nr * p.cols);
  if (p.transform == Transform::PlusOne) for (size_t i = 0; i < n; ++i) out[i] += 1.0f;
  if (p.transform == Transform::NegExp) for (size_t i = 0; i < n; ++i) out[i] = -std::exp(out[i]);
}

// Spreads nr rows of `cols` floats (packed at the start of buf) to rows of `padded` floats, each
// ending in zeros. Last row first, so no row is overwritten before it moves.
void pad_rows(float* buf, int64_t nr, int64_t cols, int64_t padded) {
  for (int64_t r = nr - 1; r >= 0; --r) {
    std::memmove(buf + r * padded, buf + r * cols, size_t(cols) * sizeof(float));
    std::fill(buf + r * padded + cols, buf + (r + 1) * padded, 0.0f);
  }
}

// FP8 sources written as FP8_E4M3 keep their codes and tile scales: each 32-element block of an
// output row lies in one 128x128 tile of its source, so re-blocking is exact.
bool fp8_exact(const TensorPlan& p, Type type) {
  if (type != Type::FP8_E4M3 || p.transform != Transform::None) return false;
  for (const Source& s : p.sources)
    if (!s.scale || s.block_rows != quant::kFP8TileElems || s.block_cols != quant::kFP8TileElems) return false;
  const int64_t b = quant::kFP8BlockElems;
  for (const Piece& pc : p.pieces)
    if (pc.src_col % b || pc.ncols % b || pc.dst_col % b) return false;
  return true;
}

void reblock_fp8(const TensorPlan& p, int64_t r0, int64_t nr, quant::BlockFP8* out) {
  const int64_t b = quant::kFP8BlockElems, per_row = p.cols / b;
  for (const Piece& pc : p.pieces) {
    const Source& s = p.sources[pc.src];
    const int64_t lo = std::max(r0, pc.dst_row), hi = std::min(r0 + nr, pc.dst_row + pc.nrows);
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t sr = pc.src_row + (r - pc.dst_row);
      for (int64_t k = 0; k < pc.ncols / b; ++k) {
        quant::BlockFP8& blk = out[(r - r0) * per_row + pc.dst_col / b + k];
        const int64_t sc = pc.src_col + k * b;
        blk.scale = fp8_scale(s, sr, sc);
        std::memcpy(blk.q, s.weight->data + sr * s.cols + sc, size_t(b));
      }
    }
  }
}

Type parse_weight_type(const char* flag, const std::string& name) {
  const auto t = quant::parse_type(name);
  const char* known = "f32, f16, bf16, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, q6_k, fp8";
  if (!t || !quant::type_info(*t).weight_format) fail(flag, ": unknown type '", name, "' (known: ", known, ")");
  if (*t != Type::FP8_E4M3 && (!quant::has_kernels(*t) || !quant::kernels(*t).quantize))
    fail(flag, ": strata has no quantizer for ", quant::type_name(*t), " (convert to one of ", known,
         "; IQ types need an importance-matrix quantizer)");
  return *t;
}

tokenizer::Vocab make_vocab(const std::string& dir, const HfConfig& h, uint64_t seed,
                            std::vector<std::string>& notes) {
  const int64_t n_vocab = h.config.n_vocab;
  const fs::path json = fs::path(dir) / "tokenizer.json";
  tokenizer::Vocab v;
  if (fs::exists(json)) {
    v = tokenizer::load_hf_tokenizer_json(json.string());
    if (int64_t(v.size()) > n_vocab)
      fail(json.string(), ": ", v.size(), " tokens, but the model's vocab_size is ", n_vocab);
    if (int64_t(v.size()) < n_vocab)
      notes.push_back(cat("tokenizer: ", n_vocab - int64_t(v.size()), " [PADn] tokens fill the embedding rows past the vocabulary"));
  } else {
    if (n_vocab < 282 || n_vocab > UINT32_MAX)
      fail(dir, ": no tokenizer.json, and vocab_size ", n_vocab, " is too small for a generated vocabulary (>= 282)");
    v = tokenizer::generate_byte_level_bpe(uint32_t(n_vocab), seed);
    if (h.eos_token_id >= 0 && h.eos_token_id < n_vocab) v.eos = uint32_t(h.eos_token_id);
    notes.push_back(cat("WARNING: ", dir, " has no tokenizer.json: wrote a GENERATED byte-level BPE of ", n_vocab,
                        " tokens; text in and out will be meaningless for a trained model"));
  }
  tokenizer::pad_vocab(v, uint32_t(n_vocab));
  return v;
}

// MTP blocks to write: those the checkpoint holds, when the GGUF architecture has them.
void decide_mtp(const Checkpoint& ckpt, const ConvertOptions& o, HfConfig& h) {
  model::ModelConfig& c = h.config;
  const int64_t found = TensorMapper::mtp_layers_in(ckpt);
  const bool arch_has = c.arch == model::Arch::Qwen35Moe || c.arch == model::Arch::Qwen4Exp;
  if (found > 0 && !arch_has)
    h.notes.push_back(cat("MTP: the checkpoint has ", found, " MTP layer(s), but llama.cpp's ", model::arch_name(c.arch),
                          " loader has no NextN tensors: not written"));
  else if (found > 0 && !o.mtp)
    h.notes.push_back(cat("MTP: ", found, " MTP layer(s) left out (--no-mtp)"));
  else if (found != c.n_mtp)
    h.notes.push_back(cat("MTP: config.json declares ", c.n_mtp, " MTP layer(s), the checkpoint holds ", found));
  c.n_mtp = arch_has && o.mtp ? found : 0;
}

}  // namespace

quant::Type resolve_tensor_type(const model::TensorSpec& s, Type want, std::optional<Type> fallback,
                                std::vector<std::string>& notes) {
  if (s.cls == model::TypeClass::Vector) return Type::F32;
  const auto fits = [&](Type t) { return s.shape[0] % quant::type_info(t).block_elems == 0; };
  if (fits(want)) return want;
  const char* wname = quant::type_name(want);
  if (s.pad_rows_to_block) {
    notes.push_back(cat(s.name, ": rows zero-padded to ne0 = ", model::stored_ne0(s, want), " (",
                        wname, " does not divide ne0 = ", s.shape[0], ")"));
    return want;
  }
  if (!fallback || !fits(*fallback))
    fail("tensor ", s.name, ": ", wname, " packs ", quant::type_info(want).block_elems,
         " elements per block, which does not divide the row length ne0 = ", s.shape[0],
         fallback ? cat(", nor does the fallback type ", quant::type_name(*fallback)) : std::string(),
         "; choose another type or --fallback-type");
  notes.push_back(cat(s.name, ": ", quant::type_name(*fallback), " (", wname, " does not divide ne0 = ", s.shape[0], ")"));
  return *fallback;
}

ConvertReport run_convert(const ConvertOptions& o) {
  if (o.output.empty()) fail("convert: no output file");
  const auto t0 = std::chrono::steady_clock::now();
  const Type trunk = parse_weight_type("--trunk-type", o.trunk_type);
  const Type expert = parse_weight_type("--expert-type", o.expert_type);
  const Type ngram = parse_weight_type("--ngram-type", o.ngram_type);
  std::optional<Type> fallback;
  if (o.fallback_type != "none") fallback = parse_weight_type("--fallback-type", o.fallback_type);

  const std::string config_path = (fs::path(o.input_dir) / "config.json").string();
  HfConfig h = read_hf_config(config_path);
  const Checkpoint ckpt = Checkpoint::open(o.input_dir);
  decide_mtp(ckpt, o, h);
  model::ModelConfig& c = h.config;
  c.finalize();
  try {
    c.validate();
  } catch (const Error& e) {
    fail(config_path, ": ", e.what());
  }

  ConvertReport rep;
  rep.notes = h.notes;
  const tokenizer::Vocab vocab = make_vocab(o.input_dir, h, o.vocab_seed, rep.notes);
  const std::vector<TensorPlan> plans =
      plan_all(ckpt, c, {h.fp8_block_rows, h.fp8_block_cols, h.tied_embeddings}, rep.notes);

  gguf::Writer w(o.output);
  c.write(w);
  w.set("general.name", gguf::Value::string(fs::path(o.input_dir).lexically_normal().filename().string()));
  w.set("general.quantization_version", gguf::Value::u32(2));
  tokenizer::write_vocab_metadata(vocab, w);
  std::vector<Type> types;
  uint64_t total = 0;
  for (const TensorPlan& p : plans) {
    if (!p.present) continue;
    Type req = Type::F32;
    if (p.spec.cls == model::TypeClass::Trunk) req = trunk;
    if (p.spec.cls == model::TypeClass::Expert) req = expert;
    if (p.spec.cls == model::TypeClass::Ngram) req = ngram;
    types.push_back(resolve_tensor_type(p.spec, req, fallback, rep.notes));
    const std::vector<int64_t> shape = model::stored_shape(p.spec, types.back());
    w.add_tensor(p.spec.name, types.back(), shape);
    total += gguf::tensor_nbytes(types.back(), shape);
  }

  std::optional<ProgressBar> bar;
  if (o.progress) bar.emplace("convert " + o.output, total);
  std::vector<float> f32;
  std::vector<uint8_t> out;
  w.begin_data();
  size_t ti = 0;
  for (const TensorPlan& p : plans) {
    if (!p.present) continue;
    const Type type = types[ti++];
    // A padded row (qwen4exp's down stack) is quantized from the row followed by zeros.
    const int64_t cols = model::stored_ne0(p.spec, type);
    const size_t row_bytes = quant::row_bytes(type, cols);
    const bool exact = cols == p.cols && fp8_exact(p, type);
    int64_t chunk = std::max<int64_t>(1, int64_t(kChunkBytes / (size_t(cols) * 4)));
    // FP8 tile scales span 128 rows: chunks start on tile boundaries.
    if (type == Type::FP8_E4M3) chunk = std::max<int64_t>(128, chunk / 128 * 128);
    chunk = std::min(chunk, p.rows);
    out.resize(size_t(chunk) * row_bytes);
    if (!exact) f32.resize(size_t(chunk * cols));
    for (int64_t r0 = 0; r0 < p.rows; r0 += chunk) {
      const int64_t nr = std::min(chunk, p.rows - r0);
      if (exact) {
        reblock_fp8(p, r0, nr, reinterpret_cast<quant::BlockFP8*>(out.data()));
      } else {
        assemble(p, r0, nr, f32.data());
        if (cols != p.cols) pad_rows(f32.data(), nr, p.cols, cols);
        if (type == Type::FP8_E4M3) quant::quantize_fp8_e4m3_2d(f32.data(), nr, cols, out.data());
        else quant::kernels(type).quantize(f32.data(), out.data(), nr * cols);
      }
      w.write(out.data(), size_t(nr) * row_bytes);
      if (bar) bar->advance(uint64_t(nr) * row_bytes);
    }
    rep.fp8_exact += exact;
    ++rep.tensors;
  }
  w.finish();
  if (bar) bar->finish();
  rep.config = c;
  rep.file_bytes = fs::file_size(o.output);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace strata::convert
