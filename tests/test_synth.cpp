// strata synth: every architecture's tiny model round-trips through the GGUF reader with the
// spec list's names, shapes and types, finite sane values, and the same bytes for the same seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "model/arch.h"
#include "quant/kernels.h"
#include "synth/synth.h"
#include "util/error.h"

namespace strata::synth {
namespace {

using gguf::testing::TempDir;
using gguf::testing::read_bytes;

SynthOptions tiny(const std::string& arch, const std::string& out) {
  SynthOptions o;
  o.arch = arch;
  o.preset = "tiny";
  o.output = out;
  o.progress = false;
  return o;
}

std::string error_of(const SynthOptions& o) {
  try {
    run_synth(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class SynthArch : public ::testing::TestWithParam<std::string> {};

TEST_P(SynthArch, TinyRoundTrips) {
  TempDir dir;
  const SynthReport r = run_synth(tiny(GetParam(), dir.file("m.gguf")));
  const auto reader = gguf::Reader::open(dir.file("m.gguf"));
  const model::ModelConfig c = model::ModelConfig::read(*reader);
  EXPECT_EQ(c.arch, r.plan.config.arch);
  EXPECT_EQ(c.n_layer, r.plan.config.n_layer);
  EXPECT_EQ(c.n_mtp, r.plan.config.n_mtp);
  EXPECT_EQ(c.n_expert, r.plan.config.n_expert);
  EXPECT_EQ(c.ple_layers, r.plan.config.ple_layers);
  ASSERT_EQ(c.ple_tables.size(), r.plan.config.ple_tables.size());
  for (size_t k = 0; k < c.ple_tables.size(); ++k) {
    EXPECT_EQ(c.ple_tables[k].rows, r.plan.config.ple_tables[k].rows);
    EXPECT_EQ(c.ple_tables[k].multipliers, r.plan.config.ple_tables[k].multipliers);
  }
  model::validate_tensors(*reader, c);
  ASSERT_EQ(reader->tensors().size(), r.plan.specs.size());

  const std::string a = GetParam();
  for (const char* k : {"block_count", "embedding_length", "context_length", "attention.head_count",
                        "attention.layer_norm_rms_epsilon", "expert_count", "expert_used_count"})
    EXPECT_NE(reader->find(a + "." + k), nullptr) << k;
  if (a != "qwen3moe") {
    for (const char* k : {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size"})
      EXPECT_NE(reader->find(a + "." + k), nullptr) << k;
  }
  if (a == "qwen4exp") {
    for (const char* k : {"hyper_connection.count", "hyper_connection.low_rank", "attention.indexer.top_k",
                          "ple.layers", "ple.head_vocab_sizes", "rope.dimension_sections", "nextn_predict_layers"})
      EXPECT_NE(reader->find(a + "." + k), nullptr) << k;
  }
  EXPECT_EQ(reader->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(reader->get("tokenizer.ggml.tokens").as_array().size(), size_t(c.n_vocab));

  for (size_t i = 0; i < r.plan.specs.size(); ++i) {
    const auto& s = r.plan.specs[i];
    const gguf::TensorInfo& t = reader->tensor(s.name);
    EXPECT_EQ(t.type, r.plan.types[i]) << s.name;
    std::vector<float> v(size_t(t.n_elements()));
    quant::dequantize(t.type, t.data, v.data(), t.n_elements());
    double sum = 0, lo = 1e30, hi = -1e30;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << s.name;
      sum += double(x) * x;
      lo = std::min<double>(lo, x);
      hi = std::max<double>(hi, x);
    }
    const double rms = std::sqrt(sum / double(v.size()));
    switch (s.init) {
      case model::Init::Matrix: {
        const double want = 1.0 / std::sqrt(double(s.shape[0]));
        EXPECT_GT(rms, 0.5 * want) << s.name;
        EXPECT_LT(rms, 2.0 * want) << s.name;
        break;
      }
      case model::Init::Norm: EXPECT_NEAR(rms, 1.0, 0.1) << s.name; break;
      case model::Init::SsmA: EXPECT_LT(hi, 0.0) << s.name; EXPECT_GE(lo, -16.0) << s.name; break;
      case model::Init::SsmDt: EXPECT_NEAR(rms, 1.0, 0.3) << s.name; break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, SynthArch, ::testing::Values("qwen4exp", "qwen3next", "qwen35moe", "qwen3moe"));

TEST(Synth, SameSeedSameBytes) {
  TempDir dir;
  SynthOptions o = tiny("qwen4exp", dir.file("a.gguf"));
  o.seed = 7;
  run_synth(o);
  o.output = dir.file("b.gguf");
  run_synth(o);
  o.output = dir.file("c.gguf");
  o.seed = 8;
  run_synth(o);
  const auto a = read_bytes(dir.file("a.gguf"));
  EXPECT_EQ(a, read_bytes(dir.file("b.gguf")));
  EXPECT_NE(a, read_bytes(dir.file("c.gguf")));
}

TEST(Synth, OverridesReachTheFile) {
  TempDir dir;
  SynthOptions o = tiny("qwen4exp", dir.file("m.gguf"));
  o.layers = 8;
  o.experts = 16;
  o.sets = {{"hc_lowrank", "64"}, {"expert_ff", "512"}};
  o.expert_type = "iq2_xs";
  o.trunk_type = "q4_k";
  run_synth(o);
  const auto r = gguf::Reader::open(o.output);
  EXPECT_EQ(r->get_u64("qwen4exp.block_count"), 9u);
  EXPECT_EQ(r->tensor("blk.7.ffn_gate_exps.weight").shape, (std::vector<int64_t>{256, 512, 16}));
  EXPECT_EQ(r->tensor("blk.7.ffn_gate_exps.weight").type, quant::Type::IQ2_XS);
  EXPECT_EQ(r->tensor("blk.0.hc_attn_up.weight").shape, (std::vector<int64_t>{64, 1024}));
  // hc_lowrank 64 rows are not whole q4_K blocks: the fallback type takes them.
  EXPECT_EQ(r->tensor("blk.0.hc_attn_up.weight").type, quant::Type::Q4_0);
  EXPECT_EQ(r->tensor("blk.0.attn_qkv.weight").type, quant::Type::Q4_K);
}

TEST(Synth, BadOptionsGiveClearErrors) {
  TempDir dir;
  SynthOptions o = tiny("qwen4exp", dir.file("m.gguf"));
  o.arch = "llama";
  EXPECT_NE(error_of(o).find("unknown architecture 'llama'"), std::string::npos);
  o.arch = "qwen4exp";
  o.preset = "huge";
  EXPECT_NE(error_of(o).find("unknown preset 'huge'"), std::string::npos);
  o.preset = "tiny";
  o.expert_type = "q9_z";
  EXPECT_NE(error_of(o).find("--expert-type: unknown weight type 'q9_z'"), std::string::npos);
  o.arch = "qwen3moe";  // qwen4exp pads its down rows instead (docs/ARCH_QWEN4EXP.md)
  o.expert_type = "iq2_xs";
  o.sets = {{"expert_ff", "320"}};
  o.fallback_type = "none";
  const std::string e = error_of(o);
  EXPECT_NE(e.find("ffn_down_exps.weight [320, 256, 8]"), std::string::npos) << e;
  EXPECT_NE(e.find("ne0 = 320"), std::string::npos) << e;
  o.sets = {{"experts_used", "99"}};
  EXPECT_NE(error_of(o).find("experts_used (99)"), std::string::npos);
  o.sets = {{"bogus", "1"}};
  EXPECT_NE(error_of(o).find("unknown hparam 'bogus'"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(o.output));
}

TEST(Synth, CliReportsErrors) {
  TempDir dir;
  const std::string cmd = std::string(STRATA_BINARY) + " synth --arch llama -o " + dir.file("m.gguf") +
                          " 2> " + dir.file("err.txt");
  const int rc = std::system(cmd.c_str());
  EXPECT_NE(rc, 0);
  const auto err = read_bytes(dir.file("err.txt"));
  EXPECT_NE(std::string(err.begin(), err.end()).find("unknown architecture 'llama'"), std::string::npos);
}

}  // namespace
}  // namespace strata::synth
