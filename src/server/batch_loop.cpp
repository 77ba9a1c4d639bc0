#include "server/batch_loop.h"

#include <algorithm>
#include <exception>

#include "util/error.h"

namespace strata::server {

BatchLoop::BatchLoop(model::Model& model, const tokenizer::Tokenizer& tokenizer, decode::SessionOptions session,
                     size_t slots, int64_t row_budget, WarmUp* warmup)
    : busy_(slots, false), last_used_(slots, 0), batcher_(model, row_budget), warmup_(warmup) {
  if (slots < 1) fail("--parallel: at least one sequence");
  session.snapshot_prompt = true;
  for (size_t i = 0; i < slots; ++i) sessions_.push_back(std::make_unique<decode::Session>(model, tokenizer, session));
  thread_ = std::thread([this] { loop(); });
}

BatchLoop::~BatchLoop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

decode::GenerateResult BatchLoop::run(std::span<const int32_t> prompt, const decode::GenerateParams& params,
                                      const decode::PieceFn& on_piece) {
  Request r;
  r.prompt = prompt;
  r.params = &params;
  r.on_piece = &on_piece;
  {
    std::unique_lock lock(mutex_);
    // The free slot that can reuse most of this prompt keeps its cache hit; among equals the one
    // used longest ago, so a new conversation does not evict a recent one.
    std::optional<size_t> best;
    int64_t best_reuse = 0;
    for (size_t i = 0; i < sessions_.size(); ++i) {
      if (busy_[i]) continue;
      const int64_t reuse = sessions_[i]->reusable(prompt);
      if (!best || reuse > best_reuse || (reuse == best_reuse && last_used_[i] < last_used_[*best])) {
        best = i;
        best_reuse = reuse;
      }
    }
    if (!best) fail("internal error: more generations at once than --parallel sequences");
    r.slot = *best;
    busy_[r.slot] = true;
    last_used_[r.slot] = ++uses_;
    incoming_.push_back(&r);
    changed_.notify_all();
    changed_.wait(lock, [&] { return r.done; });
    busy_[r.slot] = false;
  }
  if (r.error) fail(*r.error);
  return r.run->result();
}

void BatchLoop::complete(Request* r) {
  {
    std::lock_guard lock(mutex_);
    r->done = true;
  }
  changed_.notify_all();
}

void BatchLoop::loop() {
  std::vector<Request*> active;
  for (;;) {
    std::vector<Request*> arrived;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !incoming_.empty() || !active.empty(); });
      if (stopping_ && incoming_.empty() && active.empty()) return;
      arrived.swap(incoming_);
    }
    if (warmup_ && active.empty() && !arrived.empty()) warmup_->before_request();
    for (Request* r : arrived) {
      try {
        r->run = std::make_unique<decode::SequenceRun>(*sessions_[r->slot], r->prompt, *r->params, *r->on_piece);
        active.push_back(r);
      } catch (const std::exception& e) {
        r->error = e.what();
        complete(r);
      }
    }
    std::vector<decode::SequenceRun*> runs;
    for (Request* r : active) runs.push_back(r->run.get());
    batcher_.step(runs);
    if (warmup_) warmup_->after_window();
    // A run may also end without rows in the window (a should_stop that fired).
    for (auto it = active.begin(); it != active.end();) {
      Request* r = *it;
      if (!r->run->done()) {
        ++it;
        continue;
      }
      if (r->run->error()) r->error = *r->run->error();
      it = active.erase(it);
      complete(r);
    }
  }
}

}  // namespace strata::server
