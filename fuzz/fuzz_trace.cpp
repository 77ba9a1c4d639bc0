// libFuzzer target for the routing-trace reader (the usage history and profile have fuzz_history).
// Only strata::Error is an accepted outcome for bad input; every layer of a trace that loads is
// read back through the replay API.
#include <cstddef>
#include <cstdint>
#include <span>

#include "route/trace.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::route;
  try {
    const auto t = TraceReader::parse(std::span<const uint8_t>(data, size), "fuzz.trace");
    volatile int64_t sink = 0;
    for (int l = 0; l < t.header().n_layers && t.rows() > 0; ++l) {
      const auto r = t.routing(0, t.rows(), l);
      for (int32_t e : r.experts) sink = sink + e;
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
