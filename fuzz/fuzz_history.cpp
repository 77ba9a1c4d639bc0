// libFuzzer target for the small files next to a pack: the usage history and the expert profile.
// The first byte picks the reader (fuzz_trace covers routing traces). A file either loads or
// throws strata::Error; one that loads is blended into a start-up fill order, which must rank
// every expert of every layer exactly once.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "route/profile.h"
#include "route/usage_history.h"
#include "util/error.h"

namespace {

void check_order(const std::vector<std::vector<int32_t>>& order, int n_layers, int n_experts) {
  if (int(order.size()) != n_layers) __builtin_trap();
  for (const auto& layer : order) {
    if (int(layer.size()) != n_experts) __builtin_trap();
    std::vector<uint8_t> seen(size_t(n_experts), 0);
    for (int32_t e : layer) {
      if (e < 0 || e >= n_experts || seen[size_t(e)]) __builtin_trap();
      seen[size_t(e)] = 1;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::route;
  if (size == 0) return 0;
  const std::span<const uint8_t> bytes(data + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      const UsageHistory h = UsageHistory::parse(bytes, "fuzz.history");
      if (int64_t(h.n_layers()) * h.n_experts() > (1 << 16)) return 0;  // a blend's cost, not a bug
      const ExpertProfile empty(h.n_layers(), h.n_experts(), h.model());
      check_order(blend(empty, h, h.tokens()), h.n_layers(), h.n_experts());
    } else {
      const ExpertProfile p = ExpertProfile::parse(bytes, "fuzz.profile");
      if (int64_t(p.n_layers()) * p.n_experts() > (1 << 16)) return 0;
      const UsageHistory none(p.n_layers(), p.n_experts(), 4096.0, p.model());
      check_order(blend(p, none, 0), p.n_layers(), p.n_experts());
    }
  } catch (const strata::Error&) {
  }
  return 0;
}
