#include "futransformer/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace futransformer {

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  if (enabled_) draw("", false);
}

ProgressBar::~ProgressBar() {
  if (enabled_ && !finished_ && tty_) std::fputc('\n', stderr);
}

void ProgressBar::update(int64_t done, const std::string& detail) {
  done_ = std::clamp<int64_t>(done, 0, total_);
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const int decile = static_cast<int>(done_ * 10 / total_);
  // A terminal gets at most ~10 redraws a second; a log gets a line per 10%.
  if (tty_ ? now - last_draw_ >= std::chrono::milliseconds(100) : decile != last_decile_) {
    last_draw_ = now;
    last_decile_ = decile;
    draw(detail, false);
  }
}

void ProgressBar::finish(const std::string& detail) {
  if (finished_) return;
  done_ = total_;
  if (enabled_) draw(detail, true);
  finished_ = true;
}

void ProgressBar::draw(const std::string& detail, bool final) {
  constexpr int kWidth = 30;
  const double frac = static_cast<double>(done_) / static_cast<double>(total_);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  const std::string eta_text = final ? "" : ", eta " + std::to_string(static_cast<int>(eta)) + "s";
  // "\033[K" clears what a longer earlier draw left to the right of this one.
  std::fprintf(stderr, "%s%s [%s] %3d%% %lld/%lld  %.0fs elapsed%s%s%s", tty_ ? "\r" : "", label_.c_str(), bar.c_str(),
               static_cast<int>(frac * 100), static_cast<long long>(done_), static_cast<long long>(total_), elapsed,
               eta_text.c_str(), detail.empty() ? "" : ("  " + detail).c_str(), tty_ ? "\033[K" : "");
  if (!tty_ || final) std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace futransformer
