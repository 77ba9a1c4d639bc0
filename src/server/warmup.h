// The warm-up window (strata serve --warmup-after SECONDS; docs/SERVER.md): when a request arrives
// after the model has been idle that long, one window of one token runs first, on a state of its
// own, so what an idle machine lets go cold (the GPU's clocks and caches, pages of the mapped trunk,
// the host's caches) is paid there and not by the request's first window. Its output is dropped,
// so no request's tokens change; a streamed model's expert cache sees its routing like any other
// window's. Skipped while a route control is installed (a recorded trace must hold only requests'
// routing). Called only from the thread that runs the model.
#pragma once

#include <atomic>
#include <chrono>
#include <optional>

#include "model/model.h"
#include "model/state.h"

namespace strata::server {

class WarmUp {
 public:
  // `after_seconds` <= 0: never. `model` must outlive this.
  WarmUp(model::Model& model, double after_seconds);

  // Before a request's first window: runs the warm-up window when the model has been idle (since
  // start-up or its last window) at least `after_seconds`. A failed warm-up is reported on stderr
  // and otherwise ignored: the request's own window will meet the same failure and report it.
  void before_request();
  // After a window ran: the model is busy now.
  void after_window();

  uint64_t windows() const { return windows_.load(); }  // warm-up windows that ran to the end
  double seconds() const { return double(nanoseconds_.load()) * 1e-9; }

 private:
  using Clock = std::chrono::steady_clock;

  model::Model& model_;
  const double after_seconds_;
  Clock::time_point last_active_;
  std::optional<model::State> state_;  // made at the first warm-up, reused (one window key)
  std::atomic<uint64_t> windows_{0};
  std::atomic<int64_t> nanoseconds_{0};  // failed warm-ups' time too
};

}  // namespace strata::server
