// The expert cache's slots in device memory (backend::ExpertSlots on CUDA; docs/CUDA.md, "Experts
// streamed into HBM"), and the host tier's pinned slots. One cudaMalloc of count x slot_bytes,
// registered as weight memory so the MoE ops accept views into it. A pack read lands in a pinned
// host buffer (landing), or a host tier slot holds the record already; fill()/fill_from() queue its
// copy into the slot on the backend's copy stream, so the copy engine moves the bytes while the SMs
// compute, and ready() makes the compute stream wait for the slot's copy before the ops that read
// it (the layer's experts). A slot's old expert may still be read by ops queued before recycle():
// every copy first waits for the compute stream's position at the latest recycle.
//
// Pinned buffers are taken per read and given back once their copy is done; the pool grows while
// more reads are outstanding than it has buffers (a long prefill window's misses), so a miss never
// waits for a buffer.
#include <algorithm>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "util/progress.h"

namespace strata::backend {

namespace {

// Pinned buffers allocated at once when the pool runs dry (one cudaHostAlloc each time).
constexpr size_t kLandingsPerChunk = 8;
// The host tier's pinned memory comes in allocations of about this size (each a whole number of
// slots): pinning one huge range at once takes longer and fails all or nothing.
constexpr size_t kTierChunkBytes = size_t(1) << 30;

void check_shape(size_t count, size_t slot_bytes, const char* what) {
  require(count > 0 && slot_bytes > 0 && slot_bytes % 4096 == 0 && count <= size_t(INT32_MAX) &&
              count <= SIZE_MAX / slot_bytes,
          what, "bad shape (", count, " slots of ", slot_bytes, " bytes; a positive multiple of 4096 each)");
}

class CudaExpertSlots : public ExpertSlots {
 public:
  CudaExpertSlots(CudaBackend::Impl& impl, size_t count, size_t slot_bytes)
      : impl_(impl), count_(count), slot_bytes_(slot_bytes) {
    check_shape(count, slot_bytes, "expert slots");
    STRATA_CUDA_CHECK(cudaSetDevice(impl_.ctx.index));
    const size_t bytes = count * slot_bytes;
    const cudaError_t err = cudaMalloc(&device_, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      fail("expert cache: cannot allocate ", format_bytes(bytes), " of device memory for ", count,
           " slots of ", format_bytes(slot_bytes), " (", format_bytes(free_bytes),
           " free: ", cudaGetErrorString(err), "); give a smaller --expert-budget");
    }
    landing_of_.assign(count, -1);
    copy_of_.assign(count, 0);
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&recycled_, cudaEventDisableTiming));
    impl_.upload_ranges[device_] = bytes;
  }

  ~CudaExpertSlots() override {
    cudaSetDevice(impl_.ctx.index);
    cudaStreamSynchronize(copy_);
    cudaStreamSynchronize(impl_.ctx.stream);  // ops reading the slots end before they go
    impl_.upload_ranges.erase(device_);
    for (Copy& c : copies_) {
      cudaEventDestroy(c.start);
      cudaEventDestroy(c.done);
    }
    for (uint8_t* chunk : chunks_) cudaFreeHost(chunk);
    cudaEventDestroy(recycled_);
    cudaStreamDestroy(copy_);
    cudaFree(device_);
  }

  size_t count() const override { return count_; }
  size_t slot_bytes() const override { return slot_bytes_; }
  const uint8_t* data(int32_t s) const override { return device_ + size_t(s) * slot_bytes_; }

  void* landing(int32_t s) override {
    check_slot("landing", s);
    int32_t& li = landing_of_[size_t(s)];
    if (li < 0) li = take_landing();
    return landings_[size_t(li)];
  }

  void fill(int32_t s, size_t bytes) override {
    check_slot("fill", s);
    const int32_t li = landing_of_[size_t(s)];
    require(li >= 0, "expert slots", "fill of slot ", s, " without a landed read");
    queue_copy(s, landings_[size_t(li)], bytes, li);
    landing_of_[size_t(s)] = -1;
  }

  uint64_t fill_from(int32_t s, const void* host, size_t bytes) override {
    check_slot("fill", s);
    return queue_copy(s, host, bytes, -1);
  }

  void wait_copied(uint64_t ticket) override {
    while (!copying_.empty() && copies_[size_t(copying_.front())].ticket <= ticket) {
      STRATA_CUDA_CHECK(cudaEventSynchronize(copies_[size_t(copying_.front())].done));
      reclaim_front();
    }
  }

  void ready(int32_t s) override {
    check_slot("ready", s);
    const uint64_t ticket = std::exchange(copy_of_[size_t(s)], 0);
    // A copy no longer queued is done: the ops queued from now on see its bytes without a wait.
    for (int32_t ci : copying_)
      if (copies_[size_t(ci)].ticket == ticket) {
        STRATA_CUDA_CHECK(cudaStreamWaitEvent(impl_.ctx.stream, copies_[size_t(ci)].done, 0));
        return;
      }
  }

  void discard(int32_t s) override {
    check_slot("discard", s);
    int32_t& li = landing_of_[size_t(s)];
    if (li < 0) return;
    free_landings_.push_back(li);
    li = -1;
  }

  void recycle(int32_t s) override {
    check_slot("recycle", s);
    STRATA_CUDA_CHECK(cudaEventRecord(recycled_, impl_.ctx.stream));
  }

  Counters counters() const override {
    // Every queued copy is counted: wait for those still in flight.
    while (!copying_.empty()) {
      STRATA_CUDA_CHECK(cudaEventSynchronize(copies_[size_t(copying_.front())].done));
      reclaim_front();
    }
    return counters_;
  }

 private:
  // One host-to-device copy, its events reused once it is done.
  struct Copy {
    cudaEvent_t start = nullptr, done = nullptr;
    size_t bytes = 0;
    int32_t landing = -1;  // the pinned buffer it reads, given back when done; -1: the caller's
    uint64_t ticket = 0;
  };

  void check_slot(const char* what, int32_t s) const {
    require(s >= 0 && size_t(s) < count_, "expert slots", what, ": slot ", s, " is outside 0..",
            count_ - 1);
  }

  uint64_t queue_copy(int32_t s, const void* host, size_t bytes, int32_t landing) {
    require(bytes <= slot_bytes_, "expert slots", "fill of ", bytes, " bytes into a slot of ",
            slot_bytes_);
    reclaim_done();
    const int32_t ci = take_copy();
    Copy& c = copies_[size_t(ci)];
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(copy_, recycled_, 0));
    STRATA_CUDA_CHECK(cudaEventRecord(c.start, copy_));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(device_ + size_t(s) * slot_bytes_, host, bytes,
                                      cudaMemcpyHostToDevice, copy_));
    STRATA_CUDA_CHECK(cudaEventRecord(c.done, copy_));
    c.bytes = bytes;
    c.landing = landing;
    c.ticket = ++tickets_;
    copying_.push_back(ci);
    copy_of_[size_t(s)] = c.ticket;
    return c.ticket;
  }

  // The oldest queued copy is done: count it and give its buffers back.
  void reclaim_front() const {
    const int32_t ci = copying_.front();
    copying_.pop_front();
    const Copy& c = copies_[size_t(ci)];
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, c.start, c.done));
    counters_.bytes += c.bytes;
    counters_.seconds += double(ms) * 1e-3;
    if (c.landing >= 0) free_landings_.push_back(c.landing);
    free_copies_.push_back(ci);
  }

  // Copies finish in queue order on the one copy stream.
  void reclaim_done() const {
    while (!copying_.empty() &&
           cudaEventQuery(copies_[size_t(copying_.front())].done) == cudaSuccess)
      reclaim_front();
  }

  int32_t take_copy() {
    if (free_copies_.empty()) {
      Copy c;
      STRATA_CUDA_CHECK(cudaEventCreate(&c.start));
      STRATA_CUDA_CHECK(cudaEventCreate(&c.done));
      free_copies_.push_back(int32_t(copies_.size()));
      copies_.push_back(c);
    }
    const int32_t ci = free_copies_.back();
    free_copies_.pop_back();
    return ci;
  }

  int32_t take_landing() {
    reclaim_done();
    if (free_landings_.empty()) grow();
    const int32_t li = free_landings_.front();
    free_landings_.pop_front();
    return li;
  }

  void grow() {
    uint8_t* chunk = nullptr;
    STRATA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&chunk),
                                    kLandingsPerChunk * slot_bytes_, cudaHostAllocPortable));
    chunks_.push_back(chunk);
    for (size_t i = 0; i < kLandingsPerChunk; ++i) {
      free_landings_.push_back(int32_t(landings_.size()));
      landings_.push_back(chunk + i * slot_bytes_);
    }
  }

  CudaBackend::Impl& impl_;
  size_t count_, slot_bytes_;
  uint8_t* device_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t recycled_ = nullptr;  // the compute stream at the latest recycle()
  std::vector<uint8_t*> chunks_;
  std::vector<uint8_t*> landings_;           // pinned buffers reads land in
  std::vector<int32_t> landing_of_;          // per slot: its read's buffer, or -1
  std::vector<uint64_t> copy_of_;            // per slot: its copy not yet made ready, or 0
  mutable std::deque<int32_t> free_landings_;
  std::vector<Copy> copies_;
  mutable std::vector<int32_t> free_copies_;
  mutable std::deque<int32_t> copying_;      // copies queued, oldest first
  uint64_t tickets_ = 0;
  mutable Counters counters_;
};

// The host tier's slots: pinned host memory (the copies into device slots read it directly).
class PinnedHostSlots : public ExpertSlots {
 public:
  PinnedHostSlots(int device, size_t count, size_t slot_bytes) : count_(count), slot_bytes_(slot_bytes) {
    check_shape(count, slot_bytes, "host tier");
    STRATA_CUDA_CHECK(cudaSetDevice(device));
    const size_t per_chunk = std::max<size_t>(1, kTierChunkBytes / slot_bytes);
    for (size_t first = 0; first < count; first += per_chunk) {
      const size_t n = std::min(per_chunk, count - first);
      uint8_t* chunk = nullptr;
      const cudaError_t err =
          cudaHostAlloc(reinterpret_cast<void**>(&chunk), n * slot_bytes, cudaHostAllocPortable);
      if (err != cudaSuccess) {
        cudaGetLastError();
        release();
        fail("expert cache: cannot pin ", format_bytes(count * slot_bytes), " of host memory for the host tier (",
             format_bytes(first * slot_bytes), " pinned before ", cudaGetErrorString(err),
             "); give a smaller --host-budget");
      }
      chunks_.push_back(chunk);
    }
    per_chunk_ = per_chunk;
  }
  ~PinnedHostSlots() override { release(); }

  size_t count() const override { return count_; }
  size_t slot_bytes() const override { return slot_bytes_; }
  const uint8_t* data(int32_t s) const override { return slot(s); }
  void* landing(int32_t s) override { return slot(s); }
  void fill(int32_t, size_t) override {}  // the read landed in place
  uint64_t fill_from(int32_t s, const void* host, size_t bytes) override {
    require(bytes <= slot_bytes_, "host tier", "fill of ", bytes, " bytes into a slot of ", slot_bytes_);
    std::memcpy(slot(s), host, bytes);
    return 0;
  }
  void discard(int32_t) override {}
  void recycle(int32_t) override {}  // only copies read it, and the tier waits for those

 private:
  uint8_t* slot(int32_t s) const {
    require(s >= 0 && size_t(s) < count_, "host tier", "slot ", s, " is outside 0..", count_ - 1);
    return chunks_[size_t(s) / per_chunk_] + (size_t(s) % per_chunk_) * slot_bytes_;
  }
  void release() {
    for (uint8_t* c : chunks_) cudaFreeHost(c);
    chunks_.clear();
  }

  size_t count_, slot_bytes_, per_chunk_ = 1;
  std::vector<uint8_t*> chunks_;
};

}  // namespace

std::unique_ptr<ExpertSlots> CudaBackend::alloc_expert_slots(size_t count, size_t slot_bytes) {
  return std::make_unique<CudaExpertSlots>(*impl_, count, slot_bytes);
}

std::unique_ptr<ExpertSlots> CudaBackend::alloc_host_tier(size_t count, size_t slot_bytes) {
  return std::make_unique<PinnedHostSlots>(impl_->ctx.index, count, slot_bytes);
}

std::optional<uint64_t> CudaBackend::expert_memory_free() const {
  STRATA_CUDA_CHECK(cudaSetDevice(impl_->ctx.index));
  size_t free_bytes = 0, total = 0;
  STRATA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return uint64_t(free_bytes);
}

}  // namespace strata::backend
