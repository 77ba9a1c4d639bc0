// qwen4exp PLE (Qwen4ExpTextNGramEmbedding, Qwen4ExpTextPLELayer in modeling_qwen4_exp.py):
// hashed n-gram ids pick rows of the layer's table, fetched row by row (the flagship's table is
// ~51B parameters and is never loaded whole); they are projected to one value and one key per
// stream, the keys gate the value into each stream, and a dilated causal conv adds context.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "model/qwen4exp.h"
#include "util/error.h"

namespace strata::model {

std::vector<int32_t> ple_ngram_ids(const ModelConfig& c, int64_t k, std::span<const int32_t> history,
                                   std::span<const int32_t> tokens) {
  const ModelConfig::PleTable& table = c.ple_tables[size_t(k)];
  const int64_t ctx = c.ple_ngram - 1, heads = c.ple_heads();
  std::vector<int32_t> seq(history.begin(), history.end());
  seq.insert(seq.end(), tokens.begin(), tokens.end());
  std::vector<int32_t> ids;
  ids.reserve(tokens.size() * size_t(heads));
  std::vector<int64_t> shifted(size_t(c.ple_ngram));
  for (size_t t = 0; t < tokens.size(); ++t) {
    const size_t i = size_t(ctx) + t;
    // _shift_right_ignore_eos: token i - s, or eos once an eos lies in i - s .. i - 1.
    bool reset = false;
    for (int64_t s = 0; s < c.ple_ngram; ++s) {
      if (s > 0) reset = reset || seq[i - size_t(s)] == c.ple_eos;
      shifted[size_t(s)] = reset ? c.ple_eos : seq[i - size_t(s)];
    }
    for (int64_t h = 0; h < heads; ++h) {
      // mixed_ids = xor over the n-gram's positions of token * layer_multipliers[position]
      // (int64 arithmetic, wrapping), then torch.remainder by the head's prime + its offset.
      const int64_t n = 2 + h / c.ple_heads_per_ngram;
      uint64_t mixed = 0;
      for (int64_t p = 0; p < n; ++p) mixed ^= uint64_t(shifted[size_t(p)]) * table.multipliers[size_t(p)];
      const int64_t size = int64_t(table.head_sizes[size_t(h)]);
      int64_t r = int64_t(mixed) % size;
      if (r < 0) r += size;
      ids.push_back(int32_t(r + int64_t(table.head_offsets[size_t(h)])));
    }
  }
  return ids;
}

void ple_advance_history(std::vector<int32_t>& history, std::span<const int32_t> tokens) {
  std::vector<int32_t> seq(history.begin(), history.end());
  seq.insert(seq.end(), tokens.begin(), tokens.end());
  std::copy(seq.end() - std::ptrdiff_t(history.size()), seq.end(), history.begin());
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

void ple_start_window(Window& w, Scratch& keep, bool prefetch) {
  const ModelConfig& c = w.c;
  const size_t heads = size_t(c.ple_heads());
  // Each sequence's rows hash with its own history; a window of one is its only sequence.
  std::vector<WindowSequence> sequences = w.sequences;
  if (sequences.empty()) sequences.push_back({0, w.T, &w.state});
  w.ple_ids.clear();
  std::vector<int32_t> window_ids(size_t(w.T) * heads), head_major(window_ids.size());
  const Clock::time_point start = Clock::now();
  for (size_t k = 0; k < c.ple_tables.size(); ++k) {
    for (const WindowSequence& s : sequences) {
      const std::vector<int32_t> ids = ple_ngram_ids(c, int64_t(k), s.state->ple_history,
                                                     w.tokens.subspan(size_t(s.first), size_t(s.rows)));
      const size_t first = size_t(s.first) * heads, rows = size_t(s.rows);
      std::copy(ids.begin(), ids.end(), window_ids.begin() + std::ptrdiff_t(first));
      for (size_t h = 0; h < heads; ++h)
        for (size_t t = 0; t < rows; ++t) head_major[first + h * rows + t] = ids[t * heads + h];
    }
    if (prefetch) w.be.prefetch_rows(w.w.ple_tables[k], window_ids);
    w.ple_ids.push_back(keep.ids(head_major, int64_t(heads), w.T));
  }
  if (prefetch && w.ple_counters) w.ple_counters->issue_seconds += seconds_since(start);
}

// Qwen4ExpTextPLELayer.forward
Tensor ple_layer(Window& w, int64_t il, const Tensor& x) {
  const ModelConfig& c = w.c;
  const LayerWeights& L = w.w.layers[size_t(il)];
  LayerState& st = w.state.layers[size_t(il)];
  backend::Backend& be = w.be;
  const int64_t k = c.ple_index(il), n = c.n_embd, hc = c.hc_count, heads = c.ple_heads(), hd = c.ple_head_dim();

  // embeddings = self.ple_embedding(input_ids): one table row per n-gram head, side by side.
  // The ids are known from the window's tokens alone: hashed on the host and uploaded head-major
  // before layer 0 (ple_start_window).
  if (size_t(k) >= w.ple_ids.size() || w.ple_ids[size_t(k)].rows != heads || w.ple_ids[size_t(k)].cols != w.T)
    fail("internal error: PLE layer ", il, " runs in a window whose n-gram ids were not hashed");
  const backend::Ids head_ids = w.ple_ids[size_t(k)];
  Tensor emb = w.tmp(w.T, heads * hd);
  const Clock::time_point gather_start = Clock::now();
  for (int64_t h = 0; h < heads; ++h)
    be.get_rows(w.w.ple_tables[size_t(k)], head_ids.rows_view(h, 1), emb.cols_view(h * hd, hd));
  if (w.ple_counters) {
    w.ple_counters->rows += uint64_t(head_ids.size());
    w.ple_counters->gather_seconds += seconds_since(gather_start);
  }
  Tensor key = w.tmp(w.T, c.hc_dim()), value = w.tmp(w.T, n);
  be.matmul(L.ple_key, emb, key);
  const Tensor key_normed = norm_streams(w, key, L.ple_norm_key);  // norm_key(key_proj(embeddings))
  be.matmul(L.ple_value, emb, value);                               // value_proj(embeddings)
  const Tensor query_normed = norm_streams(w, x, L.ple_norm_query);  // norm_query(hidden_states)
  // gate = (key_normed * query_normed).sum(-1) / sqrt(hidden); sign(gate) sqrt(max(|gate|, 1e-6))
  Tensor gate = w.tmp(w.T, hc);
  be.signed_sqrt_dot(key_normed, query_normed, n, 1.0f / std::sqrt(float(n)), gate);
  // gated_value = sigmoid(gate) * value.unsqueeze(-2), flattened to the streams
  Tensor gated = w.tmp(w.T, c.hc_dim());
  for (int64_t s = 0; s < hc; ++s) be.mul_sigmoid(value, gate.cols_view(s, 1), gated.cols_view(s * n, n));
  const Tensor gated_normed = norm_streams(w, gated, L.ple_norm_conv);  // norm_conv(gated_value)
  // _short_conv: silu(depthwise conv, kernel ple_conv, dilation ngram_size) over the previous
  // inputs (the state) and the window's
  Tensor out = w.tmp(w.T, c.hc_dim());
  if (w.journal) w.journal->conv(st.ple_conv, gated_normed, L.ple_conv1d, c.ple_ngram);
  be.conv1d_dilated_silu(gated_normed, st.ple_conv, L.ple_conv1d, c.ple_ngram, out);
  be.add(gated, out, out);  // gated_value + self._short_conv(gated_value_normed, ...)
  return out;
}

}  // namespace strata::model
