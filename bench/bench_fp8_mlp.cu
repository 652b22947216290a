// Benchmark of the FP8 prefill MLP (gate|up GEMM → SwiGLU → FP8 → down GEMM + residual) on Llama-3.1-8B / 70B shapes,
// three ways in one process on the same data:
//   per-token   gemm_fp8 (gate|up, BF16 out) → swiglu_fp8 (per-token scales) → gemm_fp8_residual      (the default)
//   block       gemm_fp8 (gate|up, BF16 out) → swiglu_fp8_block (per 128 channels) → gemm_fp8_block_a_residual
//   fused       gemm_fp8_swiglu (SwiGLU → FP8 blocks in the epilogue) → gemm_fp8_block_a_residual
// and each piece alone. Median of N L2-flushed runs (CUDA events), TFLOP/s counting the two GEMMs' 2 M N K.
//   bench_fp8_mlp [--json PATH] [--iters N]
// The git commit in the JSON comes from -DFT_GIT_COMMIT=... or the FT_GIT_COMMIT environment variable.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/engine/engine_kernels.h"
#include "futransformer/cuda/fp8_producers.h"
#include "futransformer/cuda/gemm_fp8.h"
#include "futransformer/cuda/gemm_fp8_swiglu.h"

#define FT_BENCH_LAST_ERROR() futransformer::cuda::gemm_fp8_swiglu_last_error()
#include "bench_common.h"

namespace {

using namespace futransformer::bench;
namespace fc = futransformer::cuda;

struct Shape {
  const char* name;
  int hidden, inter;
};
const Shape kShapes[] = {{"8B", 4096, 14336}, {"70B", 8192, 28672}};
const int kMs[] = {2048, 8192};

struct Row {
  std::string shape;
  int M, hidden, inter;
  double gate_up_us, swiglu_us, swiglu_block_us, fused_gate_up_us, down_us, down_block_us;
  double per_token_us, block_us, fused_us;
};

double mlp_flops(const Row& r) { return 2.0 * r.M * (2.0 * r.inter) * r.hidden + 2.0 * r.M * r.hidden * r.inter; }

template <typename T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 20, 5);
  const DeviceInfo d = query_device();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const L2Flush flush(d.l2_bytes);
  print_device_summary(d);
  std::printf("; median of %d L2-flushed runs per column\n", args.iters);

  std::vector<Row> rows;
  for (const Shape& s : kShapes) {
    const int max_m = kMs[1];
    const size_t gu_n = static_cast<size_t>(2) * s.inter;
    uint8_t* x8 = device_alloc<uint8_t>(static_cast<size_t>(max_m) * s.hidden);
    uint8_t* w_gu = device_alloc<uint8_t>(gu_n * s.hidden);
    uint8_t* w_down = device_alloc<uint8_t>(static_cast<size_t>(s.hidden) * s.inter);
    uint8_t* y8 = device_alloc<uint8_t>(static_cast<size_t>(max_m) * s.inter);
    uint16_t* gate_up = device_alloc<uint16_t>(static_cast<size_t>(max_m) * gu_n);
    float* sx = device_alloc<float>(max_m);
    float* s_gu = device_alloc<float>(gu_n);
    float* s_down = device_alloc<float>(s.hidden);
    float* sy = device_alloc<float>(static_cast<size_t>(max_m) * s.inter / 128);
    float* residual = device_alloc<float>(static_cast<size_t>(max_m) * s.hidden);
    CHECK_CUDA(fc::fill_random_fp8_e4m3(x8, static_cast<size_t>(max_m) * s.hidden, 1, stream));
    CHECK_CUDA(fc::fill_random_fp8_e4m3(w_gu, gu_n * s.hidden, 2, stream));
    CHECK_CUDA(fc::fill_random_fp8_e4m3(w_down, static_cast<size_t>(s.hidden) * s.inter, 3, stream));
    CHECK_CUDA(fc::fill_f32(sx, max_m, 0x1p-4f, stream));
    CHECK_CUDA(fc::fill_f32(s_gu, gu_n, 0x1p-6f, stream));
    CHECK_CUDA(fc::fill_f32(s_down, s.hidden, 0x1p-7f, stream));
    CHECK_CUDA(fc::fill_f32(residual, static_cast<size_t>(max_m) * s.hidden, 0.0f, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    auto* gu_bf = reinterpret_cast<__nv_bfloat16*>(gate_up);
    for (const int M : kMs) {
      Row r{std::string("llama-3.1-") + s.name, M, s.hidden, s.inter, 0, 0, 0, 0, 0, 0, 0, 0, 0};
      auto gemm_gate_up = [&] { CHECK_CUDA(fc::gemm_fp8(x8, w_gu, sx, s_gu, gu_bf, M, 2 * s.inter, s.hidden, stream)); };
      auto swiglu = [&] { CHECK_CUDA(fc::swiglu_fp8(gu_bf, y8, sy, M, s.inter, stream)); };
      auto swiglu_block = [&] { CHECK_CUDA(fc::swiglu_fp8_block(gu_bf, y8, sy, M, s.inter, stream)); };
      auto fused_gate_up = [&] {
        CHECK_CUDA(fc::gemm_fp8_swiglu(x8, w_gu, sx, s_gu, y8, sy, M, s.inter, s.hidden, stream));
      };
      auto down = [&] { CHECK_CUDA(fc::gemm_fp8_residual(y8, w_down, sy, s_down, residual, M, s.hidden, s.inter, stream)); };
      auto down_block = [&] {
        CHECK_CUDA(fc::gemm_fp8_block_a_residual(y8, w_down, sy, s_down, residual, M, s.hidden, s.inter, stream));
      };
      const int it = args.iters;
      r.gate_up_us = time_median_flushed_us(it, stream, flush, gemm_gate_up);
      r.swiglu_us = time_median_flushed_us(it, stream, flush, swiglu);
      r.swiglu_block_us = time_median_flushed_us(it, stream, flush, swiglu_block);
      r.fused_gate_up_us = time_median_flushed_us(it, stream, flush, fused_gate_up);
      r.down_us = time_median_flushed_us(it, stream, flush, down);
      r.down_block_us = time_median_flushed_us(it, stream, flush, down_block);
      r.per_token_us = time_median_flushed_us(it, stream, flush, [&] {
        gemm_gate_up();
        swiglu();
        down();
      });
      r.block_us = time_median_flushed_us(it, stream, flush, [&] {
        gemm_gate_up();
        swiglu_block();
        down_block();
      });
      r.fused_us = time_median_flushed_us(it, stream, flush, [&] {
        fused_gate_up();
        down_block();
      });
      rows.push_back(r);
    }
    for (void* p : {static_cast<void*>(x8), static_cast<void*>(w_gu), static_cast<void*>(w_down),
                    static_cast<void*>(y8), static_cast<void*>(gate_up), static_cast<void*>(sx),
                    static_cast<void*>(s_gu), static_cast<void*>(s_down), static_cast<void*>(sy),
                    static_cast<void*>(residual)})
      CHECK_CUDA(cudaFree(p));
  }
  std::printf("\n| shape | M | gate\\|up GEMM µs | SwiGLU→FP8 µs | SwiGLU→FP8 blocks µs | fused gate\\|up + SwiGLU µs | "
              "down + res µs | down (block A) + res µs | MLP per-token µs | MLP block µs | MLP fused µs | "
              "fused / per-token | fused TFLOP/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.3f | %.0f |\n",
                r.shape.c_str(), r.M, r.gate_up_us, r.swiglu_us, r.swiglu_block_us, r.fused_gate_up_us, r.down_us,
                r.down_block_us, r.per_token_us, r.block_us, r.fused_us, r.fused_us / r.per_token_us,
                mlp_flops(r) / (r.fused_us * 1e6));
  }
  const int sm_now = report_sm_clock_after_runs(d.dev);
  if (!args.json_path.empty()) {
    const auto extra = [&](FILE* f) { std::fprintf(f, "  \"timed_runs\": %d,\n  \"l2_flushed\": true,\n", args.iters); };
    const auto row = [&](FILE* f, size_t i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "    {\"shape\": \"%s\", \"M\": %d, \"hidden\": %d, \"inter\": %d, \"gate_up_us\": %.2f, "
                   "\"swiglu_fp8_us\": %.2f, \"swiglu_fp8_block_us\": %.2f, \"fused_gate_up_swiglu_us\": %.2f, "
                   "\"down_residual_us\": %.2f, \"down_block_a_residual_us\": %.2f, \"mlp_per_token_us\": %.2f, "
                   "\"mlp_block_us\": %.2f, \"mlp_fused_us\": %.2f, \"mlp_flops\": %.0f}",
                   r.shape.c_str(), r.M, r.hidden, r.inter, r.gate_up_us, r.swiglu_us, r.swiglu_block_us,
                   r.fused_gate_up_us, r.down_us, r.down_block_us, r.per_token_us, r.block_us, r.fused_us,
                   mlp_flops(r));
    };
    if (!write_json(args.json_path, "fp8_mlp", d, sm_now, std::nullopt, extra, rows.size(), row)) return 1;
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
