// A CUDA injection library (CUDA_INJECTION64_PATH=libstrata_kernel_timeline.so) that records when
// every kernel ran, replayed graph nodes included, through CUPTI's activity API, and writes one
// line per kernel to $STRATA_TIMELINE_OUT (default kernel_timeline.tsv):
//
//   start_ns  end_ns  stream  graph_id  correlation_id  grid  block  name
//
// (The kernels of one graph launch share its correlation id.) Between the kernels, what the host
// and the copy engines did, one line each, tagged:
//
//   api     start_ns  end_ns  thread  correlation_id  name      (CUDA runtime calls)
//   copy    start_ns  end_ns  stream  graph_id  bytes  kind     (HtoD, DtoH, DtoD, ...)
//   memset  start_ns  end_ns  stream  graph_id  bytes
//
// Nsight Compute times each kernel alone, after flushing the caches; what a replayed decode window
// costs is each kernel's share of the critical path in place, with dependent launches overlapping
// one kernel's start with the previous one's end, and the host's time between two windows.
// scripts/gpu_timeline.sh reads these lines.
#include <cupti.h>

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

constexpr size_t kBufferBytes = size_t(16) << 20;

std::mutex out_mutex;
FILE* out = nullptr;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* why = nullptr;
  cuptiGetResultString(r, &why);
  std::fprintf(stderr, "kernel_timeline: %s failed: %s\n", what, why ? why : "unknown error");
}

// The kernel's name without its namespaces, return type and parameters: "moe_q_kernel<...>", the
// template arguments kept (they tell the formats apart) with their namespaces dropped.
std::string short_name(const char* mangled) {
  int status = 0;
  char* full = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && full ? full : mangled;
  std::free(full);
  for (const char* noise : {"strata::cuda::detail::", "mvq::", "(anonymous namespace)::"})
    for (size_t at; (at = name.find(noise)) != std::string::npos;) name.erase(at, std::strlen(noise));
  const size_t open = std::min(name.find_first_of("<("), name.size());
  const size_t space = name.rfind(' ', open);  // after the return type, if any
  const size_t start = space == std::string::npos ? 0 : space + 1;
  size_t end = open;
  if (end < name.size() && name[end] == '<')  // through the template arguments
    for (int depth = 0; end < name.size(); ++end) {
      depth += name[end] == '<' ? 1 : name[end] == '>' ? -1 : 0;
      if (depth == 0) {
        ++end;
        break;
      }
    }
  return name.substr(start, end - start);
}

const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    default: return "other";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  const std::lock_guard lock(out_mutex);
  while (out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        std::fprintf(out, "%llu\t%llu\t%u\t%u\t%u\t%dx%dx%d\t%dx%dx%d\t%s\n",
                     static_cast<unsigned long long>(k->start), static_cast<unsigned long long>(k->end),
                     k->streamId, k->graphId, k->correlationId, k->gridX, k->gridY, k->gridZ, k->blockX,
                     k->blockY, k->blockZ, short_name(k->name).c_str());
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        const char* name = nullptr;
        if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS || !name) name = "?";
        std::fprintf(out, "api\t%llu\t%llu\t%u\t%u\t%s\n", static_cast<unsigned long long>(a->start),
                     static_cast<unsigned long long>(a->end), a->threadId, a->correlationId, name);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        std::fprintf(out, "copy\t%llu\t%llu\t%u\t%u\t%llu\t%s\n", static_cast<unsigned long long>(c->start),
                     static_cast<unsigned long long>(c->end), c->streamId, c->graphId,
                     static_cast<unsigned long long>(c->bytes), copy_kind(c->copyKind));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        std::fprintf(out, "memset\t%llu\t%llu\t%u\t%u\t%llu\n", static_cast<unsigned long long>(m->start),
                     static_cast<unsigned long long>(m->end), m->streamId, m->graphId,
                     static_cast<unsigned long long>(m->bytes));
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const std::lock_guard lock(out_mutex);
  if (out) std::fclose(out), out = nullptr;
}

}  // namespace

// Called by the CUDA driver at initialization when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection() {
  const char* path = std::getenv("STRATA_TIMELINE_OUT");
  out = std::fopen(path ? path : "kernel_timeline.tsv", "w");
  if (!out) {
    std::fprintf(stderr, "kernel_timeline: cannot write %s\n", path ? path : "kernel_timeline.tsv");
    return 0;
  }
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_RUNTIME,
                                  CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET})
    check(cuptiActivityEnable(kind), "cuptiActivityEnable");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
        "cuptiActivityRegisterCallbacks");
  check(cuptiActivityFlushPeriod(200), "cuptiActivityFlushPeriod");
  std::atexit(flush_at_exit);
  return 1;
}
