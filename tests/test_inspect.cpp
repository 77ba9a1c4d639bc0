// strata inspect: the report of a small GGUF written here, the expert/trunk/ngram split, exact
// --values output for F32/F16/Q8_0 tensors, errors, and the built binary end to end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <tuple>

#include "gguf/gguf.h"
#include "gguf/inspect.h"
#include "util/error.h"
#include "util/half.h"

namespace strata::gguf {
namespace {

namespace fs = std::filesystem;

const std::vector<float> kF32Values = {0.1f, -2.5f, 3.14159274f, 1e-30f, -0.0f, 123456.789f,
                                       7.0f, 1.0f / 3.0f, -1e20f, 0.5f, 2.0f, -3.0f};
// Exactly representable in fp16: normals, the smallest normal and the smallest subnormal.
const std::vector<float> kF16Values = {0.5f, -1.25f, 3.0f, 1024.0f, 0.0009765625f,
                                       6.103515625e-05f, 5.9604644775390625e-08f, -65504.0f};
constexpr float kQ8Scale = 0.25f;  // fp16-exact

class InspectFile {
 public:
  InspectFile() : path_((fs::temp_directory_path() / ("strata_test_inspect_" + std::to_string(::getpid()) + ".gguf")).string()) {
    Writer w(path_);
    w.set("general.architecture", Value::string("qwen3moe"));
    w.set("general.name", Value::string("inspect test"));
    w.set("qwen3moe.block_count", Value::u32(1));
    w.set("qwen3moe.expert_count", Value::u32(2));
    std::vector<std::string> tokens;
    for (int i = 0; i < 100; ++i) tokens.push_back(cat("t", i));
    w.set("tokenizer.ggml.tokens", Value::strings(tokens));
    w.set("tokenizer.chat_template", Value::string("{{ a }}\n{{ b }}\n"));
    w.add_tensor("token_embd.weight", quant::Type::F32, {4, 3});
    w.add_tensor("blk.0.ffn_gate_exps.weight", quant::Type::F16, {8, 1, 1});
    w.add_tensor("blk.0.ffn_down_exps.weight", quant::Type::Q8_0, {32, 2, 1});
    w.add_tensor("blk.0.ffn_gate_shexp.weight", quant::Type::F32, {4});
    w.add_tensor("ple_ngram_embd.weight", quant::Type::F32, {8, 2});
    w.begin_data();
    w.write(kF32Values.data(), kF32Values.size() * 4);
    std::vector<uint16_t> halves;
    for (float v : kF16Values) halves.push_back(fp32_to_fp16(v));
    w.write(halves.data(), halves.size() * 2);
    for (int block = 0; block < 2; ++block) {  // q[i] = i - 128 + 100 * block, clamped to int8
      uint8_t bytes[34];
      const uint16_t d = fp32_to_fp16(kQ8Scale);
      std::memcpy(bytes, &d, 2);
      for (int i = 0; i < 32; ++i) bytes[2 + i] = uint8_t(int8_t(q8_value(block, i)));
      w.write(bytes, sizeof bytes);
    }
    const std::vector<float> shexp(4, 1.0f), ngram(16, 2.0f);
    w.write(shexp.data(), 16);
    w.write(ngram.data(), 64);
    w.finish();
    reader_ = Reader::open(path_);
  }
  ~InspectFile() { fs::remove(path_); }
  static int q8_value(int block, int i) { return std::min(127, i - 128 + 100 * block); }
  const Reader& reader() const { return *reader_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<Reader> reader_;
};

std::string fmt(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(v));
  return buf;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(TensorGroup, Classification) {
  EXPECT_EQ(tensor_group("qwen3moe", "blk.3.ffn_gate_exps.weight"), TensorGroup::Expert);
  EXPECT_EQ(tensor_group("qwen4exp", "blk.48.ffn_down_exps.weight"), TensorGroup::Expert);
  EXPECT_EQ(tensor_group("qwen3next", "blk.3.ffn_gate_shexp.weight"), TensorGroup::Trunk);
  EXPECT_EQ(tensor_group("qwen3moe", "blk.3.ffn_gate_inp.weight"), TensorGroup::Trunk);
  EXPECT_EQ(tensor_group("x", "ngram_embedding.weight"), TensorGroup::Ngram);
  EXPECT_EQ(tensor_group("qwen4exp", "per_layer_token_embd.weight"), TensorGroup::Ngram);
  EXPECT_EQ(tensor_group("gemma3n", "per_layer_token_embd.weight"), TensorGroup::Trunk);
}

TEST(Inspect, JsonReport) {
  InspectFile f;
  const auto j = inspect_json(f.reader());
  EXPECT_EQ(j["file"], f.path());
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["alignment"], 32);
  EXPECT_EQ(j["file_size"], fs::file_size(f.path()));
  EXPECT_EQ(j["architecture"], "qwen3moe");
  EXPECT_EQ(j["hyperparameters"]["expert_count"], 2);
  EXPECT_EQ(j["hyperparameters"]["vocab (tokenizer.ggml.tokens)"], 100);
  EXPECT_EQ(j["metadata"]["general.name"], "inspect test");
  EXPECT_EQ(j["metadata"]["tokenizer.ggml.tokens"], "[100 strings]");
  ASSERT_EQ(j["tensors"].size(), 5u);
  const auto& down = j["tensors"][2];
  EXPECT_EQ(down["name"], "blk.0.ffn_down_exps.weight");
  EXPECT_EQ(down["type"], "q8_0");
  EXPECT_EQ(down["shape"], nlohmann::ordered_json::array({32, 2, 1}));
  EXPECT_EQ(down["bytes"], 68);
  EXPECT_EQ(down["offset"], f.reader().tensor("blk.0.ffn_down_exps.weight").offset);
  EXPECT_EQ(down["group"], "experts");

  // The split: experts = the two *_exps tensors, ngram = the ngram table, trunk = the rest.
  const auto& g = j["groups"];
  EXPECT_EQ(g["experts"]["tensors"], 2);
  EXPECT_EQ(g["experts"]["bytes"], 16 + 68);
  EXPECT_EQ(g["experts"]["params"], 8 + 64);
  EXPECT_EQ(g["ngram"]["bytes"], 64);
  EXPECT_EQ(g["ngram"]["params"], 16);
  EXPECT_EQ(g["trunk"]["tensors"], 2);
  EXPECT_EQ(g["trunk"]["bytes"], 48 + 16);
  EXPECT_EQ(g["trunk"]["params"], 12 + 4);
  uint64_t bytes = 0;
  for (const TensorInfo& t : f.reader().tensors()) bytes += t.nbytes;
  EXPECT_EQ(j["total"]["bytes"], bytes);
  EXPECT_EQ(g["trunk"]["bytes"].get<uint64_t>() + g["experts"]["bytes"].get<uint64_t>() +
                g["ngram"]["bytes"].get<uint64_t>(),
            bytes);
  EXPECT_EQ(j["total"]["params"], 12 + 8 + 64 + 4 + 16);
  EXPECT_EQ(j["bytes_by_type"]["f32"]["tensors"], 3);
  EXPECT_EQ(j["bytes_by_type"]["f32"]["bytes"], 48 + 16 + 64);
  EXPECT_EQ(j["bytes_by_type"]["f16"]["bytes"], 16);
  EXPECT_EQ(j["bytes_by_type"]["q8_0"]["bytes"], 68);
}

TEST(Inspect, TextReport) {
  InspectFile f;
  const std::string text = inspect_text(f.reader());
  for (const std::string& part :
       {"file          " + f.path(), std::string("gguf          v3, alignment 32"),
        std::string("architecture  qwen3moe"), std::string("  expert_count = 2"),
        std::string("  vocab = 100 tokens"), std::string("metadata (6 keys)"),
        std::string("[100 strings]"), std::string("(16 bytes of text, 3 lines)"),
        std::string("tensors (5)"), std::string("blk.0.ffn_down_exps.weight"),
        std::string("[32, 2, 1]"), std::string("bytes by type"), std::string("split")})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  const auto split_line = [&](const std::string& group) {
    for (const std::string& l : lines(text.substr(text.find("\nsplit\n"))))
      if (l.starts_with("  " + group + " ")) return l;
    return std::string();
  };
  for (const auto& [group, tensors, bytes] :
       {std::tuple{"trunk", 2, 64}, std::tuple{"experts", 2, 84}, std::tuple{"ngram", 1, 64},
        std::tuple{"total", 5, 212}}) {
    const std::string l = split_line(group);
    EXPECT_NE(l.find(cat(" ", tensors, " tensors ")), std::string::npos) << l;
    EXPECT_NE(l.find(cat(" ", bytes, " bytes ")), std::string::npos) << l;
  }
}

TEST(Inspect, ValuesAreExact) {
  InspectFile f;
  const Reader& r = f.reader();
  EXPECT_EQ(tensor_values(r, "token_embd.weight", 100), kF32Values);  // all 12, not 100
  EXPECT_EQ(tensor_values(r, "blk.0.ffn_gate_exps.weight", 8), kF16Values);
  const auto q8 = tensor_values(r, "blk.0.ffn_down_exps.weight", 40);  // one and a part blocks
  ASSERT_EQ(q8.size(), 40u);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(q8[size_t(i)], kQ8Scale * float(InspectFile::q8_value(i / 32, i % 32))) << i;
  EXPECT_EQ(tensor_values(r, "token_embd.weight", 0).size(), 0u);

  const auto text = lines(format_values(tensor_values(r, "token_embd.weight", 12)));
  ASSERT_EQ(text.size(), 12u);
  EXPECT_EQ(text[0], "0.100000001");
  EXPECT_EQ(text[4], "-0");
  for (size_t i = 0; i < text.size(); ++i) {
    EXPECT_EQ(text[i], fmt(kF32Values[i]));
    const float back = std::strtof(text[i].c_str(), nullptr);
    EXPECT_EQ(std::memcmp(&back, &kF32Values[i], 4), 0) << text[i];  // round-trips bit-exactly
  }
}

TEST(Inspect, UnknownTensorListsSimilarNames) {
  InspectFile f;
  try {
    tensor_values(f.reader(), "blk.0.ffn_gate_exp.weight", 4);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(f.path() + ": no tensor named \"blk.0.ffn_gate_exp.weight\"; similar: "
                                  "blk.0.ffn_gate_exps.weight"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("blk.0.ffn_gate_shexp.weight"), std::string::npos) << msg;
  }
}

// Runs the built binary; returns its exit status and output (stdout and stderr).
std::pair<int, std::string> run(const std::string& args) {
  FILE* p = ::popen((std::string(STRATA_BINARY) + " " + args + " 2>&1").c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(Inspect, BinaryEndToEnd) {
  InspectFile f;
  const auto [rc, text] = run("inspect " + f.path());
  EXPECT_EQ(rc, 0) << text;
  EXPECT_EQ(text, inspect_text(f.reader()));

  const auto [rc_json, json] = run("inspect --json " + f.path());
  EXPECT_EQ(rc_json, 0) << json;
  EXPECT_EQ(nlohmann::ordered_json::parse(json), inspect_json(f.reader()));

  const auto [rc_values, values] = run("inspect " + f.path() + " --tensor blk.0.ffn_gate_exps.weight --values 3");
  EXPECT_EQ(rc_values, 0) << values;
  EXPECT_EQ(values, "0.5\n-1.25\n3\n");

  const auto [rc_bad, bad] = run("inspect " + f.path() + " --tensor nope --values 3");
  EXPECT_EQ(rc_bad, 1);
  EXPECT_NE(bad.find("strata: error: " + f.path() + ": no tensor named \"nope\""), std::string::npos) << bad;
}

}  // namespace
}  // namespace strata::gguf
