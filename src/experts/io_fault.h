// Fault injection for expert reads: a FileIo that wraps the real one (io_uring or pread) and,
// at chosen rates, fails a read with EIO before it reaches the kernel, submits it shorter (so the
// kernel really returns a short read), or flips one bit of what landed. The reader must detect
// every one (retry, or fail the request with an error naming the record); docs/RELIABILITY.md
// records the figures. Tests install it through ReaderOptions::wrap; `strata run` and `strata
// serve` install it when STRATA_IO_FAULTS is set (a test hook: "eio=0.05,short=0.05,flip=0.05,
// seed=7"; rates are per read, 0..1).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "experts/expert_reader.h"
#include "util/rng.h"

namespace strata::experts {

struct FaultRates {
  double eio = 0;         // the read fails with EIO without being issued
  double short_read = 0;  // the read is issued for fewer bytes than asked
  double flip = 0;        // one bit of a complete read is flipped after it lands
  uint64_t seed = 1;
};

// "eio=0.1,short=0.05,flip=0.01,seed=3" (any subset, any order). Throws strata::Error naming
// the part it cannot read.
FaultRates parse_fault_rates(const std::string& spec);

// Shared by every reader thread's wrapper: the rates (changeable while reads run) and what was
// injected so far.
class FaultInjector {
 public:
  explicit FaultInjector(FaultRates rates) : rates_(rates), rng_(rates.seed) {}

  void set_rates(FaultRates rates);
  FaultRates rates() const;

  struct Counts {
    uint64_t reads = 0, eio = 0, short_reads = 0, flips = 0;
    uint64_t total() const { return eio + short_reads + flips; }
  };
  Counts counts() const;
  std::string summary() const;  // "I/O faults injected: 3 EIO, 2 short reads, 1 bit flip in 40 reads"

  // Wraps a reader thread's FileIo (for ReaderOptions::wrap).
  std::unique_ptr<FileIo> wrap(std::unique_ptr<FileIo> inner);

  enum class Fault { None, Eio, Short, Flip };
  // Decides the next read's fault and counts it (a flip is counted by count_flip(), once a read
  // has landed bytes to flip).
  Fault draw();
  void count_flip();

 private:
  mutable std::mutex mutex_;
  FaultRates rates_;
  Rng rng_;
  Counts counts_;
};

}  // namespace strata::experts
