#include "weightlift/progress.h"

#include <cmath>

#include <fmt/format.h>

#include "weightlift/text.h"

namespace wl {

namespace {
std::string clock_fmt(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  auto t = static_cast<uint64_t>(s);
  if (t >= 3600) return fmt::format("{}:{:02d}:{:02d}", t / 3600, (t / 60) % 60, t % 60);
  return fmt::format("{:02d}:{:02d}", t / 60, t % 60);
}
std::string si(double v, const std::string& unit) {
  const char* pre[] = {"", "k", "M", "G", "T"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 4) v /= 1000, ++i;
  return fmt::format("{:.2f}{}{}", v, pre[i], unit);
}
}  // namespace

ProgressBar::ProgressBar(std::string desc, uint64_t total, bool enabled, std::FILE* out, std::string unit)
    : desc_(inert(desc)),  // it may name a file from a listing
      total_(total), enabled_(enabled), out_(out), unit_(std::move(unit)), start_(std::chrono::steady_clock::now()) {}

std::string ProgressBar::format(uint64_t done, double elapsed) const {
  double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
  double remaining = rate > 0 ? static_cast<double>(total_ - std::min(done, total_)) / rate : NAN;
  std::string n = unit_ == "B" ? si(static_cast<double>(done), "B") : std::to_string(done);
  std::string t = unit_ == "B" ? si(static_cast<double>(total_), "B") : std::to_string(total_);
  std::string r = rate > 0 ? si(rate, unit_) + "/s" : "?" + unit_ + "/s";
  if (unit_ != "B" && rate > 0) r = fmt::format("{:.2f}{}/s", rate, unit_);
  return fmt::format("{}: {:3.0f}% Completed | {}/{} [{}<{}, {}]", desc_, frac * 100.0, n, t, clock_fmt(elapsed),
                     clock_fmt(remaining), r);
}

void ProgressBar::update(uint64_t done) {
  if (!enabled_) return;
  int pct = total_ ? static_cast<int>(done * 100 / total_) : 100;
  if (pct == last_pct_) return;
  auto now = std::chrono::steady_clock::now();
  // A line per 10% step, per second of slow progress, and at 100%.
  bool step = last_pct_ < 0 || pct / 10 != last_pct_ / 10 || pct == 100 || now - last_line_ >= std::chrono::seconds(1);
  if (!step) return;
  last_pct_ = pct;
  last_line_ = now;
  double el = std::chrono::duration<double>(now - start_).count();
  std::fprintf(out_, "%s\n", format(done, el).c_str());
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (enabled_ && last_pct_ != 100) update(total_);
}

}  // namespace wl
