// Stop strings over streamed text. Text that might be the start of a stop string is held back
// until the next piece decides it, so a client never sees part of a stop string.
#pragma once

#include <string>
#include <vector>

namespace strata::decode {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds generated text; returns the text that is now safe to emit. After a stop string is
  // found, stopped() is true and the returned text ends right before it.
  std::string feed(const std::string& piece);
  // The held-back remainder at the end of generation (empty after a stop).
  std::string flush();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace strata::decode
