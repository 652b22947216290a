// Quantisation progress for the CLI: one ProgressBar (futransformer/progress.h) per stage reported by the
// quantiser, so the CLI has a single progress mechanism.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "futransformer/progress.h"
#include "futransformer/quant/quantize_model.h"

namespace futransformer::cli {

class ProgressLine {
 public:
  explicit ProgressLine(bool enabled) : enabled_(enabled) {}
  // A callback that updates the bar of the current stage (valid while the ProgressLine lives).
  quant::QuantizeProgress callback();
  // Completes the current stage's bar, if any was shown.
  void finish();

 private:
  void update(const std::string& stage, int64_t done, int64_t total);
  bool enabled_;
  std::string stage_;
  int64_t total_ = 0;
  std::unique_ptr<ProgressBar> bar_;
};

}  // namespace futransformer::cli
