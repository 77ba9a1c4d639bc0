// ExpertReader: a request is one record, cut into pieces of at most piece_bytes; pieces wait in
// the urgent or the read-ahead queue and any free thread of the right kind takes them. The
// thread that lands a request's last piece checks the record's checksum and completes it (or
// queues the whole record again after a mismatch). One mutex guards queues, request states and
// counters; reads and checksums run outside it.
#include "experts/expert_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "experts/pack.h"
#include "util/error.h"
#include "util/run_counters.h"

namespace strata::experts {

namespace detail {

enum State : int { kQueued, kDone, kFailed, kCancelled };

struct Request {
  int layer = 0, expert = 0;
  uint8_t* dst = nullptr;
  Record record;
  Priority priority = Priority::Urgent;
  int n_pieces = 0;
  int generation = 0;            // record-level attempt (a checksum mismatch reads it again)
  std::vector<uint8_t> claimed;  // per piece: taken by a thread in this generation
  int outstanding = 0;           // pieces of this generation not finished
  bool started = false;          // a thread took a piece (cancel no longer possible)
  std::string error;             // first failure of this generation
  std::atomic<int> state{kQueued};
};

}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;
using detail::Request;

struct PieceRef {
  std::shared_ptr<Request> request;
  int piece = 0;
  int generation = 0;
};

std::atomic<bool> g_direct_notice_shown{false};

void direct_notice(const std::string& path) {
  if (!g_direct_notice_shown.exchange(true))
    std::fprintf(
        stderr,
        "strata: %s: the filesystem refuses O_DIRECT; expert reads go through the page cache\n",
        path.c_str());
}

}  // namespace

struct ExpertReader::Impl {
  const Pack& pack;
  ReaderOptions opt;
  FileIoFactory factory;
  std::string io_name;
  unsigned batch = 1;
  int fd_direct = -1;
  int fd_buffered = -1;
  std::atomic<int> fd{-1};
  std::atomic<bool> direct{false};

  mutable std::mutex mu;
  // Idle readers wait on these: urgent_cv the urgent-only ones, work_cv the others. New work
  // wakes only as many as it gives work to (one per batch of pieces), urgent-only readers
  // first for urgent work: waking all eight readers for every record cost a context switch
  // each, on the cores the compute threads need (docs/PERFORMANCE.md, "Where a streamed token's
  // time goes").
  std::condition_variable urgent_cv, work_cv;
  int idle_urgent = 0, idle_general = 0;
  std::condition_variable done_cv;
  std::deque<PieceRef> urgent, readahead;
  bool stopping = false;
  ReaderStats stats;
  int in_flight = 0;
  Clock::time_point busy_since;
  std::vector<std::thread> threads;

  Impl(const Pack& p, ReaderOptions o) : pack(p), opt(std::move(o)) {}

  std::string what(const Request& r) const {
    return cat(pack.path(), ": layer ", r.layer, " expert ", r.expert);
  }

  void open_files() {
    if (pack.fd() < 0 || pack.path().empty())
      fail("ExpertReader: the pack has no file to read (opened from memory)");
    if (opt.direct) {
      fd_direct = ::open(pack.path().c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      if (fd_direct < 0 && errno != EINVAL)
        fail(pack.path(), ": cannot open: ", std::strerror(errno));
      if (fd_direct < 0) direct_notice(pack.path());
    }
    if (fd_direct >= 0) {
      fd = fd_direct;
      direct = true;
    } else if (!use_buffered()) {
      fail(pack.path(), ": cannot open: ", std::strerror(errno));
    }
  }

  // Switches reads to the page cache; false (errno set) if the file cannot be opened. Called with
  // mu held, or before the threads start.
  bool use_buffered() {
    if (fd_buffered < 0) fd_buffered = ::open(pack.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_buffered < 0) return false;
    fd = fd_buffered;
    direct = false;
    return true;
  }

  void choose_io() {
    if (opt.io) {
      factory = opt.io;
      io_name = factory()->name();
      return;
    }
    if (opt.backend != IoBackend::Pread && make_uring_io(opt.batch)) {
      const unsigned depth = opt.batch;
      factory = [depth]() -> std::unique_ptr<FileIo> {
        if (auto io = make_uring_io(depth)) return io;
        return make_pread_io();  // this thread's ring was refused (e.g. locked-memory limit)
      };
      io_name = "io_uring";
      batch = opt.batch;
      return;
    }
    if (opt.backend == IoBackend::Uring)
      fail("ExpertReader: io_uring is not available on this kernel");
    factory = make_pread_io;
    io_name = "pread";
  }

  bool has_work(bool urgent_only) const {
    return !urgent.empty() || (!urgent_only && !readahead.empty());
  }

  static bool live(const PieceRef& p) {
    const Request& r = *p.request;
    return r.state.load() == detail::kQueued && p.generation == r.generation &&
           !r.claimed[size_t(p.piece)];
  }

  void take(std::deque<PieceRef>& q, std::vector<PieceRef>& mine) {
    while (mine.size() < batch && !q.empty()) {
      PieceRef p = std::move(q.front());
      q.pop_front();
      if (!live(p)) continue;
      p.request->claimed[size_t(p.piece)] = 1;
      p.request->started = true;
      mine.push_back(std::move(p));
    }
  }

  void queue(const std::shared_ptr<Request>& r) {
    auto& q = r->priority == Priority::Urgent ? urgent : readahead;
    for (int i = 0; i < r->n_pieces; ++i) q.push_back({r, i, r->generation});
    wake(r->n_pieces, r->priority == Priority::Urgent);
  }

  // Wakes idle readers for `pieces` new pieces: one per batch, as many as are idle. A reader
  // woken for work another took goes back to sleep; a busy one looks at the queues before it
  // sleeps, so no piece waits while a reader could take it. Called with mu held.
  void wake(int pieces, bool is_urgent) {
    int wakes = (pieces + int(batch) - 1) / int(batch);
    if (is_urgent) {
      for (int i = 0; i < std::min(wakes, idle_urgent); ++i) urgent_cv.notify_one();
      wakes -= std::min(wakes, idle_urgent);
    }
    for (int i = 0; i < std::min(wakes, idle_general); ++i) work_cv.notify_one();
  }

  void finish(Request& r, int state) {
    r.state = state;
    if (state == detail::kDone) {
      ++stats.requests;
      stats.bytes += r.record.length;
    } else if (state == detail::kFailed) {
      ++stats.failed;
    }
    done_cv.notify_all();
  }

  void begin_reads(size_t n) {
    if (in_flight == 0) busy_since = Clock::now();
    in_flight += int(n);
  }
  void end_reads(size_t n) {
    in_flight -= int(n);
    if (in_flight == 0)
      stats.busy_seconds += std::chrono::duration<double>(Clock::now() - busy_since).count();
  }

  // Reads the pieces, retrying failed ones; returns per piece "" or why it failed for good.
  std::vector<std::string> read_pieces(FileIo& io, const std::vector<PieceRef>& mine,
                                       uint64_t& issued, uint64_t& retried) {
    std::vector<std::string> errors(mine.size());
    std::vector<size_t> todo(mine.size());
    for (size_t i = 0; i < mine.size(); ++i) todo[i] = i;
    std::vector<int> attempts(mine.size(), 0);
    std::vector<ReadOp> ops;
    while (!todo.empty()) {
      ops.clear();
      for (size_t i : todo) {
        const Request& r = *mine[i].request;
        const uint64_t at = uint64_t(mine[i].piece) * opt.piece_bytes;
        const uint64_t len = std::min<uint64_t>(opt.piece_bytes, r.record.length - at);
        ops.push_back({r.dst + at, size_t(len), r.record.offset + at, 0});
      }
      const bool was_direct = direct;
      try {
        io.read(fd, ops);
      } catch (const std::exception&) {
        for (ReadOp& op : ops) op.result = -EIO;
      }
      issued += ops.size();
      std::vector<size_t> again;
      for (size_t k = 0; k < ops.size(); ++k) {
        const size_t i = todo[k];
        const ReadOp& op = ops[k];
        if (op.result == ssize_t(op.length)) continue;
        if (op.result == -EINVAL && was_direct) {
          // The filesystem took O_DIRECT at open but refuses it on read: not the pack's fault.
          std::lock_guard lock(mu);
          if (!direct || use_buffered()) {
            direct_notice(pack.path());
            again.push_back(i);
            continue;
          }
        }
        if (++attempts[i] <= opt.max_retries) {
          ++retried;
          again.push_back(i);
          continue;
        }
        const std::string why = op.result < 0
                                    ? std::string(std::strerror(int(-op.result)))
                                    : cat("short read (", op.result, " of ", op.length, " bytes)");
        errors[i] = cat(what(*mine[i].request), ": read of ", op.length, " bytes at offset ",
                        op.offset, " failed after ", attempts[i], " attempts: ", why);
      }
      todo = std::move(again);
    }
    return errors;
  }

  // A reader thread's FileIo, made on the constructing thread so that a factory (a test's, with
  // state) is never called from two threads at once.
  std::unique_ptr<FileIo> make_io() {
    std::unique_ptr<FileIo> io;
    try {
      io = factory();
    } catch (const std::exception&) {
    }
    if (!io) io = make_pread_io();
    if (opt.wrap) io = opt.wrap(std::move(io));
    return io;
  }

  void worker(bool urgent_only, std::unique_ptr<FileIo> io) {
    util::name_thread(util::kReaderThreadName);
    std::vector<PieceRef> mine;
    std::vector<std::shared_ptr<Request>> landed;
    std::unique_lock lock(mu);
    for (;;) {
      int& idle = urgent_only ? idle_urgent : idle_general;
      ++idle;
      (urgent_only ? urgent_cv : work_cv).wait(lock, [&] { return stopping || has_work(urgent_only); });
      --idle;
      if (stopping) return;
      mine.clear();
      take(urgent, mine);
      // An urgent batch is not held back by read-ahead pieces riding along.
      if (mine.empty() && !urgent_only) take(readahead, mine);
      if (mine.empty()) continue;
      begin_reads(mine.size());
      lock.unlock();
      uint64_t issued = 0, retried = 0;
      const std::vector<std::string> errors = read_pieces(*io, mine, issued, retried);
      lock.lock();
      end_reads(mine.size());
      stats.pieces += issued;
      stats.retries += retried;
      landed.clear();
      for (size_t i = 0; i < mine.size(); ++i) {
        Request& r = *mine[i].request;
        if (!errors[i].empty() && r.error.empty()) r.error = errors[i];
        if (--r.outstanding > 0) continue;
        if (!r.error.empty()) {
          finish(r, detail::kFailed);
        } else {
          landed.push_back(mine[i].request);
        }
      }
      if (landed.empty()) continue;
      lock.unlock();
      std::vector<uint64_t> sums;
      for (const auto& r : landed) sums.push_back(checksum(r->dst, size_t(r->record.length)));
      lock.lock();
      for (size_t i = 0; i < landed.size(); ++i) {
        Request& r = *landed[i];
        if (sums[i] == r.record.checksum) {
          finish(r, detail::kDone);
        } else if (r.generation < opt.max_retries && !stopping) {
          ++stats.retries;
          ++r.generation;
          std::fill(r.claimed.begin(), r.claimed.end(), 0);
          r.outstanding = r.n_pieces;
          queue(landed[i]);
        } else {
          r.error = cat(what(r), ": record at offset ", r.record.offset, " (", r.record.length,
                        " bytes) fails its checksum after ", r.generation + 1, " reads (index ",
                        std::hex, r.record.checksum, ", read ", sums[i], std::dec,
                        "); the pack is damaged: check it with `strata pack --verify`");
          finish(r, detail::kFailed);
        }
      }
    }
  }

  void shutdown() {
    std::unique_lock lock(mu);
    stopping = true;
    for (auto* q : {&urgent, &readahead}) {
      for (const PieceRef& p : *q) {
        if (!live(p)) continue;
        Request& r = *p.request;
        r.claimed[size_t(p.piece)] = 1;
        if (r.error.empty())
          r.error = cat(what(r), ": the expert reader shut down before the read");
        if (--r.outstanding == 0) finish(r, detail::kFailed);
      }
      q->clear();
    }
    urgent_cv.notify_all();
    work_cv.notify_all();
    lock.unlock();
    for (auto& t : threads) t.join();
  }
};

ExpertReader::ExpertReader(const Pack& pack, ReaderOptions options)
    : impl_(std::make_unique<Impl>(pack, std::move(options))) {
  Impl& m = *impl_;
  const ReaderOptions& o = m.opt;
  if (o.threads < 1) fail("ExpertReader: threads must be at least 1, not ", o.threads);
  if (o.urgent_threads < 0 || o.urgent_threads >= o.threads)
    fail("ExpertReader: urgent threads (", o.urgent_threads, ") must be in [0, threads (",
         o.threads, ")) so read-ahead is served too");
  if (o.piece_bytes == 0 || o.piece_bytes % kPackAlignment != 0 ||
      o.piece_bytes > (uint64_t(1) << 30))
    fail("ExpertReader: piece size ", o.piece_bytes, " is not a multiple of ", kPackAlignment,
         " up to 1 GiB");
  if (o.batch < 1 || o.batch > 256) fail("ExpertReader: batch ", o.batch, " out of range (1..256)");
  if (o.max_retries < 0 || o.max_retries > 100)
    fail("ExpertReader: max_retries ", o.max_retries, " out of range (0..100)");
  m.open_files();
  m.choose_io();
  for (int i = 0; i < o.threads; ++i)
    m.threads.emplace_back([&m, urgent_only = i < o.urgent_threads, io = m.make_io()]() mutable {
      m.worker(urgent_only, std::move(io));
    });
}

ExpertReader::~ExpertReader() {
  impl_->shutdown();
  if (impl_->fd_direct >= 0) ::close(impl_->fd_direct);
  if (impl_->fd_buffered >= 0) ::close(impl_->fd_buffered);
}

Ticket ExpertReader::submit(int layer, int expert, void* dst, Priority priority) {
  Impl& m = *impl_;
  const Record& rec = m.pack.record(layer, expert);
  if (reinterpret_cast<uintptr_t>(dst) % kPackAlignment != 0)
    fail(m.pack.path(), ": layer ", layer, " expert ", expert, ": destination ", dst, " is not ",
         kPackAlignment, "-byte aligned");
  auto r = std::make_shared<Request>();
  r->layer = layer;
  r->expert = expert;
  r->dst = static_cast<uint8_t*>(dst);
  r->record = rec;
  r->priority = priority;
  r->n_pieces = int((rec.length + m.opt.piece_bytes - 1) / m.opt.piece_bytes);
  r->claimed.assign(size_t(r->n_pieces), 0);
  r->outstanding = r->n_pieces;
  std::lock_guard lock(m.mu);
  if (m.stopping) fail(m.what(*r), ": submitted to an expert reader that is shutting down");
  m.queue(r);
  return Ticket(std::move(r));
}

void ExpertReader::wait(const Ticket& ticket) {
  if (!ticket.valid()) fail("ExpertReader::wait: empty ticket");
  Request& r = *ticket.request_;
  std::unique_lock lock(impl_->mu);
  impl_->done_cv.wait(lock, [&] { return r.state.load() != detail::kQueued; });
  if (r.state.load() != detail::kDone) throw Error(r.error);
}

bool ExpertReader::ready(const Ticket& ticket) const {
  return ticket.valid() && ticket.request_->state.load() != detail::kQueued;
}

bool ExpertReader::cancel(const Ticket& ticket) {
  if (!ticket.valid()) return false;
  Request& r = *ticket.request_;
  std::lock_guard lock(impl_->mu);
  if (r.state.load() == detail::kCancelled) return true;
  if (r.state.load() != detail::kQueued || r.started) return false;
  r.error = cat(impl_->what(r), ": read cancelled");
  ++impl_->stats.cancelled;
  impl_->finish(r, detail::kCancelled);
  return true;
}

void ExpertReader::promote(const Ticket& ticket) {
  if (!ticket.valid()) return;
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  Request& r = *ticket.request_;
  if (r.state.load() != detail::kQueued || r.priority == Priority::Urgent) return;
  r.priority = Priority::Urgent;
  int moved = 0;
  for (int i = 0; i < r.n_pieces; ++i)
    if (!r.claimed[size_t(i)]) {
      m.urgent.push_back({ticket.request_, i, r.generation});
      ++moved;
    }
  m.wake(moved, true);
}

ReaderStats ExpertReader::stats() const {
  std::lock_guard lock(impl_->mu);
  ReaderStats s = impl_->stats;
  if (impl_->in_flight > 0)
    s.busy_seconds += std::chrono::duration<double>(Clock::now() - impl_->busy_since).count();
  return s;
}

std::string ExpertReader::backend_name() const { return impl_->io_name; }

bool ExpertReader::direct() const { return impl_->direct.load(); }

}  // namespace strata::experts
