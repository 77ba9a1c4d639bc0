// A window's boundaries on the expert cache and on the backend, and the key under which the
// backend may record it as a graph (Backend::begin_window). Shared by the trunk's windows
// (model.cpp) and the MTP head's (mtp.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "experts/expert_source.h"
#include "model/forward_common.h"
#include "model/model.h"
#include "model/state.h"

namespace strata::model {

// One sequence's part in a window's graph key: its rows, logits mode and state, and what of its
// rows is chosen in the window (a window of several sequences; KeyExtras for a window of one).
struct KeyPart {
  int64_t rows;
  LogitsMode mode;
  const State* state;
  bool greedy = false;
  int32_t top_k = 0;
  float sum_temperature = 0.0f;
  float draw_temperature = 0.0f;
  bool hidden = false;  // every row's hidden state is kept
};

// What else shapes a window's ops: a window of the MTP head (its block and head instead of the
// trunk), whether every row's hidden state is kept, whether the rows' greedy choices are made in
// the window, the journal whose copies a speculative window writes.
struct KeyExtras {
  bool mtp = false, hidden = false, greedy = false;
  int32_t top_k = 0;  // the rows' top-k candidates chosen in the window (0: not)
  float sum_temperature = 0.0f;  // the rows' softmax sums taken at it in the window (0: not)
  float draw_temperature = 0.0f;  // the rows' plain temperature draws at it in the window (0: not)
  const Journal* journal = nullptr;
  int64_t draft_head = 0, draft_tail_first = 0;  // an MTP window's draft vocabulary (model.h)
};

// The key: per sequence, in window order, its row count, logits mode and the state tensors it
// updates (a window of several sequences runs the same ops whenever the same states share it in
// the same order with the same rows), whether its MoE layers take host steps (their ops are the
// host's choice, outside the key's promise), and the extras. 0 (no recording) with dumps, which
// read activations back mid-window. Positions never enter the key: every op takes them as
// uploaded values (qwen4exp's QSA included, model/qsa.cpp).
uint64_t window_key(std::span<const KeyPart> parts, bool dumps, bool host_steps, const KeyExtras& extras);

// Whether the MoE layers take host steps (forward_common.cpp, moe()): a route control or an
// expert cache decides on the routing.
bool host_steps(bool routed, const experts::ExpertSource& source);

// The expert cache's window boundary, also when the window throws (a record that cannot be read):
// limbo retires and no expert stays held.
class ExpertWindow {
 public:
  explicit ExpertWindow(experts::ExpertSource& source) : source_(source) { source_.begin_window(); }
  ~ExpertWindow() { source_.end_window(); }
  ExpertWindow(const ExpertWindow&) = delete;
  ExpertWindow& operator=(const ExpertWindow&) = delete;

 private:
  experts::ExpertSource& source_;
};

// The backend's window: end() after the window's last op; a window that throws before it is
// closed as not completed (whatever was being recorded is dropped).
class BackendWindow {
 public:
  BackendWindow(backend::Backend& be, uint64_t key) : be_(be) { be_.begin_window(key); }
  ~BackendWindow() {
    if (open_) be_.end_window(false);
  }
  BackendWindow(const BackendWindow&) = delete;
  BackendWindow& operator=(const BackendWindow&) = delete;
  void end() {
    open_ = false;
    be_.end_window(true);
  }

 private:
  backend::Backend& be_;
  bool open_ = true;
};

// What a window gives back from its LM head: every logits row, or each row's greedy choice, top-k
// candidates or plain temperature draw, chosen by an op inside the window so that only a token
// (and, when asked, its probability) or k candidates per row are read back.
class WindowLogits {
 public:
  // Before the window's first layer, for `rows` logits rows: the choice's outputs allocated in
  // `keep` (which outlives the window's end) and a draw's uniforms uploaded, so that a replayed
  // window has every input before its walk reaches the layers. At most one of greedy and top;
  // probs only with greedy. Throws strata::Error otherwise.
  WindowLogits(backend::Backend& be, Scratch& keep, int64_t rows, std::vector<int32_t>* greedy,
               std::vector<float>* probs = nullptr, TopLogits* top = nullptr);
  // Inside the window, after the LM head: logits has the rows given at construction.
  void choose(const backend::Tensor& logits);
  // After the window: the logits rows, or none when the window chose (*greedy or *top holds it).
  std::vector<float> read(const backend::Tensor& logits);

 private:
  backend::Backend& be_;
  std::vector<int32_t>* greedy_;
  std::vector<float>* probs_;
  TopLogits* top_;
  int64_t rows_;
  backend::Ids index_;
  backend::Tensor values_;  // greedy: the probabilities; top-k: the candidates' logits
  backend::Tensor sums_;    // top-k with sums: the rows' softmax sums
  backend::Tensor uniforms_;  // a draw: the rows' uniform numbers
};

}  // namespace strata::model
