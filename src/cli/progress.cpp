#include "cli/progress.h"

namespace futransformer::cli {

quant::QuantizeProgress ProgressLine::callback() {
  return [this](const std::string& stage, int64_t done, int64_t total) { update(stage, done, total); };
}

void ProgressLine::update(const std::string& stage, int64_t done, int64_t total) {
  if (!enabled_) return;
  // A new stage (or a stage restarting with another total) completes the previous bar and starts its own.
  if (!bar_ || stage != stage_ || total != total_) {
    finish();
    stage_ = stage;
    total_ = total;
    bar_ = std::make_unique<ProgressBar>("[" + stage + "]", total);
  }
  bar_->update(done);
}

void ProgressLine::finish() {
  if (bar_) bar_->finish();
  bar_.reset();
}

}  // namespace futransformer::cli
