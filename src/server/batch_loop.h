// --parallel N: up to N generations share decode windows (continuous batching). Each of the N
// slots is a decode::Session: its own model state and prompt cache. The scheduler's worker
// threads (one per slot) call run(), which hands the request to the loop thread and blocks until
// it is done; the loop thread alone runs the model and changes the sessions: it starts each
// request in the free slot that can reuse most of its prompt (so a conversation keeps its cache;
// the least recently used among equals), then pushes one window after another (decode::Batcher)
// while any request is active.
// Every generation's tokens are those it would get alone (the window-identity contract).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "decode/batcher.h"
#include "decode/generate.h"
#include "decode/sequence_run.h"
#include "server/warmup.h"

namespace strata::server {

class BatchLoop {
 public:
  // `model` and `tokenizer` must outlive this; `slots` >= 1 sessions made with `session` (its
  // context and speculation; each keeps a prompt snapshot); `row_budget`: prompt rows a window
  // takes beyond the decode rows. `warmup` (null: none) runs before the window that starts work
  // after idle. A generation running alone speculates when `session.spec` says so.
  BatchLoop(model::Model& model, const tokenizer::Tokenizer& tokenizer, decode::SessionOptions session,
            size_t slots, int64_t row_budget, WarmUp* warmup = nullptr);
  // Every run() must have returned (the scheduler has shut down).
  ~BatchLoop();
  BatchLoop(const BatchLoop&) = delete;
  BatchLoop& operator=(const BatchLoop&) = delete;

  // Runs one generation as Session::generate would, sharing windows with the others. Blocks
  // until it is done; on_piece and the hooks are called on the loop thread. Throws strata::Error
  // for a bad prompt or parameters and for a failed window. At most `slots` calls at once.
  decode::GenerateResult run(std::span<const int32_t> prompt, const decode::GenerateParams& params,
                             const decode::PieceFn& on_piece);

 private:
  struct Request {
    std::span<const int32_t> prompt;
    const decode::GenerateParams* params = nullptr;
    const decode::PieceFn* on_piece = nullptr;
    size_t slot = 0;
    std::unique_ptr<decode::SequenceRun> run;
    std::optional<std::string> error;
    bool done = false;
  };

  void loop();
  void complete(Request* r);

  std::vector<std::unique_ptr<decode::Session>> sessions_;
  std::vector<bool> busy_;
  std::vector<uint64_t> last_used_;  // when each slot last took a request (uses_ then)
  uint64_t uses_ = 0;
  decode::Batcher batcher_;
  WarmUp* warmup_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Request*> incoming_;  // handed over by run(), started by the loop thread
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace strata::server
