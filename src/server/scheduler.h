// Generations behind a bounded queue: `workers` worker threads each run one job at a time, in
// arrival order (one worker for the single model state; several when the jobs share windows
// through a BatchLoop, --parallel). HTTP threads submit a Job and read its streamed text as it is
// produced. A job whose client has gone, whose deadline has passed or whose server is shutting
// down stops at its next window (Job::should_stop), queued or running.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "decode/generate.h"

namespace strata::server {

using Clock = std::chrono::steady_clock;

class Job {
 public:
  // Runs on the worker thread; streams text through emit() and returns the result. Exceptions
  // are kept as error() for the HTTP thread.
  using Work = std::function<decode::GenerateResult(Job& job)>;

  Job(Work work, Clock::time_point deadline);

  enum class Phase { Queued, Running, Done };

  // The client is gone: stop as soon as possible; nobody reads the result.
  void cancel() { cancelled_ = true; }
  // The server is shutting down: stop at the next window and answer with what there is.
  void abort() { aborted_ = true; }
  bool cancelled() const { return cancelled_; }
  bool expired() const { return Clock::now() >= deadline_; }
  bool should_stop() const { return cancelled_ || aborted_ || expired(); }

  // Waits until the worker has picked the job up (or finished or dropped it), at most until
  // `until`. Returns the phase then.
  Phase wait_started(Clock::time_point until);
  // Moves text emitted so far into `pieces`, waiting until there is some, the job is done, or
  // `until`. Returns false once the job is done and everything has been taken.
  bool next(std::vector<std::string>& pieces, Clock::time_point until);

  // After Done: the result, or the reason there is none.
  const std::optional<decode::GenerateResult>& result() const { return result_; }
  const std::string& error() const { return error_; }
  bool dropped() const { return dropped_; }  // never ran (queue shut down or deadline passed)

  // A running job's figures for /metrics, read from any thread.
  struct Progress {
    size_t sequence = 0;  // the worker running it: 0 .. --parallel - 1
    int64_t tokens = 0;   // generated so far
    // Tokens after the first per second of decoding, from the first token to the latest (absent
    // before the second token).
    std::optional<double> decode_tok_per_s;
  };
  Progress progress() const;
  // Worker side: one more token generated (the generation's on_token hook).
  void count_token();

  // Worker side: run() (or drop() for a job that never starts), then finish(), which wakes the
  // HTTP thread. result() and error() are written by run() alone and read only after Done.
  void emit(const std::string& piece);
  void run(size_t worker = 0);
  void drop();
  void finish();

 private:
  void set_phase(Phase p);

  Work work_;
  Clock::time_point deadline_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> aborted_{false};
  std::mutex mutex_;
  std::condition_variable changed_;
  Phase phase_ = Phase::Queued;
  std::vector<std::string> pending_;
  std::optional<decode::GenerateResult> result_;
  std::string error_;
  bool dropped_ = false;
  std::atomic<size_t> worker_{0};
  std::atomic<int64_t> tokens_{0};
  std::atomic<int64_t> first_token_ns_{0}, last_token_ns_{0};  // steady clock, since its epoch
};

class Scheduler {
 public:
  // `capacity`: jobs that may wait while `workers` (>= 1) jobs run.
  explicit Scheduler(size_t capacity, size_t workers = 1);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Admission { Accepted, Full, Closed };
  Admission submit(std::shared_ptr<Job> job);

  // Stops taking jobs, drops the queued ones, aborts the running ones (they end at their next
  // window and answer with what they have) and joins the workers. Idempotent.
  void shutdown();

  // Jobs waiting for a worker.
  size_t queued() const;
  size_t running() const;
  // The running jobs' progress, by sequence.
  std::vector<Job::Progress> progress() const;
  size_t capacity() const { return capacity_; }
  size_t workers() const { return workers_.size(); }

 private:
  void work(size_t worker);

  const size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> running_;
  bool closed_ = false;
  std::mutex shutdown_mutex_;  // a signal watcher and the serving thread may both shut down
  std::vector<std::thread> workers_;
};

}  // namespace strata::server
