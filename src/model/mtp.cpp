// The MTP (NextN) head: one block after the trunk that drafts the token after next from the
// trunk's hidden state and the next token (docs/DESIGN.md, "Speculative decoding"; the wiring is the
// published Qwen3-Next MTP module's, docs/SPECULATION.md "The MTP head"):
// - qwen35moe: x = eh_proj(concat(enorm(embed(token)), hnorm(hidden))), hidden being the trunk's
//   output after its final norm; then a full-attention MoE block (the trunk's layer function at
//   block index n_layer, with the head's own KV cache); then shared_head_norm (checkpoint
//   mtp.norm) and the shared LM head. The normed output is the next chained step's hidden.
// - qwen4exp: hidden is the four residual streams before the final mixer; each stream of the
//   block's input is eh_proj(concat(enorm(e), hnorm(h)_s)); the block is a QSA + MoE block with
//   its mixers; the head's own final mixer (nextn.hc_head_*) feeds the shared LM head, and the
//   block's output streams are the chained step's hidden.
// Rows sit at the positions of their hidden states (vLLM's convention: row t at state.n_past + t).
#include "model/forward_common.h"
#include "model/model.h"
#include "model/qwen4exp.h"
#include "model/window_scope.h"
#include "util/error.h"

namespace strata::model {

std::vector<float> Model::mtp_forward(std::span<const int32_t> tokens, std::span<const float> hidden,
                                      State& state, LogitsMode mode, std::vector<float>* hidden_out,
                                      std::vector<int32_t>* greedy, std::vector<float>* probs,
                                      DraftVocab vocab) {
  const ModelConfig& c = config_;
  const int64_t T = int64_t(tokens.size()), n = c.n_embd, hcols = hidden_cols();
  if (!has_mtp()) fail("mtp: the model has no MTP block (nextn_predict_layers is 0)");
  if (T == 0) fail("mtp: the window has no tokens");
  if (int64_t(hidden.size()) != T * hcols)
    fail("mtp: ", hidden.size(), " hidden values for ", T, " rows of ", hcols);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab)
      fail("mtp: token ", tokens[i], " at row ", i, " is outside the vocabulary (0..", c.n_vocab - 1, ")");
  if (int64_t(state.layers.size()) != c.n_blocks()) fail("mtp: the state is not an MTP state of this model");
  if (state.n_past + T > state.n_ctx())
    fail("mtp: context overflow: ", state.n_past, " positions done + ", T, " new exceed ", state.n_ctx());
  if (!vocab.whole() && vocab.head >= vocab.tail_first) vocab = {};  // the ranges cover every id
  if (!vocab.whole()) {
    if (vocab.head < 0 || vocab.tail_first > c.n_vocab)
      fail("mtp: draft vocabulary [0, ", vocab.head, ") + [", vocab.tail_first, ", ", c.n_vocab,
           ") is outside the vocabulary of ", c.n_vocab);
    if (!greedy || mode != LogitsMode::Last)
      fail("mtp: a draft vocabulary gives the last row's greedy choice only");
  }

  ExpertWindow expert_window(*experts_);
  const KeyPart part{T, mode, &state};
  BackendWindow backend_window(backend_, window_key(std::span(&part, 1), dump_ != nullptr,
                                                    host_steps(false, *experts_),
                                                    {.mtp = true, .hidden = hidden_out != nullptr,
                                                     .greedy = greedy != nullptr,
                                                     .draft_head = vocab.head,
                                                     .draft_tail_first = vocab.tail_first}));
  Window w{backend_, c, weights_, *experts_, state, {}, tokens, T, renormalize_topk_, dump_, Scratch(backend_)};
  for (int64_t t = 0; t < T; ++t) w.pos.push_back(int32_t(state.n_past + t));
  const int64_t il = c.n_layer;  // the first MTP block; chained steps reuse it
  const LayerWeights& L = weights_.layers[size_t(il)];
  const bool hc = c.arch == Arch::Qwen4Exp;
  const float eps = float(c.rms_eps);
  // Every upload before the block, as in Model::forward.
  Scratch keep(backend_);
  w.positions = keep.ids(w.pos, T, 1);
  if (c.has_qsa()) qsa_start_window(w, keep);
  Tensor e = keep(T, n), h = keep(T, hcols), x = keep(T, hc ? c.hc_dim() : n);
  backend_.get_rows(weights_.token_embd, keep.ids(tokens, T, 1), e);
  backend_.upload(hidden.data(), h);
  WindowLogits result(backend_, keep, mode == LogitsMode::All ? T : 1, greedy, probs);
  if (hc) {
    qwen4exp_mtp_input(w, L, e, h, x);
  } else {
    Tensor cat = w.tmp(T, 2 * n);
    backend_.rms_norm(e, &L.nextn_enorm, n, eps, cat.cols_view(0, n));  // pre_fc_norm_embedding
    backend_.rms_norm(h, &L.nextn_hnorm, n, eps, cat.cols_view(n, n));  // pre_fc_norm_hidden
    backend_.matmul(L.nextn_eh_proj, cat, x);                           // fc(cat(e, h))
  }
  w.tmp.clear();
  w.dump("mtp_in", -1, x);
  layer_function(c.arch)(w, il, x);
  w.tmp.clear();
  Tensor out;
  if (hc) {
    out = qwen4exp_mtp_output(w, L, mode == LogitsMode::All ? x : x.rows_view(T - 1, 1));
  } else {
    out = keep(T, n);
    const Weight& g = present(L.nextn_shared_head_norm) ? L.nextn_shared_head_norm : weights_.output_norm;
    backend_.rms_norm(x, &g, n, eps, out);  // norm(hidden_states)
  }
  const Tensor hidden_rows = hc ? x : out;  // read back after the window, with the logits
  if (!hc && mode == LogitsMode::Last) out = out.rows_view(T - 1, 1);
  w.dump("mtp_out", -1, out);
  Tensor logits = keep(out.rows, vocab.size(c.n_vocab));
  if (vocab.whole()) {
    backend_.matmul(weights_.output, out, logits);  // the shared lm_head
  } else {
    // One row (LogitsMode::Last), so each range's columns are a contiguous row of their own.
    const int64_t tail = c.n_vocab - vocab.tail_first;
    backend_.matmul(lm_head_rows(0, vocab.head), out, {logits.data, 1, vocab.head, vocab.head});
    if (tail > 0)
      backend_.matmul(lm_head_rows(vocab.tail_first, tail), out,
                      {logits.data + vocab.head, 1, tail, tail});
  }
  result.choose(logits);
  backend_window.end();
  if (hidden_out) {
    hidden_out->resize(size_t(hidden_rows.rows * hidden_rows.cols));
    backend_.download(hidden_rows, hidden_out->data());
  }
  state.n_past += T;
  std::vector<float> rows = result.read(logits);
  if (greedy)
    for (int32_t& id : *greedy)
      if (id >= 0) id = vocab.id(id);
  return rows;
}

backend::Weight Model::lm_head_rows(int64_t first, int64_t n) const {
  backend::Weight w = weights_.output;
  w.data = static_cast<const uint8_t*>(w.data) + size_t(first) * w.row_stride;
  w.rows = n;
  return w;
}

}  // namespace strata::model
