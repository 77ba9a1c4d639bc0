// libFuzzer target for the route file readers: routing traces, usage histories and expert
// profiles. The first byte picks the reader. Only strata::Error is an accepted outcome for bad
// input; every row of a trace that loads is read back through the replay API.
#include <cstddef>
#include <cstdint>
#include <span>

#include "route/profile.h"
#include "route/trace.h"
#include "route/usage_history.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::route;
  if (size == 0) return 0;
  const std::span<const uint8_t> bytes(data + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0: {
        const auto t = TraceReader::parse(bytes, "fuzz.trace");
        volatile int64_t sink = 0;
        for (int l = 0; l < t.header().n_layers && t.rows() > 0; ++l) {
          const auto r = t.routing(0, t.rows(), l);
          for (int32_t e : r.experts) sink = sink + e;
        }
        break;
      }
      case 1: {
        const auto h = UsageHistory::parse(bytes, "fuzz.usage");
        volatile double sink = h.count(h.n_layers() - 1, h.n_experts() - 1);
        (void)sink;
        break;
      }
      default: {
        const auto p = ExpertProfile::parse(bytes, "fuzz.profile");
        volatile int32_t sink = p.ranking(p.n_layers() - 1).front();
        (void)sink;
        break;
      }
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
