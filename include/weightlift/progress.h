// weightlift/progress.h: the reference's plain-text progress bar.
//
//   <desc>:  42% Completed | 5/12 [00:03<00:04, 1.52it/s]
//
// One line per update (no carriage returns), so logs under multiprocessing
// stay readable; a line is written at each 10% step, after each second of
// slower progress, and at 100%.
// Not thread-safe: update from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace wl {

class ProgressBar {
 public:
  // `unit` is "it" for counts or "B" for bytes (then rates read "1.2GB/s").
  ProgressBar(std::string desc, uint64_t total, bool enabled = true, std::FILE* out = stderr, std::string unit = "it");
  void update(uint64_t done);  // absolute position
  void finish();               // writes the 100% line if it was not written
  // The line for a position and elapsed time (for tests).
  std::string format(uint64_t done, double elapsed_s) const;

 private:
  std::string desc_;
  uint64_t total_;
  bool enabled_;
  std::FILE* out_;
  std::string unit_;
  int last_pct_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_line_{};
};

}  // namespace wl
