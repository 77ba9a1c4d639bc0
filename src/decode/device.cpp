#include "decode/device.h"

#include <charconv>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#ifdef STRATA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "experts/pack.h"
#include "gguf/gguf.h"
#include "util/error.h"
#include "util/progress.h"

namespace strata::decode {

namespace {

#ifdef STRATA_HAVE_CUDA
// Device memory a forward pass needs beyond the weights (activations, KV cache of a default
// context, the CUDA context itself): a margin rather than a model of every allocation.
constexpr uint64_t kDeviceMargin = uint64_t(2) << 30;

// Whether the model's experts would be streamed (a trunk-only GGUF, or a budget/pack asked
// for): then only the trunk and the expert cache's budget take device memory.
bool streams_experts(const gguf::Reader& reader, const experts::SourceOptions& o) {
  return !experts::has_expert_stacks(reader) || o.budget_bytes || !o.pack.empty();
}

int cuda_devices() { return cuda::device_count(); }
std::string no_cuda_reason() { return cuda::unavailable_reason(); }
#else
int cuda_devices() { return 0; }
std::string no_cuda_reason() {
  return "this strata was built without the CUDA backend (nvcc was not found when it was built)";
}
#endif

OpenedBackend cpu(int threads, const std::string& why) {
  auto be = std::make_unique<backend::CpuBackend>(threads);
  const int n = be->threads();
  return {std::move(be),
          cat("cpu (", n, " thread", n == 1 ? "" : "s", why.empty() ? "" : "; ", why, ")"), n};
}

}  // namespace

DeviceSpec parse_device(std::string_view text) {
  if (text == "auto") return {DeviceSpec::Kind::Auto, 0};
  if (text == "cpu") return {DeviceSpec::Kind::Cpu, 0};
  if (text == "cuda") return {DeviceSpec::Kind::Cuda, 0};
  if (text.starts_with("cuda:")) {
    const std::string_view digits = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0)
      return {DeviceSpec::Kind::Cuda, index};
  }
  fail("--device: '", text, "' is not cpu, cuda, cuda:N or auto");
}

OpenedBackend open_backend(const DeviceSpec& device, int threads, const std::string& model_path,
                           const experts::SourceOptions& experts) {
  if (device.kind == DeviceSpec::Kind::Cpu) return cpu(threads, "");
  const bool asked = device.kind == DeviceSpec::Kind::Cuda;
  const int count = cuda_devices();
  if (count == 0) {
    if (asked) fail("--device cuda: ", no_cuda_reason());
    return cpu(threads, "auto: no CUDA device");
  }
  if (device.index >= count)
    fail("--device cuda:", device.index, ": there ", count == 1 ? "is " : "are ", count,
         " CUDA device", count == 1 ? "" : "s", " (cuda:0", count > 1 ? cat("..cuda:", count - 1) : "",
         ")");
#ifdef STRATA_HAVE_CUDA
  const auto reader = gguf::Reader::open(model_path);
  // Streamed experts live in the device's expert cache (its budget: --expert-budget, else cut
  // from the memory left once the trunk is up); only the trunk must fit beside it.
  const bool streams = streams_experts(*reader, experts);
  uint64_t weight_bytes = 0, expert_bytes = 0;
  for (const auto& t : reader->tensors()) {
    weight_bytes += t.nbytes;
    if (t.name.ends_with("_exps.weight")) expert_bytes += t.nbytes;
  }
  const uint64_t resident_bytes = streams ? weight_bytes - expert_bytes : weight_bytes;
  const uint64_t budget = streams ? experts.budget_bytes.value_or(0) : 0;
  const cuda::DeviceInfo info = cuda::query_device(device.index);
  const uint64_t needed = resident_bytes + budget + kDeviceMargin;
  const std::string where = cat("cuda:", device.index, " (", info.name, ", ",
                                format_bytes(info.free_bytes), " free of ",
                                format_bytes(info.total_bytes), ")");
  if (needed > info.free_bytes) {
    const std::string what =
        streams ? cat(format_bytes(resident_bytes), " of trunk + ", format_bytes(budget),
                      " of --expert-budget + ", format_bytes(kDeviceMargin),
                      " for activations and caches")
                : cat(format_bytes(weight_bytes), " of weights + ", format_bytes(kDeviceMargin),
                      " for activations and caches");
    if (asked)
      fail("--device cuda: ", model_path, " needs ", format_bytes(needed), " of device memory (",
           what, ") and ", where, " has less; ",
           streams ? "give a smaller --expert-budget, or run it with --device cpu"
                   : "give --expert-budget to stream the experts from the pack (strata pack "
                     "MODEL.gguf) into a device cache of that size, or run it with --device cpu");
    return cpu(threads, cat("auto: the model's ", format_bytes(needed), " do not fit ", where));
  }
  return {cuda::make_cuda_backend(device.index),
          cat(where, streams ? cat("; trunk ", format_bytes(resident_bytes),
                                   ", experts streamed into device memory")
                             : cat("; model ", format_bytes(weight_bytes)),
              asked ? "" : "; auto")};
#else
  fail("internal error: a CUDA device without the CUDA backend");
#endif
}

}  // namespace strata::decode
