// The parts of the qwen4exp forward (qwen4exp.cpp) that live in their own files: PLE (ple.cpp)
// and QSA (qsa.cpp). Reference: modeling_qwen4_exp.py of transformers 5.17.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/forward_common.h"

namespace strata::model {

// Qwen4ExpTextRMSNorm(hc_dim, group_size=hidden): RMSNorm of each stream of x [rows, hc_dim],
// stream s scaled by gain[s*n .. (s+1)*n).
Tensor norm_streams(Window& w, const Tensor& x, const Weight& gain);

// Qwen4ExpTextNGramEmbedding's row ids for the window: per row, ple_heads() ids into PLE layer
// k's table (bigram heads, then trigram heads, ...). history is the ngram_size - 1 tokens before
// the window; an n-gram does not reach back across an eos (the reference's
// _shift_right_ignore_eos: missing tokens read as eos).
std::vector<int32_t> ple_ngram_ids(const ModelConfig& c, int64_t k, std::span<const int32_t> history,
                                   std::span<const int32_t> tokens);

// The history after the window: its last ngram_size - 1 tokens.
void ple_advance_history(std::vector<int32_t>& history, std::span<const int32_t> tokens);

// Before layer 0 of a window: hashes every PLE table's ids for the window's rows (each sequence's
// rows with its own history) and uploads them into `keep` (w.ple_ids), and with `prefetch` hands
// them to Backend::prefetch_rows, so that the rows of every PLE layer are being read while the
// layers before it compute, and in parallel rather than one fault after another. The ids depend
// only on the tokens and the history, so they are known before anything runs.
void ple_start_window(Window& w, Scratch& keep, bool prefetch);

// Qwen4ExpTextPLELayer.forward: x [T, hc_dim] are the streams; returns what is added to them.
// Gathers the rows ple_start_window hashed.
Tensor ple_layer(Window& w, int64_t il, const Tensor& x);

// Before layer 0 of a window of an architecture with QSA layers: the key blocks the window's rows
// complete, from their positions alone, uploaded into `keep` (w.qsa_block_starts, w.qsa_blocks)
// once for every QSA layer.
void qsa_start_window(Window& w, Scratch& keep);

// Qwen4ExpTextAttention.forward with its QSA indexer: x [T, n_embd] -> [T, n_embd].
Tensor sparse_attention(Window& w, int64_t il, const Tensor& x);

}  // namespace strata::model
