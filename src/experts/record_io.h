// How pack records reach host memory the expert cache owns (an arena slot, a landing buffer, a
// host tier slot): the pack through ExpertReader (make_reader_io), or in tests any other source of
// record bytes. One caller thread.
#pragma once

#include <cstdint>
#include <memory>

#include "experts/expert_reader.h"
#include "experts/pack.h"

namespace strata::experts {

class RecordIo {
 public:
  using Id = uint64_t;  // 0 is never an id
  struct Counters {
    uint64_t bytes = 0;       // record bytes delivered, checksums verified
    double busy_seconds = 0;  // wall time with a read in flight
  };

  virtual ~RecordIo() = default;
  // Queues a read of record (layer, expert) into dst (4 KiB-aligned host memory).
  virtual Id submit(int layer, int expert, void* dst, Priority priority) = 0;
  // Blocks until the read ends; throws its strata::Error (a bad checksum, an I/O error). The id
  // is finished either way.
  virtual void wait(Id id) = 0;
  // True: dropped before any byte was written, the id is finished. False: wait() for it.
  virtual bool cancel(Id id) = 0;
  // A queued read-ahead request that became a miss moves to the urgent queue.
  virtual void promote(Id id) = 0;
  virtual Counters counters() const = 0;
};

// ExpertReader over `pack` (which must outlive the result).
std::unique_ptr<RecordIo> make_reader_io(const Pack& pack, const ReaderOptions& options);

}  // namespace strata::experts
