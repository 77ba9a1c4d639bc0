#include "backend/cuda/op_profile.h"

#include <cstdlib>
#include <cstring>

#include "backend/cuda/check.h"

namespace strata::backend {

namespace {
// Far longer than queuing one segment takes; a window whose host waits on the device mid-way
// (a read-back, a staging ring that wraps twice) waits this long once and is discarded.
constexpr uint64_t kHoldTimeoutNs = 500'000'000;
}  // namespace

OpProfile::OpProfile(cudaStream_t stream) : stream_(stream) {
  const char* env = std::getenv("STRATA_CUDA_PROFILE");
  enabled_ = env && std::strcmp(env, "1") == 0;
  if (!enabled_) return;
  void* host = nullptr;
  STRATA_CUDA_CHECK(cudaHostAlloc(&host, 2 * sizeof(uint32_t), cudaHostAllocMapped));
  gate_ = static_cast<volatile uint32_t*>(host);
  gate_[0] = 0;
  gate_[1] = 0;
  void* device = nullptr;
  STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
  gate_device_ = static_cast<uint32_t*>(device);
}

OpProfile::~OpProfile() {
  if (!enabled_) return;
  gate_[0] = segment_;
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  cudaFreeHost(const_cast<uint32_t*>(gate_));
}

cudaEvent_t OpProfile::event(size_t i) {
  while (events_.size() <= i) {
    cudaEvent_t e = nullptr;
    STRATA_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  return events_[i];
}

void OpProfile::hold_next_segment() {
  ++segment_;
  segment_ops_ = 0;
  cuda::detail::launch_hold(gate_device_, segment_, gate_device_ + 1, kHoldTimeoutNs, stream_);
}

void OpProfile::release(uint32_t segment) { gate_[0] = segment; }

void OpProfile::begin() {
  if (!enabled_) return;
  marks_.clear();
  gate_[1] = 0;
  hold_next_segment();
  open_ = true;
}

void OpProfile::op(const char* name) {
  if (!open_) return;
  if (segment_ops_ == kSegmentOps) {
    STRATA_CUDA_CHECK(cudaEventRecord(event(marks_.size()), stream_));
    marks_.push_back(nullptr);
    const uint32_t queued = segment_;
    hold_next_segment();
    release(queued);
  }
  ++segment_ops_;
  STRATA_CUDA_CHECK(cudaEventRecord(event(marks_.size()), stream_));
  marks_.push_back(name);
}

void OpProfile::end(std::map<std::string, OpTime>& into, uint64_t& discarded) {
  if (!open_) return;
  open_ = false;
  const size_t n = marks_.size();
  STRATA_CUDA_CHECK(cudaEventRecord(event(n), stream_));
  release(segment_);
  STRATA_CUDA_CHECK(cudaEventSynchronize(event(n)));
  if (gate_[1] != 0) {
    ++discarded;
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!marks_[i]) continue;
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    OpTime& t = into[marks_[i]];
    ++t.calls;
    t.us += double(ms) * 1e3;
  }
}

}  // namespace strata::backend
