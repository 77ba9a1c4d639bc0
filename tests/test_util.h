// Small helpers every test suite uses.
#pragma once

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

}  // namespace strata::testing
