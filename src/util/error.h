// Errors strata reports to users. Every failure a user can cause (a bad file, a bad flag, a bad
// request) is thrown as strata::Error with a message that names the thing and the problem.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace strata {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Concatenates any streamable values into one string: cat("tensor ", name, ": ", n, " bytes").
template <typename... Parts>
std::string cat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <typename... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Error(cat(std::forward<Parts>(parts)...));
}

}  // namespace strata
