// A progress bar for long work (synth, convert, pack) on stderr: bytes done, rate and ETA.
// Redraws at most every 100 ms; on a non-terminal it prints a plain line every 10%.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace strata {

class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total_bytes);
  ~ProgressBar();
  void advance(uint64_t bytes);
  void finish();

 private:
  void draw(bool final_line);

  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool tty_;
  bool finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

// "1.23 GiB", "512.0 MiB", "12 B".
std::string format_bytes(uint64_t bytes);

}  // namespace strata
