// Which compute backend a command runs a model on (`--device cpu|cuda[:N]|auto`), decided once
// before the model loads and printed at start-up. auto takes the first CUDA device when there is
// one and the model fits its free memory (with its experts resident, or the trunk alone when the
// experts stream), else the CPU.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "experts/expert_source.h"

namespace strata::decode {

struct DeviceSpec {
  enum class Kind { Auto, Cpu, Cuda };
  Kind kind = Kind::Auto;
  int index = 0;  // cuda:N
};

// Throws strata::Error naming --device for anything but cpu, cuda, cuda:N or auto.
DeviceSpec parse_device(std::string_view text);

struct OpenedBackend {
  std::unique_ptr<backend::Backend> backend;
  // "cpu (16 threads)" or "cuda:0 (NVIDIA H200, 139.8 GiB, 120.3 GiB free; model 43.3 GiB)",
  // with why auto chose it.
  std::string description;
  int threads = 0;  // the CPU backend's thread count (--threads or one per hardware thread); 0 on a GPU
};

// The backend for the model at `model_path` with its experts placed as `experts` asks. Throws
// strata::Error when CUDA is asked for and there is no such device, or when the model does not
// fit its free memory (naming the bytes needed and free, and the ways out). Experts that stream
// (a trunk-only GGUF, --expert-budget or --pack) go into the device's expert cache: then only the
// trunk, the budget given and a margin must fit.
OpenedBackend open_backend(const DeviceSpec& device, int threads, const std::string& model_path,
                           const experts::SourceOptions& experts);

}  // namespace strata::decode
