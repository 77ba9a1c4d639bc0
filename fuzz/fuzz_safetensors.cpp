// libFuzzer target for the safetensors reader. Only strata::Error is an accepted outcome for bad
// input; any other exception, crash or sanitizer report is a bug. Every byte of every tensor view
// is read, so a view that points outside the input shows up under AddressSanitizer.
#include <cstddef>
#include <cstdint>

#include "convert/safetensors.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::convert;
  try {
    const auto f = SafetensorsFile::from_memory(data, size, "fuzz.safetensors");
    volatile size_t sink = 0;
    for (const auto& t : f->tensors()) {
      if (t.nbytes != uint64_t(t.n_elements()) * dtype_size(t.dtype)) __builtin_trap();
      for (uint64_t i = 0; i < t.nbytes; ++i) sink = sink + t.data[i];
      sink = sink + t.shape_string().size() + t.name.size();
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
