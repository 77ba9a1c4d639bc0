#include "server/warmup.h"

#include <array>
#include <cstdio>
#include <exception>

namespace strata::server {

WarmUp::WarmUp(model::Model& model, double after_seconds)
    : model_(model), after_seconds_(after_seconds), last_active_(Clock::now()) {}

void WarmUp::before_request() {
  const Clock::time_point start = Clock::now();
  if (after_seconds_ <= 0 || model_.route_control() ||
      std::chrono::duration<double>(start - last_active_).count() < after_seconds_)
    return;
  try {
    if (!state_) state_.emplace(model_.new_state(1));
    state_->reset();
    const std::array<int32_t, 1> token{0};
    model_.forward(token, *state_, model::LogitsMode::Last);
    windows_ += 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[strata] warm-up window failed: %s\n", e.what());
  }
  last_active_ = Clock::now();
  nanoseconds_ += std::chrono::duration_cast<std::chrono::nanoseconds>(last_active_ - start).count();
}

void WarmUp::after_window() { last_active_ = Clock::now(); }

}  // namespace strata::server
