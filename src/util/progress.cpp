#include "util/progress.h"

#include <unistd.h>

#include <cstdio>

namespace strata {

std::string format_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  }
  return buf;
}

ProgressBar::ProgressBar(std::string label, uint64_t total_bytes)
    : label_(std::move(label)),
      total_(total_bytes),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (!finished_ && done_ > 0 && tty_) std::fputc('\n', stderr);
}

void ProgressBar::advance(uint64_t bytes) {
  done_ += bytes;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ >= std::chrono::milliseconds(100)) {
      last_draw_ = now;
      draw(false);
    }
  } else if (total_ > 0) {
    const int decile = int(done_ * 10 / total_);
    if (decile != last_decile_ && decile < 10) {
      last_decile_ = decile;
      draw(false);
    }
  }
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  draw(true);
}

void ProgressBar::draw(bool final_line) {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double frac = total_ ? double(done_) / double(total_) : 1.0;
  const double rate = secs > 0 ? double(done_) / secs : 0.0;
  const double eta = rate > 0 && total_ > done_ ? double(total_ - done_) / rate : 0.0;
  constexpr int width = 30;
  std::string bar(width, ' ');
  for (int i = 0; i < int(frac * width) && i < width; ++i) bar[i] = '=';
  const std::string head = tty_ ? "\r" : "";
  std::fprintf(stderr, "%s%s [%s] %5.1f%% %s / %s  %s/s  %s %.0fs%s", head.c_str(),
               label_.c_str(), bar.c_str(), frac * 100.0, format_bytes(done_).c_str(),
               format_bytes(total_).c_str(), format_bytes(uint64_t(rate)).c_str(),
               final_line ? "took" : "eta", final_line ? secs : eta,
               (final_line || !tty_) ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace strata
