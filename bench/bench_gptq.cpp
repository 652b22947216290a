// GPTQ on the CPU (group 64, symmetric): time per layer for SmolLM2-135M and Llama-3.1-8B shapes, RTN alongside.
// Usage: bench_gptq [reps]   (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS pick the threads)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "futransformer/formats/int4.h"
#include "futransformer/quant/gptq.h"

namespace {

using namespace futransformer;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  const char* what;
  int64_t rows, cols;
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  constexpr int64_t kCalibTokens = 2048;
  const Case cases[] = {
      {"smollm2 q_proj 576x576", 576, 576},
      {"smollm2 up_proj 1536x576", 1536, 576},
      {"smollm2 down_proj 576x1536", 576, 1536},
      {"llama8b q_proj 4096x4096", 4096, 4096},
  };
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
#else
  const int threads = 1;
#endif
  std::printf("OpenMP threads: %d, calibration tokens: %lld, median of %d\n", threads,
              static_cast<long long>(kCalibTokens), reps);
  std::printf("%-28s %10s %10s %12s %12s %10s\n", "layer (N x K)", "hessian s", "rtn s", "gptq s", "act_ord s",
              "gptq/rtn");
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Case& c : cases) {
    std::vector<float> x(static_cast<size_t>(kCalibTokens * c.cols));
    for (float& v : x) v = nd(rng);
    std::vector<float> w(static_cast<size_t>(c.rows * c.cols));
    for (float& v : w) v = 0.02f * nd(rng);
    auto t0 = Clock::now();
    quant::HessianAccumulator h(c.cols, c.what);
    h.add(x.data(), kCalibTokens);
    const double t_h = seconds_since(t0);
    const formats::Int4Spec spec{64, true, formats::ScaleType::F16};  // 64 divides 576 (SmolLM2 hidden)
    std::vector<double> t_rtn, t_gptq, t_act;
    for (int r = 0; r < reps; ++r) {
      t0 = Clock::now();
      (void)formats::int4_quantize_rtn(w, c.rows, c.cols, spec, c.what);
      t_rtn.push_back(seconds_since(t0));
      t0 = Clock::now();
      (void)quant::gptq_quantize(w, c.rows, c.cols, h, quant::GptqOptions{spec}, c.what);
      t_gptq.push_back(seconds_since(t0));
      t0 = Clock::now();
      (void)quant::gptq_quantize(w, c.rows, c.cols, h, quant::GptqOptions{spec, 0.01, 128, true}, c.what);
      t_act.push_back(seconds_since(t0));
    }
    std::printf("%-28s %10.3f %10.4f %12.4f %12.4f %10.1f\n", c.what, t_h, median(t_rtn), median(t_gptq),
                median(t_act), median(t_gptq) / median(t_rtn));
  }
  return 0;
}
