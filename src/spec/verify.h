// Acceptance rules for drafted tokens. Exact acceptance needs no function: a draft stands iff it
// equals the token the target chooses at its position (argmax when greedy; when sampling, the
// sampler's choice with the position-keyed random number, decode/sampler.h), so the output is
// the one plain decoding gives. Typical acceptance (opt-in, --spec-typical) trades that for
// longer accepted runs and is reported as not exact.
#pragma once

#include <cstdint>
#include <span>

namespace strata::spec {

// Typical acceptance (Medusa): the draft stands when the target's probability for it at
// temperature t (t <= 0 is read as 1) is at least min(epsilon, delta * exp(-H)), H the entropy
// of that distribution.
bool typical_accept(std::span<const float> logits, int32_t draft, float temperature, float epsilon,
                    float delta);

}  // namespace strata::spec
