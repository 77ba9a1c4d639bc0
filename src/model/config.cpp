#include "model/config.h"

#include <charconv>
#include <cmath>
#include <variant>

#include "gguf/gguf.h"
#include "util/error.h"

namespace strata::model {

namespace {

constexpr unsigned kQ4 = 1u << int(Arch::Qwen4Exp);
constexpr unsigned kNext = 1u << int(Arch::Qwen3Next);
constexpr unsigned k35 = 1u << int(Arch::Qwen35Moe);
constexpr unsigned kMoe = 1u << int(Arch::Qwen3Moe);
constexpr unsigned kAll = kQ4 | kNext | k35 | kMoe;
constexpr unsigned kGdn = kQ4 | kNext | k35;

unsigned bit(Arch a) { return 1u << int(a); }

// One scalar hparam: its `--set` name, the GGUF key suffix after "ARCH." (null when the file
// does not carry it), the archs that write it, and whether reading a file without it fails
// (false: the member keeps its default, which is what llama.cpp assumes too).
struct Field {
  const char* name;
  std::variant<int64_t ModelConfig::*, double ModelConfig::*> member;
  const char* key;
  unsigned archs;
  bool required;
};

const Field kFields[] = {
    {"vocab_size", &ModelConfig::n_vocab, nullptr, kAll, false},
    {"hidden", &ModelConfig::n_embd, "embedding_length", kAll, true},
    {"layers", &ModelConfig::n_layer, nullptr, kAll, false},
    {"context", &ModelConfig::n_ctx, "context_length", kAll, true},
    {"rms_eps", &ModelConfig::rms_eps, "attention.layer_norm_rms_epsilon", kAll, true},
    {"heads", &ModelConfig::n_head, "attention.head_count", kAll, true},
    {"kv_heads", &ModelConfig::n_head_kv, "attention.head_count_kv", kAll, true},
    {"head_dim", &ModelConfig::head_dim, "attention.key_length", kAll, false},
    {"rope_dim", &ModelConfig::rope_dim, "rope.dimension_count", kAll, false},
    {"rope_theta", &ModelConfig::rope_theta, "rope.freq_base", kAll, false},
    {"ff", &ModelConfig::n_ff, "feed_forward_length", kNext | k35 | kMoe, false},
    {"experts", &ModelConfig::n_expert, "expert_count", kAll, true},
    {"experts_used", &ModelConfig::n_expert_used, "expert_used_count", kAll, true},
    {"expert_ff", &ModelConfig::n_ff_exp, "expert_feed_forward_length", kAll, false},
    {"shared_ff", &ModelConfig::n_ff_shexp, "expert_shared_feed_forward_length", kGdn, false},
    {"full_attn_interval", &ModelConfig::full_attn_interval, "full_attention_interval", kGdn, false},
    {"ssm_conv", &ModelConfig::ssm_conv, "ssm.conv_kernel", kGdn, true},
    {"ssm_state", &ModelConfig::ssm_state, "ssm.state_size", kGdn, true},
    {"ssm_groups", &ModelConfig::ssm_groups, "ssm.group_count", kGdn, true},
    {"ssm_v_heads", &ModelConfig::ssm_v_heads, "ssm.time_step_rank", kGdn, true},
    {"hc_count", &ModelConfig::hc_count, "hyper_connection.count", kQ4, true},
    {"hc_lowrank", &ModelConfig::hc_lowrank, "hyper_connection.low_rank", kQ4, true},
    {"indexer_heads", &ModelConfig::idx_heads, "attention.indexer.head_count", kQ4, true},
    {"indexer_head_dim", &ModelConfig::idx_head_dim, "attention.indexer.key_length", kQ4, true},
    {"indexer_top_k", &ModelConfig::idx_top_k, "attention.indexer.top_k", kQ4, true},
    // strata's key: llama.cpp hard-wires the 4-token block; the reference makes it a config field.
    {"indexer_block", &ModelConfig::idx_block, "attention.indexer.compress_ratio", kQ4, false},
    {"ngram_size", &ModelConfig::ple_ngram, nullptr, kQ4, false},
    {"heads_per_ngram", &ModelConfig::ple_heads_per_ngram, nullptr, kQ4, false},
    {"ple_embed_dim", &ModelConfig::ple_embed_dim, nullptr, kQ4, false},
    {"ple_conv", &ModelConfig::ple_conv, nullptr, kQ4, false},
    {"ngram_vocab_base", &ModelConfig::ngram_vocab_base, nullptr, kQ4, false},
    {"ngram_vocab_divisor", &ModelConfig::ngram_vocab_divisor, nullptr, kQ4, false},
    {"ple_seed", &ModelConfig::ple_seed, nullptr, kQ4, false},
    {"ple_eos", &ModelConfig::ple_eos, nullptr, kQ4, false},
    {"image_token", &ModelConfig::image_token, nullptr, kQ4, false},
    {"mtp_layers", &ModelConfig::n_mtp, nullptr, kAll, false},
};

// PLE keys, written only when the model has a PLE layer (names from llama.cpp's qwen4exp).
const Field kPleFields[] = {
    {"ngram_size", &ModelConfig::ple_ngram, "ple.ngram_size", kQ4, true},
    {"heads_per_ngram", &ModelConfig::ple_heads_per_ngram, "ple.heads_per_ngram", kQ4, true},
    {"ple_conv", &ModelConfig::ple_conv, "ple.conv_kernel", kQ4, true},
    {"ple_eos", &ModelConfig::ple_eos, "ple.eos_token_id", kQ4, true},
    {"image_token", &ModelConfig::image_token, "ple.image_token_id", kQ4, false},
};

std::string key(Arch a, const char* suffix) { return cat(arch_name(a), ".", suffix); }

void write_field(const ModelConfig& c, const Field& f, gguf::Writer& w) {
  if (auto m = std::get_if<int64_t ModelConfig::*>(&f.member)) {
    w.set(key(c.arch, f.key), gguf::Value::u32(uint32_t(c.*(*m))));
  } else {
    w.set(key(c.arch, f.key), gguf::Value::f32(float(c.*std::get<double ModelConfig::*>(f.member))));
  }
}

void read_field(ModelConfig& c, const Field& f, const gguf::Reader& r) {
  const std::string k = key(c.arch, f.key);
  const gguf::Value* v = r.find(k);
  if (!v) {
    if (f.required) fail(r.path(), ": missing metadata key ", k);
    return;
  }
  try {
    if (auto m = std::get_if<int64_t ModelConfig::*>(&f.member)) {
      c.*(*m) = v->as_i64();
    } else {
      c.*std::get<double ModelConfig::*>(f.member) = v->as_f64();
    }
  } catch (const Error& e) {
    fail(r.path(), ": metadata ", k, ": ", e.what());
  }
}

std::vector<uint64_t> read_u64s(const gguf::Reader& r, const std::string& k) {
  std::vector<uint64_t> out;
  try {
    for (const auto& v : r.get(k).as_array()) out.push_back(v.as_u64());
  } catch (const Error& e) {
    fail(r.path(), ": metadata ", k, ": ", e.what());
  }
  return out;
}

gguf::Value u64s(const std::vector<uint64_t>& xs) {
  std::vector<gguf::Value> items;
  for (uint64_t x : xs) items.push_back(gguf::Value::u64(x));
  return gguf::Value::array(gguf::ValueType::U64, std::move(items));
}

// The n-gram hashing constants of the reference (modeling_qwen4_exp.py): a splitmix64 stream
// gives the odd per-position multipliers, and each head's table size is a distinct prime above
// ngram_vocab_base. Recomputed here, not copied, so synthetic files hash like real ones.
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

uint64_t splitmix64(uint64_t v) {
  v += kGamma;
  v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
  v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
  return v ^ (v >> 31);
}

bool is_prime(uint64_t v) {
  if (v < 2) return false;
  if (v % 2 == 0) return v == 2;
  for (uint64_t d = 3; d * d <= v; d += 2)
    if (v % d == 0) return false;
  return true;
}

uint64_t nth_prime_after(uint64_t start, int64_t count) {
  uint64_t p = start;
  for (int64_t i = 0; i < count; ++i) {
    ++p;
    while (!is_prime(p)) ++p;
  }
  return p;
}

bool parse_int(std::string_view s, int64_t& out) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

}  // namespace

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Qwen4Exp: return "qwen4exp";
    case Arch::Qwen3Next: return "qwen3next";
    case Arch::Qwen35Moe: return "qwen35moe";
    case Arch::Qwen3Moe: return "qwen3moe";
  }
  return "?";
}

Arch parse_arch(std::string_view name) {
  for (Arch a : {Arch::Qwen4Exp, Arch::Qwen3Next, Arch::Qwen35Moe, Arch::Qwen3Moe})
    if (name == arch_name(a)) return a;
  fail("unknown architecture '", name, "' (known: qwen4exp, qwen3next, qwen35moe, qwen3moe)");
}

bool has_gdn(Arch a) { return (bit(a) & kGdn) != 0; }

bool ModelConfig::is_linear(int64_t il) const {
  return has_gdn(arch) && il < n_layer && (il + 1) % full_attn_interval != 0;
}

int64_t ModelConfig::ple_index(int64_t il) const {
  for (size_t k = 0; k < ple_layers.size(); ++k)
    if (ple_layers[k] == il) return int64_t(k);
  return -1;
}

std::string ModelConfig::ple_table_name(int64_t k) const {
  return k == 0 ? "per_layer_token_embd.weight"
                : "blk." + std::to_string(ple_layers[size_t(k)]) + ".per_layer_token_embd.weight";
}

void ModelConfig::finalize() {
  ple_tables.clear();
  if (ple_embed_dim == 0) ple_embed_dim = n_embd;
  if (arch != Arch::Qwen4Exp || !has_ple() || ple_ngram < 2 || ple_heads_per_ngram < 1 ||
      ngram_vocab_base < 2 || ngram_vocab_divisor < 1 || n_vocab < 1)
    return;
  const uint64_t half = std::max<uint64_t>(1, (uint64_t(INT64_MAX) / uint64_t(n_vocab)) / 2);
  for (size_t k = 0; k < ple_layers.size(); ++k) {
    // _build_layer_multipliers(vocab, ngram, ple_layer_index, seed) and the head sizes: primes
    // numbered on from the previous PLE layers' heads, so no two tables share a size.
    PleTable t;
    const uint64_t base_seed = uint64_t(ple_seed) + 10007 * uint64_t(k);
    for (int64_t i = 0; i < ple_ngram; ++i)
      t.multipliers.push_back(2 * (splitmix64(base_seed + kGamma * uint64_t(i + 1)) % half) + 1);
    uint64_t total = 0;
    for (int64_t h = 0; h < ple_heads(); ++h) {
      const uint64_t size = nth_prime_after(uint64_t(ngram_vocab_base) - 1, int64_t(k) * ple_heads() + h + 1);
      t.head_offsets.push_back(total);
      t.head_sizes.push_back(size);
      total += size;
    }
    const uint64_t div = uint64_t(ngram_vocab_divisor);
    t.rows = int64_t((total + div - 1) / div * div);
    ple_tables.push_back(std::move(t));
  }
}

void ModelConfig::validate() const {
  const char* a = arch_name(arch);
  auto need = [&](bool ok, auto&&... why) {
    if (!ok) fail(a, ": ", why...);
  };
  need(n_vocab > 0 && n_embd > 0 && n_layer > 0 && n_ctx > 0, "vocab_size, hidden, layers and context must be > 0");
  need(n_head > 0 && n_head_kv > 0 && n_head % n_head_kv == 0, "heads (", n_head, ") must be a positive multiple of kv_heads (", n_head_kv, ")");
  need(head_dim > 0 && rope_dim > 0 && rope_dim <= head_dim && rope_dim % 2 == 0, "rope_dim (", rope_dim, ") must be even and within head_dim (", head_dim, ")");
  need(n_expert > 0 && n_expert_used > 0 && n_expert_used <= n_expert, "experts_used (", n_expert_used, ") must be in [1, experts (", n_expert, ")]");
  need(n_ff_exp > 0, "expert_ff must be > 0");
  need(n_mtp >= 0, "mtp_layers must be >= 0");
  need(rms_eps > 0 && rope_theta > 0, "rms_eps and rope_theta must be > 0");
  if (arch == Arch::Qwen3Moe) {
    // llama.cpp's qwen3moe graph asserts n_rot == head_dim.
    need(rope_dim == head_dim, "rope_dim (", rope_dim, ") must equal head_dim (", head_dim, ")");
    need(n_mtp == 0, "has no MTP blocks in llama.cpp (mtp_layers must be 0)");
    return;
  }
  need(n_ff_shexp > 0, "shared_ff must be > 0");
  need(full_attn_interval > 0, "full_attn_interval must be > 0");
  need(ssm_conv > 0 && ssm_state > 0 && ssm_groups > 0 && ssm_v_heads % ssm_groups == 0 && ssm_v_heads > 0,
       "ssm_conv, ssm_state must be > 0 and ssm_v_heads (", ssm_v_heads, ") a positive multiple of ssm_groups (", ssm_groups, ")");
  if (arch == Arch::Qwen3Next) {
    // Its llama.cpp loader creates no nextn.* tensors, so a file with them fails to load there.
    need(n_mtp == 0, "has no MTP blocks in llama.cpp (mtp_layers must be 0)");
  }
  if (arch == Arch::Qwen35Moe || arch == Arch::Qwen4Exp) {
    int64_t sum = 0;
    for (int64_t s : rope_sections) {
      need(s >= 0, "rope sections must be >= 0");
      sum += s;
    }
    need(sum > 0 && sum <= rope_dim / 2, "rope sections (sum ", sum, ") must sum to 1..rope_dim/2 (", rope_dim / 2, ")");
  }
  if (arch != Arch::Qwen4Exp) return;
  need(hc_count > 1, "hc_count (", hc_count, ") must be > 1");
  need(hc_lowrank > 0, "hc_lowrank must be > 0");
  need(idx_heads > 0 && idx_head_dim > 0 && idx_top_k > 0 && idx_block > 0, "indexer_heads, indexer_head_dim, indexer_top_k and indexer_block must be > 0");
  need(idx_top_k % idx_block == 0, "indexer_top_k (", idx_top_k, ") must be a multiple of indexer_block (", idx_block, ")");
  need(rope_dim <= idx_head_dim, "rope_dim (", rope_dim, ") must fit the indexer head (", idx_head_dim, ")");
  if (!has_ple()) return;
  for (size_t k = 0; k < ple_layers.size(); ++k) {
    const int64_t il = ple_layers[k];
    need(il < n_layer && is_linear(il), "PLE layer ", il, " must be a linear-attention trunk layer");
    need(ple_index(il) == int64_t(k), "PLE layer ", il, " is listed twice");
  }
  need(ple_ngram >= 2 && ple_heads_per_ngram > 0, "ngram_size must be >= 2 and heads_per_ngram > 0");
  need(ple_embed_dim > 0 && ple_embed_dim % ple_heads() == 0, "ple_embed_dim (", ple_embed_dim, ") must be a multiple of the n-gram head count (", ple_heads(), ")");
  need(ple_conv > 0, "ple_conv must be > 0");
  need(ple_eos >= 0 && ple_eos < n_vocab, "ple_eos (", ple_eos, ") must be a token id below vocab_size (", n_vocab, ")");
  need(ple_tables.size() == ple_layers.size(), "PLE tables are not derived (ngram_vocab_base, ngram_vocab_divisor must be > 1 and >= 1)");
  for (const PleTable& t : ple_tables) {
    need(t.rows > 0 && int64_t(t.head_sizes.size()) == ple_heads() && int64_t(t.multipliers.size()) == ple_ngram,
         "PLE tables must have one multiplier per n-gram position and one size per head");
    need(t.rows <= INT32_MAX, "an n-gram table (", t.rows, " rows) must fit an int32 row index");
  }
}

void ModelConfig::set(std::string_view name, std::string_view value) {
  if (name == "rope_sections") {
    std::array<int64_t, 4> s{};
    size_t i = 0, start = 0;
    while (start <= value.size()) {
      size_t end = value.find(',', start);
      if (end == std::string_view::npos) end = value.size();
      if (i == 4 || !parse_int(value.substr(start, end - start), s[i]))
        fail("--set rope_sections: expected up to 4 comma-separated integers, got '", value, "'");
      ++i;
      start = end + 1;
    }
    rope_sections = s;
    return;
  }
  if (name == "ple_layers") {
    std::vector<int64_t> layers;
    for (size_t start = 0; value != "none" && start <= value.size();) {
      size_t end = value.find(',', start);
      if (end == std::string_view::npos) end = value.size();
      int64_t il;
      if (!parse_int(value.substr(start, end - start), il))
        fail("--set ple_layers: expected 'none' or comma-separated layer indices, got '", value, "'");
      layers.push_back(il);
      start = end + 1;
    }
    ple_layers = std::move(layers);
    return;
  }
  for (const Field& f : kFields) {
    if (name != f.name) continue;
    if (auto m = std::get_if<int64_t ModelConfig::*>(&f.member)) {
      int64_t v;
      if (!parse_int(value, v)) {
        fail("--set ", name, ": expected an integer, got '", value, "'");
      }
      this->*(*m) = v;
    } else {
      const std::string s(value);
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (s.empty() || *end != '\0' || !std::isfinite(v)) fail("--set ", name, ": expected a number, got '", value, "'");
      this->*std::get<double ModelConfig::*>(f.member) = v;
    }
    return;
  }
  std::string known;
  for (const auto& n : settable_names()) known += " " + n;
  fail("--set: unknown hparam '", name, "' (known:", known, ")");
}

std::vector<std::string> ModelConfig::settable_names() {
  std::vector<std::string> out;
  for (const Field& f : kFields) out.push_back(f.name);
  out.push_back("rope_sections");
  out.push_back("ple_layers");
  return out;
}

void ModelConfig::write(gguf::Writer& w) const {
  w.set("general.architecture", gguf::Value::string(arch_name(arch)));
  // block_count counts the MTP blocks too: llama.cpp sizes its layer array from it.
  w.set(key(arch, "block_count"), gguf::Value::u32(uint32_t(n_blocks())));
  for (const Field& f : kFields)
    if (f.key && (f.archs & bit(arch))) write_field(*this, f, w);
  w.set(key(arch, "attention.value_length"), gguf::Value::u32(uint32_t(head_dim)));
  if (has_gdn(arch)) w.set(key(arch, "ssm.inner_size"), gguf::Value::u32(uint32_t(ssm_value_dim())));
  if (arch == Arch::Qwen35Moe || arch == Arch::Qwen4Exp) {
    std::vector<int32_t> s(rope_sections.begin(), rope_sections.end());
    w.set(key(arch, "rope.dimension_sections"), gguf::Value::i32s(s));
    if (n_mtp > 0) w.set(key(arch, "nextn_predict_layers"), gguf::Value::u32(uint32_t(n_mtp)));
  }
  if (arch == Arch::Qwen4Exp && has_ple()) {
    // The per-layer arrays are concatenated in ple.layers order (one layer: llama.cpp's form).
    std::vector<gguf::Value> layers;
    std::vector<uint64_t> mult, offsets, sizes;
    for (size_t k = 0; k < ple_layers.size(); ++k) {
      layers.push_back(gguf::Value::u32(uint32_t(ple_layers[k])));
      const PleTable& t = ple_tables.at(k);
      mult.insert(mult.end(), t.multipliers.begin(), t.multipliers.end());
      offsets.insert(offsets.end(), t.head_offsets.begin(), t.head_offsets.end());
      sizes.insert(sizes.end(), t.head_sizes.begin(), t.head_sizes.end());
    }
    w.set(key(arch, "ple.layers"), gguf::Value::array(gguf::ValueType::U32, std::move(layers)));
    for (const Field& f : kPleFields) write_field(*this, f, w);
    w.set(key(arch, "embedding_length_per_layer_input"), gguf::Value::u32(uint32_t(ple_head_dim())));
    w.set(key(arch, "ple.layer_multipliers"), u64s(mult));
    w.set(key(arch, "ple.head_offsets"), u64s(offsets));
    w.set(key(arch, "ple.head_vocab_sizes"), u64s(sizes));
  }
}

ModelConfig ModelConfig::read(const gguf::Reader& r) {
  ModelConfig c;
  c.arch = parse_arch(r.architecture());
  c.n_vocab = r.tensor("token_embd.weight").shape.at(1);
  const int64_t blocks = int64_t(r.get_u64(key(c.arch, "block_count")));
  for (const Field& f : kFields)
    if (f.key && (f.archs & bit(c.arch))) read_field(c, f, r);
  if (!r.find(key(c.arch, "attention.key_length"))) c.head_dim = c.n_embd / c.n_head;
  if (!r.find(key(c.arch, "rope.dimension_count"))) c.rope_dim = c.head_dim;
  if (c.arch == Arch::Qwen4Exp && c.idx_block == 0) c.idx_block = 4;  // llama.cpp's fixed block
  c.n_mtp = int64_t(r.get_u64(key(c.arch, "nextn_predict_layers"), 0));
  c.n_layer = blocks - c.n_mtp;
  if (const gguf::Value* s = r.find(key(c.arch, "rope.dimension_sections"))) {
    const auto& items = s->as_array();
    for (size_t i = 0; i < items.size() && i < 4; ++i) c.rope_sections[i] = items[i].as_i64();
  }
  if (c.arch == Arch::Qwen4Exp && r.find(key(c.arch, "ple.layers"))) {
    for (uint64_t il : read_u64s(r, key(c.arch, "ple.layers"))) c.ple_layers.push_back(int64_t(il));
    for (const Field& f : kPleFields) read_field(c, f, r);
    c.ple_embed_dim = int64_t(r.get_u64(key(c.arch, "embedding_length_per_layer_input"))) * c.ple_heads();
    const auto mult = read_u64s(r, key(c.arch, "ple.layer_multipliers"));
    const auto offsets = read_u64s(r, key(c.arch, "ple.head_offsets"));
    const auto sizes = read_u64s(r, key(c.arch, "ple.head_vocab_sizes"));
    const size_t n = c.ple_layers.size(), g = size_t(c.ple_ngram), h = size_t(std::max<int64_t>(c.ple_heads(), 0));
    if (mult.size() != n * g || offsets.size() != n * h || sizes.size() != n * h)
      fail(r.path(), ": the PLE arrays must hold ", g, " multipliers and ", h, " head offsets and sizes per PLE layer (",
           n, " layers)");
    for (size_t k = 0; k < n; ++k) {
      PleTable t;
      t.multipliers.assign(mult.begin() + k * g, mult.begin() + (k + 1) * g);
      t.head_offsets.assign(offsets.begin() + k * h, offsets.begin() + (k + 1) * h);
      t.head_sizes.assign(sizes.begin() + k * h, sizes.begin() + (k + 1) * h);
      t.rows = r.tensor(c.ple_table_name(int64_t(k))).shape.at(1);
      c.ple_tables.push_back(std::move(t));
    }
  }
  return c;
}

}  // namespace strata::model
