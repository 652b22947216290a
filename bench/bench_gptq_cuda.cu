// GPTQ on the GPU at Llama-3.1-8B shapes: the Hessian of 131072 calibration tokens (2048 · 64, correlated random
// activations generated on the device, fed through CudaHessianAccumulator::add_device) for the two input sizes
// (4096, 14336), and gptq_quantize_detailed_cuda (act_order, group 128, symmetric: the quantize command's default)
// for the seven projections [N, K]. The per-layer sum (3 Hessians of K = 4096: q/k/v, o, gate/up; 1 of K = 14336:
// down; 7 GPTQs) times 32 layers is the whole 8B model's GPTQ time (the calibration forward, still on the CPU, not
// counted). For comparison the CPU path (HessianAccumulator + gptq_quantize_detailed, OpenMP/OpenBLAS threads as
// the environment sets) on q_proj in the same process: its Hessian over --cpu-tokens tokens, scaled linearly to
// 131072 (syrk time is linear in the tokens), and its GPTQ.
//
//   bench_gptq_cuda [--json PATH] [--iters N] [--no-cpu]
// Environment: FT_GIT_COMMIT (recorded), FT_BENCH_CPU_TOKENS (default 2048).
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "futransformer/quant/gptq.h"
#include "futransformer/quant/gptq_cuda.h"

using namespace futransformer;
using namespace futransformer::bench;

namespace {

constexpr int64_t kTokens = 2048 * 64;
constexpr int64_t kGenChunk = 8192;  // tokens generated (and added) per step
constexpr int kLayers = 32;

struct Shape {
  const char* name;
  int64_t n, k;
};
constexpr Shape kShapes[] = {{"q_proj", 4096, 4096},     {"k_proj", 1024, 4096},   {"v_proj", 1024, 4096},
                             {"o_proj", 4096, 4096},     {"gate_proj", 14336, 4096}, {"up_proj", 14336, 4096},
                             {"down_proj", 4096, 14336}};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Standard normals from a hash of (index, salt) through Box–Muller: reproducible, no RNG state.
__device__ float hash_uniform(uint64_t i, uint32_t salt) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32) * 40503u ^ salt;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  h *= 3266489917u;
  h ^= h >> 16;
  return (static_cast<float>(h >> 8) + 0.5f) * (1.0f / 16777216.0f);
}
__global__ void normal_kernel(float* x, int64_t n, float sd, uint32_t salt) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u1 = hash_uniform(2 * static_cast<uint64_t>(i), salt);
    const float u2 = hash_uniform(2 * static_cast<uint64_t>(i) + 1, salt);
    x[i] = sd * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  }
}
// A = N(0, 1/k) + 0.5·I: mixing that correlates the channels (as tests/gpu/test_gptq_cuda.cpp's activations).
__global__ void add_diagonal_kernel(float* a, int64_t k, float v) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k) a[i * k + i] += v;
}
// A few outlier channels 8x larger, as in real LLM activations.
__global__ void scale_channels_kernel(float* x, int64_t n, int64_t k) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  constexpr int64_t kOutliers[] = {3, 41, 100, 1000};
  for (int64_t c : kOutliers) x[t * k + c] *= 8.0f;
}

// The Hessian of kTokens correlated tokens of k inputs; returns the seconds spent in add_device (generation not
// counted). The accumulator is left in *h for the GPTQ runs.
double hessian_seconds(int64_t k, cublasHandle_t blas, quant::CudaHessianAccumulator& h) {
  float *a = nullptr, *z = nullptr, *x = nullptr;
  CHECK_CUDA(cudaMalloc(&a, static_cast<size_t>(k * k) * 4));
  CHECK_CUDA(cudaMalloc(&z, static_cast<size_t>(kGenChunk * k) * 4));
  CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(kGenChunk * k) * 4));
  normal_kernel<<<4096, 256>>>(a, k * k, 1.0f / std::sqrt(static_cast<float>(k)), 17u);
  add_diagonal_kernel<<<static_cast<unsigned>((k + 255) / 256), 256>>>(a, k, 0.5f);
  CHECK_CUDA(cudaGetLastError());
  double s = 0.0;
  const float one = 1.0f, zero = 0.0f;
  for (int64_t t0 = 0; t0 < kTokens; t0 += kGenChunk) {
    normal_kernel<<<4096, 256>>>(z, kGenChunk * k, 1.0f, static_cast<uint32_t>(1000 + t0 / kGenChunk));
    // x = z·A, row-major [chunk, k]: column-major xᵀ = Aᵀ·zᵀ.
    CHECK_CUBLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(k), static_cast<int>(kGenChunk),
                             static_cast<int>(k), &one, a, static_cast<int>(k), z, static_cast<int>(k), &zero, x,
                             static_cast<int>(k)));
    scale_channels_kernel<<<static_cast<unsigned>((kGenChunk + 255) / 256), 256>>>(x, kGenChunk, k);
    CHECK_CUDA(cudaDeviceSynchronize());
    const auto t = Clock::now();
    h.add_device(x, kGenChunk);
    s += seconds_since(t);
  }
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(z));
  CHECK_CUDA(cudaFree(x));
  return s;
}

std::vector<float> host_weight(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(n * k));
  for (float& v : w) v = nd(rng);
  return w;
}

struct Row {
  std::string what;
  int64_t n, k;
  double seconds, prepare_s, factor_s, quantize_s, finish_s;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 3, 1, "--no-cpu");
  const bool run_cpu = !args.flag;
  const char* cpu_tokens_env = std::getenv("FT_BENCH_CPU_TOKENS");
  const int64_t cpu_tokens = cpu_tokens_env ? std::max(64, std::atoi(cpu_tokens_env)) : 2048;
  const DeviceInfo d = query_device();
  print_device_summary(d);
  std::printf("; %lld calibration tokens; GPTQ act_order, group 128, symmetric; median of %d runs\n",
              static_cast<long long>(kTokens), args.iters);
  cublasHandle_t blas;
  CHECK_CUBLAS(cublasCreate(&blas));
  const quant::GptqOptions opt{formats::Int4Spec{128, true, formats::ScaleType::F16}, 0.01, 128, true};

  std::vector<Row> rows;
  std::printf("%-22s %7s %7s | %10s %10s %10s %10s %10s\n", "step", "N", "K", "total s", "prepare", "factor",
              "quantize", "finish");
  double layer_s = 0.0;
  for (int64_t k : {int64_t{4096}, int64_t{14336}}) {
    quant::CudaHessianAccumulator h(k, "bench K=" + std::to_string(k));
    const double hs = hessian_seconds(k, blas, h);
    const double tflops = static_cast<double>(kTokens) * k * k / hs / 1e12;
    std::printf("%-22s %7s %7lld | %10.4f   (%.1f TFLOP/s fp64 syrk)\n", "hessian", "-", static_cast<long long>(k), hs,
                tflops);
    rows.push_back({"hessian", 0, k, hs, 0, 0, 0, 0});
    layer_s += (k == 4096 ? 3.0 : 1.0) * hs;  // q/k/v, o and gate/up share K = 4096 inputs; down has its own
    for (const Shape& s : kShapes) {
      if (s.k != k) continue;
      const std::vector<float> w = host_weight(s.n, s.k, static_cast<uint32_t>(s.n + s.k));
      std::vector<double> total, prep, fac, quant_s, fin;
      (void)quant::gptq_quantize_detailed_cuda(w, s.n, s.k, h, opt, s.name);  // warm-up (handles, workspaces)
      for (int i = 0; i < args.iters; ++i) {
        const auto t0 = Clock::now();
        (void)quant::gptq_quantize_detailed_cuda(w, s.n, s.k, h, opt, s.name);
        total.push_back(seconds_since(t0));
        const quant::GptqCudaTimings t = quant::gptq_cuda_last_timings();
        prep.push_back(t.prepare_s);
        fac.push_back(t.factor_s);
        quant_s.push_back(t.quantize_s);
        fin.push_back(t.finish_s);
      }
      const Row r{std::string("gptq ") + s.name, s.n, s.k, median_of(total), median_of(prep), median_of(fac),
                  median_of(quant_s), median_of(fin)};
      std::printf("%-22s %7lld %7lld | %10.4f %10.4f %10.4f %10.4f %10.4f\n", r.what.c_str(),
                  static_cast<long long>(r.n), static_cast<long long>(r.k), r.seconds, r.prepare_s, r.factor_s,
                  r.quantize_s, r.finish_s);
      rows.push_back(r);
      layer_s += r.seconds;
    }
  }
  const double model_s = kLayers * layer_s;
  std::printf("GPU: one layer %.3f s; %d layers (Llama-3.1-8B) %.1f s = %.2f min (Hessians + GPTQ; the calibration "
              "forward not included)\n",
              layer_s, kLayers, model_s, model_s / 60.0);

  double cpu_hessian_s = -1.0, cpu_hessian_scaled_s = -1.0, cpu_gptq_s = -1.0;
  if (run_cpu) {
    const Shape& q = kShapes[0];
    std::vector<float> x(static_cast<size_t>(cpu_tokens * q.k));
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& v : x) v = nd(rng);
    quant::HessianAccumulator hc(q.k, "cpu bench");
    auto t0 = Clock::now();
    hc.add(x.data(), cpu_tokens);
    cpu_hessian_s = seconds_since(t0);
    cpu_hessian_scaled_s = cpu_hessian_s * static_cast<double>(kTokens) / static_cast<double>(cpu_tokens);
    const std::vector<float> w = host_weight(q.n, q.k, 3);
    t0 = Clock::now();
    (void)quant::gptq_quantize_detailed(w, q.n, q.k, hc, opt, q.name);
    cpu_gptq_s = seconds_since(t0);
    const Row& gpu_q = rows[1];
    std::printf("CPU q_proj: Hessian %.3f s over %lld tokens (%.1f s scaled to %lld; GPU %.3f s: %.0fx), GPTQ %.3f s "
                "(GPU %.3f s: %.0fx)\n",
                cpu_hessian_s, static_cast<long long>(cpu_tokens), cpu_hessian_scaled_s,
                static_cast<long long>(kTokens), rows[0].seconds, cpu_hessian_scaled_s / rows[0].seconds, cpu_gptq_s,
                gpu_q.seconds, cpu_gptq_s / gpu_q.seconds);
  }
  const int sm_mhz_now = report_sm_clock_after_runs(d.dev);
  if (!args.json_path.empty()) {
    const auto extra = [&](FILE* f) {
      std::fprintf(f,
                   "  \"calibration_tokens\": %lld,\n  \"spec\": \"act_order, group 128, symmetric, f16 scales\",\n"
                   "  \"timed_runs\": %d,\n  \"gpu_layer_s\": %.4f,\n  \"gpu_model_32_layers_s\": %.3f,\n"
                   "  \"cpu_tokens\": %lld,\n  \"cpu_q_proj_hessian_s\": %.4f,\n"
                   "  \"cpu_q_proj_hessian_scaled_s\": %.3f,\n  \"cpu_q_proj_gptq_s\": %.4f,\n",
                   static_cast<long long>(kTokens), args.iters, layer_s, model_s, static_cast<long long>(cpu_tokens),
                   cpu_hessian_s, cpu_hessian_scaled_s, cpu_gptq_s);
    };
    const auto row = [&](FILE* f, size_t i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "    {\"step\": \"%s\", \"n\": %lld, \"k\": %lld, \"seconds\": %.5f, \"prepare_s\": %.5f, "
                   "\"factor_s\": %.5f, \"quantize_s\": %.5f, \"finish_s\": %.5f}",
                   r.what.c_str(), static_cast<long long>(r.n), static_cast<long long>(r.k), r.seconds, r.prepare_s,
                   r.factor_s, r.quantize_s, r.finish_s);
    };
    if (!write_json(args.json_path, "gptq_cuda", d, sm_mhz_now, std::nullopt, extra, rows.size(), row)) return 1;
  }
  CHECK_CUBLAS(cublasDestroy(blas));
  return 0;
}
