// Vocab checks, the GPT-2 byte mapping and the GGUF tokenizer metadata.
#include "tokenizer/vocab.h"

#include <array>
#include <unordered_map>
#include <utility>

#include "gguf/gguf.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace strata::tokenizer {

namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order, so no token contains a space or control character.
struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};  // code points up to U+0143

  ByteMap() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? uint32_t(b) : next++;
      to_byte[to_cp[b]] = int16_t(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

constexpr const char* kModel = "tokenizer.ggml.model";
constexpr const char* kPre = "tokenizer.ggml.pre";
constexpr const char* kTokens = "tokenizer.ggml.tokens";
constexpr const char* kTokenType = "tokenizer.ggml.token_type";
constexpr const char* kMerges = "tokenizer.ggml.merges";
constexpr const char* kBos = "tokenizer.ggml.bos_token_id";
constexpr const char* kEos = "tokenizer.ggml.eos_token_id";
constexpr const char* kPad = "tokenizer.ggml.padding_token_id";
constexpr const char* kUnk = "tokenizer.ggml.unknown_token_id";
constexpr const char* kAddBos = "tokenizer.ggml.add_bos_token";
constexpr const char* kChatTemplate = "tokenizer.chat_template";

// The array under key, checked to hold elements of elem_type.
const std::vector<gguf::Value>& typed_array(const gguf::Reader& reader, const char* key,
                                            gguf::ValueType elem_type) {
  const gguf::Value& v = reader.get(key);
  if (v.type() != gguf::ValueType::ARRAY || v.elem_type() != elem_type) {
    const std::string found = v.type() == gguf::ValueType::ARRAY
                                  ? cat("array of ", gguf::value_type_name(v.elem_type()))
                                  : std::string(gguf::value_type_name(v.type()));
    fail(reader.path(), ": metadata ", key, ": expected array of ",
         gguf::value_type_name(elem_type), ", found ", found);
  }
  return v.as_array();
}

std::optional<uint32_t> read_id(const gguf::Reader& reader, const char* key, size_t n_tokens) {
  const gguf::Value* v = reader.find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer()) {
    fail(reader.path(), ": metadata ", key, ": expected an integer token id, found ",
         gguf::value_type_name(v->type()));
  }
  const bool is_signed = v->type() == gguf::ValueType::I8 || v->type() == gguf::ValueType::I16 ||
                         v->type() == gguf::ValueType::I32 || v->type() == gguf::ValueType::I64;
  if (is_signed && v->as_i64() < 0)
    fail(reader.path(), ": metadata ", key, ": token id ", v->as_i64(), " is negative");
  const uint64_t id = is_signed ? uint64_t(v->as_i64()) : v->as_u64();
  if (id >= n_tokens)
    fail(reader.path(), ": metadata ", key, ": token id ", id, " is outside the vocab of ",
         n_tokens, " tokens");
  return uint32_t(id);
}

}  // namespace

std::optional<uint32_t> Vocab::find(std::string_view token) const {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == token) return uint32_t(i);
  return std::nullopt;
}

std::string bytes_to_token(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append(out, byte_map().to_cp[uint8_t(c)]);
  return out;
}

std::optional<std::string> token_to_bytes(std::string_view token) {
  std::string out;
  size_t pos = 0;
  while (pos < token.size()) {
    const uint32_t cp = utf8::next(token, pos);
    if (cp >= byte_map().to_byte.size() || byte_map().to_byte[cp] < 0) return std::nullopt;
    out += char(byte_map().to_byte[cp]);
  }
  return out;
}

void check_vocab(const Vocab& vocab, const std::string& what) {
  const size_t n = vocab.tokens.size();
  if (n == 0) fail(what, ": the vocab has no tokens");
  if (vocab.types.size() != n)
    fail(what, ": ", n, " tokens but ", vocab.types.size(), " token types");
  std::unordered_map<std::string_view, uint32_t> ids;
  ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (vocab.tokens[i].empty()) fail(what, ": token ", i, " is empty");
    const auto [it, fresh] = ids.emplace(vocab.tokens[i], uint32_t(i));
    if (!fresh)
      fail(what, ": duplicate token \"", vocab.tokens[i], "\" (ids ", it->second, " and ", i, ")");
  }
  const std::pair<const char*, std::optional<uint32_t>> specials[] = {
      {"bos", vocab.bos}, {"eos", vocab.eos}, {"pad", vocab.pad}, {"unk", vocab.unk}};
  for (const auto& [name, id] : specials)
    if (id && *id >= n) fail(what, ": ", name, " id ", *id, " is outside the vocab of ", n);
  std::string joined;
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    // Split where llama.cpp splits: at the first space after the first byte.
    const std::string& m = vocab.merges[i];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos || space + 1 == m.size() ||
        m.find(' ', space + 1) != std::string::npos)
      fail(what, ": merge ", i, " \"", m, "\" is not two tokens separated by one space");
    const std::string_view a(m.data(), space), b(m.data() + space + 1, m.size() - space - 1);
    joined.assign(a).append(b);
    for (std::string_view part : {a, b, std::string_view(joined)})
      if (!ids.count(part))
        fail(what, ": merge ", i, " \"", m, "\": \"", part, "\" is not a token");
  }
}

void pad_vocab(Vocab& vocab, uint32_t n_vocab) {
  if (vocab.tokens.size() > n_vocab)
    fail("vocab of ", vocab.tokens.size(), " tokens is larger than the model's ", n_vocab);
  for (size_t i = vocab.tokens.size(); i < n_vocab; ++i) {
    vocab.tokens.push_back(cat("[PAD", i, "]"));
    vocab.types.push_back(TokenType::Unused);
  }
}

void write_vocab_metadata(const Vocab& vocab, gguf::Writer& writer) {
  check_vocab(vocab, "vocab");
  std::vector<int32_t> types(vocab.types.size());
  for (size_t i = 0; i < types.size(); ++i) types[i] = int32_t(vocab.types[i]);
  writer.set(kModel, gguf::Value::string("gpt2"));
  writer.set(kPre, gguf::Value::string(vocab.pre));
  writer.set(kTokens, gguf::Value::strings(vocab.tokens));
  writer.set(kTokenType, gguf::Value::i32s(types));
  writer.set(kMerges, gguf::Value::strings(vocab.merges));
  // llama.cpp reads the ids as u32 and refuses any other type.
  if (vocab.bos) writer.set(kBos, gguf::Value::u32(*vocab.bos));
  if (vocab.eos) writer.set(kEos, gguf::Value::u32(*vocab.eos));
  if (vocab.pad) writer.set(kPad, gguf::Value::u32(*vocab.pad));
  if (vocab.unk) writer.set(kUnk, gguf::Value::u32(*vocab.unk));
  writer.set(kAddBos, gguf::Value::boolean(vocab.add_bos));
  if (!vocab.chat_template.empty())
    writer.set(kChatTemplate, gguf::Value::string(vocab.chat_template));
}

Vocab read_vocab_metadata(const gguf::Reader& reader) {
  const std::string model = reader.get_string(kModel);
  if (model != "gpt2")
    fail(reader.path(), ": metadata ", kModel, " is \"", model,
         "\"; only byte-level BPE (\"gpt2\") vocabs are supported");
  Vocab v;
  v.pre = reader.get_string(kPre, "default");
  const auto& tokens = typed_array(reader, kTokens, gguf::ValueType::STRING);
  v.tokens.reserve(tokens.size());
  for (const gguf::Value& t : tokens) v.tokens.push_back(t.as_string());
  if (reader.find(kTokenType)) {
    const auto& types = typed_array(reader, kTokenType, gguf::ValueType::I32);
    if (types.size() != tokens.size())
      fail(reader.path(), ": metadata ", kTokenType, " has ", types.size(), " entries for ",
           tokens.size(), " tokens");
    v.types.reserve(types.size());
    for (const gguf::Value& t : types) v.types.push_back(TokenType(t.as_i64()));
  } else {
    v.types.assign(tokens.size(), TokenType::Normal);
  }
  const auto& merges = typed_array(reader, kMerges, gguf::ValueType::STRING);
  v.merges.reserve(merges.size());
  for (const gguf::Value& m : merges) v.merges.push_back(m.as_string());
  v.bos = read_id(reader, kBos, tokens.size());
  v.eos = read_id(reader, kEos, tokens.size());
  v.pad = read_id(reader, kPad, tokens.size());
  v.unk = read_id(reader, kUnk, tokens.size());
  if (const gguf::Value* add_bos = reader.find(kAddBos)) {
    if (add_bos->type() != gguf::ValueType::BOOL)
      fail(reader.path(), ": metadata ", kAddBos, ": expected bool, found ",
           gguf::value_type_name(add_bos->type()));
    v.add_bos = add_bos->as_bool();
  }
  v.chat_template = reader.get_string(kChatTemplate, "");
  check_vocab(v, reader.path());
  return v;
}

}  // namespace strata::tokenizer
