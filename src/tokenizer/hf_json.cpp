// Hugging Face tokenizer.json (+ tokenizer_config.json) -> Vocab, typed the way llama.cpp's
// converter types tokens: added tokens that are special or look special (<|...|>) are Control,
// other added tokens UserDefined, the rest Normal, id gaps [PADn] Unused.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "tokenizer/vocab.h"
#include "util/error.h"

namespace strata::tokenizer {

namespace {

using nlohmann::json;

// Qwen's pre-tokenizer regexes as tokenizer.json spells them; llama.cpp names them "qwen2"
// (Qwen2, Qwen3) and "qwen35" (Qwen3.5, whose letters may carry combining marks).
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json parse_text(std::string_view text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
}

json parse_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_text(text.str(), path);
}

const char* kind(const json& j) { return j.type_name(); }

const json& member(const json& obj, const std::string& path, const char* parent, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end()) fail(path, ": missing field ", parent, key);
  return *it;
}

// Ids index a dense table (gaps filled with [PADn]), so a hostile id must not make it huge: at
// 2^24 a 3 KB file took 2 GiB and 30 s under ASan. Real vocabs are at most about 2^18 (262,144).
constexpr int64_t kMaxTokenId = int64_t(1) << 21;

uint32_t token_id(const json& j, const std::string& path, const std::string& field) {
  if (!j.is_number_integer() || j.get<int64_t>() < 0)
    fail(path, ": ", field, ": expected a token id (a non-negative integer), found ", j.dump());
  if (j.get<int64_t>() >= kMaxTokenId)
    fail(path, ": ", field, ": token id ", j.get<int64_t>(), " is too large (limit ", kMaxTokenId, ")");
  return uint32_t(j.get<int64_t>());
}

bool looks_special(const std::string& t) {
  return t.size() >= 4 && t.compare(0, 2, "<|") == 0 && t.compare(t.size() - 2, 2, "|>") == 0;
}

// An optional string member, "" when absent; any other kind is an error naming `field`.
std::string optional_string(const json& obj, const char* key, const std::string& path,
                            const std::string& field) {
  const auto it = obj.find(key);
  if (it == obj.end()) return "";
  if (!it->is_string()) fail(path, ": ", field, ".", key, ": expected a string, found ", kind(*it));
  return it->get<std::string>();
}

// Sequences nest this deep at most (real files nest one), so a hostile file cannot recurse the
// stack away.
constexpr int kMaxPreTokenizerDepth = 16;

// The Split regex of a pre_tokenizer (possibly inside a Sequence), empty if there is none.
std::string split_regex(const json& pre, const std::string& path, const std::string& field,
                        int depth = 0) {
  if (!pre.is_object()) return "";
  const std::string type = optional_string(pre, "type", path, field);
  if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
    if (depth == kMaxPreTokenizerDepth)
      fail(path, ": ", field, ": Sequences nest more than ", kMaxPreTokenizerDepth, " deep");
    const json& steps = pre["pretokenizers"];
    for (size_t i = 0; i < steps.size(); ++i)
      if (std::string r = split_regex(steps[i], path, cat(field, ".pretokenizers[", i, "]"), depth + 1);
          !r.empty())
        return r;
    return "";
  }
  if (type != "Split" || !pre.contains("pattern") || !pre["pattern"].is_object()) return "";
  const json& pattern = pre["pattern"];
  return pattern.contains("Regex") && pattern["Regex"].is_string() ? pattern["Regex"].get<std::string>()
                                                                    : "";
}

// A token named in tokenizer_config.json: null, "text" or {"content": "text", ...}.
std::optional<uint32_t> config_token(const json& config, const char* key, const std::string& path,
                                     const std::unordered_map<std::string, uint32_t>& ids) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  std::string text;
  if (it->is_string()) {
    text = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    text = (*it)["content"].get<std::string>();
  } else {
    fail(path, ": ", key, ": expected a token string or {\"content\": ...}, found ", kind(*it));
  }
  const auto id = ids.find(text);
  if (id == ids.end()) fail(path, ": ", key, ": \"", text, "\" is not a token of the vocab");
  return id->second;
}

void apply_config(Vocab& v, const std::string& path) {
  const json config = parse_file(path);
  if (!config.is_object()) fail(path, ": expected a JSON object, found ", kind(config));
  std::unordered_map<std::string, uint32_t> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) ids.emplace(v.tokens[i], uint32_t(i));
  v.bos = config_token(config, "bos_token", path, ids);
  v.eos = config_token(config, "eos_token", path, ids);
  v.pad = config_token(config, "pad_token", path, ids);
  v.unk = config_token(config, "unk_token", path, ids);
  if (const auto it = config.find("add_bos_token"); it != config.end() && !it->is_null()) {
    if (!it->is_boolean()) fail(path, ": add_bos_token: expected a boolean, found ", kind(*it));
    v.add_bos = it->get<bool>();
  }
  if (const auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      v.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      // Several named templates: [{"name": "default", "template": "..."}, ...].
      for (size_t i = 0; i < it->size(); ++i) {
        const json& t = (*it)[i];
        if (!t.is_object() || !t.contains("template") || !t["template"].is_string())
          fail(path, ": chat_template: expected {\"name\": ..., \"template\": \"...\"} entries");
        if (v.chat_template.empty() ||
            optional_string(t, "name", path, cat("chat_template[", i, "]")) == "default")
          v.chat_template = t["template"].get<std::string>();
      }
    } else {
      fail(path, ": chat_template: expected a string or a list of named templates, found ",
           kind(*it));
    }
  }
}

}  // namespace

namespace {

// tokenizer.json's content -> Vocab, before tokenizer_config.json and the final check.
Vocab vocab_from(const json& root, const std::string& path) {
  if (!root.is_object()) fail(path, ": expected a JSON object, found ", kind(root));
  const json& model = member(root, path, "", "model");
  if (!model.is_object()) fail(path, ": model: expected an object, found ", kind(model));
  const json& type = member(model, path, "model.", "type");
  if (!type.is_string() || type.get<std::string>() != "BPE")
    fail(path, ": model.type is ", type.dump(), "; only BPE tokenizers are supported");

  const json& vocab = member(model, path, "model.", "vocab");
  if (!vocab.is_object()) fail(path, ": model.vocab: expected an object, found ", kind(vocab));
  std::vector<std::string> tokens;
  std::vector<TokenType> types;
  std::vector<bool> present;
  const auto place = [&](uint32_t id, const std::string& text, TokenType t, const std::string& field) {
    if (id >= tokens.size()) {
      tokens.resize(size_t(id) + 1);
      types.resize(size_t(id) + 1, TokenType::Unused);
      present.resize(size_t(id) + 1, false);
    }
    if (present[id] && tokens[id] != text)
      fail(path, ": ", field, ": id ", id, " is given to both \"", tokens[id], "\" and \"", text, "\"");
    tokens[id] = text;
    types[id] = t;
    present[id] = true;
  };
  for (const auto& [text, id] : vocab.items())
    place(token_id(id, path, "model.vocab[\"" + text + "\"]"), text, TokenType::Normal,
          "model.vocab");

  if (const auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) fail(path, ": added_tokens: expected an array, found ", kind(*it));
    for (size_t i = 0; i < it->size(); ++i) {
      const json& a = (*it)[i];
      const std::string field = cat("added_tokens[", i, "]");
      if (!a.is_object()) fail(path, ": ", field, ": expected an object, found ", kind(a));
      const json& content = member(a, path, (field + ".").c_str(), "content");
      if (!content.is_string())
        fail(path, ": ", field, ".content: expected a string, found ", kind(content));
      const std::string text = content.get<std::string>();
      const bool special = a.contains("special") && a["special"].is_boolean() && a["special"].get<bool>();
      place(token_id(member(a, path, (field + ".").c_str(), "id"), path, field + ".id"), text,
            special || looks_special(text) ? TokenType::Control : TokenType::UserDefined, field);
    }
  }

  Vocab v;
  v.tokens = std::move(tokens);
  v.types = std::move(types);
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (!present[i]) v.tokens[i] = cat("[PAD", i, "]");

  const json& merges = member(model, path, "model.", "merges");
  if (!merges.is_array()) fail(path, ": model.merges: expected an array, found ", kind(merges));
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string() && m.get<std::string>().find(' ', 1) != std::string::npos) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      fail(path, ": model.merges[", i, "]: expected \"a b\" or [\"a\", \"b\"], found ", m.dump());
    }
  }

  const std::string regex =
      root.contains("pre_tokenizer") ? split_regex(root["pre_tokenizer"], path, "pre_tokenizer") : "";
  v.pre = regex == kQwen2Regex ? std::string(kPreQwen2)
          : regex == kQwen35Regex ? std::string(kPreQwen35)
                                  : std::string("default");

  return v;
}

}  // namespace

Vocab parse_hf_tokenizer_json(std::string_view text, const std::string& name) {
  Vocab v = vocab_from(parse_text(text, name), name);
  check_vocab(v, name);
  return v;
}

Vocab load_hf_tokenizer_json(const std::string& path) {
  Vocab v = vocab_from(parse_file(path), path);
  const std::filesystem::path config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config)) apply_config(v, config.string());
  check_vocab(v, path);
  return v;
}

}  // namespace strata::tokenizer
