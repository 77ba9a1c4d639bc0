// Launchers of the CUDA backend's ops, one op family per ops_*.cu file. Internal: they take device
// pointers and a DeviceContext (CUDA types), are called by the CudaBackend after it has checked
// shapes, and only queue work on the context's stream (no synchronization).
//
// Every kernel writes each output element from one thread (or one warp, with a fixed shuffle
// order), with a reduction order that depends on the op's definition alone, never on the number of
// rows: a T-row call equals T one-row calls bit for bit. No float atomics anywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "backend/cuda/launch.h"
#include "quant/kernels.h"
#include "quant/types.h"

namespace strata::cuda::detail {

using backend::Tensor;

// Activation layouts as the kernels see them: how a block's scale is stored (Q8_0 keeps it as
// fp16, Q8_K as fp32) decides the values the quantized activation encodes.
enum class ActQuant : int { None = 0, Q8_0 = 1, Q8_K = 2 };

inline ActQuant act_quant(quant::ActFormat f) {
  switch (f) {
    case quant::ActFormat::Q8_0:
      return ActQuant::Q8_0;
    case quant::ActFormat::Q8_K:
      return ActQuant::Q8_K;
    default:
      return ActQuant::None;
  }
}

// formats.cu: the alignment decode.cuh's decoder for t assumes of block pointers and row strides
// (0: no decoder).
size_t weight_alignment(quant::Type t);

// ops_elementwise.cu ------------------------------------------------------------------------------

void launch_fill(const DeviceContext& ctx, Tensor t, float value);
// dst = src (shapes equal; src and dst do not overlap).
void launch_copy(const DeviceContext& ctx, const Tensor& src, Tensor dst);
// dst row rows[t] = src row t; ids outside dst's rows (negative ones included) skip their row.
void launch_set_rows(const DeviceContext& ctx, const Tensor& src, const int32_t* rows, Tensor dst);
void launch_add(const DeviceContext& ctx, const Tensor& a, const Tensor& b, Tensor y);
void launch_scale(const DeviceContext& ctx, const Tensor& x, float s, Tensor y);
// gate: x's shape, or one column (per_row).
void launch_mul_sigmoid(const DeviceContext& ctx, const Tensor& x, const Tensor& gate, Tensor y);
// y += x * sigmoid(gate); gate as for launch_mul_sigmoid.
// residual (when given) += y after the add: add_mul_sigmoid_residual.
void launch_add_mul_sigmoid(const DeviceContext& ctx, Tensor y, const Tensor& x, const Tensor& gate,
                            const Tensor* residual = nullptr);
void launch_swiglu(const DeviceContext& ctx, const Tensor& gate, const Tensor& up, Tensor y);
void launch_scaled_silu(const DeviceContext& ctx, const Tensor& x, float s, Tensor y);
void launch_mean_mul_sigmoid_streams(const DeviceContext& ctx, const Tensor& x, const Tensor& gate,
                                     int64_t streams, Tensor y);
void launch_inject_streams(const DeviceContext& ctx, Tensor x, const Tensor& out,
                           const Tensor& logits, float logit_scale);

constexpr int kMaxSplitParts = 8;
struct SplitParts {
  int n = 0;
  int64_t width[kMaxSplitParts] = {};
  float* out[kMaxSplitParts] = {};
  int64_t out_stride[kMaxSplitParts] = {};
};
void launch_split_groups(const DeviceContext& ctx, const Tensor& x, int64_t n_groups,
                         const SplitParts& parts);

// ops_norm.cu -------------------------------------------------------------------------------------

// An output gate applied after a norm (rms_norm_gated): none while p is null, else gate rows of
// the normed tensor's shape at p, `stride` apart.
struct NormGate {
  const float* p = nullptr;
  int64_t stride = 0;
  backend::OutputGate kind = backend::OutputGate::Silu;
};
// w: null, or group g's gains at w + g * w_step (w_step 0: the same `group` floats for every
// group). Wide groups (fuses_wide_rms_norm) take a block each unless gated.
void launch_rms_norm(const DeviceContext& ctx, const Tensor& x, const float* w, int64_t w_step,
                     int64_t group, float eps, Tensor y, NormGate gate = {});
bool fuses_wide_rms_norm(int64_t group);
// x += delta, then y = rms_norm(x, w) over x's columns, in one kernel, for the widths
// fuses_wide_rms_norm accepts (w: x.cols floats).
void launch_add_rms_norm(const DeviceContext& ctx, Tensor x, const Tensor& delta, const float* w,
                         float eps, Tensor y);
// y += x * sigmoid(gate), residual += y (launch_add_mul_sigmoid with a residual), then
// normed = rms_norm(residual, w), in one kernel, for the widths fuses_wide_rms_norm accepts.
// With combine_weights, y first takes launch_moe_combine(combine_weights, top_k, experts_out).
void launch_add_mul_sigmoid_rms_norm(const DeviceContext& ctx, Tensor residual, Tensor y,
                                     const Tensor& x, const Tensor& gate, const float* w, float eps,
                                     Tensor normed, const float* combine_weights = nullptr,
                                     int64_t top_k = 0, const Tensor& experts_out = {});
// l2_norm per group; the first q_cols columns then scaled by q_scale (qk_l2_norm).
void launch_l2_norm(const DeviceContext& ctx, const Tensor& x, int64_t group, float eps, Tensor y,
                    int64_t q_cols = 0, float q_scale = 1.0f);
void launch_signed_sqrt_dot(const DeviceContext& ctx, const Tensor& a, const Tensor& b,
                            int64_t group, float scale, Tensor y);

// ops_rope.cu -------------------------------------------------------------------------------------

// inv_freq: rope_dim / 2 floats, as the CPU computes them on the host.
void launch_rope_neox(const DeviceContext& ctx, Tensor x, const int32_t* positions,
                      const float* inv_freq, int64_t head_dim, int64_t rope_dim);

// ops_attention.cu --------------------------------------------------------------------------------

// Each sequence's rows of k and v (and positions) into its caches (one sequence: the whole
// window), all sequences in one launch per CacheTable::kMax; the caches of one shape.
void launch_kv_write(const DeviceContext& ctx, std::span<const backend::SequenceCache> sequences,
                     const Tensor& k, const Tensor& v, const int32_t* positions);

// Which cache positions row r attends to, in order: 0..positions[r] (dense: `positions` set), or
// selected[begin(r) + i] for i < count(r), where begin(r) = offsets ? offsets[r] : r * stride and
// count(r) = offsets ? offsets[r + 1] - offsets[r] : counts[r].
struct AttendRows {
  const int32_t* positions = nullptr;
  const int32_t* selected = nullptr;
  const int64_t* offsets = nullptr;
  int64_t stride = 0;
  const int32_t* counts = nullptr;
};
// head_dim <= kMaxHeadDim.
constexpr int64_t kMaxHeadDim = 512;
// Each sequence's rows of q against its caches; `rows` indexes the window's rows.
void launch_attention(const DeviceContext& ctx, const Tensor& q,
                      std::span<const backend::SequenceCache> sequences, const AttendRows& rows,
                      int64_t n_head, int64_t n_head_kv, int64_t head_dim, float scale, Tensor y);
// Row r scores blocks b < count(r): counts[r], or (positions[r] + 1) / block where counts is null.
void launch_block_scores(const DeviceContext& ctx, const Tensor& q, const Tensor& keys,
                         const int32_t* counts, const int32_t* positions, int64_t block,
                         int64_t n_head, int64_t head_dim, float scale, Tensor y);

// ops_qsa.cu --------------------------------------------------------------------------------------

// A first outside 0 .. x.rows - block (negative ones included) gives zeros.
void launch_block_mean(const DeviceContext& ctx, const Tensor& x, const int32_t* firsts,
                       int64_t block, Tensor y);
// rows = scores.rows; selected rows are sel_cols apart; counts one per row.
void launch_qsa_select(const DeviceContext& ctx, const Tensor& scores, const int32_t* positions,
                       int64_t block, int64_t top_blocks, int32_t* selected, int64_t sel_cols,
                       int32_t* counts);

// ops_ssm.cu --------------------------------------------------------------------------------------

// Each sequence's rows of x with its state (one sequence: the whole window), all sequences in one
// launch per kSequencesPerLaunch. w: [C, K] contiguous; each state [(K-1)*dilation, C], one stride.
void launch_conv1d_silu(const DeviceContext& ctx, const Tensor& x,
                        std::span<const backend::SequenceState> sequences, const float* w,
                        int64_t kernel, int64_t dilation, Tensor y);
// Value head h reads q/k head (h / qk_div) % qk_mod (backend::qk_head_map); each state
// [n_heads * dk, dv] contiguous.
void launch_gated_delta_rule(const DeviceContext& ctx, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& g, const Tensor& beta,
                             std::span<const backend::SequenceState> sequences, int64_t n_heads,
                             int64_t qk_div, int64_t qk_mod, Tensor y);
void launch_ssm_decay(const DeviceContext& ctx, const Tensor& a, const float* dt_bias,
                      const float* ssm_a, Tensor g);
// beta = sigmoid(b), g as launch_ssm_decay, in one kernel.
void launch_ssm_gates(const DeviceContext& ctx, const Tensor& b, const Tensor& a,
                      const float* dt_bias, const float* ssm_a, Tensor beta, Tensor g);

// ops_delta_net.cu --------------------------------------------------------------------------------

// Backend::delta_net_recurrence in one kernel: the operands of one window, device pointers, and
// each sequence's rows with its conv state ([taps - 1, channels], conv_stride) and delta-rule
// state ([n_heads * state, dv] contiguous).
struct DeltaNetLaunch {
  const float* qkv = nullptr;
  int64_t qkv_stride = 0, key_dim = 0;
  const float* conv = nullptr;  // [channels, taps] contiguous
  int64_t taps = 0, conv_stride = 0;
  const float *b = nullptr, *a = nullptr;
  int64_t b_stride = 0, a_stride = 0;
  // Head h's b and a at column (h / gate_group) * gate_group_stride + h % gate_group of theirs
  // (in_proj_ba's groups of b then a; separate b and a: one group of every head)
  int64_t gate_group = 1, gate_group_stride = 1;
  const float *dt_bias = nullptr, *ssm_a = nullptr;
  int64_t n_heads = 0, state = 0;  // value heads of dv = state columns, key heads of `state`
  bool interleaved = true;         // backend::HeadRepeat::Interleaved
  float l2_eps = 0.0f, q_scale = 1.0f;
  const float* norm = nullptr;  // [state]
  float norm_eps = 0.0f;
  const float* z = nullptr;
  int64_t z_stride = 0;
  backend::OutputGate gate = backend::OutputGate::Silu;
  float* y = nullptr;
  int64_t y_stride = 0;
};
struct DeltaNetSequence {
  int64_t first = 0, rows = 0;
  float* conv_state = nullptr;
  float* ssm_state = nullptr;
};
// Whether the kernel takes this shape: a state of 64 or 128 (= dv), at most 8 value heads a key
// head (one cluster), and at most kDeltaNetMaxRows rows a sequence (longer windows run the ops one
// by one, whose kernels spread the rows).
constexpr int64_t kDeltaNetMaxRows = 8;
bool delta_net_recurrence_fits(int64_t state, int64_t key_dim, int64_t n_heads, int64_t max_rows);
void launch_delta_net_recurrence(const DeviceContext& ctx, const DeltaNetLaunch& p,
                                 std::span<const DeltaNetSequence> sequences);

// ops_matmul.cu -----------------------------------------------------------------------------------

// out [x.rows, x.cols] contiguous = x with each block replaced by what its quantization in layout
// f encodes (quant::quantize_act, dequantized): the activation the CPU's dot products see.
// x.cols is a multiple of the layout's block.
void launch_quantize_act(const DeviceContext& ctx, quant::ActFormat f, const Tensor& x, float* out);
// y[r, o] = W[o, :] . act[r, :] for r < y.rows, o < rows: the mat-vec of matvec.cu (same lanes,
// same order, so bitwise Device::matvec) with the weight decoded once for up to 8 activations.
// act rows are act_stride floats apart, 16-byte aligned.
void launch_matmul(const DeviceContext& ctx, quant::Type t, const void* w, size_t row_stride,
                   int64_t rows, int64_t cols, const float* act, int64_t act_stride, Tensor y);
// The same for up to kMaxMatvecQMatrices weights of type t and `cols` columns in one launch: y of
// each is [activations x its rows], every y the same activations.
struct MatmulMatrix {
  const void* w;
  size_t row_stride;
  int64_t rows;
  Tensor y;
};
void launch_matmuls(const DeviceContext& ctx, quant::Type t, std::span<const MatmulMatrix> ms,
                    int64_t cols, const float* act, int64_t act_stride);
// y[r] = dequantized table row ids[r].
// A row whose id is outside [0, table_rows) is written as zeros.
void launch_get_rows(const DeviceContext& ctx, quant::Type t, const void* table, size_t row_stride,
                     int64_t cols, const int32_t* ids, int64_t table_rows, Tensor y);

// ops_moe.cu ----------------------------------------------------------------------------------------

// One expert of a table as the MoE kernels read it: matrices 0 gate, 1 up, 2 down.
struct ExpertEntry {
  const void* w[3];
  uint64_t row_stride[3];
  int32_t rows[3];
  int32_t cols[3];
  int32_t type[3];  // quant::Type
  int32_t act[3];   // ActQuant of the matrix's activation layout
};

// Integer MoE lists up to this long (decode windows) run pair by pair, each CTA quantizing its
// pair's activation itself; longer ones (prefill) quantize every row once beforehand and run
// grouped by expert (MoeBuffers' slots needed).
constexpr int64_t kMoeByPairMaxPairs = 128;

// Device scratch of one MoE call; the launcher fills groups from the expert ids.
struct MoeBuffers {
  int32_t* n_active;  // 1: experts with at least one listed pair
  int32_t* active;    // [max_slots] their ids, ascending
  int32_t* first;     // [max_slots] their first item
  int32_t* count;     // [max_slots] their item count
  int32_t* items;     // [n_listed] listed indices grouped by expert
  int32_t* cursor;    // [max_slots] scratch
  int32_t* chunk_first;  // [max_slots] their first chunk of kMoeChunkPairs items
  int32_t* n_chunks;     // 1: chunks of all of them
  int32_t* slot_of;   // [n_experts] scratch
  float* x_act[3];    // x in each ActQuant layout the table's gate/up use ([T, n_embd])
  int64_t x_act_stride[3];
  float* gate;        // [n_listed, ff_stride]
  float* up;          // [n_listed, ff_stride]
  float* hidden;      // [n_listed, ff_stride]: swiglu(gate, up) in down's activation layout
  int64_t ff_stride;  // >= every down's cols, a multiple of 4
};

// The pairs listed (pair p = r * top_k + j, `listed` ascending; null: all n_listed pairs) of the
// routing `expert_ids` ([T * top_k]): out row p = FFN_{expert_ids[p]}(x row p / top_k).
// gate_up_types / down_types: the weight types present in the table (a kernel per type).
void launch_moe_expert_outputs(const DeviceContext& ctx, const ExpertEntry* table,
                               int64_t n_experts, const int32_t* expert_ids, int64_t top_k,
                               const int32_t* listed, int64_t n_listed, const Tensor& x,
                               const quant::Type* gate_up_types, int n_gate_up_types,
                               const quant::Type* down_types, int n_down_types, int64_t max_ff,
                               const MoeBuffers& buf, Tensor out);
// moe_expert_outputs of every pair followed by moe_combine into y, for a window of few rows
// (x.rows <= kMoeByPairMaxRows, at most 65535 pairs) whose downs all have down_type: each pair on
// its own, no grouping by expert, the combine fused into down (bitwise the same y).
constexpr int64_t kMoeByPairMaxRows = 8;
void launch_moe_experts_by_pair(const DeviceContext& ctx, const ExpertEntry* table,
                                int64_t n_experts, const int32_t* expert_ids, const float* weights, int64_t top_k,
                                const Tensor& x, const quant::Type* gate_up_types,
                                int n_gate_up_types, quant::Type down_type, int64_t max_ff,
                                const MoeBuffers& buf, Tensor y);
// launch_moe_expert_outputs by the integer mat-vec (launch.h's launch_moe_q), for tables whose
// gate/up and down types all have one (cuda::has_matvec_q) and x rows 16-byte aligned: gate and
// up of every listed pair, the hidden rows, down of every listed pair into its out row. The
// kernels quantize x and the hidden rows themselves (up to kMaxFusedActCols wide; wider ones are
// quantized to bytes once beforehand). Each pair's dots are bitwise the CPU's
// dot_ref, whatever the window: a T-row window equals T one-row windows. buf.out is not used.
void launch_moe_expert_outputs_q(const DeviceContext& ctx, const ExpertEntry* table,
                                 int64_t n_experts, const int32_t* expert_ids, int64_t top_k,
                                 const int32_t* listed, int64_t n_listed, const Tensor& x,
                                 const quant::Type* gate_up_types, int n_gate_up_types,
                                 const quant::Type* down_types, int n_down_types, int64_t max_ff,
                                 int64_t max_cols, const MoeBuffers& buf, Tensor out);
// y[r] += sum over j in rank order of weights[r * top_k + j] * out[r * top_k + j].
void launch_moe_combine(const DeviceContext& ctx, const float* weights, int64_t top_k,
                        const Tensor& out, Tensor y);
// Per row: softmax (max-subtracted, column-order sum), top-k (ties: lower id), optional
// renormalization, into experts / weights [rows * top_k].
void launch_route_softmax_topk(const DeviceContext& ctx, const Tensor& logits, int64_t top_k,
                               bool renormalize, int32_t* experts, float* weights);

// ops_argmax.cu -------------------------------------------------------------------------------------

// index[r] = row r's argmax (cpu/ops_argmax.h's rule), prob [rows, 1] its softmax probability
// (prob without rows: not computed).
void launch_argmax(const DeviceContext& ctx, const Tensor& x, int32_t* index, Tensor prob);

// ops_top_k.cu --------------------------------------------------------------------------------------

// index [rows * k] and values [rows, k]: each row's k largest values (cpu/ops_top_k.h's rule).
void launch_top_k(const DeviceContext& ctx, const Tensor& x, int64_t k, int32_t* index, Tensor values);

// ops_sampling_sums.cu ------------------------------------------------------------------------------
// sums [rows, 1]: each row's softmax sum at `temperature` (cpu/ops_sampling_sums.h's rule), for
// rows of at most sampling_sums_max_cols() columns (one shared float per chunk).
int64_t sampling_sums_max_cols();
void launch_sampling_sums(const DeviceContext& ctx, const Tensor& x, float temperature, Tensor sums);
// index[r]: row r's plain temperature draw with uniforms[r] (cpu/ops_sampling_sums.h's rule), rows
// of at most sampling_sums_max_cols() columns.
void launch_draw(const DeviceContext& ctx, const Tensor& x, float temperature, const Tensor& uniforms,
                 int32_t* index);

}  // namespace strata::cuda::detail
