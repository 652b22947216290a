// A progress line on stderr for long CLI steps (quantisation): rewritten in place, at most a few times a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "futransformer/quant/quantize_model.h"

namespace futransformer::cli {

class ProgressLine {
 public:
  explicit ProgressLine(bool enabled) : enabled_(enabled), start_(std::chrono::steady_clock::now()) {}
  // A callback that updates this line (valid while the ProgressLine lives).
  quant::QuantizeProgress callback();
  // Ends the line (newline) if anything was shown.
  void finish();

 private:
  void update(const std::string& stage, int64_t done, int64_t total);
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_, last_{};
};

}  // namespace futransformer::cli
