#include "spec/verify.h"

#include <algorithm>
#include <cmath>

namespace strata::spec {

bool typical_accept(std::span<const float> logits, int32_t draft, float temperature, float epsilon,
                    float delta) {
  if (draft < 0 || size_t(draft) >= logits.size() || !std::isfinite(logits[size_t(draft)])) return false;
  const double t = temperature > 0 ? temperature : 1.0;
  double top = -INFINITY;
  for (float l : logits)
    if (std::isfinite(l)) top = std::max(top, double(l));
  double sum = 0, weighted = 0;
  for (float l : logits) {
    if (!std::isfinite(l)) continue;
    const double z = (double(l) - top) / t;
    const double e = std::exp(z);
    sum += e;
    weighted += e * z;
  }
  const double entropy = std::log(sum) - weighted / sum;
  const double p = std::exp((double(logits[size_t(draft)]) - top) / t) / sum;
  return p >= std::min(double(epsilon), double(delta) * std::exp(-entropy));
}

}  // namespace strata::spec
