// The INT4 projection at prefill sizes, piece by piece, on Llama-3.1 8B / 70B shapes: int4_dequant_bf16 (packed
// W4A16 weight → BF16 [N, K]; bytes = N·K/2 read + N·K·2/group scale bytes + N·K·2 written, against the
// device-to-device copy roofline), the cuBLAS BF16 GEMM on the result at M tokens, their sum (what DeviceLinear's
// large-M path costs), and the W4A16 GEMM run as the engine ran it before, in ⌈M / 64⌉ launches of ≤ 64 rows.
// The L2 is flushed before every timed repetition (weights come from DRAM); medians of --iters repetitions.
//   bench_int4_dequant [--json PATH] [--iters N] [--tokens 192,2048]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "futransformer/cuda/gemm_w4a16.h"
#include "futransformer/cuda/int4_dequant.h"

using namespace futransformer;

namespace {

struct Shape {
  const char* name;
  int N, K;
};
constexpr Shape kShapes[] = {{"8b qkv", 6144, 4096},      {"8b o", 4096, 4096},        {"8b gate_up", 28672, 4096},
                             {"8b down", 4096, 14336},    {"70b qkv", 10240, 8192},    {"70b o", 8192, 8192},
                             {"70b gate_up", 57344, 8192}, {"70b down", 8192, 28672}};
constexpr int kGroup = 128;

struct Row {
  std::string shape;
  int N, K, M;
  double dequant_us, gemm_us, loop_us;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, token_list = "192,2048";
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::max(3, std::atoi(argv[++i]));
    else if (a == "--tokens" && i + 1 < argc) token_list = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--iters N] [--tokens 192,2048]\n", argv[0]);
      return 2;
    }
  }
  std::vector<int> tokens;
  for (const std::string& t : bench::split_list(token_list)) tokens.push_back(std::max(1, std::atoi(t.c_str())));
  const bench::DeviceInfo d = bench::query_device();
  bench::print_device_summary(d);
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreate(&stream));
  const double copy_tbps = bench::device_copy_tbps(stream);
  std::printf(", copy roofline %.2f TB/s\n\n", copy_tbps);
  cublasHandle_t cublas = nullptr;
  CHECK_CUBLAS(cublasCreate(&cublas));
  CHECK_CUBLAS(cublasSetStream(cublas, stream));
  const bench::L2Flush l2(d.l2_bytes);
  const int max_m = *std::max_element(tokens.begin(), tokens.end());

  std::vector<Row> rows;
  std::mt19937 rng(1);
  for (const Shape& s : kShapes) {
    const size_t n_words = static_cast<size_t>(s.N) * s.K / 8, n_scales = static_cast<size_t>(s.N) * (s.K / kGroup);
    // Any nibbles are valid codes; FP16 scales near 1/(8·sqrt(K)) keep outputs of unit inputs near unit size.
    std::vector<uint32_t> words(n_words);
    for (uint32_t& w : words) w = rng();
    std::vector<uint16_t> scales(n_scales, 0x1c00);  // FP16 2^-8
    uint32_t *d_words = nullptr;
    uint16_t *d_scales = nullptr, *d_w = nullptr, *d_x = nullptr, *d_y = nullptr;
    CHECK_CUDA(cudaMalloc(&d_words, n_words * 4));
    CHECK_CUDA(cudaMalloc(&d_scales, n_scales * 2));
    CHECK_CUDA(cudaMalloc(&d_w, static_cast<size_t>(s.N) * s.K * 2));
    CHECK_CUDA(cudaMalloc(&d_x, static_cast<size_t>(max_m) * s.K * 2));
    CHECK_CUDA(cudaMalloc(&d_y, static_cast<size_t>(max_m) * s.N * 2));
    CHECK_CUDA(cudaMemcpy(d_words, words.data(), n_words * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_scales, scales.data(), n_scales * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(d_x, 0x3f, static_cast<size_t>(max_m) * s.K * 2));  // BF16 ~0.75
    size_t ws_bytes = 16;
    for (int m = 1; m <= cuda::kW4A16MaxM; ++m)
      ws_bytes = std::max(ws_bytes, cuda::gemm_w4a16_workspace_bytes(m, s.N, s.K));
    void* d_ws = nullptr;
    CHECK_CUDA(cudaMalloc(&d_ws, ws_bytes));
    auto* wb = reinterpret_cast<__nv_bfloat16*>(d_w);
    auto* xb = reinterpret_cast<__nv_bfloat16*>(d_x);
    auto* yb = reinterpret_cast<__nv_bfloat16*>(d_y);

    auto dequant = [&] {
      const cudaError_t e = cuda::int4_dequant_bf16(d_words, d_scales, wb, s.N, s.K, kGroup, formats::ScaleType::F16,
                                                    formats::Int4MmaRows::canonical, cuda::Int4DequantRows::canonical,
                                                    stream);
      if (e != cudaSuccess) {
        std::fprintf(stderr, "int4_dequant_bf16: %s\n", cuda::int4_dequant_last_error());
        std::exit(1);
      }
    };
    const double dq_us = bench::time_median_flushed_us(iters, stream, l2, dequant);
    for (const int M : tokens) {
      auto gemm = [&] {
        const float alpha = 1.0f, beta = 0.0f;
        CHECK_CUBLAS(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, s.N, M, s.K, &alpha, d_w, CUDA_R_16BF, s.K, d_x,
                                  CUDA_R_16BF, s.K, &beta, d_y, CUDA_R_16BF, s.N, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
      };
      auto loop = [&] {
        for (int m0 = 0; m0 < M; m0 += cuda::kW4A16MaxM) {
          const int mc = std::min(cuda::kW4A16MaxM, M - m0);
          const cudaError_t e = cuda::gemm_w4a16(xb + static_cast<size_t>(m0) * s.K, d_words, d_scales,
                                                 yb + static_cast<size_t>(m0) * s.N, mc, s.N, s.K, kGroup,
                                                 formats::ScaleType::F16, d_ws, ws_bytes, stream);
          if (e != cudaSuccess) {
            std::fprintf(stderr, "gemm_w4a16: %s\n", cuda::gemm_w4a16_last_error());
            std::exit(1);
          }
        }
      };
      Row r{s.name, s.N, s.K, M, dq_us, 0, 0};
      r.gemm_us = bench::time_median_flushed_us(iters, stream, l2, gemm);
      r.loop_us = bench::time_median_flushed_us(iters, stream, l2, loop);
      rows.push_back(r);
    }
    CHECK_CUDA(cudaFree(d_words));
    CHECK_CUDA(cudaFree(d_scales));
    CHECK_CUDA(cudaFree(d_w));
    CHECK_CUDA(cudaFree(d_x));
    CHECK_CUDA(cudaFree(d_y));
    CHECK_CUDA(cudaFree(d_ws));
  }

  std::printf("| shape | N | K | M | dequant us | dequant TB/s | / copy | cuBLAS us | cuBLAS TFLOP/s | "
              "dequant + cuBLAS us | W4A16 loop us | loop TFLOP/s | loop / (dequant + cuBLAS) |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  auto bytes = [](const Row& r) {
    const double nk = static_cast<double>(r.N) * r.K;
    return nk / 2 + nk / kGroup * 2 + nk * 2;
  };
  for (const Row& r : rows) {
    const double flops = 2.0 * r.M * static_cast<double>(r.N) * r.K, tbps = bytes(r) / (r.dequant_us * 1e6);
    std::printf("| %s | %d | %d | %d | %.1f | %.2f | %.0f%% | %.1f | %.0f | %.1f | %.1f | %.0f | %.2f |\n",
                r.shape.c_str(), r.N, r.K, r.M, r.dequant_us, tbps, 100.0 * tbps / copy_tbps, r.gemm_us,
                flops / (r.gemm_us * 1e6), r.dequant_us + r.gemm_us, r.loop_us, flops / (r.loop_us * 1e6),
                r.loop_us / (r.dequant_us + r.gemm_us));
  }
  const int sm_now = bench::report_sm_clock_after_runs(d.dev);
  if (!json_path.empty()) {
    auto extra = [&](FILE* f) { std::fprintf(f, "  \"group\": %d,\n  \"iters\": %d,\n", kGroup, iters); };
    auto row = [&](FILE* f, size_t i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "    {\"shape\": \"%s\", \"N\": %d, \"K\": %d, \"M\": %d, \"dequant_us\": %.2f, \"dequant_bytes\": "
                   "%.0f, \"cublas_us\": %.2f, \"w4a16_loop_us\": %.2f}",
                   r.shape.c_str(), r.N, r.K, r.M, r.dequant_us, bytes(r), r.gemm_us, r.loop_us);
    };
    if (!bench::write_json(json_path, "int4_dequant", d, sm_now, copy_tbps, extra, rows.size(), row)) return 1;
  }
  cublasDestroy(cublas);
  cudaStreamDestroy(stream);
  return 0;
}
