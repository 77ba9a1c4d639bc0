// libFuzzer target for the GGUF reader. Only strata::Error is an accepted outcome for bad input;
// any other exception, crash or sanitizer report is a bug. Everything the Reader returns is
// touched, so a view that points outside the input shows up under AddressSanitizer.
#include <cstddef>
#include <cstdint>

#include "gguf/gguf.h"
#include "util/error.h"

namespace {

size_t walk(const strata::gguf::Value& v) {
  size_t n = v.to_string().size();
  if (v.type() == strata::gguf::ValueType::ARRAY)
    for (const auto& item : v.as_array()) n += walk(item);
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::gguf;
  try {
    const auto r = Reader::from_memory(data, size, "fuzz.gguf");
    volatile size_t sink = r->alignment() + r->data_offset();
    for (const auto& [key, value] : r->metadata()) {
      sink = sink + key.size() + walk(value);
      if (r->find(key) != &value) __builtin_trap();
    }
    for (const auto& t : r->tensors()) {
      if (r->find_tensor(t.name) != &t) __builtin_trap();
      sink = sink + t.data[0] + t.data[t.nbytes - 1] + t.shape_string().size();
      sink = sink + size_t(t.n_elements() + t.n_rows()) + t.row_stride();
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
