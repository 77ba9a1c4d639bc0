// Deterministic random numbers for synthetic weights and tests: the same seed gives the same
// stream on every machine and compiler (no std:: distributions, whose output is unspecified).
#pragma once

#include <cstdint>

namespace strata {

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t z = seed;
    for (auto& s : state_) s = splitmix(z);
  }

  // xoshiro256** step.
  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  uint32_t next_u32() { return uint32_t(next() >> 32); }
  // Uniform in [0, n) for n > 0 (multiply-shift; bias is below 2^-32 for our n).
  uint32_t below(uint32_t n) { return uint32_t((uint64_t(next_u32()) * n) >> 32); }
  // Uniform in [0, 1).
  float uniform() { return float(next() >> 40) * 0x1p-24f; }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Approximately standard normal (sum of 4 uniforms, rescaled): cheap and deterministic.
  float normal() {
    float s = uniform() + uniform() + uniform() + uniform();
    return (s - 2.0f) * 1.7320508f;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix(uint64_t& z) {
    uint64_t r = (z += 0x9e3779b97f4a7c15ull);
    r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
    r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
    return r ^ (r >> 31);
  }
  uint64_t state_[4];
};

// Counter-based uniform in [0, 1): a pure function of (seed, counter), so the number drawn for
// a position does not depend on how many were drawn before it. Sampling keys it by the token's
// position, which is what keeps speculative decoding's sampled output bitwise that of plain
// decoding (docs/SPECULATION.md).
inline float counter_uniform(uint64_t seed, uint64_t counter) {
  uint64_t z = seed ^ (counter * 0xd1b54a32d192ed03ull);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z = (z ^ (z >> 31)) + seed;
  z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdull;
  z ^= z >> 33;
  return float(z >> 40) * 0x1p-24f;
}

}  // namespace strata
