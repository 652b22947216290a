// A progress bar on stderr for long CPU/GPU phases: redrawn in place on a terminal, a line every 10% otherwise
// (logs and CI stay readable).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace futransformer {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, bool enabled = true);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Sets the amount done (0 … total) and redraws if due.
  void update(int64_t done, const std::string& detail = "");
  // Draws the final state and ends the line.
  void finish(const std::string& detail = "");

 private:
  void draw(const std::string& detail, bool final);

  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  bool enabled_;
  bool tty_;
  bool finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace futransformer
