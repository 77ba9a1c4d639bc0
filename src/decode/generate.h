// A generation session: one model state that a sequence of prompts runs against. Each call
// makes the state hold the prompt, reusing the longest prefix it already holds (a chat turn
// re-renders the whole conversation, and the earlier turns must not be prefilled again), then
// samples token by token and streams text through a callback. No terminal or HTTP code here:
// `strata run` and the server both drive it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decode/sampler.h"
#include "model/model.h"
#include "spec/speculator.h"
#include "tokenizer/tokenizer.h"

namespace strata::decode {

struct GenerateParams {
  SamplingParams sampling;
  int64_t max_tokens = 256;
  int64_t batch = 512;  // rows per prefill window
  std::vector<std::string> stop;

  // Polled before every forward (each prefill window and each decoded token); returning true ends
  // the call with FinishReason::Cancelled. A server ends a dropped client's or an expired
  // request's generation here.
  std::function<bool()> should_stop;
  // Edits each step's logits (n_vocab entries) in place before sampling: a constrained decoder
  // sets the tokens it forbids to -infinity here.
  std::function<void(std::span<float> logits)> logits_filter;
  // Sees each sampled token that the output keeps (not the end-of-generation token), after it is
  // sampled and before the next step's logits_filter, so a constraint can advance its state.
  std::function<void(int32_t id)> on_token;
  // With SessionOptions::snapshot_prompt: where in the prompt to keep the state copy. A chat
  // server passes the end of the conversation before the generation prompt, which the next turn
  // re-renders with the reply (and a template may render differently, e.g. Qwen3 without its
  // empty <think> block). Outside (reused prefix, prompt end]: the prompt's end, unless the
  // snapshot already held lies within the reused prefix, which is then kept.
  int64_t snapshot_at = -1;
  // Benchmarks only (strata bench --continue-from): the output is these tokens instead of the
  // chosen ones, each still computed and chosen as usual (docs/SPECULATION.md, "Measuring it
  // honestly"); the generation ends with them.
  std::vector<int32_t> forced;

  // Throws strata::Error naming the parameter that is out of range.
  void validate() const;
};

// What one generate() call cost. The streaming-cache fields stay empty until the expert cache
// reports them; they print as "-".
struct Telemetry {
  int64_t prompt_tokens = 0;  // prefilled by this call
  int64_t reused_tokens = 0;  // already in the state from an earlier call
  double prefill_seconds = 0;
  int64_t generated_tokens = 0;
  int64_t decode_steps = 0;   // decode windows (one token each, or one plus drafts)
  int64_t decode_tokens = 0;  // tokens those windows kept; the first token comes from the prefill
  double decode_seconds = 0;
  std::optional<double> cache_hit_rate;  // 0..1
  std::optional<double> ssd_gb_per_s;
  std::optional<double> stall_ms_per_token;
  std::optional<double> h2d_gb_per_s;  // copies into device expert slots, over the copy time
  std::optional<double> host_hit_rate;  // device misses the host tier answered (0..1)
  std::optional<double> handshake_us;   // device time waiting for the host per layer's handshake
  std::optional<spec::Report> spec;  // when speculation is on

  std::optional<double> prefill_tok_per_s() const;
  std::optional<double> decode_tok_per_s() const;
};

// "prompt 42 tok, prefill 512.3 tok/s | 64 tok, decode 23.1 tok/s | cache hit - | ssd - GB/s |
// stall - ms/tok"; ", 120 reused" follows the prompt count when the state was reused, and
// " | h2d 21.3 GB/s" the stall when decode copied experts into device slots, then
// " | host tier 97.5% of misses" with a host tier, " | handshake 9.8 us" where windows ran on a
// device.
std::string format_telemetry(const Telemetry& t);

// The expert cache's share of the decode phase, from its counters over that phase (`tm`'s
// decode_seconds and decode_steps already set).
void fill_cache_telemetry(Telemetry& tm, const experts::CacheStats& d);

enum class FinishReason { Eos, Stop, Length, Cancelled };

struct GenerateResult {
  std::vector<int32_t> tokens;  // sampled ids, the end-of-generation token excluded
  std::string text;             // what was streamed: decoded, cut before a stop string
  FinishReason finish = FinishReason::Length;
  std::string stop_sequence;    // with FinishReason::Stop: the stop string that ended it
  Telemetry telemetry;
};

// Receives each piece of text as soon as it is safe to show: whole UTF-8 characters, never part
// of a stop string.
using PieceFn = std::function<void(const std::string& piece)>;

struct SessionOptions {
  int64_t n_ctx = 4096;
  // Copy the state after each prompt's prefill so the next prompt can roll back to it when it
  // diverges inside the reply (a chat template re-rendering the assistant turn differently).
  // Costs one state copy per call; a one-shot run leaves it off.
  bool snapshot_prompt = false;
  spec::Options spec{};  // speculative decoding (off unless set; strata run/serve/bench default auto)
};

class Session {
 public:
  // The model and tokenizer must outlive the session.
  Session(model::Model& model, const tokenizer::Tokenizer& tokenizer,
          const SessionOptions& options);

  // Runs `prompt` (non-empty) and generates after it. Throws strata::Error for an empty prompt or
  // one that does not fit the context, and for bad params. Generation also ends when the context
  // is full (FinishReason::Length).
  GenerateResult generate(std::span<const int32_t> prompt, const GenerateParams& params,
                          const PieceFn& on_piece);

  // Forgets everything the state holds.
  void reset();

  // The tokens whose positions the state holds, in order.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // How many of `prompt`'s tokens the next generate() would reuse instead of prefilling.
  int64_t reusable(std::span<const int32_t> prompt) const;
  int64_t n_ctx() const { return state_.n_ctx(); }
  spec::Speculator& speculator() { return speculator_; }
  // The model state (what tokens() lists), for inspection.
  const model::State& state() const { return state_; }

 private:
  friend class SequenceRun;  // sequence_run.h: the same generation, one window at a time

  // generate() after its checks; a throw leaves the state half-advanced (generate resets it).
  GenerateResult run(std::span<const int32_t> prompt, const GenerateParams& params,
                     const PieceFn& on_piece);
  // Brings the state to hold prompt[0, n) for the largest n it can reuse, n < prompt.size().
  int64_t reuse_prefix(std::span<const int32_t> prompt);
  // Where this prompt's prefill copies the state (GenerateParams::snapshot_at); -1: nowhere.
  int64_t snapshot_position(const GenerateParams& params, int64_t reused, int64_t n) const;
  void keep_snapshot();
  bool is_end(int32_t id) const;

  model::Model& model_;
  const tokenizer::Tokenizer& tokenizer_;
  SessionOptions options_;
  model::State state_;
  std::vector<int32_t> tokens_;
  std::optional<model::State> snapshot_;
  int64_t snapshot_len_ = 0;
  std::vector<int32_t> end_ids_;
  spec::Speculator speculator_;
};

}  // namespace strata::decode
