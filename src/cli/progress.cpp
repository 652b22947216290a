#include "cli/progress.h"

#include <cstdio>

namespace futransformer::cli {

quant::QuantizeProgress ProgressLine::callback() {
  return [this](const std::string& stage, int64_t done, int64_t total) { update(stage, done, total); };
}

void ProgressLine::update(const std::string& stage, int64_t done, int64_t total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  // Redrawing on every tensor of a small model would flood a log; the last step of a stage is always shown.
  if (shown_ && done != total && now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  shown_ = true;
  const double s = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r[%s] %lld/%lld  %.1f s   ", stage.c_str(), static_cast<long long>(done),
               static_cast<long long>(total), s);
  std::fflush(stderr);
}

void ProgressLine::finish() {
  if (shown_) std::fputc('\n', stderr);
  shown_ = false;
}

}  // namespace futransformer::cli
