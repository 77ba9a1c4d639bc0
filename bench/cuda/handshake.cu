// The per-layer handshake of a streamed window, three ways (issue 10 item 3; docs/CUDA.md, "The
// handshake, three ways"). A window of `layers` layers; in each, the device computes (a kernel
// that keeps it busy `work_us`), routes (`route`: k expert ids), and cannot go on until the host
// has answered with a slot for every id (`consume` reads the answer and checks it against the
// device's own copy of the host's map, so a stale or early read is counted as an error). Forms:
//
//   none  the answer computed on the device: the window with no handshake, the baseline;
//   a     graph segments: one graph per layer up to the routing, a stream synchronization, the
//         host answers, `consume` is launched op by op (what the engine does today);
//   b     one graph per window, stream memory operations: cuStreamWriteValue32 publishes the ids,
//         cuStreamWaitValue32 holds the stream until the host's flag, a host thread answers;
//   c     one graph per window, the device spins: `route` publishes with a system fence, a
//         one-thread kernel polls the host's flag in mapped memory.
//
// The ids and the answers travel through mapped pinned memory in every form. Prints one JSON
// object: per form the median window time over `rounds` rounds of `windows` windows, the
// handshake's cost per layer (its window less the baseline's, over the layers) and the errors.
//
//   strata_handshake_bench [--layers 48] [--ids 80] [--work-us 0] [--host-us 0] [--windows 200]
//                          [--rounds 5]
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kExperts = 512;
constexpr uint64_t kSpinTimeoutNs = 2'000'000'000;  // a lost answer ends the spin as an error

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "handshake: %s: %s\n", what, cudaGetErrorString(err));
  std::exit(1);
}

void check_driver(CUresult res, const char* what) {
  if (res == CUDA_SUCCESS) return;
  std::fprintf(stderr, "handshake: %s: CUresult %d\n", what, int(res));
  std::exit(1);
}

__host__ __device__ int32_t routed_id(uint32_t window, int layer, int i) {
  uint32_t h = window * 0x9E3779B1u ^ uint32_t(layer) * 0x85EBCA77u ^ uint32_t(i) * 0xC2B2AE3Du;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return int32_t(h % kExperts);
}

__device__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__global__ void work_kernel(uint32_t us) {
  const uint64_t end = now_ns() + uint64_t(us) * 1000;
  while (now_ns() < end) {
  }
}

// ids[i] for this window and layer; with `pub`, published to the host once every id is visible.
__global__ void route_kernel(const uint32_t* window, int layer, int k, int32_t* ids, uint32_t* pub) {
  for (int i = threadIdx.x; i < k; i += blockDim.x) ids[i] = routed_id(*window, layer, i);
  if (!pub) return;
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile uint32_t*>(pub) = 1;
}

// The host's answer computed on the device (form none).
__global__ void answer_kernel(const int32_t* ids, int k, const int32_t* map, int32_t* answer) {
  for (int i = threadIdx.x; i < k; i += blockDim.x) answer[i] = map[ids[i]];
}

__global__ void spin_kernel(uint32_t* ans, uint32_t* errors) {
  volatile uint32_t* flag = ans;
  const uint64_t deadline = now_ns() + kSpinTimeoutNs;
  while (*flag != 1) {
    if (now_ns() > deadline) {
      atomicAdd(errors, 1u);
      return;
    }
    __nanosleep(32);
  }
  *flag = 0;
  __threadfence_system();
}

__global__ void consume_kernel(const uint32_t* window, int layer, int k, const int32_t* answer,
                               const int32_t* map, uint32_t* errors) {
  const volatile int32_t* a = answer;
  for (int i = threadIdx.x; i < k; i += blockDim.x)
    if (a[i] != map[routed_id(*window, layer, i)]) atomicAdd(errors, 1u);
}

__global__ void next_window_kernel(uint32_t* window) { ++*window; }

struct Options {
  int layers = 48, ids = 80, work_us = 0, host_us = 0, windows = 200, rounds = 5;
};

// Mapped pinned memory shared by host and device, one stripe per layer.
struct Mailbox {
  uint32_t* pub = nullptr;   // [layers] device -> host: the ids are there
  uint32_t* ans = nullptr;   // [layers] host -> device: the answer is there
  int32_t* ids = nullptr;    // [layers][k]
  int32_t* answer = nullptr; // [layers][k]
  uint32_t *pub_d = nullptr, *ans_d = nullptr;
  int32_t *ids_d = nullptr, *answer_d = nullptr;
};

template <class T>
void mapped(T*& host, T*& device, size_t count) {
  check(cudaHostAlloc(reinterpret_cast<void**>(&host), count * sizeof(T), cudaHostAllocMapped), "cudaHostAlloc");
  std::memset(host, 0, count * sizeof(T));
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), host, 0), "cudaHostGetDevicePointer");
}

struct Bench {
  Options o;
  cudaStream_t stream{};
  Mailbox box;
  std::vector<int32_t> map;
  int32_t* map_d = nullptr;
  int32_t* answer_dev = nullptr;  // form none: [layers][k] on the device
  uint32_t* window_d = nullptr;
  uint32_t* errors_d = nullptr;
  PFN_cuStreamWaitValue32_v11070 wait_value = nullptr;
  PFN_cuStreamWriteValue32_v11070 write_value = nullptr;

  explicit Bench(const Options& opt) : o(opt), map(kExperts) {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int e = 0; e < kExperts; ++e) map[size_t(e)] = (e * 37 + 11) % 1000;
    check(cudaMalloc(&map_d, map.size() * sizeof(int32_t)), "cudaMalloc");
    check(cudaMemcpy(map_d, map.data(), map.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "upload map");
    check(cudaMalloc(&answer_dev, size_t(o.layers) * size_t(o.ids) * sizeof(int32_t)), "cudaMalloc");
    check(cudaMalloc(&window_d, sizeof(uint32_t)), "cudaMalloc");
    check(cudaMalloc(&errors_d, sizeof(uint32_t)), "cudaMalloc");
    check(cudaMemset(window_d, 0, sizeof(uint32_t)), "cudaMemset");
    check(cudaMemset(errors_d, 0, sizeof(uint32_t)), "cudaMemset");
    mapped(box.pub, box.pub_d, size_t(o.layers));
    mapped(box.ans, box.ans_d, size_t(o.layers));
    mapped(box.ids, box.ids_d, size_t(o.layers) * size_t(o.ids));
    mapped(box.answer, box.answer_d, size_t(o.layers) * size_t(o.ids));
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", reinterpret_cast<void**>(&wait_value),
                                           12000, cudaEnableDefault, &found), "cuStreamWaitValue32");
    check(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", reinterpret_cast<void**>(&write_value),
                                           12000, cudaEnableDefault, &found), "cuStreamWriteValue32");
  }

  int32_t* ids_of(int l) { return box.ids_d + size_t(l) * size_t(o.ids); }
  int32_t* answer_of(int l) { return box.answer_d + size_t(l) * size_t(o.ids); }

  void enqueue_compute(int l, bool publish_in_kernel) {
    work_kernel<<<1, 32, 0, stream>>>(uint32_t(o.work_us));
    route_kernel<<<1, 128, 0, stream>>>(window_d, l, o.ids, ids_of(l), publish_in_kernel ? box.pub_d + l : nullptr);
  }

  // What the host does with a layer's ids: look each up, write the answer.
  void resolve(int l) {
    const auto start = std::chrono::steady_clock::now();
    const int32_t* ids = box.ids + size_t(l) * size_t(o.ids);
    int32_t* answer = box.answer + size_t(l) * size_t(o.ids);
    for (int i = 0; i < o.ids; ++i) answer[i] = map[size_t(ids[i])];
    while (std::chrono::steady_clock::now() - start < std::chrono::microseconds(o.host_us)) {
    }
  }

  // Forms b and c: a host thread answers every layer of `windows` windows as they publish.
  void answer_loop(int windows, std::atomic<bool>& failed) {
    for (int w = 0; w < windows; ++w)
      for (int l = 0; l < o.layers; ++l) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (__atomic_load_n(&box.pub[l], __ATOMIC_ACQUIRE) != 1) {
          if (std::chrono::steady_clock::now() > deadline) {
            failed = true;
            return;
          }
        }
        box.pub[l] = 0;
        resolve(l);
        __atomic_store_n(&box.ans[l], 1u, __ATOMIC_RELEASE);
      }
  }

  cudaGraphExec_t capture(const char* form) {
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    for (int l = 0; l < o.layers; ++l) {
      const std::string f = form;
      enqueue_compute(l, f == "c");
      if (f == "none") {
        answer_kernel<<<1, 128, 0, stream>>>(ids_of(l), o.ids, map_d, answer_dev + size_t(l) * size_t(o.ids));
        consume_kernel<<<1, 128, 0, stream>>>(window_d, l, o.ids, answer_dev + size_t(l) * size_t(o.ids), map_d, errors_d);
        continue;
      }
      CUstream s = reinterpret_cast<CUstream>(stream);
      if (f == "b") {
        check_driver(write_value(s, CUdeviceptr(box.pub_d + l), 1, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32");
        check_driver(wait_value(s, CUdeviceptr(box.ans_d + l), 1, CU_STREAM_WAIT_VALUE_EQ), "cuStreamWaitValue32");
        check_driver(write_value(s, CUdeviceptr(box.ans_d + l), 0, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32");
      } else {
        spin_kernel<<<1, 1, 0, stream>>>(box.ans_d + l, errors_d);
      }
      consume_kernel<<<1, 128, 0, stream>>>(window_d, l, o.ids, answer_of(l), map_d, errors_d);
    }
    next_window_kernel<<<1, 1, 0, stream>>>(window_d);
    cudaGraph_t graph = nullptr;
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
    return exec;
  }

  // Form a: one graph per layer up to the routing; the host step between.
  std::vector<cudaGraphExec_t> capture_segments() {
    std::vector<cudaGraphExec_t> segments;
    for (int l = 0; l <= o.layers; ++l) {
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
      if (l < o.layers) enqueue_compute(l, false);
      else next_window_kernel<<<1, 1, 0, stream>>>(window_d);
      cudaGraph_t graph = nullptr;
      check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
      cudaGraphExec_t exec = nullptr;
      check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
      cudaGraphDestroy(graph);
      segments.push_back(exec);
    }
    return segments;
  }

  void run_segments(const std::vector<cudaGraphExec_t>& segments, int windows) {
    for (int w = 0; w < windows; ++w) {
      for (int l = 0; l < o.layers; ++l) {
        check(cudaGraphLaunch(segments[size_t(l)], stream), "cudaGraphLaunch");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        resolve(l);
        consume_kernel<<<1, 128, 0, stream>>>(window_d, l, o.ids, answer_of(l), map_d, errors_d);
      }
      check(cudaGraphLaunch(segments.back(), stream), "cudaGraphLaunch");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

  // Seconds for `windows` windows of `form`.
  double time_windows(const std::string& form, cudaGraphExec_t exec,
                      const std::vector<cudaGraphExec_t>& segments, int windows) {
    const auto start = std::chrono::steady_clock::now();
    if (form == "a") {
      run_segments(segments, windows);
    } else {
      std::atomic<bool> failed{false};
      std::thread host;
      if (form != "none") host = std::thread([&] { answer_loop(windows, failed); });
      for (int w = 0; w < windows; ++w) check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      if (host.joinable()) host.join();
      if (failed) {
        std::fprintf(stderr, "handshake: form %s: the device never published a layer\n", form.c_str());
        std::exit(1);
      }
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  uint32_t errors() {
    uint32_t e = 0;
    check(cudaMemcpy(&e, errors_d, sizeof e, cudaMemcpyDeviceToHost), "read errors");
    return e;
  }
};

int parse_int(const char* flag, const char* value) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (!*value || *end || v < 0 || v > 1'000'000) {
    std::fprintf(stderr, "handshake: %s: expected a non-negative integer, got '%s'\n", flag, value);
    std::exit(2);
  }
  return int(v);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "handshake: %s needs a value\n", a.c_str());
      return 2;
    }
    const int v = parse_int(a.c_str(), argv[++i]);
    if (a == "--layers") o.layers = v;
    else if (a == "--ids") o.ids = v;
    else if (a == "--work-us") o.work_us = v;
    else if (a == "--host-us") o.host_us = v;
    else if (a == "--windows") o.windows = v;
    else if (a == "--rounds") o.rounds = v;
    else {
      std::fprintf(stderr, "handshake: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (o.layers < 1 || o.ids < 1 || o.windows < 1 || o.rounds < 1) {
    std::fprintf(stderr, "handshake: --layers, --ids, --windows and --rounds must be at least 1\n");
    return 2;
  }
  Bench b(o);
  const char* forms[] = {"none", "a", "b", "c"};
  std::vector<cudaGraphExec_t> execs;
  const std::vector<cudaGraphExec_t> segments = b.capture_segments();
  for (const char* f : forms) execs.push_back(std::string(f) == "a" ? nullptr : b.capture(f));

  std::printf("{\"layers\": %d, \"ids\": %d, \"work_us\": %d, \"host_us\": %d, \"windows\": %d, \"rounds\": %d, \"forms\": {",
              o.layers, o.ids, o.work_us, o.host_us, o.windows, o.rounds);
  double baseline_us = 0;
  for (size_t f = 0; f < 4; ++f) {
    const std::string form = forms[f];
    b.time_windows(form, execs[f], segments, std::max(1, o.windows / 10));  // warm-up
    const uint32_t errors_before = b.errors();
    std::vector<double> window_us;
    for (int r = 0; r < o.rounds; ++r)
      window_us.push_back(b.time_windows(form, execs[f], segments, o.windows) * 1e6 / o.windows);
    std::sort(window_us.begin(), window_us.end());
    const double median = window_us[window_us.size() / 2];
    if (form == "none") baseline_us = median;
    std::printf("%s\"%s\": {\"window_us\": %.2f, \"window_us_min\": %.2f, \"window_us_max\": %.2f, "
                "\"handshake_us\": %.2f, \"errors\": %u}",
                f ? ", " : "", form.c_str(), median, window_us.front(), window_us.back(),
                (median - baseline_us) / o.layers, b.errors() - errors_before);
  }
  std::printf("}}\n");
  return 0;
}
