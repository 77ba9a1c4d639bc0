// ExpertReader: the I/O pool that brings pack records into caller memory (the expert arena or its
// staging buffers; docs/DESIGN.md, "Expert arena, tiers and I/O").
//
// - Reader threads (default 8), of which `urgent_threads` (default 2) serve only urgent requests,
//   so a miss never queues behind read-ahead. Urgent requests go before read-ahead ones.
// - One request per (layer, expert) record; a record larger than `piece_bytes` is split into
//   pieces that several threads read at once.
// - O_DIRECT reads into 4 KiB-aligned destinations (the page cache is not our cache); where the
//   filesystem refuses O_DIRECT (tmpfs) reads go through the page cache, with a one-time notice.
// - io_uring where the kernel allows it (each thread submits its pieces in one batch), else pread;
//   decided at run time.
// - Every record's checksum is checked when its last piece lands. EIO, short reads and checksum
//   mismatches are retried (max_retries times), then the request fails: wait() throws a
//   strata::Error naming the pack, layer, expert and offset. Never silent garbage.
// - Destruction with requests pending never hangs: queued requests fail ("reader shut down"),
//   reads in flight finish first.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace strata::experts {

class Pack;

// One read: fill `length` bytes at `dst` from file offset `offset`. `result` is set to the bytes
// read or -errno.
struct ReadOp {
  void* dst = nullptr;
  size_t length = 0;
  uint64_t offset = 0;
  ssize_t result = 0;
};

// The low-level reads, one instance per reader thread (so it needs no locking). Tests replace it
// to inject EIO, short reads and corrupted bytes.
class FileIo {
 public:
  virtual ~FileIo() = default;
  virtual const char* name() const = 0;
  // Performs every op on fd (in any order, possibly concurrently) and sets each op's result.
  // The default runs pread() on each.
  virtual void read(int fd, std::span<ReadOp> ops);
  virtual ssize_t pread(int fd, void* dst, size_t length, uint64_t offset);
};
using FileIoFactory = std::function<std::unique_ptr<FileIo>()>;
// Wraps each reader thread's FileIo, whichever backend it is (fault injection: io_fault.h).
using FileIoWrapper = std::function<std::unique_ptr<FileIo>(std::unique_ptr<FileIo>)>;

// Plain pread(2).
std::unique_ptr<FileIo> make_pread_io();
// An io_uring of `depth` entries submitting each batch at once; nullptr when the kernel refuses
// io_uring (old kernel, seccomp, io_uring_disabled).
std::unique_ptr<FileIo> make_uring_io(unsigned depth);

enum class Priority { Urgent, ReadAhead };

enum class IoBackend { Auto, Uring, Pread };

struct ReaderOptions {
  int threads = 8;
  int urgent_threads = 2;               // of `threads`, serving only urgent requests; < threads
  IoBackend backend = IoBackend::Auto;  // Auto: io_uring if the kernel allows, else pread
  bool direct = true;                   // O_DIRECT (falls back to buffered where refused)
  uint64_t piece_bytes = 512 << 10;     // records larger than this are split (multiple of 4 KiB)
  unsigned batch = 4;                   // pieces one thread takes (and io_uring submits) at once
  int max_retries = 3;                  // per piece (EIO, short read) and per record (checksum)
  FileIoFactory io;                     // overrides `backend` (tests)
  FileIoWrapper wrap;                   // applied to every thread's FileIo (fault injection)
};

// Counters since construction; GB/s = bytes / busy_seconds.
struct ReaderStats {
  uint64_t bytes = 0;       // record bytes delivered (checksum verified)
  uint64_t requests = 0;    // completed successfully
  uint64_t failed = 0;      // requests that failed
  uint64_t cancelled = 0;   // read-ahead requests dropped before any read
  uint64_t pieces = 0;      // reads issued (including retries)
  uint64_t retries = 0;     // reads or records re-done after EIO / short read / bad checksum
  double busy_seconds = 0;  // wall time with at least one read in flight
};

namespace detail {
struct Request;
}

// A submitted request. Copyable handle; the reader keeps what it needs until the read ends.
class Ticket {
 public:
  Ticket() = default;
  bool valid() const { return request_ != nullptr; }

 private:
  friend class ExpertReader;
  explicit Ticket(std::shared_ptr<detail::Request> r) : request_(std::move(r)) {}
  std::shared_ptr<detail::Request> request_;
};

class ExpertReader {
 public:
  // `pack` must outlive the reader. Throws on bad options or an unreadable pack file.
  ExpertReader(const Pack& pack, ReaderOptions options = {});
  ~ExpertReader();
  ExpertReader(const ExpertReader&) = delete;
  ExpertReader& operator=(const ExpertReader&) = delete;

  // Queues a read of record (layer, expert) into dst: 4 KiB-aligned, at least
  // pack.record(layer, expert).length bytes, and valid until wait() returns, ready() is true or
  // cancel() returned true. Throws on ids out of range or a misaligned dst.
  Ticket submit(int layer, int expert, void* dst, Priority priority);
  // Blocks until the request ends; throws its strata::Error if it failed or was cancelled.
  void wait(const Ticket& ticket);
  // The request ended (successfully or not); wait() then returns (or throws) at once.
  bool ready(const Ticket& ticket) const;
  // Drops a request no thread has started reading: true if dropped (dst is never touched; wait()
  // throws "cancelled"). False if it is under way or done: wait for it before reusing dst.
  bool cancel(const Ticket& ticket);
  // Moves a queued read-ahead request (a guess that turned into a miss) to the urgent queue.
  void promote(const Ticket& ticket);

  ReaderStats stats() const;
  // "io_uring" or "pread" (or the injected FileIo's name), and whether reads bypass the page cache.
  std::string backend_name() const;
  bool direct() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::experts
