// ExpertReader: real reads through io_uring and pread (O_DIRECT on /tmp), many concurrent
// requests of mixed priority, splitting, cancel / promote, shutdown with work pending, and
// injected faults (EIO, short reads, corrupted bytes, O_DIRECT refused on read).
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "experts/expert_reader.h"
#include "experts/pack.h"
#include "pack_test_util.h"

namespace strata::experts {
namespace {

using namespace testing;

ReaderOptions options(int threads, int urgent, IoBackend backend = IoBackend::Auto,
                      uint64_t piece_bytes = 512 << 10) {
  ReaderOptions o;
  o.threads = threads;
  o.urgent_threads = urgent;
  o.backend = backend;
  o.piece_bytes = piece_bytes;
  return o;
}

// A pack of 3 layers x 6 experts with records of 12 KiB and up (Q8_0 256 x 64 parts).
class ReaderTest : public ::testing::Test {
 protected:
  void SetUp() override { make_pack(dir_.path().string()); }

  void make_pack(const std::string& folder) {
    model_path_ = folder + "/r.gguf";
    pack_path_ = model_path_ + ".experts";
    write_expert_gguf(model_path_, spec_);
    model_ = gguf::Reader::open(model_path_);
    write_pack(*model_, pack_path_);
    pack_ = Pack::open(pack_path_);
  }

  // The record as it must land: the GGUF's slices at the layout's offsets, zeros elsewhere.
  std::vector<uint8_t> expected(int layer, int expert) const {
    const Layout& l = pack_->layout(layer);
    std::vector<uint8_t> want(l.record_bytes, 0);
    for (int p = 0; p < 3; ++p) {
      const auto& t = model_->tensor(expert_stack_name(layer, p));
      const Part& part = l.part(p);
      std::memcpy(want.data() + part.offset, t.data + uint64_t(expert) * part.bytes(),
                  part.bytes());
    }
    return want;
  }

  bool landed_right(int layer, int expert, const uint8_t* dst) const {
    const auto want = expected(layer, expert);
    return std::memcmp(dst, want.data(), want.size()) == 0;
  }

  static std::string wait_error(ExpertReader& r, const Ticket& t) {
    return error_of([&] { r.wait(t); });
  }

  TempDir dir_;
  TinyExperts spec_ = tiny_experts(3, 6);
  std::string model_path_, pack_path_;
  std::unique_ptr<gguf::Reader> model_;
  std::unique_ptr<Pack> pack_;
};

// Reads every record once through `options` and checks every byte.
void read_all(ReaderTest& t, const Pack& pack, ExpertReader& reader,
              const std::function<bool(int, int, const uint8_t*)>& right) {
  const size_t stride = pack.max_record_bytes();
  AlignedBuffer buf(stride * size_t(pack.n_layers() * pack.n_experts()));
  std::vector<Ticket> tickets;
  for (int l = 0; l < pack.n_layers(); ++l)
    for (int e = 0; e < pack.n_experts(); ++e)
      tickets.push_back(reader.submit(l, e, buf.data() + tickets.size() * stride,
                                      e % 2 ? Priority::Urgent : Priority::ReadAhead));
  size_t i = 0;
  for (int l = 0; l < pack.n_layers(); ++l)
    for (int e = 0; e < pack.n_experts(); ++e, ++i) {
      reader.wait(tickets[i]);
      EXPECT_TRUE(reader.ready(tickets[i]));
      EXPECT_TRUE(right(l, e, buf.data() + i * stride)) << "layer " << l << " expert " << e;
    }
  const ReaderStats s = reader.stats();
  EXPECT_EQ(s.requests, tickets.size());
  EXPECT_EQ(s.failed, 0u);
  EXPECT_EQ(s.retries, 0u);
  EXPECT_EQ(s.bytes, pack.data_bytes());
  EXPECT_GT(s.busy_seconds, 0.0);
}

TEST_F(ReaderTest, PreadDirect) {
  ExpertReader reader(*pack_, options(3, 1, IoBackend::Pread));
  EXPECT_EQ(reader.backend_name(), "pread");
  read_all(*this, *pack_, reader,
           [&](int l, int e, const uint8_t* d) { return landed_right(l, e, d); });
}

TEST_F(ReaderTest, UringDirect) {
  if (!make_uring_io(4)) GTEST_SKIP() << "io_uring is not available on this kernel";
  ExpertReader reader(*pack_, options(2, 1, IoBackend::Uring, 4096));
  EXPECT_EQ(reader.backend_name(), "io_uring");
  read_all(*this, *pack_, reader,
           [&](int l, int e, const uint8_t* d) { return landed_right(l, e, d); });
  // Every record is more than one 4 KiB piece.
  EXPECT_GT(reader.stats().pieces, reader.stats().requests);
}

TEST_F(ReaderTest, ManyConcurrentRequestsOfMixedPriority) {
  ExpertReader reader(*pack_, options(4, 2, IoBackend::Auto, 8192));
  constexpr int kThreads = 3, kPerThread = 64;
  const size_t stride = pack_->max_record_bytes();
  std::atomic<int> wrong{0}, cancelled{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t)
    submitters.emplace_back([&, t] {
      std::mt19937 rng(uint32_t(t + 1));
      AlignedBuffer buf(stride * 8);
      std::vector<std::pair<int, int>> ids(8);
      std::vector<Ticket> tickets(8);
      for (int i = 0; i < kPerThread; i += 8) {
        for (int k = 0; k < 8; ++k) {
          ids[size_t(k)] = {int(rng() % 3), int(rng() % 6)};
          tickets[size_t(k)] = reader.submit(ids[size_t(k)].first, ids[size_t(k)].second,
                                             buf.data() + size_t(k) * stride,
                                             rng() % 2 ? Priority::Urgent : Priority::ReadAhead);
          if (rng() % 5 == 0) reader.promote(tickets[size_t(k)]);
        }
        for (int k = 0; k < 8; ++k) {
          if (rng() % 7 == 0 && reader.cancel(tickets[size_t(k)])) {
            ++cancelled;
            continue;
          }
          reader.wait(tickets[size_t(k)]);
          if (!landed_right(ids[size_t(k)].first, ids[size_t(k)].second,
                            buf.data() + size_t(k) * stride))
            ++wrong;
        }
      }
    });
  for (auto& s : submitters) s.join();
  EXPECT_EQ(wrong.load(), 0);
  const ReaderStats s = reader.stats();
  EXPECT_EQ(s.requests + s.cancelled, uint64_t(kThreads * kPerThread));
  EXPECT_EQ(s.cancelled, uint64_t(cancelled.load()));
  EXPECT_EQ(s.failed, 0u);
}

TEST_F(ReaderTest, RefusesBadRequestsAndOptions) {
  ExpertReader reader(*pack_, options(2, 1));
  AlignedBuffer buf(pack_->max_record_bytes() + 4096);
  EXPECT_THROW(reader.submit(3, 0, buf.data(), Priority::Urgent), Error);
  EXPECT_THROW(reader.submit(0, 6, buf.data(), Priority::Urgent), Error);
  try {
    reader.submit(0, 0, buf.data() + 64, Priority::Urgent);
    FAIL();
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "is not 4096-byte aligned");
  }
  EXPECT_THROW(ExpertReader(*pack_, options(2, 2)), Error);
  EXPECT_THROW(ExpertReader(*pack_, options(0, 0)), Error);
  EXPECT_THROW(ExpertReader(*pack_, options(8, 2, IoBackend::Auto, 1000)), Error);
  const auto image = read_bytes(pack_path_);
  const auto in_memory = Pack::from_memory(image.data(), image.size(), "mem.experts");
  EXPECT_THROW(ExpertReader(*in_memory, options(2, 1)), Error);
}

// A FileIo whose reads can block until released, fail, come up short or come back corrupted.
struct Faults {
  std::mutex mu;
  std::condition_variable cv;
  bool blocked = false;
  int eio = 0;  // next reads that fail with EIO
  int short_reads = 0;
  int corrupt = 0;  // next reads whose bytes get one bit flipped
  int einval = 0;   // next reads refused as O_DIRECT is by some filesystems
  bool eio_forever = false;
  int reads = 0;

  void release() {
    std::lock_guard lock(mu);
    blocked = false;
    cv.notify_all();
  }
};

class FaultyIo : public FileIo {
 public:
  explicit FaultyIo(Faults& f) : f_(f) {}
  const char* name() const override { return "faulty"; }
  ssize_t pread(int fd, void* dst, size_t length, uint64_t offset) override {
    std::unique_lock lock(f_.mu);
    ++f_.reads;
    f_.cv.wait(lock, [&] { return !f_.blocked; });
    if (f_.eio_forever) return -EIO;
    if (f_.einval > 0) {
      --f_.einval;
      return -EINVAL;
    }
    if (f_.eio > 0) {
      --f_.eio;
      return -EIO;
    }
    const bool cut = f_.short_reads > 0 && f_.short_reads--;
    const bool flip = f_.corrupt > 0 && f_.corrupt--;
    lock.unlock();
    const ssize_t got = FileIo::pread(fd, dst, cut ? length / 2 : length, offset);
    if (flip && got > 0) static_cast<uint8_t*>(dst)[got / 2] ^= 0x10;
    return got;
  }

 private:
  Faults& f_;
};

ReaderOptions faulty(Faults& f, int threads = 2) {
  ReaderOptions o;
  o.threads = threads;
  o.urgent_threads = 1;
  o.io = [&f] { return std::make_unique<FaultyIo>(f); };
  return o;
}

TEST_F(ReaderTest, TransientFaultsAreRetried) {
  Faults f;
  ExpertReader reader(*pack_, faulty(f));
  EXPECT_EQ(reader.backend_name(), "faulty");
  AlignedBuffer buf(pack_->max_record_bytes());
  const std::pair<int*, const char*> kinds[] = {
      {&f.eio, "EIO"}, {&f.short_reads, "short read"}, {&f.corrupt, "corruption"}};
  uint64_t retries = 0;
  for (const auto& [counter, what] : kinds) {
    {
      std::lock_guard lock(f.mu);
      *counter = 1;
    }
    std::memset(buf.data(), 0, buf.size());
    const Ticket t = reader.submit(1, 4, buf.data(), Priority::Urgent);
    EXPECT_EQ(wait_error(reader, t), "(no error)") << what;
    EXPECT_TRUE(landed_right(1, 4, buf.data())) << what;
    EXPECT_EQ(reader.stats().retries, ++retries) << what;
  }
}

TEST_F(ReaderTest, ODirectRefusedOnReadFallsBackToBuffered) {
  Faults f;
  f.einval = 1;
  ExpertReader reader(*pack_, faulty(f));
  ASSERT_TRUE(reader.direct()) << "/tmp does not take O_DIRECT";
  AlignedBuffer buf(pack_->max_record_bytes());
  const Ticket t = reader.submit(2, 1, buf.data(), Priority::Urgent);
  EXPECT_EQ(wait_error(reader, t), "(no error)");
  EXPECT_TRUE(landed_right(2, 1, buf.data()));
  EXPECT_FALSE(reader.direct());
  EXPECT_EQ(reader.stats().retries, 0u);
}

TEST_F(ReaderTest, PersistentEioFailsTheRequest) {
  Faults f;
  f.eio_forever = true;
  ExpertReader reader(*pack_, faulty(f));
  AlignedBuffer buf(pack_->max_record_bytes());
  const Ticket t = reader.submit(2, 5, buf.data(), Priority::ReadAhead);
  const std::string e = wait_error(reader, t);
  EXPECT_CONTAINS(e, pack_path_ + ": layer 2 expert 5: read of ");
  EXPECT_CONTAINS(e, "at offset " + std::to_string(pack_->record(2, 5).offset));
  EXPECT_CONTAINS(e, "failed after 4 attempts: Input/output error");
  EXPECT_EQ(reader.stats().failed, 1u);
  // The reader keeps working for the next request.
  f.eio_forever = false;
  const Ticket ok = reader.submit(0, 0, buf.data(), Priority::Urgent);
  EXPECT_EQ(wait_error(reader, ok), "(no error)");
  EXPECT_TRUE(landed_right(0, 0, buf.data()));
}

TEST_F(ReaderTest, PersistentCorruptionIsAnError) {
  Faults f;
  f.corrupt = 1000;
  ExpertReader reader(*pack_, faulty(f));
  AlignedBuffer buf(pack_->max_record_bytes());
  const Ticket t = reader.submit(1, 2, buf.data(), Priority::Urgent);
  const std::string e = wait_error(reader, t);
  EXPECT_CONTAINS(e, pack_path_ + ": layer 1 expert 2: record at offset " +
                         std::to_string(pack_->record(1, 2).offset));
  EXPECT_CONTAINS(e, "fails its checksum after 4 reads");
}

TEST_F(ReaderTest, CorruptPackOnDiskIsAnError) {
  std::vector<uint8_t> b = read_bytes(pack_path_);
  b[pack_->record(0, 3).offset + 99] ^= 0x80;
  write_bytes(pack_path_, b);
  ExpertReader reader(*pack_, options(2, 1));
  AlignedBuffer buf(pack_->max_record_bytes());
  const Ticket t = reader.submit(0, 3, buf.data(), Priority::Urgent);
  EXPECT_CONTAINS(wait_error(reader, t), "layer 0 expert 3: record at offset");
}

TEST_F(ReaderTest, CancelAndPromote) {
  // One urgent-only thread and one general thread; the general one is held inside a read.
  Faults f;
  f.blocked = true;
  ExpertReader reader(*pack_, faulty(f));
  AlignedBuffer buf(pack_->max_record_bytes() * 4);
  const size_t stride = pack_->max_record_bytes();
  const Ticket held = reader.submit(0, 0, buf.data(), Priority::ReadAhead);
  while (true) {
    std::lock_guard lock(f.mu);
    if (f.reads > 0) break;
  }
  const Ticket dropped = reader.submit(0, 1, buf.data() + stride, Priority::ReadAhead);
  const Ticket promoted = reader.submit(0, 2, buf.data() + 2 * stride, Priority::ReadAhead);
  EXPECT_FALSE(reader.cancel(held));  // under way
  EXPECT_TRUE(reader.cancel(dropped));
  EXPECT_CONTAINS(wait_error(reader, dropped), "layer 0 expert 1: read cancelled");
  reader.promote(promoted);  // now the urgent thread takes it, and blocks in the read too
  while (true) {
    std::lock_guard lock(f.mu);
    if (f.reads > 1) break;
  }
  EXPECT_FALSE(reader.cancel(promoted));
  f.release();
  EXPECT_EQ(wait_error(reader, held), "(no error)");
  EXPECT_EQ(wait_error(reader, promoted), "(no error)");
  EXPECT_TRUE(landed_right(0, 2, buf.data() + 2 * stride));
  EXPECT_EQ(reader.stats().cancelled, 1u);
}

TEST_F(ReaderTest, ShutdownWithPendingRequestsNeverHangs) {
  Faults f;
  f.blocked = true;
  const size_t stride = pack_->max_record_bytes();
  AlignedBuffer buf(stride * 18);
  auto reader = std::make_unique<ExpertReader>(*pack_, faulty(f));
  for (int i = 0; i < 18; ++i)
    reader->submit(i / 6, i % 6, buf.data() + size_t(i) * stride,
                   i % 3 ? Priority::ReadAhead : Priority::Urgent);
  while (true) {
    std::lock_guard lock(f.mu);
    if (f.reads >= 2) break;
  }
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    f.release();
  });
  // The destructor fails what is queued and waits for the two reads in flight.
  reader.reset();
  releaser.join();
  std::lock_guard lock(f.mu);
  EXPECT_LT(f.reads, 18);
}

TEST_F(ReaderTest, DestroyRightAfterSubmitting) {
  const size_t stride = pack_->max_record_bytes();
  AlignedBuffer buf(stride * 18);
  for (int round = 0; round < 5; ++round) {
    ExpertReader reader(*pack_, options(3, 1, IoBackend::Auto, 4096));
    for (int i = 0; i < 18; ++i)
      reader.submit(i / 6, i % 6, buf.data() + size_t(i) * stride, Priority::ReadAhead);
  }
  SUCCEED();
}

}  // namespace
}  // namespace strata::experts
