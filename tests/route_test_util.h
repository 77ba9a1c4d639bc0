// Shared by the route tests: the message of the strata::Error a call throws.
#pragma once

#include <string>

#include "util/error.h"

namespace strata::route::testing {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace strata::route::testing
