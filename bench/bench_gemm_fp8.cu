// Benchmark of the FP8 prefill GEMM against cuBLASLt (FP8 and BF16) on Llama-3.1-8B / 70B projection shapes.
//   bench_gemm_fp8 [--json PATH] [--iters N]
//   FT_BENCH_ONLY=8B.gate_up:2048 runs that one shape and M (for profilers: ncu, nsys).
//   The qkv shapes also time RoPE on the q and k heads (8 KV heads of 128): gemm_fp8 + rope_qk_bf16 against
//   gemm_fp8_rope (RoPE in the GEMM's epilogue), L2-flushed, with their outputs compared bit for bit.
//   bench_gemm_fp8 --chain [--json PATH] [--iters N]: instead of the table, the projections of a whole 8B-shaped
//   prefill of 2048 tokens back to back (32 layers x qkv, o, gate|up, down; kChainWeightSets weight sets in turn, so
//   no layer finds its weights in L2), ours against cuBLASLt FP8 with the same scaling, alternating chain by chain:
//   what the GEMMs alone cost at the clocks a sustained prefill runs at (the H200 lowers its SM clock under a long
//   FP8 load; single L2-flushed launches run near 1980 MHz). Per GEMM: µs per layer (event pairs around each launch).
// Each row: median of N (default 20) launches, each timed by its own pair of CUDA events after the L2 was flushed
// (a 2x L2-sized memset between launches, outside the timed interval), after warm-up. TFLOP/s counts 2 M N K.
// Baselines, same data and layout (A [M, K], B [N, K], both K-major: cuBLASLt's "TN"):
//   cuBLASLt FP8 with outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: a_scale[m] * b_scale[n],
//   our semantics) when this cuBLASLt offers it for the shape, else per-tensor scalar scales (the scale mode
//   column says which); FAST_ACCUM off, i.e. with promotion like ours; and the same with FAST_ACCUM on.
//   The scales are constant vectors, so both modes compute the same D and the outputs are compared (max |diff|
//   over max |D|) to show the timed kernels agree. cuBLASLt BF16 on BF16 copies of the shape.
// The git commit in the JSON comes from -DFT_GIT_COMMIT=... or the FT_GIT_COMMIT environment variable.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/gemm_fp8.h"

#define FT_BENCH_LAST_ERROR() futransformer::cuda::gemm_fp8_last_error()
#include "bench_common.h"

namespace {

using namespace futransformer::bench;

struct Shape {
  const char* name;
  int K, N;  // in -> out
};
const Shape kShapes[] = {
    {"8B.qkv", 4096, 6144},   {"8B.o", 4096, 4096},  {"8B.gate_up", 4096, 28672},  {"8B.down", 14336, 4096},
    {"70B.qkv", 8192, 10240}, {"70B.o", 8192, 8192}, {"70B.gate_up", 8192, 57344}, {"70B.down", 28672, 8192},
};
const int kMs[] = {512, 2048, 8192};
constexpr float kScaleA = 0x1p-7f, kScaleB = 0x1p-9f;

// Random finite E4M3 codes (0x7F / 0xFF are NaN) and random BF16 values in +-[1, 2), from a hash of the index.
__device__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}
__global__ void fill_codes(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint8_t c = static_cast<uint8_t>(mix(i ^ seed));
    if ((c & 0x7F) == 0x7F) c ^= 1;
    p[i] = c;
  }
}
__global__ void fill_bf16(uint16_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<uint16_t>(0x3F80u | (mix(i ^ seed) & 0x807Fu));
}
__global__ void fill_f32(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) p[i] = v;
}

// cuBLASLt D[M, N] = A[M, K] * B[N, K]^T in column-major terms: D^T (N x M, ld N) = op_T(B as K x N) * (A as K x M).
// For FP8 the Lt "A" operand is our B (weights, scale vector of N) and the Lt "B" operand our A (scale of M).
struct LtGemm {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* ws = nullptr;
  size_t ws_bytes = 32u << 20;
  bool ok = false;
  LtGemm(cublasLtHandle_t h, int M, int N, int K, cudaDataType_t in, bool fast_accum, const float* scale_w,
         const float* scale_x, bool outer_vec, void* workspace)
      : lt(h), ws(workspace) {
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (in == CUDA_R_8F_E4M3) {
      const int8_t fa = fast_accum ? 1 : 0;
      CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof(fa)));
      CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_w, sizeof(scale_w)));
      CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_x, sizeof(scale_x)));
      if (outer_vec) {
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
        CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
      }
    }
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&la, in, K, N, K));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lb, in, K, M, K));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref = nullptr;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                      sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &result, &found);
    ok = s == CUBLAS_STATUS_SUCCESS && found > 0;
    if (ok) algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  cublasStatus_t try_run(const void* w, const void* x, void* d, cudaStream_t s) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt, op, &alpha, w, la, x, lb, &beta, d, lc, d, lc, &algo, ws, ws_bytes, s);
  }
  void run(const void* w, const void* x, void* d, cudaStream_t s) { CHECK_CUBLAS(try_run(w, x, d, s)); }
};

// cuBLASLt FP8 for D[M, N] = A[M, K] * B[N, K]^T with outer-vector scaling if this cuBLASLt offers it for the shape
// (our semantics), else per-tensor scalars (sa / sb then hold one value each); an algorithm the heuristic offers must
// also run, so it is probed once (b8 / a8 / d: operands of the shape). *outer says which mode it got.
std::unique_ptr<LtGemm> make_lt_fp8(cublasLtHandle_t lt, int M, int N, int K, bool fast, const float* sb,
                                    const float* sa, void* lt_ws, const uint8_t* b8, const uint8_t* a8, uint16_t* d,
                                    cudaStream_t stream, bool* outer) {
  auto g = std::make_unique<LtGemm>(lt, M, N, K, CUDA_R_8F_E4M3, fast, sb, sa, true, lt_ws);
  g->ok = g->ok && g->try_run(b8, a8, d, stream) == CUBLAS_STATUS_SUCCESS && cudaStreamSynchronize(stream) == cudaSuccess;
  *outer = g->ok;
  if (!g->ok) g = std::make_unique<LtGemm>(lt, M, N, K, CUDA_R_8F_E4M3, fast, sb, sa, false, lt_ws);
  if (!g->ok) {
    std::fprintf(stderr, "cuBLASLt found no FP8 algorithm for M=%d N=%d K=%d\n", M, N, K);
    std::exit(1);
  }
  return g;
}

// max |a - b| / max |b| over two BF16 device arrays.
double relative_max_diff(const uint16_t* a, const uint16_t* b, size_t n) {
  std::vector<uint16_t> ha(n), hb(n);
  CHECK_CUDA(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
  auto f = [](uint16_t v) {
    const uint32_t u = static_cast<uint32_t>(v) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return static_cast<double>(x);
  };
  double diff = 0.0, mag = 0.0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(f(ha[i]) - f(hb[i])));
    mag = std::max(mag, std::fabs(f(hb[i])));
  }
  return mag > 0.0 ? diff / mag : (diff > 0.0 ? INFINITY : 0.0);
}

struct Row {
  std::string shape, scale_mode;
  int M, K, N;
  double ours_us, lt_fp8_us, lt_fp8_fast_us, lt_bf16_us, agree;
  // qkv shapes: gemm_fp8 + rope_qk_bf16, and gemm_fp8_rope (0: not timed), and whether their outputs are identical.
  double rope_separate_us = 0, rope_fused_us = 0;
  bool rope_identical = false;
};
constexpr int kRopeKvHeads = 8;  // Llama-3.1 8B and 70B
constexpr int kRopeHeadDim = 128;

double tflops(const Row& r, double us) { return 2.0 * r.M * r.N * r.K / (us * 1e-6) / 1e12; }

// --chain (see the top of the file).
constexpr int kChainLayers = 32, kChainM = 2048, kChainWeightSets = 4;

int run_chain(const DeviceInfo& d, cudaStream_t stream, cublasLtHandle_t lt, void* lt_ws, int iters,
              const std::string& json_path) {
  struct Op {
    const Shape* shape;
    uint8_t* a = nullptr;
    std::vector<uint8_t*> b;
    float* sb = nullptr;
    std::unique_ptr<LtGemm> lt_gemm;
    bool outer = false;
  };
  std::vector<Op> ops(4);
  for (int i = 0; i < 4; ++i) ops[static_cast<size_t>(i)].shape = &kShapes[i];  // 8B qkv, o, gate_up, down
  size_t d_n = 0;
  for (const Op& op : ops) d_n = std::max(d_n, static_cast<size_t>(kChainM) * op.shape->N);
  uint16_t* dst = nullptr;
  float* sa = nullptr;
  CHECK_CUDA(cudaMalloc(&dst, d_n * 2));
  CHECK_CUDA(cudaMalloc(&sa, size_t{kChainM} * 4));
  fill_f32<<<64, 256, 0, stream>>>(sa, size_t{kChainM}, kScaleA);
  uint64_t seed = 100;
  for (Op& op : ops) {
    const size_t a_n = size_t{kChainM} * op.shape->K, b_n = static_cast<size_t>(op.shape->N) * op.shape->K;
    CHECK_CUDA(cudaMalloc(&op.a, a_n));
    fill_codes<<<1024, 256, 0, stream>>>(op.a, a_n, seed++);
    for (int w = 0; w < kChainWeightSets; ++w) {
      uint8_t* b = nullptr;
      CHECK_CUDA(cudaMalloc(&b, b_n));
      fill_codes<<<1024, 256, 0, stream>>>(b, b_n, seed++);
      op.b.push_back(b);
    }
    CHECK_CUDA(cudaMalloc(&op.sb, static_cast<size_t>(op.shape->N) * 4));
    fill_f32<<<64, 256, 0, stream>>>(op.sb, static_cast<size_t>(op.shape->N), kScaleB);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaStreamSynchronize(stream));
    op.lt_gemm = make_lt_fp8(lt, kChainM, op.shape->N, op.shape->K, false, op.sb, sa, lt_ws, op.b[0], op.a, dst,
                             stream, &op.outer);
  }
  // One chain: events before the first launch and after each; returns the chain's µs and adds each GEMM's µs to
  // per_op (indexed like ops), plus the NVML SM clock read right after the chain.
  std::vector<cudaEvent_t> ev(size_t{kChainLayers} * ops.size() + 1);
  for (cudaEvent_t& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  auto chain = [&](bool ours, std::vector<double>& per_op, int* mhz) {
    size_t k = 0;
    CHECK_CUDA(cudaEventRecord(ev[k++], stream));
    for (int l = 0; l < kChainLayers; ++l)
      for (Op& op : ops) {
        const uint8_t* b = op.b[static_cast<size_t>(l % kChainWeightSets)];
        if (ours)
          CHECK_CUDA(futransformer::cuda::gemm_fp8(op.a, b, sa, op.sb, reinterpret_cast<__nv_bfloat16*>(dst), kChainM,
                                                   op.shape->N, op.shape->K, stream));
        else
          op.lt_gemm->run(b, op.a, dst, stream);
        CHECK_CUDA(cudaEventRecord(ev[k++], stream));
      }
    CHECK_CUDA(cudaEventSynchronize(ev.back()));
    *mhz = nvml_sm_clock_mhz(d.dev);
    for (size_t i = 1; i < ev.size(); ++i) {
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, ev[i - 1], ev[i]));
      per_op[(i - 1) % ops.size()] += ms * 1e3;
    }
    float total = 0;
    CHECK_CUDA(cudaEventElapsedTime(&total, ev.front(), ev.back()));
    return static_cast<double>(total) * 1e3;
  };
  struct Side {
    std::vector<double> chain_us, mhz;
    std::vector<std::vector<double>> per_op;  // [run][op], µs summed over the layers
  };
  Side side[2];  // 0: ours, 1: cuBLASLt
  for (int warm = 0; warm < 2; ++warm) {
    std::vector<double> scratch(ops.size());
    int mhz = 0;
    chain(warm == 0, scratch, &mhz);
  }
  for (int it = 0; it < iters; ++it)
    for (int who = 0; who < 2; ++who) {
      std::vector<double> per_op(ops.size(), 0.0);
      int mhz = 0;
      side[who].chain_us.push_back(chain(who == 0, per_op, &mhz));
      side[who].mhz.push_back(mhz);
      side[who].per_op.push_back(per_op);
    }
  double flops_layer = 0;
  for (const Op& op : ops) flops_layer += 2.0 * kChainM * op.shape->N * op.shape->K;
  // The median run by chain time, per side; per-op µs per layer from that run.
  auto median_run = [](const std::vector<double>& v) {
    std::vector<size_t> order(v.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
    return order[(order.size() - 1) / 2];
  };
  const size_t med[2] = {median_run(side[0].chain_us), median_run(side[1].chain_us)};
  std::printf("\nGEMM chain: %d layers x (qkv, o, gate|up, down) at M = %d, %d weight sets in turn; median of %d "
              "chains per side, alternating\n",
              kChainLayers, kChainM, kChainWeightSets, iters);
  std::printf("| | ours | cuBLASLt FP8 (%s) | cuBLASLt / ours |\n|---|---|---|---|\n",
              ops[0].outer ? "outer_vec" : "per_tensor");
  const double t0 = side[0].chain_us[med[0]], t1 = side[1].chain_us[med[1]];
  std::printf("| chain ms | %.2f | %.2f | %.3f |\n", t0 / 1e3, t1 / 1e3, t1 / t0);
  std::printf("| TFLOP/s | %.0f | %.0f | |\n", flops_layer * kChainLayers / (t0 * 1e-6) / 1e12,
              flops_layer * kChainLayers / (t1 * 1e-6) / 1e12);
  std::printf("| SM MHz right after (median run) | %.0f | %.0f | |\n", side[0].mhz[med[0]], side[1].mhz[med[1]]);
  for (size_t i = 0; i < ops.size(); ++i) {
    const double a = side[0].per_op[med[0]][i] / kChainLayers, b = side[1].per_op[med[1]][i] / kChainLayers;
    std::printf("| %s µs per layer | %.1f | %.1f | %.3f |\n", ops[i].shape->name, a, b, b / a);
  }
  const int sm_mhz_now = report_sm_clock_after_runs(d.dev);
  int rc = 0;
  if (!json_path.empty()) {
    const auto extra = [&](FILE* f) {
      std::fprintf(f,
                   "  \"mode\": \"chain\",\n  \"layers\": %d,\n  \"M\": %d,\n  \"weight_sets\": %d,\n  "
                   "\"chains_per_side\": %d,\n  \"cublaslt_fp8_scale_mode\": \"%s\",\n",
                   kChainLayers, kChainM, kChainWeightSets, iters, ops[0].outer ? "outer_vec" : "per_tensor");
    };
    const auto row = [&](FILE* f, size_t who) {
      const Side& sd = side[who];
      std::fprintf(f, "    {\"library\": \"%s\", \"chain_us_median\": %.1f, \"tflops\": %.1f, \"sm_mhz_after\": %.0f, "
                      "\"chain_us\": [",
                   who == 0 ? "futransformer gemm_fp8" : "cublaslt_fp8", sd.chain_us[med[who]],
                   flops_layer * kChainLayers / (sd.chain_us[med[who]] * 1e-6) / 1e12, sd.mhz[med[who]]);
      for (size_t i = 0; i < sd.chain_us.size(); ++i) std::fprintf(f, "%s%.1f", i ? ", " : "", sd.chain_us[i]);
      std::fprintf(f, "], \"per_layer_us\": {");
      for (size_t i = 0; i < ops.size(); ++i)
        std::fprintf(f, "%s\"%s\": %.2f", i ? ", " : "", ops[i].shape->name,
                     sd.per_op[med[who]][i] / kChainLayers);
      std::fprintf(f, "}}");
    };
    if (!write_json(json_path, "gemm_fp8_chain", d, sm_mhz_now, std::nullopt, extra, 2, row)) rc = 1;
  }
  for (cudaEvent_t e : ev) CHECK_CUDA(cudaEventDestroy(e));
  for (Op& op : ops) {
    CHECK_CUDA(cudaFree(op.a));
    CHECK_CUDA(cudaFree(op.sb));
    for (uint8_t* b : op.b) CHECK_CUDA(cudaFree(b));
  }
  CHECK_CUDA(cudaFree(dst));
  CHECK_CUDA(cudaFree(sa));
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 20, 5, "--chain");
  const int iters = args.iters;
  const DeviceInfo d = query_device();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasLtHandle_t lt;
  CHECK_CUBLAS(cublasLtCreate(&lt));
  void* lt_ws = nullptr;
  CHECK_CUDA(cudaMalloc(&lt_ws, 32u << 20));
  if (args.flag) {
    print_device_summary(d);
    std::printf("\n");
    const int rc = run_chain(d, stream, lt, lt_ws, args.iters, args.json_path);
    CHECK_CUDA(cudaFree(lt_ws));
    cublasLtDestroy(lt);
    CHECK_CUDA(cudaStreamDestroy(stream));
    return rc;
  }
  const L2Flush flush(d.l2_bytes);

  print_device_summary(d);
  std::printf("; median of %d L2-flushed runs per column\n", iters);
  std::printf("%-12s %5s %6s %6s | %9s %7s | %9s %7s %6s %-9s| %7s | %7s | %8s\n", "shape", "M", "K", "N", "ours us",
              "TFLOP/s", "ltfp8 us", "TFLOP/s", "ratio", "scales", "fastacc", "bf16", "max diff");

  // FT_BENCH_ONLY=SHAPE:M keeps one row (a profiler then sees only its kernels); unknown names run nothing.
  const char* only_env = std::getenv("FT_BENCH_ONLY");
  const std::string only = only_env ? only_env : "";
  auto selected = [&](const Shape& s, int M) {
    return only.empty() || only == std::string(s.name) + ":" + std::to_string(M);
  };
  std::vector<Row> rows;
  const int max_m = *std::max_element(std::begin(kMs), std::end(kMs));
  for (const Shape& s : kShapes) {
    if (!std::any_of(std::begin(kMs), std::end(kMs), [&](int M) { return selected(s, M); })) continue;
    const size_t a_n = static_cast<size_t>(max_m) * s.K, b_n = static_cast<size_t>(s.N) * s.K;
    const size_t d_n = static_cast<size_t>(max_m) * s.N;
    uint8_t *a8 = nullptr, *b8 = nullptr;
    uint16_t *a16 = nullptr, *b16 = nullptr, *d_ours = nullptr, *d_lt = nullptr;
    float *sa = nullptr, *sb = nullptr;
    CHECK_CUDA(cudaMalloc(&a8, a_n));
    CHECK_CUDA(cudaMalloc(&b8, b_n));
    CHECK_CUDA(cudaMalloc(&a16, a_n * 2));
    CHECK_CUDA(cudaMalloc(&b16, b_n * 2));
    CHECK_CUDA(cudaMalloc(&d_ours, d_n * 2));
    CHECK_CUDA(cudaMalloc(&d_lt, d_n * 2));
    CHECK_CUDA(cudaMalloc(&sa, static_cast<size_t>(max_m) * 4));
    CHECK_CUDA(cudaMalloc(&sb, static_cast<size_t>(s.N) * 4));
    fill_codes<<<1024, 256, 0, stream>>>(a8, a_n, 1);
    fill_codes<<<1024, 256, 0, stream>>>(b8, b_n, 2);
    fill_bf16<<<1024, 256, 0, stream>>>(a16, a_n, 3);
    fill_bf16<<<1024, 256, 0, stream>>>(b16, b_n, 4);
    fill_f32<<<64, 256, 0, stream>>>(sa, static_cast<size_t>(max_m), kScaleA);
    fill_f32<<<64, 256, 0, stream>>>(sb, static_cast<size_t>(s.N), kScaleB);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaStreamSynchronize(stream));

    for (int M : kMs) {
      if (!selected(s, M)) continue;
      Row r{s.name, "", M, s.K, s.N, 0, 0, 0, 0, 0};
      r.ours_us = time_median_flushed_us(iters, stream, flush, [&] {
        CHECK_CUDA(futransformer::cuda::gemm_fp8(a8, b8, sa, sb, reinterpret_cast<__nv_bfloat16*>(d_ours), M, s.N,
                                                 s.K, stream));
      });
      auto make_fp8 = [&](bool fast, bool* outer) {
        return make_lt_fp8(lt, M, s.N, s.K, fast, sb, sa, lt_ws, b8, a8, d_lt, stream, outer);
      };
      bool outer = false, outer_fast = false;
      auto fp8 = make_fp8(false, &outer);
      auto fp8_fast = make_fp8(true, &outer_fast);
      r.scale_mode = outer ? "outer_vec" : "per_tensor";
      r.lt_fp8_us = time_median_flushed_us(iters, stream, flush, [&] { fp8->run(b8, a8, d_lt, stream); });
      CHECK_CUDA(cudaStreamSynchronize(stream));
      r.agree = relative_max_diff(d_ours, d_lt, static_cast<size_t>(M) * s.N);
      r.lt_fp8_fast_us =
          time_median_flushed_us(iters, stream, flush, [&] { fp8_fast->run(b8, a8, d_lt, stream); });
      LtGemm bf(lt, M, s.N, s.K, CUDA_R_16BF, false, nullptr, nullptr, false, lt_ws);
      if (!bf.ok) {
        std::fprintf(stderr, "cuBLASLt found no BF16 algorithm for M=%d N=%d K=%d\n", M, s.N, s.K);
        return 1;
      }
      r.lt_bf16_us = time_median_flushed_us(iters, stream, flush, [&] { bf.run(b16, a16, d_lt, stream); });
      if (std::string(s.name).find(".qkv") != std::string::npos) {
        const int rope_heads = s.N / kRopeHeadDim - kRopeKvHeads;  // q and k heads
        std::vector<int32_t> pos(static_cast<size_t>(M));
        for (int i = 0; i < M; ++i) pos[static_cast<size_t>(i)] = 3 * i + 7;
        std::vector<float> inv(kRopeHeadDim / 2);
        for (int i = 0; i < kRopeHeadDim / 2; ++i)
          inv[static_cast<size_t>(i)] = static_cast<float>(std::pow(500000.0, -2.0 * i / kRopeHeadDim));
        int32_t* d_pos = nullptr;
        float *d_inv = nullptr, *table = nullptr;
        CHECK_CUDA(cudaMalloc(&d_pos, pos.size() * 4));
        CHECK_CUDA(cudaMalloc(&d_inv, inv.size() * 4));
        CHECK_CUDA(cudaMalloc(&table, static_cast<size_t>(M) * kRopeHeadDim * 4));
        CHECK_CUDA(cudaMemcpy(d_pos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(d_inv, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(futransformer::cuda::rope_cos_sin_table(d_pos, d_inv, M, kRopeHeadDim, table, stream));
        auto* ours = reinterpret_cast<__nv_bfloat16*>(d_ours);
        auto* fused = reinterpret_cast<__nv_bfloat16*>(d_lt);
        r.rope_separate_us = time_median_flushed_us(iters, stream, flush, [&] {
          CHECK_CUDA(futransformer::cuda::gemm_fp8(a8, b8, sa, sb, ours, M, s.N, s.K, stream));
          CHECK_CUDA(futransformer::cuda::rope_qk_bf16(ours, d_pos, d_inv, M, rope_heads - kRopeKvHeads, kRopeKvHeads,
                                                       kRopeHeadDim, stream));
        });
        r.rope_fused_us = time_median_flushed_us(iters, stream, flush, [&] {
          CHECK_CUDA(futransformer::cuda::gemm_fp8_rope(a8, b8, sa, sb, fused, table, rope_heads, M, s.N, s.K, stream));
        });
        CHECK_CUDA(cudaStreamSynchronize(stream));
        // Both buffers hold one launch's output (each timed launch rewrites the whole of it).
        std::vector<uint16_t> h1(static_cast<size_t>(M) * s.N), h2(h1.size());
        CHECK_CUDA(cudaMemcpy(h1.data(), d_ours, h1.size() * 2, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(h2.data(), d_lt, h2.size() * 2, cudaMemcpyDeviceToHost));
        r.rope_identical = h1 == h2;
        for (void* q : {static_cast<void*>(d_pos), static_cast<void*>(d_inv), static_cast<void*>(table)})
          CHECK_CUDA(cudaFree(q));
      }
      std::printf("%-12s %5d %6d %6d | %9.1f %7.0f | %9.1f %7.0f %5.2fx %-9s| %7.0f | %7.0f | %8.1e\n", r.shape.c_str(),
                  M, s.K, s.N, r.ours_us, tflops(r, r.ours_us), r.lt_fp8_us, tflops(r, r.lt_fp8_us),
                  r.lt_fp8_us / r.ours_us, r.scale_mode.c_str(), tflops(r, r.lt_fp8_fast_us), tflops(r, r.lt_bf16_us),
                  r.agree);
      rows.push_back(r);
    }
    for (void* p : {static_cast<void*>(a8), static_cast<void*>(b8), static_cast<void*>(a16), static_cast<void*>(b16),
                    static_cast<void*>(d_ours), static_cast<void*>(d_lt), static_cast<void*>(sa),
                    static_cast<void*>(sb)})
      CHECK_CUDA(cudaFree(p));
  }
  if (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.rope_fused_us > 0; })) {
    std::printf("\nqkv with RoPE on the q and k heads (L2-flushed medians)\n%-12s %5s | %16s | %14s | %6s | %s\n",
                "shape", "M", "gemm + rope us", "gemm_fp8_rope", "ratio", "bits");
    for (const Row& r : rows)
      if (r.rope_fused_us > 0)
        std::printf("%-12s %5d | %16.1f | %14.1f | %5.3fx | %s\n", r.shape.c_str(), r.M, r.rope_separate_us,
                    r.rope_fused_us, r.rope_separate_us / r.rope_fused_us, r.rope_identical ? "identical" : "DIFFER");
  }
  const int sm_mhz_now = report_sm_clock_after_runs(d.dev);

  if (!args.json_path.empty()) {
    const auto extra = [&](FILE* f) { std::fprintf(f, "  \"timed_runs\": %d,\n  \"l2_flushed\": true,\n", iters); };
    const auto row = [&](FILE* f, size_t i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "    {\"shape\": \"%s\", \"M\": %d, \"K\": %d, \"N\": %d, \"ours_us\": %.3f, \"ours_tflops\": %.1f, "
                   "\"cublaslt_fp8_us\": %.3f, \"cublaslt_fp8_tflops\": %.1f, \"cublaslt_fp8_scale_mode\": \"%s\", "
                   "\"ratio_vs_cublaslt_fp8\": %.4f, \"cublaslt_fp8_fast_accum_us\": %.3f, "
                   "\"cublaslt_fp8_fast_accum_tflops\": %.1f, \"cublaslt_bf16_us\": %.3f, "
                   "\"cublaslt_bf16_tflops\": %.1f, \"max_rel_diff_vs_cublaslt_fp8\": %.3e",
                   r.shape.c_str(), r.M, r.K, r.N, r.ours_us, tflops(r, r.ours_us), r.lt_fp8_us,
                   tflops(r, r.lt_fp8_us), r.scale_mode.c_str(), r.lt_fp8_us / r.ours_us, r.lt_fp8_fast_us,
                   tflops(r, r.lt_fp8_fast_us), r.lt_bf16_us, tflops(r, r.lt_bf16_us), r.agree);
      if (r.rope_fused_us > 0)
        std::fprintf(f, ", \"gemm_then_rope_us\": %.3f, \"gemm_fp8_rope_us\": %.3f, \"rope_outputs_identical\": %s",
                     r.rope_separate_us, r.rope_fused_us, r.rope_identical ? "true" : "false");
      std::fprintf(f, "}");
    };
    if (!write_json(args.json_path, "gemm_fp8", d, sm_mhz_now, std::nullopt, extra, rows.size(), row)) return 1;
  }
  CHECK_CUDA(cudaFree(lt_ws));
  cublasLtDestroy(lt);
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
