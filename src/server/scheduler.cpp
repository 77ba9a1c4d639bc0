#include "server/scheduler.h"

#include <algorithm>
#include <exception>

namespace strata::server {

Job::Job(Work work, Clock::time_point deadline) : work_(std::move(work)), deadline_(deadline) {}

void Job::set_phase(Phase p) {
  {
    std::lock_guard lock(mutex_);
    phase_ = p;
  }
  changed_.notify_all();
}

Job::Phase Job::wait_started(Clock::time_point until) {
  std::unique_lock lock(mutex_);
  changed_.wait_until(lock, until, [&] { return phase_ != Phase::Queued; });
  return phase_;
}

bool Job::next(std::vector<std::string>& pieces, Clock::time_point until) {
  std::unique_lock lock(mutex_);
  changed_.wait_until(lock, until, [&] { return !pending_.empty() || phase_ == Phase::Done; });
  const bool more = !pending_.empty() || phase_ != Phase::Done;
  for (auto& p : pending_) pieces.push_back(std::move(p));
  pending_.clear();
  return more;
}

void Job::emit(const std::string& piece) {
  {
    std::lock_guard lock(mutex_);
    pending_.push_back(piece);
  }
  changed_.notify_all();
}

void Job::count_token() {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  if (tokens_ == 0) first_token_ns_ = now;
  last_token_ns_ = now;
  ++tokens_;
}

Job::Progress Job::progress() const {
  Progress p;
  p.sequence = worker_;
  // Racing count_token, the times may lag the count by a token: a figure, not an invariant.
  const int64_t first = first_token_ns_, last = last_token_ns_;
  p.tokens = tokens_;
  if (p.tokens >= 2 && last > first) p.decode_tok_per_s = double(p.tokens - 1) / (double(last - first) * 1e-9);
  return p;
}

void Job::run(size_t worker) {
  worker_ = worker;
  set_phase(Phase::Running);
  try {
    result_ = work_(*this);
  } catch (const std::exception& e) {
    error_ = e.what();
  }
}

void Job::finish() { set_phase(Phase::Done); }

void Job::drop() {
  std::lock_guard lock(mutex_);
  dropped_ = true;
}

Scheduler::Scheduler(size_t capacity, size_t workers) : capacity_(capacity) {
  for (size_t i = 0; i < std::max<size_t>(workers, 1); ++i) workers_.emplace_back([this, i] { work(i); });
}

Scheduler::~Scheduler() { shutdown(); }

Scheduler::Admission Scheduler::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return Admission::Closed;
    // Running jobs do not count against the queue, and a free worker always takes one.
    const size_t free = workers_.size() - running_.size();
    if (queue_.size() >= capacity_ + free) return Admission::Full;
    queue_.push_back(std::move(job));
  }
  wake_.notify_one();
  return Admission::Accepted;
}

void Scheduler::work(size_t worker) {
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return closed_ || !queue_.empty(); });
      if (closed_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_.push_back(job);
    }
    // A job whose client left or whose time ran out while it waited never starts.
    if (job->should_stop())
      job->drop();
    else
      job->run(worker);
    {
      std::lock_guard lock(mutex_);
      running_.erase(std::find(running_.begin(), running_.end(), job));
    }
    // Only now, so a client that has its answer sees an idle server.
    job->finish();
  }
}

void Scheduler::shutdown() {
  std::lock_guard once(shutdown_mutex_);
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    dropped.swap(queue_);
    for (auto& job : running_) job->abort();
  }
  wake_.notify_all();
  for (auto& job : dropped) {
    job->drop();
    job->finish();
  }
  for (auto& worker : workers_)
    if (worker.joinable()) worker.join();
}

size_t Scheduler::queued() const {
  std::lock_guard lock(mutex_);
  const size_t free = workers_.size() - running_.size();
  return queue_.size() > free ? queue_.size() - free : 0;
}

std::vector<Job::Progress> Scheduler::progress() const {
  std::vector<Job::Progress> out;
  {
    std::lock_guard lock(mutex_);
    for (const auto& job : running_) out.push_back(job->progress());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.sequence < b.sequence; });
  return out;
}

size_t Scheduler::running() const {
  std::lock_guard lock(mutex_);
  return running_.size();
}

}  // namespace strata::server
