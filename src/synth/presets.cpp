#include "synth/presets.h"

#include "util/error.h"

namespace strata::synth {

namespace {

using model::Arch;
using model::ModelConfig;
using quant::Type;

// The reference config's n-gram vocabulary base (ngram_vocab_size_base): 16 heads of ~20M rows,
// a ~51B-parameter table.
constexpr int64_t kFullNgramBase = 20'000'000;

// A few MB with every kind of tensor: 3 DeltaNet layers + 1 attention layer, PLE and MTP on the
// architectures that have them, 8 experts top-2, and dims that are multiples of 256 wherever the
// model allows, so every block format fits (hc_lowrank 32 is the deliberate exception, which
// exercises the trunk fallback). The PLE head dim is 128 so FP8 rows fit its 128-element blocks.
ModelConfig tiny(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.n_vocab = 512;
  c.n_embd = 256;
  c.n_layer = 4;
  c.n_ctx = 4096;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 64;
  c.rope_dim = arch == Arch::Qwen3Moe ? 64 : 16;
  c.rope_theta = 1e7;
  c.rope_sections = {3, 3, 2, 0};
  c.n_ff = 512;
  c.n_expert = 8;
  c.n_expert_used = 2;
  c.n_ff_exp = 256;
  c.n_ff_shexp = arch == Arch::Qwen3Moe ? 0 : 256;
  c.ssm_conv = 4;
  c.ssm_state = 64;
  c.ssm_groups = 2;
  c.ssm_v_heads = 4;
  c.hc_count = 4;
  c.hc_lowrank = 32;
  c.idx_heads = 2;
  c.idx_head_dim = 64;
  c.idx_top_k = 8;  // two blocks: the window tests take the sparse path
  c.idx_block = 4;
  if (arch == Arch::Qwen4Exp) c.ple_layers = {1, 2};  // two tables, hashed differently
  c.ple_ngram = 3;
  c.ple_heads_per_ngram = 1;
  c.ple_conv = 4;
  c.ngram_vocab_base = 1000;
  c.ngram_vocab_divisor = 128;
  c.ple_seed = 1234;
  c.image_token = 0;
  c.n_mtp = (arch == Arch::Qwen4Exp || arch == Arch::Qwen35Moe) ? 1 : 0;
  return c;
}

// Qwen3.8-Flash-Next. docs/DESIGN.md: 48 layers (12 x (3 GDN + 1 QSA)), hidden 2560, 512 experts
// top-10, expert and shared widths 640, vocab 248320, HC 4 x 320, PLE at layer 1, QSA budget
// 2048, one MTP block. The published GGUF metadata of the real checkpoint: 24 query heads of 256,
// 2 KV heads, partial rope 64 with sections 11/11/10, rope base 1e7, 262144 context, 48 DeltaNet
// v heads (inner 6144) over 16 k heads of 128, indexer 4 heads of 128, PLE eos 248044, image
// token 248056. The reference config: conv kernels 4, n-gram size 3 with 8 heads per order
// (16 heads of 2560/16 = 160), n-gram seed 1234, table padded to 128 rows, rms eps 1e-6,
// indexer block 4.
ModelConfig flagship(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.n_vocab = 248320;
  c.n_embd = 2560;
  c.n_layer = 48;
  c.n_ctx = 262144;
  c.n_head = 24;
  c.n_head_kv = 2;
  c.head_dim = 256;
  c.rope_dim = arch == Arch::Qwen3Moe ? 256 : 64;
  c.rope_theta = 1e7;
  c.rope_sections = {11, 11, 10, 0};
  c.n_ff = 640;
  c.n_expert = 512;
  c.n_expert_used = 10;
  c.n_ff_exp = 640;
  c.n_ff_shexp = arch == Arch::Qwen3Moe ? 0 : 640;
  c.ssm_conv = 4;
  c.ssm_state = 128;
  c.ssm_groups = 16;
  c.ssm_v_heads = 48;
  c.hc_count = 4;
  c.hc_lowrank = 320;
  c.idx_heads = 4;
  c.idx_head_dim = 128;
  c.idx_top_k = 2048;
  c.idx_block = 4;
  c.ple_layers = {1};
  c.ple_ngram = 3;
  c.ple_heads_per_ngram = 8;
  c.ple_conv = 4;
  // 1/20 of the real table (16 heads of ~1M rows, 2.9 GB at FP8_E4M3 instead of ~58 GB): still far
  // larger than any cache, so every lookup is a random row read as with the real one, but the
  // file fits next to the experts on a benchmark disk. --ngram-full restores the real size.
  c.ngram_vocab_base = 1'000'000;
  c.ngram_vocab_divisor = 128;
  c.ple_seed = 1234;
  c.ple_eos = 248044;
  c.image_token = 248056;
  c.n_mtp = (arch == Arch::Qwen4Exp || arch == Arch::Qwen35Moe) ? 1 : 0;
  return c;
}

// Qwen3-Next-80B-A3B (its HF config.json, and reference/llamacpp-qwen3next-gguf.md): 48 layers,
// hidden 2048, 16 query heads of 256, 2 KV heads, partial rope 64, base 1e7, 262144 context,
// intermediate 5120, 512 experts top-10 of 512 plus a 512 shared expert, DeltaNet 16 k heads and
// 32 v heads of 128, vocab 151936. Its MTP block is not written: llama.cpp's qwen3next loader
// has no place for it. The HC/QSA/PLE values only matter for --arch qwen4exp and follow the
// flagship, scaled to hidden 2048.
ModelConfig qwen3_next_80b(Arch arch) {
  ModelConfig c = flagship(arch);
  c.n_vocab = 151936;
  c.n_embd = 2048;
  c.n_head = 16;
  c.n_ff = 5120;
  c.n_ff_exp = 512;
  c.n_ff_shexp = arch == Arch::Qwen3Moe ? 0 : 512;
  c.ssm_v_heads = 32;
  c.ple_eos = 151643;  // <|endoftext|> in Qwen3's vocabulary
  c.image_token = 151655;
  c.n_mtp = 0;
  return c;
}

}  // namespace

std::vector<std::string> preset_names() { return {"tiny", "flagship", "qwen3-next-80b-a3b"}; }

Preset make_preset(std::string_view name, Arch arch, bool ngram_full) {
  Preset p;
  if (name == "tiny") {
    p = {tiny(arch), Type::Q8_0, Type::Q4_K, Type::FP8_E4M3};
  } else if (name == "flagship") {
    p = {flagship(arch), Type::Q8_0, Type::Q4_K, Type::FP8_E4M3};
  } else if (name == "qwen3-next-80b-a3b") {
    p = {qwen3_next_80b(arch), Type::Q8_0, Type::Q4_K, Type::FP8_E4M3};
  } else {
    fail("unknown preset '", name, "' (known: tiny, flagship, qwen3-next-80b-a3b)");
  }
  if (ngram_full) p.config.ngram_vocab_base = kFullNgramBase;
  return p;
}

}  // namespace strata::synth
