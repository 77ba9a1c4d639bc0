// The MTP drafter: drafts with the model's MTP head (Model::mtp_forward), greedily, chained for
// depth > 1 (each step feeds the head its own output hidden state and the token it drafted).
// The head keeps its own KV cache: the trunk's hidden state of every position reaches it once,
// in a catch-up window that runs just before the next draft (all rows since the last draft in
// one pass), so its attention sees the whole sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model/model.h"
#include "tokenizer/vocab.h"

namespace strata::spec {

// The ids the MTP head drafts from (docs/SPECULATION.md, "Draft vocabulary"): [0, head) and the
// trailing run of ids that are not ordinary text tokens (control and added tokens such as
// <|im_end|>, <tool_call> or </think>, then the padding; ids past the tokenizer's count too).
// Byte-level BPE numbers tokens in merge order, the frequent ones first. head 0, or ranges that
// leave nothing out, give the whole vocabulary.
model::DraftVocab draft_vocab(const tokenizer::Vocab& vocab, int64_t head, int64_t n_vocab);

// --draft-vocab's default for a head computing on `backend`: 65536 ids on the CPU, where the LM
// head is most of a draft's time (151936 rows on Qwen3-Next), and every id on an accelerator,
// where it costs little and the ids left out (about 2% of the tokens of code, tool calls and
// prose) would cost acceptance (docs/SPECULATION.md, "Draft vocabulary").
int64_t default_draft_vocab(const backend::Backend& backend);

// The draft vocabulary of --draft-vocab `head` (unset: the default for the model's backend).
model::DraftVocab draft_vocab(const model::Model& model, const tokenizer::Vocab& vocab,
                              std::optional<int64_t> head);

class MtpDrafter {
 public:
  MtpDrafter(model::Model& model, int64_t n_ctx, model::DraftVocab vocab = {});

  // The trunk's hidden states of positions first.. (rows of Model::hidden_cols()). A position
  // at or before earlier ones replaces them (the sequence was rolled back or re-prompted). At
  // most kMaxPending rows wait for the next draft: older ones are dropped, so a head that
  // SpecGate leaves idle costs neither memory nor a long catch-up window later (the dropped
  // positions' cache rows stay stale, which only lowers its acceptance). A head that drafts every
  // window has at most a window's rows pending; 16 bounds what a probe after a pause pays (each
  // pending row is one head row: a full catch-up after 64 idle windows cost 12% of decode on the
  // 12-layer 80B shape, docs/PERFORMANCE.md).
  void observe(int64_t first, std::span<const float> hidden);
  static constexpr int64_t kMaxPending = 16;

  struct Drafts {
    std::vector<int32_t> tokens;
    std::vector<float> probs;  // the head's probability for each drafted token
    double catch_up_seconds = 0;  // the catch-up window's share of the drafting time
    int catch_up_rows = 0;        // its rows besides the one the first draft's step needed
  };
  // Up to k drafts after history.back() (at position history.size() - 1); history[p] is the
  // token at position p. Empty when the hidden state before the last token was not observed.
  Drafts draft(std::span<const int32_t> history, int k);

 private:
  model::Model& model_;
  model::State state_;
  model::DraftVocab vocab_;
  int64_t first_ = 0;          // position of rows_'s first row
  std::vector<float> rows_;    // observed hidden states not yet in the head's cache
  std::vector<float> chain_;   // a step's output hidden state
};

}  // namespace strata::spec
