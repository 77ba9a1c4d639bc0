// Hyperparameters of the Qwen MoE family, one struct for all four architectures, and their GGUF
// form. Each architecture reads and writes only the keys its loader knows (the table in
// config.cpp says which); names follow llama.cpp ("qwen3next.ssm.state_size"), so files we write
// load there and files its converter writes load here.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::gguf {
class Reader;
class Writer;
}  // namespace strata::gguf

namespace strata::model {

enum class Arch { Qwen4Exp, Qwen3Next, Qwen35Moe, Qwen3Moe };

// GGUF general.architecture names.
const char* arch_name(Arch a);
// Throws strata::Error listing the known names.
Arch parse_arch(std::string_view name);
// Archs with Gated DeltaNet (linear attention) layers between the attention layers.
bool has_gdn(Arch a);

struct ModelConfig {
  Arch arch = Arch::Qwen3Moe;

  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;  // trunk blocks; block_count in the file adds n_mtp
  int64_t n_ctx = 0;
  double rms_eps = 1e-6;

  // Attention (full / QSA layers). rope_dim < head_dim is partial rotary (NeoX style).
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;
  double rope_theta = 1e4;
  // Multimodal rope sections (qwen35moe, qwen4exp): text uses them all at one position, so they
  // only need to be present and sum to at most rope_dim / 2.
  std::array<int64_t, 4> rope_sections{};
  int64_t n_ff = 0;  // HF intermediate_size; informational for these all-MoE models

  // MoE.
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_ff_shexp = 0;  // shared expert width (qwen3next family); 0 = none

  // Gated DeltaNet. Layer i is linear iff (i + 1) % full_attn_interval != 0.
  int64_t full_attn_interval = 4;
  int64_t ssm_conv = 0;     // conv kernel
  int64_t ssm_state = 0;    // head dim of q/k and of v
  int64_t ssm_groups = 0;   // k heads
  int64_t ssm_v_heads = 0;  // v heads (= time_step_rank)

  // qwen4exp: hyper-connections.
  int64_t hc_count = 0;
  int64_t hc_lowrank = 0;
  // qwen4exp: QSA indexer.
  int64_t idx_heads = 0;
  int64_t idx_head_dim = 0;
  int64_t idx_top_k = 0;  // token budget
  int64_t idx_block = 0;  // tokens mean-pooled into one scored block
  // qwen4exp: PLE. Each PLE layer (0-based, in the checkpoint's ple_layer_ids order; empty = none)
  // has its own n-gram table and hash, derived by finalize() from its position k in this list (the
  // reference's ple_layer_index) the way the reference does; ngram_vocab_base, ngram_vocab_divisor and ple_seed
  // only feed that derivation.
  std::vector<int64_t> ple_layers;
  int64_t ple_ngram = 0;
  int64_t ple_heads_per_ngram = 0;
  int64_t ple_embed_dim = 0;  // 0: hidden, the reference's default
  int64_t ple_conv = 0;
  int64_t ngram_vocab_base = 0;
  int64_t ngram_vocab_divisor = 0;
  int64_t ple_seed = 0;
  int64_t ple_eos = 0;
  int64_t image_token = 0;
  struct PleTable {
    std::vector<uint64_t> multipliers;   // one per n-gram position
    std::vector<uint64_t> head_offsets;  // first table row of each head
    std::vector<uint64_t> head_sizes;    // rows of each head (distinct primes across all tables)
    int64_t rows = 0;                    // table rows, padded to ngram_vocab_divisor
  };
  std::vector<PleTable> ple_tables;  // one per ple_layers entry

  int64_t n_mtp = 0;  // MTP / NextN blocks after the trunk

  // Derived sizes.
  int64_t n_blocks() const { return n_layer + n_mtp; }
  bool is_linear(int64_t il) const;  // a GDN layer (never an MTP block)
  bool is_mtp(int64_t il) const { return il >= n_layer; }
  bool has_ple() const { return arch == Arch::Qwen4Exp && !ple_layers.empty(); }
  bool has_qsa() const { return arch == Arch::Qwen4Exp && idx_block > 0; }
  // Index of layer il among the PLE layers, or -1.
  int64_t ple_index(int64_t il) const;
  // GGUF name of PLE layer k's n-gram table: the first keeps llama.cpp's global name, further
  // ones (which llama.cpp does not support) are per block.
  std::string ple_table_name(int64_t k) const;
  int64_t ple_heads() const { return (ple_ngram - 1) * ple_heads_per_ngram; }
  int64_t ple_head_dim() const { return ple_embed_dim / ple_heads(); }
  int64_t hc_dim() const { return hc_count * n_embd; }
  int64_t ssm_key_dim() const { return ssm_state * ssm_groups; }
  int64_t ssm_value_dim() const { return ssm_state * ssm_v_heads; }
  int64_t ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }

  // Resolves ple_embed_dim 0 and recomputes the derived PLE tables (none without PLE).
  void finalize();
  // Throws strata::Error naming the first hparam that is out of range for this architecture.
  void validate() const;

  // Sets one hparam by its short name (the names `strata synth --set` takes); throws on an
  // unknown name or an unparsable value.
  void set(std::string_view name, std::string_view value);
  static std::vector<std::string> settable_names();

  // Writes general.architecture and every hparam key of this architecture.
  void write(gguf::Writer& writer) const;
  // Reads a file's hparams; throws naming the file and key when a required one is missing.
  static ModelConfig read(const gguf::Reader& reader);
};

}  // namespace strata::model
