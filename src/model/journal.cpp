#include "model/journal.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "model/forward_common.h"
#include "model/qwen4exp.h"
#include "model/state.h"
#include "util/error.h"

namespace strata::model {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t new_layout() {
  static std::atomic<uint64_t> layouts{0};
  return ++layouts;
}

}  // namespace

Journal::Journal(backend::Backend& backend) : be_(backend), layout_(new_layout()) {}

Journal::~Journal() {
  for (Entry& e : entries_) {
    if (e.snapshot.data) be_.release(e.snapshot);
    for (Tensor& t : e.inputs)
      if (t.data) be_.release(t);
  }
}

// The copies outlive the window that takes them (a rollback reads them after it) and keep their
// addresses from window to window (a recorded window writes to them): inputs get room for a
// multiple of 8 rows, so windows of 2 to 8 rows share one layout.
Tensor Journal::ensure(Tensor& t, int64_t rows, int64_t cols, int64_t room) {
  if (!t.data || t.rows < rows || t.cols != cols) {
    if (t.data) be_.release(t);
    t = be_.alloc_lasting(std::max(rows, room), cols);
    layout_ = new_layout();
  }
  return t.rows_view(0, rows);
}

void Journal::begin(const State& state, std::span<const int32_t> tokens) {
  state_ = &state;
  n_past_ = state.n_past;
  tokens_.assign(tokens.begin(), tokens.end());
  ple_history_ = state.ple_history;
  used_ = 0;
}

Journal::Entry& Journal::next_entry(Op op, Tensor state, std::span<const Tensor* const> inputs) {
  const auto t0 = Clock::now();
  if (used_ == entries_.size()) entries_.emplace_back();
  Entry& e = entries_[used_++];
  e.op = op;
  e.state = state;
  be_.copy(state, ensure(e.snapshot, state.rows, state.cols, state.rows));
  e.inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    be_.copy(*inputs[i], ensure(e.inputs[i], inputs[i]->rows, inputs[i]->cols,
                                (inputs[i]->rows + 7) / 8 * 8));
  snapshot_bytes_ += uint64_t(state.rows * state.cols) * sizeof(float);
  snapshot_seconds_ += seconds_since(t0);
  return e;
}

void Journal::conv(Tensor state, const Tensor& x, const Weight& w, int64_t dilation) {
  const Tensor* in[] = {&x};
  Entry& e = next_entry(Op::Conv, state, in);
  e.w = w;
  e.dilation = dilation;
}

void Journal::delta_rule(Tensor state, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, int64_t n_heads,
                         backend::HeadRepeat repeat) {
  const Tensor* in[] = {&q, &k, &v, &g, &beta};
  Entry& e = next_entry(Op::DeltaRule, state, in);
  e.n_heads = n_heads;
  e.repeat = repeat;
}

void Journal::replay(Entry& e, int64_t keep) {
  be_.copy(e.snapshot.rows_view(0, e.state.rows), e.state);
  auto rows = [&](size_t i) { return e.inputs[i].rows_view(0, keep); };
  if (e.op == Op::Conv) {
    Tensor y = be_.alloc(keep, e.inputs[0].cols);
    if (e.dilation == 1)
      be_.conv1d_silu(rows(0), e.state, e.w, y);
    else
      be_.conv1d_dilated_silu(rows(0), e.state, e.w, e.dilation, y);
    be_.release(y);
    return;
  }
  Tensor y = be_.alloc(keep, e.inputs[2].cols);
  be_.gated_delta_rule(rows(0), rows(1), rows(2), rows(3), rows(4), e.state, e.n_heads, e.repeat,
                       y);
  be_.release(y);
}

void Journal::rollback(State& state, int64_t keep) {
  const int64_t T = window_rows();
  if (&state != state_) fail("rollback: the state is not the one the journal recorded");
  if (keep < 1 || keep > T) fail("rollback: keep ", keep, " rows of a window of ", T);
  if (state.n_past != n_past_ + T) fail("rollback: the state has moved since the window");
  if (keep == T) return;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < used_; ++i) replay(entries_[i], keep);
  state.n_past = n_past_ + keep;
  state.ple_history = ple_history_;
  if (!state.ple_history.empty())
    ple_advance_history(state.ple_history, std::span(tokens_).first(size_t(keep)));
  used_ = 0;
  tokens_.resize(size_t(keep));
  ++rollbacks_;
  rollback_seconds_ += seconds_since(t0);
}

}  // namespace strata::model
