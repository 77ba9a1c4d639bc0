// Time on the GPU per op, for finding where a window's time goes (STRATA_CUDA_PROFILE=1). A window
// profiled this way runs op by op in segments of kSegmentOps ops, and no segment starts before all
// of it is queued: a hold kernel in front of each segment waits until the host, having queued the
// segment and the next hold, raises a counter past it. So the host's launch cost never shows as
// idle time between ops (the CUDA launch queue is too short to hold a whole window back at once).
// Each op's time runs from its first launch to the next op's first launch or its segment's end,
// as it would inside a replayed graph. Internal: names CUDA types.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace strata::backend {

class OpProfile {
 public:
  // Enabled when the environment has STRATA_CUDA_PROFILE=1.
  explicit OpProfile(cudaStream_t stream);
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  bool enabled() const { return enabled_; }
  void begin();
  void op(const char* name);
  // Releases the window's last segment, waits for it and adds its times to `into`. A window whose
  // host waited on the device mid-way held a segment past the hold's timeout: its times would
  // include the wait, so it is counted in `discarded` instead.
  void end(std::map<std::string, OpTime>& into, uint64_t& discarded);

 private:
  static constexpr int kSegmentOps = 64;

  cudaEvent_t event(size_t i);
  void hold_next_segment();
  void release(uint32_t segment);

  bool enabled_ = false;
  cudaStream_t stream_;
  // [0]: the highest segment released, [1]: set by a hold that timed out.
  volatile uint32_t* gate_ = nullptr;
  uint32_t* gate_device_ = nullptr;
  uint32_t segment_ = 0;  // the segment being queued (counts on across windows)
  int segment_ops_ = 0;
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> marks_;  // per event: the op starting there, or null (segment end)
  bool open_ = false;
};

}  // namespace strata::backend

namespace strata::cuda::detail {
// One thread waits until gate[0] >= segment (wrapping compare), or sets gate[1] after timeout_ns.
void launch_hold(const uint32_t* gate, uint32_t segment, uint32_t* timed_out, uint64_t timeout_ns,
                 cudaStream_t stream);
}  // namespace strata::cuda::detail
