// qwen4exp QSA (Qwen4ExpTextAttention with Qwen4ExpTextQSAIndexer, modeling_qwen4_exp.py): the
// gated attention of qwen3next, restricted per query to the key blocks an indexer picks. Block
// b is positions b*B .. b*B + B - 1 (B = idx_block); its key is the mean of their raw index keys,
// k_norm'ed and roped at b*B. A query at position p scores each complete visible block with
// sum over index heads of relu(q_h . key_b) / sqrt(di), keeps the best idx_top_k / B of them plus
// the incomplete tail (p+1 not a multiple of B: the last (p+1) % B positions) and attends to those
// positions only. With at most idx_top_k / B complete blocks it is dense causal attention; the
// query itself is not kept when its block is complete and loses (docs/FIXTURES.md).
//
// The backend scores the blocks (block_scores); the top-k runs on the host over the downloaded
// scores (T x blocks), as the router's does, and the restricted attention is the backend's
// attention_selected. Pooling a completed block reads its 4 raw keys back from the backend.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/qwen4exp.h"

namespace strata::model {

namespace {

// Block keys of the blocks this window completes, into st.idx_blocks (the reference recomputes
// them per query from the raw keys it caches; they do not change once a block is complete).
void update_blocks(Window& w, const LayerWeights& L, LayerState& st) {
  const int64_t B = w.c.idx_block, di = w.c.idx_head_dim, n_past = w.pos.front();
  const int64_t first = n_past / B, last = (n_past + w.T) / B;  // new blocks: [first, last)
  if (last == first) return;
  const int64_t nb = last - first;
  std::vector<float> raw(size_t(nb * B * di)), pooled(size_t(nb * di));
  w.be.download(st.idx_k.rows_view(first * B, nb * B), raw.data());
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t j = 0; j < di; ++j) {
      float sum = 0.0f;  // key_groups.float().mean(dim=1)
      for (int64_t r = 0; r < B; ++r) sum += raw[size_t((b * B + r) * di + j)];
      pooled[size_t(b * di + j)] = sum / float(B);
    }
  Tensor keys = w.tmp(nb, di);
  w.be.upload(pooled.data(), keys);
  w.be.rms_norm(keys, &L.indexer_k_norm, di, float(w.c.rms_eps), keys);  // k_layernorm(pooled_keys)
  std::vector<int32_t> starts(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) starts[size_t(b)] = int32_t((first + b) * B);
  w.be.rope_neox(keys, starts, di, w.c.rope_dim, float(w.c.rope_theta));  // rope at group_starts
  w.be.copy(keys, st.idx_blocks.rows_view(first, nb));
}

// The positions each window row attends to, ascending: row t's are
// selected[offsets[t] .. offsets[t + 1]).
struct Selection {
  std::vector<int32_t> selected;
  std::vector<int64_t> offsets{0};
};

Selection select_positions(Window& w, const LayerState& st, const Tensor& iq) {
  const ModelConfig& c = w.c;
  const int64_t B = c.idx_block, top = c.idx_top_k / B;
  const int64_t blocks = (w.pos.back() + 1) / B;
  // scores = relu(q . block_key_states^T).sum over heads / sqrt(index_head_dim), complete blocks
  std::vector<int32_t> counts(size_t(w.T));
  for (int64_t t = 0; t < w.T; ++t) counts[size_t(t)] = int32_t((w.pos[size_t(t)] + 1) / B);
  std::vector<float> scores(size_t(w.T * blocks));
  if (blocks > 0) {
    Tensor y = w.tmp(w.T, blocks);
    w.be.block_scores(iq, st.idx_blocks.rows_view(0, blocks), counts, c.idx_heads, c.idx_head_dim,
                      1.0f / std::sqrt(float(c.idx_head_dim)), y);
    w.be.download(y, scores.data());
  }
  Selection out;
  std::vector<int64_t> order;
  for (int64_t t = 0; t < w.T; ++t) {
    const int64_t p = w.pos[size_t(t)], nb = counts[size_t(t)];
    const float* score = scores.data() + t * blocks;
    // scores.topk(min(block_topk, blocks)); ties (unspecified in torch) go to the earlier block.
    order.resize(size_t(nb));
    std::iota(order.begin(), order.end(), 0);
    const int64_t keep = std::min(top, nb);
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
      return score[a] != score[b] ? score[a] > score[b] : a < b;
    });
    order.resize(size_t(keep));
    std::sort(order.begin(), order.end());
    for (int64_t b : order)
      for (int64_t r = 0; r < B; ++r) out.selected.push_back(int32_t(b * B + r));
    for (int64_t r = nb * B; r <= p; ++r) out.selected.push_back(int32_t(r));  // the incomplete tail
    out.offsets.push_back(int64_t(out.selected.size()));
  }
  return out;
}

}  // namespace

// Qwen4ExpTextAttention.forward
Tensor sparse_attention(Window& w, int64_t il, const Tensor& x) {
  const ModelConfig& c = w.c;
  const LayerWeights& L = w.w.layers[size_t(il)];
  LayerState& st = w.state.layers[size_t(il)];
  backend::Backend& be = w.be;
  const int64_t h = c.n_head, g = c.n_head_kv, d = c.head_dim, di = c.idx_head_dim;
  const float eps = float(c.rms_eps), theta = float(c.rope_theta);

  // self.indexer(hidden_states, ...): index queries (q_layernorm, rope) and raw keys (cached)
  Tensor iq = w.tmp(w.T, c.idx_heads * di), ik = w.tmp(w.T, di);
  be.matmul(L.indexer_q_proj, x, iq);
  be.rms_norm(iq, &L.indexer_q_norm, di, eps, iq);
  be.rope_neox(iq, w.pos, di, c.rope_dim, theta);
  be.matmul(L.indexer_k_proj, x, ik);
  be.copy(ik, st.idx_k.rows_view(w.pos.front(), w.T));  // past_key_values.update_indexer
  update_blocks(w, L, st);
  const Selection sel = select_positions(w, st, iq);

  const GatedQuery qg = gated_query(w, il, x);
  Tensor o = w.tmp(w.T, h * d);
  // attention_interface(..., attention_mask & selected_token_mask)
  be.attention_selected(qg.q, st.k_cache, st.v_cache, sel.selected, sel.offsets, h, g, d,
                        1.0f / std::sqrt(float(d)), o);
  return gated_output(w, il, o, qg.gate);
}

}  // namespace strata::model
