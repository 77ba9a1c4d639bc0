// The compute interface every model is written against. A backend (CPU today, CUDA next) owns
// the memory activations live in and implements each op; engine and model code hold handles and
// never read activation memory themselves, so no backend type leaks out of src/backend/<name>.
//
// Rows are tokens of one window. Every op computes output row r from input row r alone (plus the
// per-layer state for attention, conv and the delta rule, which it reads in position order), with
// a reduction order that does not depend on how many rows the window has: a T-row window gives
// bitwise the results of T one-row windows (docs/DESIGN.md, "Determinism").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "quant/types.h"

namespace strata::gguf {
struct TensorInfo;
}

namespace strata::backend {

// A weight matrix as stored in the model file: `rows` outputs, each a row of `cols` inputs in
// `type` (ne[0] = cols, ne[1] = rows). For a stack of experts, one Weight is one expert's slice.
struct Weight {
  quant::Type type = quant::Type::F32;
  const void* data = nullptr;  // backend memory (CPU: the file mapping or the expert arena)
  int64_t cols = 0;
  int64_t rows = 0;
  size_t row_stride = 0;  // bytes between rows
};

// A row-major fp32 matrix in backend memory. Views (row ranges, column ranges) share storage.
struct Tensor {
  float* data = nullptr;  // backend memory; only the backend dereferences it
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements between rows

  Tensor rows_view(int64_t first, int64_t n) const { return {data + first * stride, n, cols, stride}; }
  Tensor cols_view(int64_t first, int64_t n) const { return {data + first, rows, n, stride}; }
};

// Int32 values in backend memory, row-major (stride == cols): a window's positions and token ids
// ([T, 1]), expert ids ([T, top_k]), QSA's selected positions ([T, cap]). Views share storage.
struct Ids {
  int32_t* data = nullptr;  // backend memory; only the backend dereferences it
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t size() const { return rows * cols; }
  Ids rows_view(int64_t first, int64_t n) const { return {data + first * cols, n, cols}; }
};

// One routed expert's FFN: down(silu(gate x) * up x).
struct ExpertWeights {
  Weight gate;  // [n_ff_exp rows, n_embd cols]
  Weight up;    // [n_ff_exp rows, n_embd cols]
  Weight down;  // [n_embd rows, n_ff_exp cols]
};

// How value head h of the delta rule reads a q/k with fewer heads (qk of them, r = n_heads / qk):
// Interleaved: head h / r (torch's repeat_interleave, Qwen3-Next); Tiled: head h % qk (a tile of
// the qk heads per r, Qwen3.5-MoE and qwen4exp).
enum class HeadRepeat { Interleaved, Tiled };

// The output gate after the DeltaNet's norm: silu(z) (Qwen3-Next, Qwen3.5-MoE) or sigmoid(z)
// (qwen4exp's output_gate_type).
enum class OutputGate { Silu, Sigmoid };

// The q/k head value head h reads: (h / div) % mod.
struct QkHeadMap {
  int64_t div, mod;
};
inline QkHeadMap qk_head_map(HeadRepeat repeat, int64_t n_heads, int64_t qk_heads) {
  return repeat == HeadRepeat::Interleaved ? QkHeadMap{n_heads / qk_heads, qk_heads}
                                           : QkHeadMap{1, qk_heads};
}

// One sequence of a window that holds several (the *_sequences ops): the window's rows
// [first, first + rows) and that sequence's state for the op.
struct SequenceState {
  int64_t first = 0, rows = 0;
  Tensor state;
};

// The operands of Backend::delta_net_recurrence: n_heads value heads (y.cols / n_heads columns
// each) over key heads of `state` columns (key_dim = (qkv.cols - y.cols) / 2 of q, then of k):
//   conv = conv1d_silu_sequences(qkv, conv_states, conv)         causal_conv1d_fn, silu
//   q, k = qk_l2_norm(conv[:, :2 key_dim], state, l2_eps, key_dim, q_scale)
//   beta, g = ssm_gates(b, a, dt_bias, ssm_a)                     b, a: [T, n_heads]
// b and a are either two tensors or, where ba_groups > 0, split from ba [T, 2 n_heads]: ba_groups
// groups, each its n_heads / ba_groups heads' b then their a (Qwen3-Next's in_proj_ba; the default
// splits it with split_groups).
//   y = gated_delta_rule_sequences(q, k, conv[:, 2 key_dim:], g, beta, ssm_states, n_heads, repeat)
//   rms_norm_gated(y, norm, state, norm_eps, z, gate)             self.norm(core_attn_out, z)
// The conv and delta-rule states advance as those ops advance them.
struct DeltaNetRecurrence {
  Tensor qkv;
  std::span<const SequenceState> conv_states;
  const Weight* conv = nullptr;
  Tensor b, a;
  Tensor ba;
  int64_t ba_groups = 0;
  const Weight* dt_bias = nullptr;
  const Weight* ssm_a = nullptr;
  std::span<const SequenceState> ssm_states;
  int64_t n_heads = 0, state = 0;
  HeadRepeat repeat = HeadRepeat::Interleaved;
  float l2_eps = 0.0f, q_scale = 1.0f;
  const Weight* norm = nullptr;
  float norm_eps = 0.0f;
  Tensor z;
  OutputGate gate = OutputGate::Silu;
};

// One sequence's rows of a window and its layer's KV cache (kv_write_sequences,
// attention_sequences).
struct SequenceCache {
  int64_t first = 0, rows = 0;
  Tensor k_cache, v_cache;
};

// The routed choice of a window, on the host: per row the experts in rank order (best first) and
// their mixing weights. The forward pass keeps routing in backend memory (Ids + Tensor); the host
// sees it only where it decides something (the expert cache, traces, cache-conditional routing).
struct Routing {
  int64_t top_k = 0;
  std::vector<int32_t> experts;  // rows x top_k
  std::vector<float> weights;    // rows x top_k
};

// What a backend did, cumulative (strata bench reports them per token).
// Device time of one op (name) over a run, from a backend that profiles its ops.
struct OpTime {
  uint64_t calls = 0;
  double us = 0;
};

struct BackendCounters {
  uint64_t ops = 0;             // ops run one by one (each one or a few kernel launches)
  uint64_t graph_captures = 0;  // windows recorded as a graph
  uint64_t graph_replays = 0;   // windows run by replaying a recorded graph
  uint64_t graph_kernels = 0;   // kernels run inside replayed graphs
  // Windows of a recordable key run before its recording replays (op by op, or captured): one-time
  // costs, not what the key's windows take (SpecGate leaves them out of T(n)).
  uint64_t warming_windows = 0;
  // Host steps inside windows (begin_host_step), timed on the device: `host_step_seconds` from
  // the end of the work queued before each step to the end of the step's own; `handshake_seconds`
  // the part of it the device waited for the host's answer, from that point to the first op the
  // host queued after reading device memory (`handshakes` such steps). CUDA only.
  uint64_t host_steps = 0;
  double host_step_seconds = 0;
  uint64_t handshakes = 0;
  double handshake_seconds = 0;
  // Per op, when the backend profiles (CUDA: STRATA_CUDA_PROFILE=1, windows run op by op).
  std::map<std::string, OpTime> op_times;
  uint64_t profiled_windows_discarded = 0;  // windows that read back mid-way (timings unusable)
};

// The expert cache's slot storage (experts/arena.h keeps the bookkeeping), owned by a backend:
// `count` equal slots of `slot_bytes`, each holding one pack record whose parts the kernels read
// as an expert's weights (CPU: host memory; CUDA: device memory). A record reaches a slot in two
// steps: the pack read lands in landing(slot), host memory the reader writes with O_DIRECT (the
// slot itself where slots are host memory, else a pinned staging buffer), then fill(slot, bytes)
// queues the copy of those bytes into the slot, and ready(slot) makes every op queued after it see
// them (CUDA: a host-to-device copy on a copy stream, which the compute stream waits for at
// ready(), so a copy queued early overlaps the compute queued before its slot is used). One caller
// thread, like the backend.
class ExpertSlots {
 public:
  // Cumulative host-to-device copies (zero where slots are host memory).
  struct Counters {
    uint64_t bytes = 0;
    double seconds = 0;  // copy-engine time, summed over the copies
  };

  virtual ~ExpertSlots() = default;
  virtual size_t count() const = 0;
  virtual size_t slot_bytes() const = 0;
  // Backend memory of slot s: the base of its expert's Weight views.
  virtual const uint8_t* data(int32_t slot) const = 0;
  // Host memory (4 KiB-aligned, slot_bytes long) the read of slot s's next record lands in; the
  // same buffer until fill(s) or discard(s), after which it is no longer the caller's (CUDA: the
  // copy reads it until it ends).
  virtual void* landing(int32_t slot) = 0;
  // The read into landing(s) finished: its first `bytes` become slot s's content for ops queued
  // after the next ready(s).
  virtual void fill(int32_t slot, size_t bytes) = 0;
  // The same from host memory the caller owns (a host tier slot: host memory this backend copies
  // from fastest, alloc_host_tier), which must stay unchanged until wait_copied(the returned
  // ticket) has returned. Ticket 0: the copy is done already.
  virtual uint64_t fill_from(int32_t slot, const void* host, size_t bytes) = 0;
  // Blocks until the copy of `ticket` (from fill_from) has read all of its source.
  virtual void wait_copied(uint64_t /*ticket*/) {}
  // Ops queued after this call see slot s's latest fill.
  virtual void ready(int32_t /*slot*/) {}
  // The read into landing(s) was cancelled, failed or is not wanted: its buffer is free again.
  virtual void discard(int32_t slot) = 0;
  // Slot s will take another expert: ops queued before this call may still read its old bytes,
  // and no later fill(s) may overwrite them before those ops are done.
  virtual void recycle(int32_t slot) = 0;
  virtual Counters counters() const { return {}; }
};

// Slots in host memory: one mapping in huge pages where the system has them, faulted in at
// creation (util/arena_memory.h: the whole budget counts towards RSS from the start, and decode
// takes no first-touch faults); landing(s) is the slot itself and fill() has nothing to do.
// Throws strata::Error when the mapping fails.
std::unique_ptr<ExpertSlots> make_host_expert_slots(size_t count, size_t slot_bytes);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // A window's ops, from its first upload to its last op before the logits are read: a backend
  // may record them the first time `key` is seen and replay the recording when it comes again
  // (CUDA graphs); key 0 runs the ops as they come. The caller guarantees that one key always
  // means the same sequence of ops, allocations and uploads of the same shapes on the same
  // persistent tensors, with only the uploaded values differing. end_window(false) closes a window
  // that threw: whatever was being recorded is dropped.
  virtual void begin_window(uint64_t key) {}
  virtual void end_window(bool completed) {}
  // A host step inside a window: between these the host reads values back and decides which ops
  // follow (the expert cache's handshake), so they run as they come even in a recorded window,
  // which is recorded in pieces around its host steps. The key's promise covers the ops outside
  // host steps; tensors allocated inside one are valid until the next host step begins.
  virtual void begin_host_step() {}
  virtual void end_host_step() {}
  // A side branch: the ops issued between begin_side_branch() and end_side_branch() may run
  // concurrently with the ops issued after it, up to join_side_branch() (or a read back to the
  // host, a host step or the window's end, which join it too). The branch reads only what the ops
  // before it wrote and writes only tensors nothing else touches before the join, so the results
  // are those of issue order. One branch at a time. A backend that runs ops one after another
  // ignores the hints.
  virtual void begin_side_branch() {}
  virtual void end_side_branch() {}
  virtual void join_side_branch() {}
  virtual BackendCounters counters() const { return {}; }

  // Memory. alloc() returns zeroed memory owned by the backend until release(); inside a window it
  // may be the window's own, valid until the next window begins. alloc_lasting() stays valid until
  // release() wherever it is called (what a window keeps for later, as the speculation journal's
  // copies); in a recorded window's key, only its first (op-by-op) window may call it.
  virtual Tensor alloc(int64_t rows, int64_t cols) = 0;
  virtual Tensor alloc_lasting(int64_t rows, int64_t cols) { return alloc(rows, cols); }
  virtual void release(Tensor t) = 0;
  virtual void upload(const float* host, Tensor dst) = 0;
  virtual void download(const Tensor& src, float* host) = 0;
  virtual void fill(Tensor t, float value) = 0;
  virtual void copy(const Tensor& src, Tensor dst) = 0;
  // dst row rows[t] = src row t; a negative id skips its row. Writes at positions the window
  // carries as values (a recorded window replays at any position).
  virtual void set_rows(const Tensor& src, const Ids& rows, Tensor dst) = 0;
  virtual Ids alloc_ids(int64_t rows, int64_t cols) = 0;  // zeroed
  virtual void release_ids(Ids t) = 0;
  virtual void upload_ids(const int32_t* host, Ids dst) = 0;
  virtual void download_ids(const Ids& src, int32_t* host) = 0;
  // Makes a file tensor (2-D, or one [.., .., n] slice of a 3-D stack) usable as a Weight.
  virtual Weight weight(const gguf::TensorInfo& tensor, int64_t slice = 0) = 0;
  // Storage for the expert cache's slots, usable as expert weights by moe_experts and
  // moe_expert_outputs (the default: host memory, make_host_expert_slots). Throws strata::Error
  // when the memory cannot be had.
  virtual std::unique_ptr<ExpertSlots> alloc_expert_slots(size_t count, size_t slot_bytes);
  // Host memory for the expert cache's host tier (experts/host_tier.h), as slots whose landing
  // buffer is the slot itself: what this backend's expert slots copy from fastest (CUDA: pinned
  // memory). Null where the expert slots are host memory already (a tier would hold copies of
  // what the arena can hold itself).
  virtual std::unique_ptr<ExpertSlots> alloc_host_tier(size_t /*count*/, size_t /*slot_bytes*/) {
    return nullptr;
  }
  // Free memory of the device expert slots live on (what the default expert budget is cut from);
  // nullopt where slots are host memory.
  virtual std::optional<uint64_t> expert_memory_free() const { return std::nullopt; }

  // y[r] = dequantized table row ids[r] (ids: y.rows values, in row-major order).
  virtual void get_rows(const Weight& table, const Ids& ids, Tensor y) = 0;
  // A hint that get_rows will soon read rows `ids` (host values) of `table`. Where the table is a
  // file mapping (the CPU's qwen4exp n-gram tables, far larger than RAM) the backend starts
  // reading those rows from the disk now, all at once, so that the gather finds them in memory
  // instead of faulting them in one synchronous read after another. Changes no result, and may
  // do nothing (the default: a table in device memory is resident already).
  virtual void prefetch_rows(const Weight& /*table*/, std::span<const int32_t> /*ids*/) {}
  // y = x W^T: y[r, o] = W[o, :] . x[r, :].
  virtual void matmul(const Weight& w, const Tensor& x, Tensor y) = 0;
  // ys[i] = x ws[i]^T for each i: the matmuls of one x, which a backend may run as one launch
  // (the bits of the separate matmuls).
  virtual void matmuls(std::span<const Weight* const> ws, const Tensor& x, std::span<Tensor> ys);
  // Per group of `group` columns: y = x / sqrt(mean(x^2) + eps) * w. w: F32 [group] (every group
  // scaled alike), F32 [x.cols] (a gain per column: qwen4exp's streams, each with its own), or none.
  virtual void rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor y) = 0;
  // Per group: y = x / sqrt(sum(x^2) + eps).
  virtual void l2_norm(const Tensor& x, int64_t group, float eps, Tensor y) = 0;
  // The delta rule's q and k side by side in x: l2_norm over every group, then the first q_cols
  // columns (q) scaled by q_scale; the bits of l2_norm then scale.
  virtual void qk_l2_norm(const Tensor& x, int64_t group, float eps, int64_t q_cols, float q_scale,
                          Tensor y);
  // The DeltaNet's gated norm in place: x = rms_norm(x, w) per group, then x = silu(gate) * x
  // (swiglu(gate, x)) or x * sigmoid(gate) (mul_sigmoid(x, gate)); the bits of the two ops.
  virtual void rms_norm_gated(Tensor x, const Weight& w, int64_t group, float eps,
                              const Tensor& gate, OutputGate kind);
  // Per group g of `group` columns: y[r, g] = sign(d) sqrt(max(|d|, 1e-6)), d = scale * (a . b)
  // over the group; y has one column per group (qwen4exp's PLE stream gates).
  virtual void signed_sqrt_dot(const Tensor& a, const Tensor& b, int64_t group, float scale,
                               Tensor y) = 0;
  virtual void add(const Tensor& a, const Tensor& b, Tensor y) = 0;
  // The residual add and the norm after it: x += delta, then y = rms_norm(x, w) over all of x's
  // columns. A backend may do both in one pass; the bits are those of add then rms_norm.
  virtual void add_rms_norm(Tensor x, const Tensor& delta, const Weight& w, float eps, Tensor y) {
    add(x, delta, x);
    rms_norm(x, &w, x.cols, eps, y);
  }
  virtual void scale(const Tensor& x, float s, Tensor y) = 0;
  // y = x * sigmoid(gate); gate has x's shape, or one column (a per-row gate).
  virtual void mul_sigmoid(const Tensor& x, const Tensor& gate, Tensor y) = 0;
  // y += x * sigmoid(gate), gate as in mul_sigmoid (the shared expert's gated add into the routed
  // sum). x is scratch: a backend may leave it scaled.
  virtual void add_mul_sigmoid(Tensor y, Tensor x, const Tensor& gate) {
    mul_sigmoid(x, gate, x);
    add(y, x, y);
  }
  // add_mul_sigmoid(y, x, gate), then the residual add after it: residual += y (the MoE's shared
  // expert into the routed sum, and the block's output into the hidden state), in one op where a
  // backend can; the bits of the two.
  virtual void add_mul_sigmoid_residual(Tensor residual, Tensor y, Tensor x, const Tensor& gate) {
    add_mul_sigmoid(y, x, gate);
    add(residual, y, residual);
  }
  // add_mul_sigmoid_residual, then normed = rms_norm(residual, w) over all its columns (a block's
  // output into the hidden state, and the next layer's input norm of it): one op where a backend
  // can; the bits of the two.
  virtual void add_mul_sigmoid_residual_rms_norm(Tensor residual, Tensor y, Tensor x,
                                                 const Tensor& gate, const Weight& w, float eps,
                                                 Tensor normed) {
    add_mul_sigmoid_residual(residual, y, x, gate);
    rms_norm(residual, &w, residual.cols, eps, normed);
  }
  // y = silu(gate) * up.
  virtual void swiglu(const Tensor& gate, const Tensor& up, Tensor y) = 0;
  // y = silu(x * s): swiglu(x * s, 1), the bits of scale then swiglu with an up of ones.
  virtual void scaled_silu(const Tensor& x, float s, Tensor y);

  // Hyper-connection ops (qwen4exp): a residual of `streams` streams of n columns side by side.
  // y [rows, n] = (x_0 sigmoid(gate_0) + x_1 sigmoid(gate_1) + ...) * (1 / streams), x and gate
  // [rows, streams * n], summed in stream order: the bits of mul_sigmoid, then copy, add stream
  // by stream and scale. gate is scratch: a backend may leave it overwritten.
  virtual void mean_mul_sigmoid_streams(const Tensor& x, Tensor gate, int64_t streams, Tensor y);
  // For each stream s of x [rows, streams * n]: x_s += (out * sigmoid(logits[:, s] * logit_scale))
  // * 2, out [rows, n], logits [rows, streams]: the bits of scale, then mul_sigmoid by the row's
  // gate, scale by 2 and add, stream by stream. logits is scratch: a backend may leave it scaled.
  virtual void inject_streams(Tensor x, const Tensor& out, Tensor logits, float logit_scale);
  // Each row of x is n_groups groups, each the concatenation of parts of the given widths;
  // outs[i] receives part i of every group, contiguous (e.g. per-head [q | gate] -> q, gate).
  virtual void split_groups(const Tensor& x, int64_t n_groups, std::span<const int64_t> widths,
                            std::span<Tensor> outs) = 0;
  // NeoX-style rotary embedding in place on the first rope_dim dims of every head_dim group.
  // positions: one per row of x.
  virtual void rope_neox(Tensor x, const Ids& positions, int64_t head_dim, int64_t rope_dim,
                         float theta) = 0;

  // Causal attention of rows at `positions` over a layer's cache (keys/values at positions
  // 0..p, the window's own rows written first by kv_write). GQA: head h reads kv head
  // h / (n_head / n_head_kv).
  virtual void kv_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v,
                        const Ids& positions) = 0;
  virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const Ids& positions, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                         float scale, Tensor y) = 0;
  // kv_write and attention over a window of several sequences, each sequence's rows with its own
  // caches: the op on each sequence's rows, positions and caches in turn (the defaults; a backend
  // may run all of them in one launch, with the same bits). Sequences as for the *_sequences ops
  // below (in row order, not overlapping, distinct caches of one width; their contexts may differ).
  virtual void kv_write_sequences(std::span<const SequenceCache> sequences, const Tensor& k,
                                  const Tensor& v, const Ids& positions);
  virtual void attention_sequences(const Tensor& q, std::span<const SequenceCache> sequences,
                                   const Ids& positions, int64_t n_head, int64_t n_head_kv,
                                   int64_t head_dim, float scale, Tensor y);
  // Attention restricted to chosen cache positions (QSA): row r attends to the positions
  // selected[r, 0 .. counts[r]), in that order, instead of 0..p. selected [T, >= max count],
  // counts [T, 1].
  virtual void attention_selected(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                  const Ids& selected, const Ids& counts, int64_t n_head,
                                  int64_t n_head_kv, int64_t head_dim, float scale, Tensor y) = 0;

  // QSA indexer block scores over the complete blocks row r sees, count (positions[r] + 1) /
  // block: y[r, b] = scale * sum_h relu(q[r, h] . keys[b]) for b < count, 0 past it;
  // q [T, n_head * head_dim], keys [blocks, head_dim], y [T, >= max count].
  virtual void block_scores(const Tensor& q, const Tensor& keys, const Ids& positions,
                            int64_t block, int64_t n_head, int64_t head_dim, float scale,
                            Tensor y) = 0;
  // y[t] = (sum of x's rows firsts[t] .. firsts[t] + block - 1, added in row order) / block: QSA's
  // pooled block keys, one per window row; a negative first gives a row of zeros (the window row
  // completes no block).
  virtual void block_mean(const Tensor& x, const Ids& firsts, int64_t block, Tensor y) = 0;
  // QSA's choice per row r at position p: the best min(top_blocks, (p + 1) / block) complete
  // blocks by scores[r] (ties: the lower block), ascending, each as its block positions, then the
  // incomplete tail (p + 1) / block * block .. p. Written to selected[r, 0 .. counts[r]);
  // selected has >= top_blocks * block + block - 1 columns.
  virtual void qsa_select(const Tensor& scores, const Ids& positions, int64_t block,
                          int64_t top_blocks, Ids selected, Ids counts) = 0;

  // Depthwise causal conv over time with a state of the previous kernel-1 rows, then silu:
  // y[t, c] = silu(sum_j w[c, j] * x_{t-kernel+1+j}[c]); the state is advanced by the window.
  virtual void conv1d_silu(const Tensor& x, Tensor state, const Weight& w, Tensor y) = 0;
  // The same with the taps `dilation` rows apart (qwen4exp's PLE conv): the state holds the
  // previous (kernel-1)*dilation rows and y[t, c] = silu(sum_j w[c, j] * x_{t-(kernel-1-j)*dilation}[c]).
  virtual void conv1d_dilated_silu(const Tensor& x, Tensor state, const Weight& w, int64_t dilation,
                                   Tensor y) = 0;
  // Gated delta rule, one token after another, per value head. state: [n_heads * dk, dv] rows of
  // S; g: log decay; beta: write strength. q and k have n_heads heads of dk, or fewer (qk_heads
  // dividing n_heads) that the value heads share as `repeat` says, so they are never copied out
  // to the value heads.
  virtual void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& g, const Tensor& beta, Tensor state, int64_t n_heads,
                                HeadRepeat repeat, Tensor y) = 0;
  // conv1d_silu and gated_delta_rule over a window of several sequences, each sequence's rows
  // with its own state: the op on each sequence's rows and state in turn (what the defaults do;
  // a backend may run all of them in one launch, with the same bits). The sequences are in row
  // order, do not overlap, and their states are distinct tensors of one shape.
  virtual void conv1d_silu_sequences(const Tensor& x, std::span<const SequenceState> sequences,
                                     const Weight& w, Tensor y);
  virtual void gated_delta_rule_sequences(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& g, const Tensor& beta,
                                          std::span<const SequenceState> sequences, int64_t n_heads,
                                          HeadRepeat repeat, Tensor y);
  // The delta rule's log decay: g[t, h] = ssm_a[h] * softplus(a[t, h] + dt_bias[h]), softplus(z)
  // = z > 20 ? z : log1p(exp(z)) (torch's threshold); ssm_a and dt_bias F32 [n_heads].
  virtual void ssm_decay(const Tensor& a, const Weight& dt_bias, const Weight& ssm_a,
                         Tensor g) = 0;
  // Both gates of the delta rule: beta = sigmoid(b) (as mul_sigmoid of ones) and g = ssm_decay(a),
  // in one op where a backend can.
  virtual void ssm_gates(const Tensor& b, const Tensor& a, const Weight& dt_bias,
                         const Weight& ssm_a, Tensor beta, Tensor g) {
    fill(beta, 1.0f);
    mul_sigmoid(beta, b, beta);
    ssm_decay(a, dt_bias, ssm_a, g);
  }

  // The DeltaNet between its in-projections and its out-projection (Qwen3NextGatedDeltaNet),
  // for a window of sequences; what the default does with the ops above, which a backend may run
  // as fewer launches with the same bits.
  virtual void delta_net_recurrence(const DeltaNetRecurrence& r, Tensor y);

  // Router: softmax over logits, top-k (k = experts.cols; ties: lower expert id), optionally
  // renormalised over the chosen k, into experts [T, k] and weights [T, k] in backend memory.
  virtual void route_softmax_topk(const Tensor& logits, bool renormalize, Ids experts,
                                  Tensor weights) = 0;
  // y[r] += sum over rank j of weights[r, j] * FFN_{experts[r, j]}(x[r]), summed in rank order.
  // table[e] holds expert e's weights (views into the file, or the expert cache's slots), read
  // by id from the routing in backend memory.
  virtual void moe_experts(const Tensor& x, const Ids& experts, const Tensor& weights,
                           std::span<const ExpertWeights> table, Tensor y) = 0;
  // The same in two steps, for a window whose experts cannot all be resident at once:
  // moe_expert_outputs writes out[p] = FFN_{experts[p]}(x[p / top_k]) for each listed pair
  // p = r * top_k + j (ascending; other rows of out [rows * top_k, n_embd] untouched), called once
  // per chunk of pairs whose experts are resident together; moe_combine then adds
  // y[r] += sum over j of weights[r, j] * out[r * top_k + j] in rank order. Bitwise moe_experts
  // however the pairs are chunked.
  virtual void moe_expert_outputs(const Tensor& x, const Ids& experts,
                                  std::span<const int64_t> pairs,
                                  std::span<const ExpertWeights> table, Tensor out) = 0;
  virtual void moe_combine(const Tensor& weights, const Tensor& out, Tensor y) = 0;
  // The greedy choice where the logits are, so only a token per row comes back: index [rows, 1]
  // gets each row's column of its largest value (NaN never wins, the lowest column among equals,
  // -1 when every value is NaN), prob [rows, 1] (or no rows: not wanted) that value's softmax
  // probability 1 / sum_c e^(x[r, c] - max) over the non-NaN values (1 when the largest is
  // infinite).
  virtual void argmax(const Tensor& x, Ids index, Tensor prob) = 0;
  // Top-k sampling where the logits are, so k candidates per row come back instead of the row:
  // index [rows, k] and values [rows, k] get each row's k largest values in the sampler's order
  // (value descending, the lower column first among equals, -0 equal to +0, NaN never taken), and
  // index -1 (value -inf) past the row's non-NaN count. k is at most kMaxTopK.
  static constexpr int64_t kMaxTopK = 1024;
  virtual void top_k(const Tensor& x, Ids index, Tensor values) = 0;
  // What top-p sampling without top-k reads besides the candidates: sums [rows, 1] gets each
  // row's softmax sum at `temperature` (> 0), the sum over its non-NaN values of
  // sampling_weight(x, the row's largest, temperature) in kSumChunk's order (sampling_weight.h),
  // bitwise on every backend.
  virtual void sampling_sums(const Tensor& x, float temperature, Tensor sums) = 0;
  // Plain temperature sampling (no top-k, no nucleus) where the logits are, so a token per row
  // comes back: index [rows, 1] gets each row's draw at `temperature` (> 0) with the uniform
  // number uniforms [rows, 1] in [0, 1) (sampling_weight.h: pick_chunk, then pick_column, over
  // the row's weights, NaN weighing 0), -1 when every value is NaN; bitwise on every backend.
  virtual void draw(const Tensor& x, float temperature, const Tensor& uniforms, Ids index) = 0;
};

// What a caller may watch between the ops of a DeltaNet recurrence run one by one: the conv's
// output, the delta rule's operands just before it runs, and its output before the gated norm.
struct DeltaNetTaps {
  std::function<void(const Tensor& conv)> after_conv;
  std::function<void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                     const Tensor& beta)>
      before_rule;
  std::function<void(const Tensor& core)> after_rule;
};
// Backend::delta_net_recurrence's default: the ops one by one on `be`, with taps between them (a
// speculative window's journal, layer dumps).
void delta_net_ops(Backend& be, const DeltaNetRecurrence& r, Tensor y, const DeltaNetTaps& taps = {});

// Host <-> backend conversions for the places that need host values.
// New ids [rows, cols] holding host (rows * cols values); the caller releases them.
Ids make_ids(Backend& be, std::span<const int32_t> host, int64_t rows, int64_t cols);
Routing download_routing(Backend& be, const Ids& experts, const Tensor& weights);
// Fails, naming op, unless `sequences` are what the *_sequences ops take for a window of `rows`
// rows (in row order, none empty or overlapping, distinct states of one shape; caches may differ
// in rows, the context each sequence holds).
void check_sequences(const char* op, int64_t rows, std::span<const SequenceState> sequences);
void check_sequences(const char* op, int64_t rows, std::span<const SequenceCache> sequences);
// Fails, naming delta_net_recurrence, unless a grouped ba (ba_groups > 0) is [rows, 2 n_heads] in
// ba_groups whole groups of b and a.
void check_delta_net_ba(const DeltaNetRecurrence& r, int64_t rows);
void upload_routing(Backend& be, const Routing& routing, Ids experts, Tensor weights);

}  // namespace strata::backend
