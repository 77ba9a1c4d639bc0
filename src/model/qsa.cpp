// qwen4exp QSA (Qwen4ExpTextAttention with Qwen4ExpTextQSAIndexer, modeling_qwen4_exp.py): the
// gated attention of qwen3next, restricted per query to the key blocks an indexer picks. Block
// b is positions b*B .. b*B + B - 1 (B = idx_block); its key is the mean of their raw index keys,
// k_norm'ed and roped at b*B. A query at position p scores each complete visible block with
// sum over index heads of relu(q_h . key_b) / sqrt(di), keeps the best idx_top_k / B of them plus
// the incomplete tail (p+1 not a multiple of B: the last (p+1) % B positions) and attends to those
// positions only. With at most idx_top_k / B complete blocks it is dense causal attention; the
// query itself is not kept when its block is complete and loses (docs/FIXTURES.md).
//
// Everything runs on the backend: pooling a completed block's keys (block_mean), scoring the
// blocks (block_scores), the top-k choice (qsa_select) and the restricted attention
// (attention_selected). Each op has the same shape at every position, the positions entering as
// uploaded values, so a recorded window replays anywhere in the sequence: a window pools one
// candidate block key per row (zeros for a row that completes no block) and stores only the
// completed ones, and the scores span every block the cache has room for.
#include <algorithm>
#include <cmath>

#include "model/qwen4exp.h"
#include "util/error.h"

namespace strata::model {

namespace {

// Block keys of the blocks this window completes (qsa_start_window), into st.idx_blocks (the
// reference recomputes them per query from the raw keys it caches; they do not change once a block
// is complete).
void update_blocks(Window& w, const LayerWeights& L, LayerState& st) {
  const int64_t B = w.c.idx_block, di = w.c.idx_head_dim;
  if (w.qsa_blocks.rows != w.T || w.qsa_blocks.cols != 1 || w.qsa_block_starts.rows != w.T ||
      w.qsa_block_starts.cols != 1)
    fail("internal error: a QSA layer runs in a window whose key blocks were not uploaded");
  Tensor keys = w.tmp(w.T, di);
  w.be.block_mean(st.idx_k, w.qsa_block_starts, B, keys);  // key_groups.float().mean(dim=1)
  w.be.rms_norm(keys, &L.indexer_k_norm, di, float(w.c.rms_eps), keys);  // k_layernorm(pooled_keys)
  w.be.rope_neox(keys, w.qsa_block_starts, di, w.c.rope_dim, float(w.c.rope_theta));  // rope at group_starts
  w.be.set_rows(keys, w.qsa_blocks, st.idx_blocks);
}

// The positions each window row attends to, ascending: row t's are selected[t, 0 .. counts[t]).
struct Selection {
  backend::Ids selected, counts;
};

Selection select_positions(Window& w, const LayerState& st, const Tensor& iq) {
  const ModelConfig& c = w.c;
  const int64_t B = c.idx_block, top = c.idx_top_k / B;
  // scores = relu(q . block_key_states^T).sum over heads / sqrt(index_head_dim), complete blocks
  // (row t sees (p_t + 1) / B of them; the columns past that are zeros nobody reads)
  Tensor scores = w.tmp(w.T, std::max<int64_t>(st.idx_blocks.rows, 1));
  w.be.block_scores(iq, st.idx_blocks, w.positions, B, c.idx_heads, c.idx_head_dim,
                    1.0f / std::sqrt(float(c.idx_head_dim)), scores);
  // scores.topk(min(block_topk, blocks)), expanded to positions, plus the incomplete tail
  Selection out{w.tmp.ids(w.T, top * B + B - 1), w.tmp.ids(w.T, 1)};
  w.be.qsa_select(scores, w.positions, B, top, out.selected, out.counts);
  return out;
}

}  // namespace

// Row t at position p completes block (p + 1) / B - 1 when p + 1 is a multiple of B.
void qsa_start_window(Window& w, Scratch& keep) {
  const int64_t B = w.c.idx_block;
  std::vector<int32_t> starts(size_t(w.T), -1), blocks(size_t(w.T), -1);  // -1: completes none
  for (int64_t t = 0; t < w.T; ++t) {
    const int64_t end = w.pos[size_t(t)] + 1;
    if (end % B == 0) starts[size_t(t)] = int32_t(end - B), blocks[size_t(t)] = int32_t(end / B - 1);
  }
  w.qsa_block_starts = keep.ids(starts, w.T, 1);
  w.qsa_blocks = keep.ids(blocks, w.T, 1);
}

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
  be.rope_neox(iq, w.positions, di, c.rope_dim, theta);
  be.matmul(L.indexer_k_proj, x, ik);
  be.set_rows(ik, w.positions, st.idx_k);  // past_key_values.update_indexer
  update_blocks(w, L, st);
  const Selection sel = select_positions(w, st, iq);

  const GatedQuery qg = gated_query(w, il, x);
  Tensor o = w.tmp(w.T, h * d);
  // attention_interface(..., attention_mask & selected_token_mask)
  be.attention_selected(qg.q, st.k_cache, st.v_cache, sel.selected, sel.counts, h, g, d,
                        1.0f / std::sqrt(float(d)), o);
  return gated_output(w, il, o, qg.gate);
}

}  // namespace strata::model
