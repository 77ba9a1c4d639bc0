// strata convert on the reference fixtures (f32, so values must come through bit-exact, transforms
// included), on edited copies of them (fused experts, a missing and an unused tensor) and on a
// small synthetic FP8 checkpoint (exact FP8 re-blocking, dequantization, K-quant output).
#include <gtest/gtest.h>

#include <cmath>

#include "convert/convert.h"
#include "convert/safetensors.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "quant/fp8.h"
#include "quant/kernels.h"
#include "test_convert_util.h"
#include "util/error.h"

namespace strata::convert {
namespace {

using namespace testing;
using quant::Type;

ConvertReport convert(const fs::path& in, const std::string& out, const std::string& trunk = "f32",
                      const std::string& expert = "f32") {
  ConvertOptions o;
  o.input_dir = in.string();
  o.output = out;
  o.trunk_type = trunk;
  o.expert_type = expert;
  o.ngram_type = "f32";
  o.progress = false;
  return run_convert(o);
}

std::string convert_error(const fs::path& in, const std::string& out) {
  try {
    convert(in, out);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// A GGUF tensor as fp32 rows (any type), and an F32 safetensors tensor.
std::vector<float> gguf_values(const gguf::Reader& r, const std::string& name) {
  const auto& t = r.tensor(name);
  std::vector<float> v(size_t(t.n_elements()));
  quant::dequantize(t.type, t.data, v.data(), t.n_elements());
  return v;
}

std::vector<float> st_values(const Checkpoint& c, const std::string& name) {
  const StTensor* t = c.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  std::vector<float> v(size_t(t->n_elements()));
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

// Rows [r0, r0 + n) of a row-major matrix with `cols` columns.
std::vector<float> rows(const std::vector<float>& m, int64_t cols, int64_t r0, int64_t n) {
  return std::vector<float>(m.begin() + r0 * cols, m.begin() + (r0 + n) * cols);
}

std::vector<float> plus_one(std::vector<float> v) {
  for (float& x : v) x += 1.0f;
  return v;
}

struct Converted {
  std::unique_ptr<gguf::Reader> reader;
  model::ModelConfig config;
};

Converted open_checked(const std::string& path) {
  Converted c{gguf::Reader::open(path), {}};
  c.config = model::ModelConfig::read(*c.reader);
  model::validate_tensors(*c.reader, c.config);
  return c;
}

TEST(Convert, Qwen3MoeFixture) {
  ScratchDir dir;
  convert(fixture_dir("qwen3_moe"), dir.file("m.gguf"));
  const auto [r, c] = open_checked(dir.file("m.gguf"));
  const Checkpoint ck = Checkpoint::open(fixture_dir("qwen3_moe").string());
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.rope_dim, 32);
  EXPECT_EQ(c.n_expert, 16);
  EXPECT_EQ(gguf_values(*r, "token_embd.weight"), st_values(ck, "model.embed_tokens.weight"));
  EXPECT_EQ(gguf_values(*r, "output.weight"), st_values(ck, "lm_head.weight"));
  // qwen3moe norms are plain w.
  EXPECT_EQ(gguf_values(*r, "blk.0.attn_norm.weight"), st_values(ck, "model.layers.0.input_layernorm.weight"));
  EXPECT_EQ(gguf_values(*r, "blk.2.ffn_norm.weight"), st_values(ck, "model.layers.2.post_attention_layernorm.weight"));
  // Expert 5 of the stacked {16, 64, 16} down projection.
  EXPECT_EQ(rows(gguf_values(*r, "blk.1.ffn_down_exps.weight"), 16, 5 * 64, 64),
            st_values(ck, "model.layers.1.mlp.experts.5.down_proj.weight"));
  EXPECT_EQ(r->get_string("tokenizer.ggml.model"), "gpt2");
}

TEST(Convert, Qwen3NextFixture) {
  ScratchDir dir;
  convert(fixture_dir("qwen3_next"), dir.file("m.gguf"));
  const auto [r, c] = open_checked(dir.file("m.gguf"));
  const Checkpoint ck = Checkpoint::open(fixture_dir("qwen3_next").string());
  EXPECT_EQ(c.full_attn_interval, 4);
  EXPECT_EQ(c.rope_dim, 8);
  const std::string L = "model.layers.4.linear_attn.";
  std::vector<float> a = st_values(ck, L + "A_log");
  for (float& x : a) x = -std::exp(x);
  EXPECT_EQ(gguf_values(*r, "blk.4.ssm_a"), a);
  EXPECT_EQ(gguf_values(*r, "blk.4.attn_norm.weight"), plus_one(st_values(ck, "model.layers.4.input_layernorm.weight")));
  EXPECT_EQ(gguf_values(*r, "blk.3.attn_q_norm.weight"), plus_one(st_values(ck, "model.layers.3.self_attn.q_norm.weight")));
  EXPECT_EQ(gguf_values(*r, "output_norm.weight"), plus_one(st_values(ck, "model.norm.weight")));
  EXPECT_EQ(gguf_values(*r, "blk.4.ssm_norm.weight"), st_values(ck, L + "norm.weight"));
  EXPECT_EQ(gguf_values(*r, "blk.4.ssm_ba.weight"), st_values(ck, L + "in_proj_ba.weight"));
  EXPECT_EQ(gguf_values(*r, "blk.4.ssm_conv1d.weight"), st_values(ck, L + "conv1d.weight"));
  EXPECT_EQ(gguf_values(*r, "blk.4.ffn_gate_inp_shexp.weight"), st_values(ck, "model.layers.4.mlp.shared_expert_gate.weight"));
  // in_proj_qkvz per key head g (2 heads, state 16, 2 v heads each): [q 16 | k 16 | v 32 | z 32].
  const auto qkvz = st_values(ck, L + "in_proj_qkvz.weight");
  const auto qkv = gguf_values(*r, "blk.4.attn_qkv.weight"), z = gguf_values(*r, "blk.4.attn_gate.weight");
  EXPECT_EQ(rows(qkv, 64, 16, 16), rows(qkvz, 64, 96, 16));        // q of key head 1
  EXPECT_EQ(rows(qkv, 64, 32 + 16, 16), rows(qkvz, 64, 96 + 16, 16));  // k of key head 1
  EXPECT_EQ(rows(qkv, 64, 64 + 32, 32), rows(qkvz, 64, 96 + 32, 32));  // v of key head 1
  EXPECT_EQ(rows(z, 64, 32, 32), rows(qkvz, 64, 96 + 64, 32));         // z of key head 1
}

TEST(Convert, Qwen35MoeFixtureTiledValueHeads) {
  ScratchDir dir;
  convert(fixture_dir("qwen3_5_moe"), dir.file("m.gguf"));
  const auto [r, c] = open_checked(dir.file("m.gguf"));
  const Checkpoint ck = Checkpoint::open(fixture_dir("qwen3_5_moe").string());
  EXPECT_EQ(c.rope_sections[0], 4);
  const std::string L = "model.layers.0.linear_attn.";
  // 2 key heads, 4 value heads of 16: GGUF slot j * 2 + g holds HF head g * 2 + j, so slot 1 is head 2.
  EXPECT_EQ(rows(gguf_values(*r, "blk.0.attn_gate.weight"), 64, 16, 16), rows(st_values(ck, L + "in_proj_z.weight"), 64, 32, 16));
  EXPECT_EQ(rows(gguf_values(*r, "blk.0.attn_qkv.weight"), 64, 64 + 16, 16),
            rows(st_values(ck, L + "in_proj_qkv.weight"), 64, 64 + 32, 16));
  EXPECT_EQ(rows(gguf_values(*r, "blk.0.attn_qkv.weight"), 64, 0, 64), rows(st_values(ck, L + "in_proj_qkv.weight"), 64, 0, 64));
  EXPECT_EQ(gguf_values(*r, "blk.0.ssm_beta.weight")[64 + 7], st_values(ck, L + "in_proj_b.weight")[2 * 64 + 7]);
  EXPECT_EQ(gguf_values(*r, "blk.0.ssm_a")[1], -std::exp(st_values(ck, L + "A_log")[2]));
  EXPECT_EQ(gguf_values(*r, "blk.0.ssm_dt.bias")[2], st_values(ck, L + "dt_bias")[1]);
  const auto out = gguf_values(*r, "blk.0.ssm_out.weight"), hf = st_values(ck, L + "out_proj.weight");
  for (int row = 0; row < 64; ++row)
    for (int k = 0; k < 16; ++k) ASSERT_EQ(out[row * 64 + 16 + k], hf[row * 64 + 32 + k]) << row;
  const auto conv = gguf_values(*r, "blk.0.ssm_conv1d.weight"), hfc = st_values(ck, L + "conv1d.weight");
  EXPECT_EQ(rows(conv, 4, 64 + 16, 16), rows(hfc, 4, 64 + 32, 16));
}

// The qwen4_exp fixture has two PLE layers (ple_layer_ids [2, 5]): each gets its own table, and the
// converter checks each layer's hash buffers against the ones the config derives.
TEST(Convert, Qwen4ExpFixture) {
  ScratchDir dir;
  const fs::path in = fixture_dir("qwen4_exp");
  convert(in, dir.file("m.gguf"));
  const auto [r, c] = open_checked(dir.file("m.gguf"));
  const Checkpoint ck = Checkpoint::open(in.string());
  EXPECT_EQ(c.ple_layers, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(c.idx_block, 4);
  ASSERT_EQ(c.ple_tables.size(), 2u);
  EXPECT_EQ(c.ple_tables[0].rows, 2304);
  EXPECT_EQ(gguf_values(*r, "blk.3.hc_attn_norm.weight"), plus_one(st_values(ck, "model.layers.3.attn_hyper_connection.hc_norm.weight")));
  EXPECT_EQ(gguf_values(*r, "blk.0.hc_ffn_inject.weight"), st_values(ck, "model.layers.0.mlp_hyper_connection.block_inject_weight.weight"));
  EXPECT_EQ(gguf_values(*r, "output_hc_norm.weight"), plus_one(st_values(ck, "model.hyper_connection_mixer.hc_norm.weight")));
  const auto qk = st_values(ck, "model.layers.3.self_attn.indexer.index_qk_proj.weight");
  EXPECT_EQ(gguf_values(*r, "blk.3.indexer.q_proj.weight"), rows(qk, 64, 0, 128));
  EXPECT_EQ(gguf_values(*r, "blk.3.indexer.k_proj.weight"), rows(qk, 64, 128, 32));
  EXPECT_EQ(gguf_values(*r, "blk.3.indexer.k_norm.weight"), plus_one(st_values(ck, "model.layers.3.self_attn.indexer.k_layernorm.weight")));
  for (const int il : {1, 4}) {
    const std::string b = "blk." + std::to_string(il) + ".", m = "model.layers." + std::to_string(il) + ".ple.";
    EXPECT_EQ(gguf_values(*r, b + "ple_norm_conv.weight"), plus_one(st_values(ck, m + "norm_conv.weight")));
    EXPECT_EQ(gguf_values(*r, b + "ple_conv1d.weight"), st_values(ck, m + "conv1d.weight"));
    const auto table = gguf_values(*r, il == 1 ? "per_layer_token_embd.weight" : b + "per_layer_token_embd.weight");
    const int64_t shard_rows = c.ple_tables[il == 1 ? 0 : 1].rows / 4;
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(rows(table, 8, shard_rows * k, shard_rows),
                st_values(ck, m + "ple_embedding.ngram_embedding.shard_" + std::to_string(k) + ".weight"));
  }
  // 2 key heads, 6 value heads: slot 1 (j 0, g 1) is HF head 3.
  EXPECT_EQ(gguf_values(*r, "blk.0.ssm_alpha.weight")[64 + 9], st_values(ck, "model.layers.0.linear_attn.in_proj_a.weight")[3 * 64 + 9]);
}

TEST(Convert, FusedGateUpExpertsSplit) {
  ScratchDir dir;
  edited_fixture("qwen3_5_moe", dir.path() / "in", [](std::vector<Entry>& e) {
    std::vector<Entry> out;
    for (int l = 0; l < 8; ++l) {
      const std::string M = "model.layers." + std::to_string(l) + ".mlp.experts.";
      Entry gu{M + "gate_up_proj", "F32", {16, 32, 64}, {}}, dn{M + "down_proj", "F32", {16, 64, 16}, {}};
      for (int x = 0; x < 16; ++x)
        for (const char* part : {"gate_proj", "up_proj", "down_proj"})
          for (const auto& t : e)
            if (t.name == M + std::to_string(x) + "." + part + ".weight")
              (std::string(part) == "down_proj" ? dn : gu).data.insert((std::string(part) == "down_proj" ? dn : gu).data.end(), t.data.begin(), t.data.end());
      out.push_back(gu);
      out.push_back(dn);
    }
    std::erase_if(e, [](const Entry& t) { return t.name.find(".mlp.experts.") != std::string::npos; });
    e.insert(e.end(), out.begin(), out.end());
  });
  convert(dir.path() / "in", dir.file("fused.gguf"));
  convert(fixture_dir("qwen3_5_moe"), dir.file("plain.gguf"));
  const auto fused = open_checked(dir.file("fused.gguf"));
  const auto plain = gguf::Reader::open(dir.file("plain.gguf"));
  for (int l = 0; l < 8; ++l)
    for (const char* t : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      const std::string name = "blk." + std::to_string(l) + "." + t + ".weight";
      EXPECT_EQ(gguf_values(*fused.reader, name), gguf_values(*plain, name)) << name;
    }
}

TEST(Convert, MissingAndUnusedTensorsAreErrors) {
  ScratchDir dir;
  edited_fixture("qwen3_moe", dir.path() / "missing", [](std::vector<Entry>& e) {
    std::erase_if(e, [](const Entry& t) { return t.name == "model.layers.2.self_attn.k_norm.weight"; });
  });
  std::string err = convert_error(dir.path() / "missing", dir.file("m.gguf"));
  EXPECT_NE(err.find("missing HF tensor model.layers.2.self_attn.k_norm.weight [32] (needed for blk.2.attn_k_norm.weight)"),
            std::string::npos) << err;
  edited_fixture("qwen3_moe", dir.path() / "extra", [](std::vector<Entry>& e) {
    e.push_back({"model.layers.0.mlp.mystery.weight", "F32", {2}, bytes_of({1, 2})});
  });
  err = convert_error(dir.path() / "extra", dir.file("m.gguf"));
  EXPECT_NE(err.find("1 HF tensor(s) have no place"), std::string::npos) << err;
  EXPECT_NE(err.find("model.layers.0.mlp.mystery.weight"), std::string::npos) << err;
  edited_fixture("qwen3_moe", dir.path() / "shape", [](std::vector<Entry>& e) {
    for (auto& t : e)
      if (t.name == "model.layers.0.self_attn.q_norm.weight") t = {t.name, "F32", {16}, bytes_of(std::vector<float>(16))};
  });
  err = convert_error(dir.path() / "shape", dir.file("m.gguf"));
  EXPECT_NE(err.find("has shape [16]; blk.0.attn_q_norm.weight needs [32]"), std::string::npos) << err;
  edited_fixture("qwen3_moe", dir.path() / "arch", {}, [](nlohmann::json& j) { j["model_type"] = "llama"; });
  err = convert_error(dir.path() / "arch", dir.file("m.gguf"));
  EXPECT_NE(err.find("model_type 'llama' is not supported (supported: qwen3_moe"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir.file("m.gguf")));
}

TEST(Convert, QuantizedTypesWithFallback) {
  ScratchDir dir;
  const ConvertReport rep = convert(fixture_dir("qwen3_moe"), dir.file("q.gguf"), "q8_0", "q4_k");
  const auto [r, c] = open_checked(dir.file("q.gguf"));
  EXPECT_EQ(r->tensor("token_embd.weight").type, Type::Q8_0);
  EXPECT_EQ(r->tensor("blk.0.ffn_gate_exps.weight").type, Type::F16);  // ne0 64: no whole Q4_K block
  EXPECT_EQ(r->tensor("blk.0.attn_norm.weight").type, Type::F32);
  bool noted = false;
  for (const auto& n : rep.notes) noted |= n.find("blk.0.ffn_gate_exps.weight: f16 (q4_K does not divide ne0 = 64)") != std::string::npos;
  EXPECT_TRUE(noted);
  const Checkpoint ck = Checkpoint::open(fixture_dir("qwen3_moe").string());
  const auto want = st_values(ck, "model.embed_tokens.weight"), got = gguf_values(*r, "token_embd.weight");
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 0.02f * std::max(1.0f, std::fabs(want[i]))) << i;
}

// A one-layer qwen3moe at 256 wide whose experts are FP8 with 128x128 block scales.
void fp8_checkpoint(const fs::path& dst) {
  fs::create_directories(dst);
  uint32_t seed = 12345;
  auto rnd = [&] { seed = seed * 1664525u + 1013904223u; return seed >> 8; };
  auto f32 = [&](std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = float(int(rnd() % 2001) - 1000) / 1000.0f;
    return Entry{"", "F32", shape, bytes_of(v)};
  };
  std::vector<Entry> e;
  auto add = [&](const std::string& name, Entry t) { t.name = name; e.push_back(std::move(t)); };
  add("model.embed_tokens.weight", f32({300, 256}));
  add("lm_head.weight", f32({300, 256}));
  add("model.norm.weight", f32({256}));
  const std::string P = "model.layers.0.";
  add(P + "input_layernorm.weight", f32({256}));
  add(P + "post_attention_layernorm.weight", f32({256}));
  add(P + "self_attn.q_proj.weight", f32({256, 256}));
  add(P + "self_attn.k_proj.weight", f32({128, 256}));
  add(P + "self_attn.v_proj.weight", f32({128, 256}));
  add(P + "self_attn.o_proj.weight", f32({256, 256}));
  add(P + "self_attn.q_norm.weight", f32({128}));
  add(P + "self_attn.k_norm.weight", f32({128}));
  add(P + "mlp.gate.weight", f32({2, 256}));
  for (int x = 0; x < 2; ++x)
    for (const char* part : {"gate_proj", "up_proj", "down_proj"}) {
      Entry w{P + "mlp.experts." + std::to_string(x) + "." + part + ".weight", "F8_E4M3", {256, 256}, std::vector<uint8_t>(65536)};
      for (auto& b : w.data) b = uint8_t(rnd()) % 0x7f | (rnd() & 0x80);  // never the NaN codes
      std::vector<float> s(4);
      for (float& v : s) v = float(1 + rnd() % 100) / 4096.0f;
      e.push_back(w);
      e.push_back({w.name + "_scale_inv", "F32", {2, 2}, bytes_of(s)});
    }
  write_file((dst / "model.safetensors").string(), safetensors_image(e));
  std::ofstream((dst / "config.json").string()) << R"({"model_type":"qwen3_moe","vocab_size":300,"hidden_size":256,
    "num_hidden_layers":1,"max_position_embeddings":1024,"num_attention_heads":2,"num_key_value_heads":1,
    "head_dim":128,"num_experts":2,"num_experts_per_tok":1,"moe_intermediate_size":256,"rms_norm_eps":1e-6,
    "eos_token_id":1,"quantization_config":{"quant_method":"fp8","weight_block_size":[128,128]}})";
}

TEST(Convert, Fp8CheckpointExactReblockDequantAndKQuant) {
  ScratchDir dir;
  fp8_checkpoint(dir.path() / "in");
  const Checkpoint ck = Checkpoint::open((dir.path() / "in").string());
  const StTensor& w = *ck.find("model.layers.0.mlp.experts.1.up_proj.weight");
  const StTensor& s = *ck.find("model.layers.0.mlp.experts.1.up_proj.weight_scale_inv");
  auto scale = [&](int row, int col) {
    float v;
    std::memcpy(&v, s.data + 4 * ((row / 128) * 2 + col / 128), 4);
    return v;
  };

  const ConvertReport fp8 = convert(dir.path() / "in", dir.file("fp8.gguf"), "f32", "fp8");
  EXPECT_EQ(fp8.fp8_exact, 3u);
  const auto r8 = open_checked(dir.file("fp8.gguf"));
  const auto& t8 = r8.reader->tensor("blk.0.ffn_up_exps.weight");
  ASSERT_EQ(t8.type, Type::FP8_E4M3);
  const auto* blocks = reinterpret_cast<const quant::BlockFP8*>(t8.data) + 256 * 8;  // expert 1
  for (int row = 0; row < 256; ++row)
    for (int k = 0; k < 8; ++k) {
      ASSERT_EQ(blocks[row * 8 + k].scale, scale(row, k * 32));
      ASSERT_EQ(0, std::memcmp(blocks[row * 8 + k].q, w.data + row * 256 + k * 32, 32)) << row;
    }

  convert(dir.path() / "in", dir.file("f32.gguf"));
  const auto r32 = open_checked(dir.file("f32.gguf"));
  const auto up = gguf_values(*r32.reader, "blk.0.ffn_up_exps.weight");
  for (int row = 0; row < 256; ++row)
    for (int col = 0; col < 256; ++col)
      ASSERT_EQ(up[size_t(256 * 256 + row * 256 + col)], quant::e4m3_to_float(w.data[row * 256 + col]) * scale(row, col));

  convert(dir.path() / "in", dir.file("q4k.gguf"), "q8_0", "q4_k");
  const auto rq = open_checked(dir.file("q4k.gguf"));
  const auto& tq = rq.reader->tensor("blk.0.ffn_up_exps.weight");
  ASSERT_EQ(tq.type, Type::Q4_K);
  std::vector<uint8_t> want(tq.nbytes);
  quant::kernels(Type::Q4_K).quantize(up.data(), want.data(), int64_t(up.size()));
  EXPECT_EQ(0, std::memcmp(tq.data, want.data(), want.size()));
}

}  // namespace
}  // namespace strata::convert
