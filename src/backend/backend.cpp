#include "backend/backend.h"

#include <cstring>

#include "util/arena_memory.h"
#include "util/error.h"

namespace strata::backend {

namespace {

class HostExpertSlots : public ExpertSlots {
 public:
  HostExpertSlots(size_t count, size_t slot_bytes)
      : count_(count), slot_bytes_(checked_slot_bytes(count, slot_bytes)), memory_(count * slot_bytes) {}

  size_t count() const override { return count_; }
  size_t slot_bytes() const override { return slot_bytes_; }
  const uint8_t* data(int32_t s) const override { return memory_.data() + size_t(s) * slot_bytes_; }
  void* landing(int32_t s) override { return memory_.data() + size_t(s) * slot_bytes_; }
  void fill(int32_t, size_t) override {}  // the read landed in place
  uint64_t fill_from(int32_t s, const void* host, size_t bytes) override {
    if (bytes > slot_bytes_) fail("expert slots: fill of ", bytes, " bytes into a slot of ", slot_bytes_);
    std::memcpy(landing(s), host, bytes);
    return 0;
  }
  void discard(int32_t) override {}
  void recycle(int32_t) override {}  // host ops finish before the forward thread goes on

 private:
  static size_t checked_slot_bytes(size_t count, size_t slot_bytes) {
    if (count == 0 || slot_bytes == 0 || slot_bytes % 4096 != 0)
      fail("expert slots: bad shape (", count, " slots of ", slot_bytes,
           " bytes; a positive multiple of 4096 each)");
    return slot_bytes;
  }

  size_t count_, slot_bytes_;
  // Huge pages where the system has them, faulted in now: decode never takes a first-touch fault.
  util::ArenaMemory memory_;
};

}  // namespace

std::unique_ptr<ExpertSlots> make_host_expert_slots(size_t count, size_t slot_bytes) {
  return std::make_unique<HostExpertSlots>(count, slot_bytes);
}

std::unique_ptr<ExpertSlots> Backend::alloc_expert_slots(size_t count, size_t slot_bytes) {
  return make_host_expert_slots(count, slot_bytes);
}

void Backend::matmuls(std::span<const Weight* const> ws, const Tensor& x, std::span<Tensor> ys) {
  if (ws.size() != ys.size())
    fail("matmuls: ", ws.size(), " weights but ", ys.size(), " outputs");
  for (size_t i = 0; i < ws.size(); ++i) matmul(*ws[i], x, ys[i]);
}

namespace {

std::string shape_of(const Tensor& t) { return cat("[", t.rows, " x ", t.cols, "]"); }

bool spans_overlap(const Tensor& a, const Tensor& b) {
  if (a.rows == 0 || a.cols == 0 || b.rows == 0 || b.cols == 0) return false;
  return a.data < b.data + (b.rows - 1) * b.stride + b.cols &&
         b.data < a.data + (a.rows - 1) * a.stride + a.cols;
}

// x [rows, streams * n] and a [rows, n] tensor `part` of one stream's width, apart in memory.
void check_streams(const char* op, const Tensor& x, const char* part_name, const Tensor& part,
                   int64_t streams) {
  if (streams < 1 || part.cols < 1 || x.rows != part.rows || x.cols != streams * part.cols)
    fail(op, ": ", part_name, " ", shape_of(part), " is not one of the ", streams, " streams of ",
         shape_of(x));
  if (spans_overlap(x, part)) fail(op, ": ", part_name, " overlaps the streams; this op cannot run in place");
}

}  // namespace

void Backend::qk_l2_norm(const Tensor& x, int64_t group, float eps, int64_t q_cols, float q_scale,
                         Tensor y) {
  if (q_cols < 0 || q_cols > x.cols)
    fail("qk_l2_norm: ", q_cols, " columns of q in x ", shape_of(x));
  l2_norm(x, group, eps, y);
  scale(y.cols_view(0, q_cols), q_scale, y.cols_view(0, q_cols));
}

void Backend::rms_norm_gated(Tensor x, const Weight& w, int64_t group, float eps,
                             const Tensor& gate, OutputGate kind) {
  rms_norm(x, &w, group, eps, x);
  if (kind == OutputGate::Silu)
    swiglu(gate, x, x);
  else
    mul_sigmoid(x, gate, x);
}

void Backend::scaled_silu(const Tensor& x, float s, Tensor y) {
  scale(x, s, y);
  Tensor ones = alloc(y.rows, y.cols);
  fill(ones, 1.0f);
  swiglu(y, ones, y);
  release(ones);
}

void Backend::mean_mul_sigmoid_streams(const Tensor& x, Tensor gate, int64_t streams, Tensor y) {
  check_streams("mean_mul_sigmoid_streams", x, "y", y, streams);
  check_streams("mean_mul_sigmoid_streams", gate, "y", y, streams);
  mul_sigmoid(x, gate, gate);
  const int64_t n = y.cols;
  copy(gate.cols_view(0, n), y);
  for (int64_t s = 1; s < streams; ++s) add(y, gate.cols_view(s * n, n), y);
  scale(y, 1.0f / float(streams), y);
}

void Backend::inject_streams(Tensor x, const Tensor& out, Tensor logits, float logit_scale) {
  const int64_t n = out.cols, streams = logits.cols;
  check_streams("inject_streams", x, "out", out, streams);
  if (logits.rows != x.rows || spans_overlap(x, logits))
    fail("inject_streams: logits ", shape_of(logits), " need one row per row of x ", shape_of(x),
         " and memory of their own");
  scale(logits, logit_scale, logits);
  Tensor part = alloc(out.rows, n);
  for (int64_t s = 0; s < streams; ++s) {
    mul_sigmoid(out, logits.cols_view(s, 1), part);
    scale(part, 2.0f, part);
    add(x.cols_view(s * n, n), part, x.cols_view(s * n, n));
  }
  release(part);
}

namespace {

// The sequences' rows are in order, none empty or past the window or overlapping; their states
// (state(i): one tensor of sequence i) are distinct and have one width and stride, and one row
// count unless `rows_may_differ` (KV caches of different context sizes).
template <class Sequences, class StateOf>
void check_sequence_rows(const char* op, int64_t rows, const Sequences& sequences, StateOf state,
                         bool rows_may_differ) {
  if (sequences.empty()) fail(op, ": no sequences");
  int64_t next = 0;
  const Tensor& a = state(0);
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& s = sequences[i];
    if (s.first < next || s.rows < 1 || s.first + s.rows > rows)
      fail(op, ": sequence ", i, " (rows ", s.first, "..", s.first + s.rows - 1,
           ") is empty, outside the window's ", rows, " rows or overlaps the one before");
    next = s.first + s.rows;
    const Tensor& t = state(i);
    if ((!rows_may_differ && t.rows != a.rows) || t.cols != a.cols || t.stride != a.stride)
      fail(op, ": sequence ", i, "'s state [", t.rows, " x ", t.cols, ", stride ", t.stride,
           "] differs in shape from sequence 0's [", a.rows, " x ", a.cols, ", stride ", a.stride, "]");
    for (size_t j = 0; j < i; ++j)
      if (state(j).data == t.data) fail(op, ": sequences ", j, " and ", i, " share one state");
  }
}

}  // namespace

void check_sequences(const char* op, int64_t rows, std::span<const SequenceState> sequences) {
  check_sequence_rows(op, rows, sequences, [&](size_t i) -> const Tensor& { return sequences[i].state; }, false);
}

void check_sequences(const char* op, int64_t rows, std::span<const SequenceCache> sequences) {
  check_sequence_rows(op, rows, sequences, [&](size_t i) -> const Tensor& { return sequences[i].k_cache; }, true);
  check_sequence_rows(op, rows, sequences, [&](size_t i) -> const Tensor& { return sequences[i].v_cache; }, true);
}

void check_delta_net_ba(const DeltaNetRecurrence& r, int64_t rows) {
  if (r.ba_groups <= 0) return;
  if (r.n_heads % r.ba_groups != 0 || r.ba.cols != 2 * r.n_heads || r.ba.rows != rows ||
      r.ba.stride < r.ba.cols || (rows > 0 && !r.ba.data))
    fail("delta_net_recurrence: ba ", shape_of(r.ba), " is not ", r.ba_groups,
         " groups of b and a for ", r.n_heads, " heads and ", rows, " rows");
}

void Backend::kv_write_sequences(std::span<const SequenceCache> sequences, const Tensor& k,
                                 const Tensor& v, const Ids& positions) {
  check_sequences("kv_write_sequences", k.rows, sequences);
  for (const SequenceCache& s : sequences)
    kv_write(s.k_cache, s.v_cache, k.rows_view(s.first, s.rows), v.rows_view(s.first, s.rows),
             positions.rows_view(s.first, s.rows));
}

void Backend::attention_sequences(const Tensor& q, std::span<const SequenceCache> sequences,
                                  const Ids& positions, int64_t n_head, int64_t n_head_kv,
                                  int64_t head_dim, float scale, Tensor y) {
  check_sequences("attention_sequences", q.rows, sequences);
  for (const SequenceCache& s : sequences)
    attention(q.rows_view(s.first, s.rows), s.k_cache, s.v_cache, positions.rows_view(s.first, s.rows),
              n_head, n_head_kv, head_dim, scale, y.rows_view(s.first, s.rows));
}

void Backend::conv1d_silu_sequences(const Tensor& x, std::span<const SequenceState> sequences,
                                    const Weight& w, Tensor y) {
  check_sequences("conv1d_silu_sequences", x.rows, sequences);
  for (const SequenceState& s : sequences)
    conv1d_silu(x.rows_view(s.first, s.rows), s.state, w, y.rows_view(s.first, s.rows));
}

void Backend::gated_delta_rule_sequences(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& g, const Tensor& beta,
                                         std::span<const SequenceState> sequences, int64_t n_heads,
                                         HeadRepeat repeat, Tensor y) {
  check_sequences("gated_delta_rule_sequences", q.rows, sequences);
  for (const SequenceState& s : sequences) {
    const auto rows = [&s](const Tensor& t) { return t.rows_view(s.first, s.rows); };
    gated_delta_rule(rows(q), rows(k), rows(v), rows(g), rows(beta), s.state, n_heads, repeat,
                     rows(y));
  }
}

void Backend::delta_net_recurrence(const DeltaNetRecurrence& r, Tensor y) {
  delta_net_ops(*this, r, y);
}

void delta_net_ops(Backend& be, const DeltaNetRecurrence& r, Tensor y, const DeltaNetTaps& taps) {
  const int64_t T = r.qkv.rows, key_dim = (r.qkv.cols - y.cols) / 2;
  if (key_dim <= 0 || 2 * key_dim + y.cols != r.qkv.cols || y.rows != T)
    fail("delta_net_recurrence: qkv ", shape_of(r.qkv), " is not q, k and the values of y ",
         shape_of(y));
  std::vector<Tensor> owned;
  const auto alloc = [&](int64_t rows, int64_t cols) { return owned.emplace_back(be.alloc(rows, cols)); };
  // causal_conv1d_fn(..., activation="silu"), each sequence's rows with its own conv state
  const Tensor conv = alloc(T, r.qkv.cols);
  be.conv1d_silu_sequences(r.qkv, r.conv_states, *r.conv, conv);
  if (taps.after_conv) taps.after_conv(conv);
  // beta = b.sigmoid(); g = -self.A_log.exp() * F.softplus(a + self.dt_bias)
  const Tensor beta = alloc(T, r.n_heads), g = alloc(T, r.n_heads);
  Tensor b = r.b, a = r.a;
  if (r.ba_groups > 0) {
    check_delta_net_ba(r, T);
    // fix_query_key_value_ordering: b, a
    const int64_t widths[] = {r.n_heads / r.ba_groups, r.n_heads / r.ba_groups};
    b = alloc(T, r.n_heads), a = alloc(T, r.n_heads);
    Tensor parts[] = {b, a};
    be.split_groups(r.ba, r.ba_groups, widths, parts);
  }
  be.ssm_gates(b, a, *r.dt_bias, *r.ssm_a, beta, g);
  // torch_*_gated_delta_rule(use_qk_l2norm_in_kernel=True): l2norm(q), l2norm(k), q * dk^-0.5;
  // torch.split(mixed_qkv, [key_dim, key_dim, value_dim]): q and k are the conv's first columns
  const Tensor qk = alloc(T, 2 * key_dim);
  be.qk_l2_norm(conv.cols_view(0, 2 * key_dim), r.state, r.l2_eps, key_dim, r.q_scale, qk);
  const Tensor q = qk.cols_view(0, key_dim), k = qk.cols_view(key_dim, key_dim),
               v = conv.cols_view(2 * key_dim, y.cols);
  if (taps.before_rule) taps.before_rule(q, k, v, g, beta);
  // q and k stay at their key heads: the op reads key head g of value head h as the reference's
  // repeat_interleave (Qwen3-Next) or tile (the others) would have put it there.
  be.gated_delta_rule_sequences(q, k, v, g, beta, r.ssm_states, r.n_heads, r.repeat, y);
  if (taps.after_rule) taps.after_rule(y);
  // self.norm(core_attn_out, z): rms_norm, then * silu(z) (or * sigmoid(z))
  be.rms_norm_gated(y, *r.norm, r.state, r.norm_eps, r.z, r.gate);
  for (const Tensor& t : owned) be.release(t);
}

Ids make_ids(Backend& be, std::span<const int32_t> host, int64_t rows, int64_t cols) {
  if (int64_t(host.size()) != rows * cols)
    fail("make_ids: ", host.size(), " values for [", rows, " x ", cols, "]");
  Ids ids = be.alloc_ids(rows, cols);
  be.upload_ids(host.data(), ids);
  return ids;
}

Routing download_routing(Backend& be, const Ids& experts, const Tensor& weights) {
  if (experts.rows != weights.rows || experts.cols != weights.cols)
    fail("download_routing: experts [", experts.rows, " x ", experts.cols, "] and weights [",
         weights.rows, " x ", weights.cols, "] differ in shape");
  Routing r;
  r.top_k = experts.cols;
  r.experts.resize(size_t(experts.size()));
  r.weights.resize(size_t(experts.size()));
  be.download_ids(experts, r.experts.data());
  be.download(weights, r.weights.data());
  return r;
}

void upload_routing(Backend& be, const Routing& routing, Ids experts, Tensor weights) {
  if (routing.top_k != experts.cols || int64_t(routing.experts.size()) != experts.size() ||
      routing.weights.size() != routing.experts.size() || weights.rows != experts.rows ||
      weights.cols != experts.cols)
    fail("upload_routing: a routing of ", routing.experts.size(), " experts (top-", routing.top_k,
         ") does not fit [", experts.rows, " x ", experts.cols, "]");
  be.upload_ids(routing.experts.data(), experts);
  be.upload(routing.weights.data(), weights);
}

}  // namespace strata::backend
