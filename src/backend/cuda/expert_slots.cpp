// The expert cache's slots in device memory (backend::ExpertSlots on CUDA; docs/CUDA.md, "Experts
// streamed into HBM"). One cudaMalloc of count x slot_bytes, registered as weight memory so the
// MoE ops accept views into it. A pack read lands in a pinned host buffer (landing), and fill()
// copies it into the slot on the backend's copy stream: the copy engine moves the bytes while the
// SMs compute, and the compute stream waits for the copy before any op queued after fill() (the
// layer's experts) reads the slot. A slot's old expert may still be read by ops queued before
// recycle(): every copy first waits for the compute stream's position at the latest recycle.
//
// Pinned buffers are taken per read and given back once their copy is done; the pool grows while
// more reads are outstanding than it has buffers (a long prefill window's misses), so a miss never
// waits for a buffer.
#include <algorithm>
#include <deque>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "util/progress.h"

namespace strata::backend {

namespace {

// Pinned buffers allocated at once when the pool runs dry (one cudaHostAlloc each time).
constexpr size_t kLandingsPerChunk = 8;

class CudaExpertSlots : public ExpertSlots {
 public:
  CudaExpertSlots(CudaBackend::Impl& impl, size_t count, size_t slot_bytes)
      : impl_(impl), count_(count), slot_bytes_(slot_bytes) {
    require(count > 0 && slot_bytes > 0 && slot_bytes % 4096 == 0 &&
                count <= size_t(INT32_MAX) && count <= SIZE_MAX / slot_bytes,
            "expert slots", "bad shape (", count, " slots of ", slot_bytes,
            " bytes; a positive multiple of 4096 each)");
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
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&recycled_, cudaEventDisableTiming));
    impl_.upload_ranges[device_] = bytes;
  }

  ~CudaExpertSlots() override {
    cudaSetDevice(impl_.ctx.index);
    cudaStreamSynchronize(copy_);
    cudaStreamSynchronize(impl_.ctx.stream);  // ops reading the slots end before they go
    impl_.upload_ranges.erase(device_);
    for (Landing& l : landings_) {
      cudaEventDestroy(l.start);
      cudaEventDestroy(l.done);
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
    return landings_[size_t(li)].host;
  }

  void fill(int32_t s, size_t bytes) override {
    check_slot("fill", s);
    const int32_t li = landing_of_[size_t(s)];
    require(li >= 0, "expert slots", "fill of slot ", s, " without a landed read");
    require(bytes <= slot_bytes_, "expert slots", "fill of ", bytes, " bytes into a slot of ",
            slot_bytes_);
    Landing& l = landings_[size_t(li)];
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(copy_, recycled_, 0));
    STRATA_CUDA_CHECK(cudaEventRecord(l.start, copy_));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(device_ + size_t(s) * slot_bytes_, l.host, bytes,
                                      cudaMemcpyHostToDevice, copy_));
    STRATA_CUDA_CHECK(cudaEventRecord(l.done, copy_));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(impl_.ctx.stream, l.done, 0));
    l.bytes = bytes;
    copying_.push_back(li);
    landing_of_[size_t(s)] = -1;
  }

  void discard(int32_t s) override {
    check_slot("discard", s);
    int32_t& li = landing_of_[size_t(s)];
    if (li < 0) return;
    free_.push_back(li);
    li = -1;
  }

  void recycle(int32_t s) override {
    check_slot("recycle", s);
    STRATA_CUDA_CHECK(cudaEventRecord(recycled_, impl_.ctx.stream));
  }

  Counters counters() const override {
    // Every queued copy is counted: wait for those still in flight.
    while (!copying_.empty()) {
      STRATA_CUDA_CHECK(cudaEventSynchronize(landings_[size_t(copying_.front())].done));
      reclaim_front();
    }
    return counters_;
  }

 private:
  struct Landing {
    uint8_t* host = nullptr;
    cudaEvent_t start = nullptr, done = nullptr;  // around its last copy
    size_t bytes = 0;                             // of that copy
  };

  void check_slot(const char* what, int32_t s) const {
    require(s >= 0 && size_t(s) < count_, "expert slots", what, ": slot ", s, " is outside 0..",
            count_ - 1);
  }

  // The oldest queued copy is done: count it and give its buffer back.
  void reclaim_front() const {
    const int32_t li = copying_.front();
    copying_.pop_front();
    const Landing& l = landings_[size_t(li)];
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, l.start, l.done));
    counters_.bytes += l.bytes;
    counters_.seconds += double(ms) * 1e-3;
    free_.push_back(li);
  }

  int32_t take_landing() {
    // Copies finish in queue order on the one copy stream.
    while (!copying_.empty() &&
           cudaEventQuery(landings_[size_t(copying_.front())].done) == cudaSuccess)
      reclaim_front();
    if (free_.empty()) grow();
    const int32_t li = free_.front();
    free_.pop_front();
    return li;
  }

  void grow() {
    uint8_t* chunk = nullptr;
    STRATA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&chunk),
                                    kLandingsPerChunk * slot_bytes_, cudaHostAllocPortable));
    chunks_.push_back(chunk);
    for (size_t i = 0; i < kLandingsPerChunk; ++i) {
      Landing l;
      l.host = chunk + i * slot_bytes_;
      STRATA_CUDA_CHECK(cudaEventCreate(&l.start));
      STRATA_CUDA_CHECK(cudaEventCreate(&l.done));
      free_.push_back(int32_t(landings_.size()));
      landings_.push_back(l);
    }
  }

  CudaBackend::Impl& impl_;
  size_t count_, slot_bytes_;
  uint8_t* device_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t recycled_ = nullptr;  // the compute stream at the latest recycle()
  std::vector<uint8_t*> chunks_;
  std::vector<Landing> landings_;
  std::vector<int32_t> landing_of_;         // per slot: its read's buffer, or -1
  mutable std::deque<int32_t> free_;        // buffers free to take
  mutable std::deque<int32_t> copying_;     // buffers whose copy is queued, oldest first
  mutable Counters counters_;
};

}  // namespace

std::unique_ptr<ExpertSlots> CudaBackend::alloc_expert_slots(size_t count, size_t slot_bytes) {
  return std::make_unique<CudaExpertSlots>(*impl_, count, slot_bytes);
}

std::optional<uint64_t> CudaBackend::expert_memory_free() const {
  STRATA_CUDA_CHECK(cudaSetDevice(impl_->ctx.index));
  size_t free_bytes = 0, total = 0;
  STRATA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return uint64_t(free_bytes);
}

}  // namespace strata::backend
