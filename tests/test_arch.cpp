// Architecture descriptions: the derived PLE tables against the reference's hashing, the
// qwen3next shapes against what llama.cpp loads, and the hparam table.
#include <gtest/gtest.h>

#include <set>

#include "model/arch.h"
#include "model/config.h"
#include "synth/presets.h"
#include "util/error.h"

namespace strata::model {
namespace {

const TensorSpec& find(const std::vector<TensorSpec>& specs, const std::string& name) {
  for (const auto& s : specs)
    if (s.name == name) return s;
  throw std::runtime_error("no tensor " + name);
}

// Values computed with the reference's own functions (_build_layer_multipliers,
// _find_nth_prime_after in modeling_qwen4_exp.py).
TEST(Arch, PleTablesMatchReferenceHashing) {
  ModelConfig c = synth::make_preset("tiny", Arch::Qwen4Exp, false).config;
  c.finalize();
  ASSERT_EQ(c.ple_tables.size(), 2u);
  EXPECT_EQ(c.ple_tables[0].multipliers, (std::vector<uint64_t>{4295158889763781ull, 17440218147737327ull, 1270917961434445ull}));
  EXPECT_EQ(c.ple_tables[0].head_sizes, (std::vector<uint64_t>{1009, 1013}));
  EXPECT_EQ(c.ple_tables[0].head_offsets, (std::vector<uint64_t>{0, 1009}));
  EXPECT_EQ(c.ple_tables[0].rows, 2048);
  // The second PLE layer hashes with ple_layer_index 1: its own multipliers, the next primes.
  EXPECT_NE(c.ple_tables[1].multipliers, c.ple_tables[0].multipliers);
  EXPECT_EQ(c.ple_tables[1].head_sizes, (std::vector<uint64_t>{1019, 1021}));

  ModelConfig f = synth::make_preset("flagship", Arch::Qwen4Exp, true).config;
  f.finalize();
  ASSERT_EQ(f.ple_tables.size(), 1u);
  EXPECT_EQ(f.ple_tables[0].multipliers, (std::vector<uint64_t>{23703573157769ull, 20109073645365ull, 8052911324071ull}));
  ASSERT_EQ(f.ple_tables[0].head_sizes.size(), 16u);
  EXPECT_EQ(f.ple_tables[0].head_sizes[0], 20000003u);
  EXPECT_EQ(f.ple_tables[0].head_sizes[15], 20000171u);
  EXPECT_EQ(f.ple_head_dim(), 160);
  // ~51B parameters, as docs/DESIGN.md says.
  EXPECT_NEAR(double(f.ple_tables[0].rows) * f.ple_head_dim(), 51.2e9, 0.1e9);
}

// Shapes from llama.cpp's qwen3next loader for the 80B-A3B (reference/llamacpp-qwen3next-gguf.md).
TEST(Arch, Qwen3NextShapesAreLlamaCpps) {
  ModelConfig c = synth::make_preset("qwen3-next-80b-a3b", Arch::Qwen3Next, false).config;
  c.finalize();
  c.validate();
  const auto s = tensor_specs(c);
  using V = std::vector<int64_t>;
  EXPECT_EQ(find(s, "token_embd.weight").shape, (V{2048, 151936}));
  EXPECT_EQ(find(s, "blk.3.attn_q.weight").shape, (V{2048, 8192}));
  EXPECT_EQ(find(s, "blk.3.attn_k.weight").shape, (V{2048, 512}));
  EXPECT_EQ(find(s, "blk.3.attn_output.weight").shape, (V{4096, 2048}));
  EXPECT_EQ(find(s, "blk.0.attn_qkv.weight").shape, (V{2048, 8192}));
  EXPECT_EQ(find(s, "blk.0.attn_gate.weight").shape, (V{2048, 4096}));
  EXPECT_EQ(find(s, "blk.0.ssm_conv1d.weight").shape, (V{4, 8192}));
  EXPECT_EQ(find(s, "blk.0.ssm_ba.weight").shape, (V{2048, 64}));
  EXPECT_EQ(find(s, "blk.0.ssm_a").shape, (V{32}));
  EXPECT_EQ(find(s, "blk.0.ssm_norm.weight").shape, (V{128}));
  EXPECT_EQ(find(s, "blk.0.ssm_out.weight").shape, (V{4096, 2048}));
  EXPECT_EQ(find(s, "blk.47.ffn_gate_exps.weight").shape, (V{2048, 512, 512}));
  EXPECT_EQ(find(s, "blk.47.ffn_down_exps.weight").shape, (V{512, 2048, 512}));
  EXPECT_EQ(find(s, "blk.47.ffn_gate_inp_shexp.weight").shape, (V{2048}));
  EXPECT_EQ(find(s, "blk.47.ffn_down_shexp.weight").shape, (V{512, 2048}));
  EXPECT_FALSE(find(s, "output.weight").required);
  EXPECT_THROW(find(s, "blk.3.attn_qkv.weight"), std::runtime_error);
}

TEST(Arch, FlagshipQwen4ExpLayout) {
  ModelConfig c = synth::make_preset("flagship", Arch::Qwen4Exp, false).config;
  c.finalize();
  c.validate();
  const auto s = tensor_specs(c);
  using V = std::vector<int64_t>;
  EXPECT_EQ(find(s, "blk.0.hc_attn_down.weight").shape, (V{10240, 320}));
  EXPECT_EQ(find(s, "blk.0.hc_ffn_inject.weight").shape, (V{10240, 4}));
  EXPECT_EQ(find(s, "blk.1.ple_key.weight").shape, (V{2560, 10240}));
  EXPECT_EQ(find(s, "blk.1.ple_conv1d.weight").shape, (V{4, 10240}));
  EXPECT_EQ(find(s, "blk.0.attn_qkv.weight").shape, (V{2560, 2 * 2048 + 6144}));
  EXPECT_EQ(find(s, "blk.3.attn_q.weight").shape, (V{2560, 24 * 256 * 2}));
  EXPECT_EQ(find(s, "blk.3.indexer.q_proj.weight").shape, (V{2560, 512}));
  EXPECT_EQ(find(s, "blk.47.ffn_down_exps.weight").shape, (V{640, 2560, 512}));
  EXPECT_EQ(find(s, "blk.48.nextn.eh_proj.weight").shape, (V{5120, 2560}));
  EXPECT_EQ(find(s, "blk.48.indexer.k_proj.weight").shape, (V{2560, 128}));
  EXPECT_EQ(find(s, "output_hc_up.weight").shape, (V{320, 10240}));
  EXPECT_EQ(find(s, "per_layer_token_embd.weight").role, Role::NgramTable);
  int64_t linear = 0;
  for (int il = 0; il < c.n_layer; ++il) linear += c.is_linear(il);
  EXPECT_EQ(linear, 36);
  EXPECT_FALSE(c.is_linear(48));  // the MTP block is QSA
}

TEST(Arch, NamesAreUniqueAndFitGgml) {
  for (Arch a : {Arch::Qwen4Exp, Arch::Qwen3Next, Arch::Qwen35Moe, Arch::Qwen3Moe}) {
    for (const auto& p : synth::preset_names()) {
      ModelConfig c = synth::make_preset(p, a, false).config;
      c.finalize();
      c.validate();
      std::set<std::string> names;
      for (const auto& s : tensor_specs(c)) {
        EXPECT_TRUE(names.insert(s.name).second) << s.name;
        EXPECT_LE(s.name.size(), 63u) << s.name;
      }
    }
  }
}

TEST(Arch, SetParsesAndRejects) {
  ModelConfig c = synth::make_preset("tiny", Arch::Qwen4Exp, false).config;
  c.set("hc_lowrank", "64");
  EXPECT_EQ(c.hc_lowrank, 64);
  c.set("rope_theta", "5e5");
  EXPECT_EQ(c.rope_theta, 5e5);
  c.set("rope_sections", "4,2,2");
  EXPECT_EQ(c.rope_sections[0], 4);
  c.set("ple_layers", "1,5");
  EXPECT_EQ(c.ple_layers, (std::vector<int64_t>{1, 5}));
  c.set("ple_layers", "none");
  EXPECT_FALSE(c.has_ple());
  EXPECT_THROW(c.set("ple_layers", "1,x"), Error);
  EXPECT_THROW(c.set("nonsense", "1"), Error);
  EXPECT_THROW(c.set("layers", "many"), Error);
  EXPECT_THROW(parse_arch("llama"), Error);
}

TEST(Arch, ValidateNamesTheProblem) {
  ModelConfig c = synth::make_preset("tiny", Arch::Qwen4Exp, false).config;
  c.ple_layers = {3};  // an attention layer
  c.finalize();
  try {
    c.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PLE layer 3"), std::string::npos) << e.what();
  }
  ModelConfig n = synth::make_preset("tiny", Arch::Qwen3Next, false).config;
  n.n_mtp = 1;
  EXPECT_THROW(n.validate(), Error);
}

}  // namespace
}  // namespace strata::model
