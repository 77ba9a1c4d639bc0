// Small helpers every test suite uses.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "util/error.h"

namespace strata::testing {

// The message of the strata::Error `f` throws, or "(no error)" when it returns.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// n pseudo-random token ids below `vocab` (xorshift from `seed`): model inputs that need no
// tokenizer and repeat run after run.
inline std::vector<int32_t> some_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t.push_back(int32_t(x % uint64_t(vocab)));
  }
  return t;
}

}  // namespace strata::testing
