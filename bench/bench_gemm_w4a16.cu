// Benchmark of the W4A16 decode GEMM against a cuBLASLt BF16 GEMM on Llama-3.1-8B / 70B projection shapes.
//   bench_gemm_w4a16 [--json PATH] [--iters N] [--probe | --sweep [--shapes 8B.o,70B.down] [--ms 1,32] [--l2-hot]]
// --sweep: every v4 launch configuration of w4a16::v4_sweep_configs (CTA size, ring depth, CTAs per SM, swapped
// two- and three/four-tile paths) on the same shapes at M = 1, 4, 8, 16, 32, graph-timed in one process; prints a
// table (us per candidate, the best with TB/s and % of 4.2 TB/s) and writes the JSON. See run_sweep. --l2-hot: the
// sweep keeps one copy of each weight, so a shape that fits the L2 is read from it (what a GEMM whose weights were
// prefetched into the L2 would run at); the JSON says so ("l2_hot").
// Each row, two timings after warm-up: (1) "launch": median of N (default 100) launches, each timed by its own
// pair of CUDA events; a layer that runs faster than the host can submit it is measured at the host's pace;
// (2) "graph": the median over N replays of a CUDA graph of kGraphLaunches launches (how a decode step runs),
// divided by kGraphLaunches: device time per GEMM including the gaps between kernels. Tables and TB/s use (2).
// Weights rotate through enough copies (>= 4x the L2) that every launch reads them from DRAM. Effective
// bandwidth counts the bytes each GEMM must read at least once: INT4 weights + group scales for W4A16,
// BF16 weights for cuBLASLt (activations and outputs are tiny and left out).
// Both kernel variants run on every row, on the same tiling (the library's choice for the shape), through the
// internal per-tiling entry point: v2 (u - 8 operands, one block per iteration) and v4 (128 + u operands with the
// offset removed per group, swapped MMA roles for M <= 8, two blocks per iteration). For M = 17..32 a third
// timing, "s32", runs v4's swapped three/four-tile path (swap32) on the same tiling, next to v2 and the v4 16-row
// path, and a closing table compares the three there (JSON: v4_swap32_us, v4_swap32_launch_us,
// swap32_speedup_over_v2; null at other M). The "w4a16" columns and JSON fields are what the library runs for that
// M (FT_W4A16_VARIANT / FT_W4A16_SWAP32, else v4 for M <= 16, and v4 swap32 for M = 17..32 if kSwap32ByDefault).
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
#include <string>
#include <vector>

#include "cuda/gemm_w4a16_internal.h"
#include "futransformer/cuda/gemm_w4a16.h"

#define FT_BENCH_LAST_ERROR() futransformer::cuda::gemm_w4a16_last_error()
#include "bench_common.h"

namespace {

using futransformer::formats::ScaleType;
using namespace futransformer::bench;
namespace w4k = futransformer::cuda::w4a16;

constexpr int kGroup = 128;
constexpr double kNominalTBps = 4.2;  // achievable H200 DRAM bandwidth the targets are stated against

struct Shape {
  const char* name;
  int K, N;  // in -> out
};
const Shape kShapes[] = {
    {"8B.qkv", 4096, 6144},   {"8B.o", 4096, 4096},  {"8B.gate_up", 4096, 28672},  {"8B.down", 14336, 4096},
    {"70B.qkv", 8192, 10240}, {"70B.o", 8192, 8192}, {"70B.gate_up", 8192, 57344}, {"70B.down", 28672, 8192},
};
const int kMs[] = {1, 2, 4, 8, 16, 17, 24, 32};
// Swept only when named in --shapes (the main table keeps the issue's eight): the 8B / 70B INT4 LM heads (vocabulary
// 128256), one GEMM per decode step as large as all of one 8B layer's weights together.
const Shape kSweepOnlyShapes[] = {{"8B.lm_head", 4096, 128256}, {"70B.lm_head", 8192, 128256}};

uint64_t g_rng = 0x9E3779B97F4A7C15ull;
uint64_t next_random() {  // xorshift64*
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return g_rng * 0x2545F4914F6CDD1Dull;
}
void fill_random_bytes(std::vector<uint8_t>& v) {
  for (size_t i = 0; i < v.size(); i += 8) {
    const uint64_t r = next_random();
    std::memcpy(v.data() + i, &r, std::min<size_t>(8, v.size() - i));
  }
}
// BF16 values uniform-ish in +-[0.5, 1) * 2^e: random sign and mantissa, fixed exponent.
void fill_random_bf16(std::vector<uint16_t>& v, uint16_t exponent_bits) {
  for (auto& x : v) x = static_cast<uint16_t>(exponent_bits | (next_random() & 0x807f));
}

// Median per-launch time of kGraphLaunches launches captured in one graph, replayed `iters` times.
constexpr int kGraphLaunches = 20;
template <typename F>
double time_graph_us(int iters, cudaStream_t stream, F launch) {
  for (int i = 0; i < 3; ++i) launch(i);  // lazy setup (attributes, handles) stays out of the capture
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < kGraphLaunches; ++i) launch(i);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double us = time_median_us(iters, stream, [&](int) { CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return us / kGraphLaunches;
}

struct Row {
  std::string shape;
  int M, K, N;
  const char* variant;                        // the one the library runs for this M ("v4s32": v4 with swap32)
  double w4_us, w4_tbps, bf16_us, bf16_tbps;  // graph timing, library variant
  double w4_launch_us, bf16_launch_us;        // one event pair per launch
  double v2_us, v4_us, v2_launch_us, v4_launch_us;
  double s32_us, s32_launch_us;  // v4 swap32 (M = 17..32; NAN elsewhere)
  std::string tiling;            // the library's
  std::string s32_tiling;        // swap32's (M = 17..32)
};

// A JSON number, or null for a timing that does not apply (NAN).
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

// cuBLASLt y[M, N] = x[M, K] * W[N, K]^T in column-major terms: D (N x M) = op_T(W as K x N) * x (K x M).
struct LtGemm {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* ws = nullptr;
  size_t ws_bytes = 32u << 20;
  LtGemm(cublasLtHandle_t h, int M, int N, int K, void* workspace) : lt(h), ws(workspace) {
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, N, K));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref = nullptr;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                      sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, &result, &found));
    if (found == 0) {
      std::fprintf(stderr, "cuBLASLt found no algorithm for M=%d N=%d K=%d\n", M, N, K);
      std::exit(1);
    }
    algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
  }
  void run(const void* w, const void* x, void* y, cudaStream_t s) {
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUBLAS(cublasLtMatmul(lt, op, &alpha, w, a, x, b, &beta, y, c, y, c, &algo, ws, ws_bytes, s));
  }
};

// --probe: streaming-only kernels over one 235 MB weight (70B gate_up) that separate the memory side of the GEMM
// from its arithmetic: same grid shape and the same per-warp runs of 512-byte blocks (contiguous per warp, or
// interleaved: the 8 warps of a CTA read adjacent blocks), data only XOR-folded. (This target is built without
// an sm_90 gencode, so the probe uses plain loads, which any architecture has, rather than cp.async.)
// Plain 16-byte loads into registers, kUnroll independent loads in flight per thread.
template <int kUnroll, bool kInterleave>
__global__ void __launch_bounds__(256) probe_ldg(const uint4* w, int64_t blocks_per_warp, uint32_t* sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t first = kInterleave ? static_cast<int64_t>(blockIdx.x) * 8 * blocks_per_warp + warp
                                    : (static_cast<int64_t>(blockIdx.x) * 8 + warp) * blocks_per_warp;
  const int64_t step = kInterleave ? 8 : 1;
  const uint4* base = w + first * 32 + lane;
  uint32_t acc = 0;
  for (int64_t i = 0; i < blocks_per_warp; i += kUnroll) {
    uint4 q[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                                                   : "=r"(q[u].x), "=r"(q[u].y), "=r"(q[u].z), "=r"(q[u].w)
                                                   : "l"(base + (i + u) * step * 32));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= q[u].x ^ q[u].y ^ q[u].z ^ q[u].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

void run_probe(cudaStream_t stream, int iters) {
  const int64_t bytes = int64_t{57344} * 8192 / 2, copies = 2;
  uint8_t* w = nullptr;
  uint32_t* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&w, bytes * copies));
  CHECK_CUDA(cudaMalloc(&sink, 16));
  CHECK_CUDA(cudaMemset(w, 0x5a, bytes * copies));
  std::printf("probe: %.1f MB per launch, alternating %lld copies, graph-timed\n", bytes / 1e6,
              static_cast<long long>(copies));
  auto report = [&](const char* name, int ctas, int smem, auto kernel) {
    const int64_t bpw = bytes / 512 / 8 / ctas;
    if (smem > 48 * 1024) CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const double us = time_graph_us(iters, stream, [&](int i) {
      kernel<<<ctas, 256, smem, stream>>>(reinterpret_cast<const uint4*>(w + (i % copies) * bytes), bpw, sink);
      CHECK_CUDA(cudaGetLastError());
    });
    std::printf("probe %-28s ctas %4d: %8.2f us %6.2f TB/s\n", name, ctas, us, bytes / (us * 1e-6) / 1e12);
  };
  for (int ctas : {224, 448, 896}) {
    report("ldg x4 per-warp runs", ctas, 0, probe_ldg<4, false>);
    report("ldg x8 per-warp runs", ctas, 0, probe_ldg<8, false>);
    report("ldg x8 interleaved", ctas, 0, probe_ldg<8, true>);
  }
  CHECK_CUDA(cudaFree(w));
  CHECK_CUDA(cudaFree(sink));
}


// --- --sweep --------------------------------------------------------------------------------------------------
// Every configuration of w4a16::v4_sweep_configs on the issue shapes at M = 1, 4, 8, 16, 32 (swap16 ones at M = 16
// only, the only sweep M where they differ; the swap32 one at M = 32 only, where the others give the default
// tiling and show as '=w8s16'), each graph-timed like the main table, in one process so the rows
// compare. Candidates whose heuristic tiling equals an earlier candidate's are not run twice. Each candidate's
// output (one extra launch) is compared with the default's: max |y - y_default| / max |y_default| above
// kSweepDiffTol marks the row "DIFF" (a broken configuration; the orders of accumulation differ, so tiny
// differences are expected). Cost: 8 shapes x 5 M x <= 10 candidates x iters x 20 GEMMs (about a minute at
// iters = 100).
const int kSweepMs[] = {1, 4, 8, 16, 32};
// --shapes A,B / --ms 1,32 (sweep only): run only these shapes (names as in kShapes) and M values, e.g. to profile
// one GEMM under ncu. Empty: all.
std::string g_sweep_shapes, g_sweep_ms;
bool g_l2_hot = false;  // --l2-hot (sweep): one copy of each weight, no rotation through DRAM
bool listed(const std::string& list, const std::string& item) {
  if (list.empty()) return true;
  size_t b = 0;
  while (b <= list.size()) {
    const size_t e = std::min(list.find(',', b), list.size());
    if (list.compare(b, e - b, item) == 0) return true;
    b = e + 1;
  }
  return false;
}
constexpr double kSweepDiffTol = 1.0 / 64;

struct SweepCandidate {
  std::string name, tiling;
  int same_as = -1;  // index of an earlier candidate with the same tiling
  double us = 0, tbps = 0, rel_diff = 0;
};
struct SweepRow {
  std::string shape;
  int M, K, N;
  std::vector<SweepCandidate> c;
  int best = 0;
};

double max_rel_diff(const std::vector<uint16_t>& y, const std::vector<uint16_t>& ref) {
  auto f = [](uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return static_cast<double>(v);
  };
  double d = 0, m = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (std::isnan(f(y[i]))) return INFINITY;  // an output left at the NaN poison
    d = std::max(d, std::fabs(f(y[i]) - f(ref[i])));
    m = std::max(m, std::fabs(f(ref[i])));
  }
  return m > 0 ? d / m : INFINITY;
}

std::vector<SweepRow> run_sweep(cudaStream_t stream, int iters, size_t rotate_bytes, const w4k::DeviceLimits& limits) {
  namespace ftc = futransformer::cuda;
  const std::vector<w4k::NamedV4Config> configs = w4k::v4_sweep_configs();
  const int max_m = *std::max_element(std::begin(kSweepMs), std::end(kSweepMs));
  std::vector<SweepRow> rows;
  std::printf("sweep: graph-timed us per GEMM (%d per graph, median of %d); '=x' = same tiling as candidate x; "
              "best = fastest, TB/s and %% of %.1f TB/s for it, speedup over %s\n",
              kGraphLaunches, iters, kNominalTBps, configs[0].name);
  std::printf("%-12s %3s |", "shape", "M");
  for (const auto& c : configs) std::printf(" %9s", c.name);
  std::printf(" | %-9s %8s %6s %6s %7s\n", "best", "us", "TB/s", "of4.2T", "speedup");
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  if (!g_sweep_shapes.empty()) shapes.insert(shapes.end(), std::begin(kSweepOnlyShapes), std::end(kSweepOnlyShapes));
  for (const Shape& s : shapes) {
    if (!listed(g_sweep_shapes, s.name)) continue;
    const size_t w4_bytes = static_cast<size_t>(s.N) * s.K / 2;
    const size_t sc_bytes = static_cast<size_t>(s.N) * (s.K / kGroup) * 2;
    const int r4 =
        g_l2_hot ? 1 : static_cast<int>(std::clamp<size_t>((rotate_bytes + w4_bytes - 1) / w4_bytes, 2, 64));
    uint8_t* w4 = nullptr;
    uint16_t* sc = nullptr;
    CHECK_CUDA(cudaMalloc(&w4, w4_bytes * r4));
    CHECK_CUDA(cudaMalloc(&sc, sc_bytes * r4));
    {
      std::vector<uint8_t> hw(w4_bytes);
      fill_random_bytes(hw);
      std::vector<uint16_t> hs(sc_bytes / 2);
      fill_random_bf16(hs, 0x3b00);
      for (int r = 0; r < r4; ++r) {
        CHECK_CUDA(cudaMemcpy(w4 + r * w4_bytes, hw.data(), w4_bytes, cudaMemcpyHostToDevice));
        CHECK_CUDA(
            cudaMemcpy(reinterpret_cast<uint8_t*>(sc) + r * sc_bytes, hs.data(), sc_bytes, cudaMemcpyHostToDevice));
      }
    }
    __nv_bfloat16 *x = nullptr, *y = nullptr;
    CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(max_m) * s.K * 2));
    CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(max_m) * s.N * 2));
    {
      std::vector<uint16_t> hx(static_cast<size_t>(max_m) * s.K);
      fill_random_bf16(hx, 0x3f00);
      CHECK_CUDA(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    }
    for (int M : kSweepMs) {
      if (!listed(g_sweep_ms, std::to_string(M))) continue;
      SweepRow row{s.name, M, s.K, s.N, {}, 0};
      std::vector<w4k::Tiling> tiles;
      size_t ws_bytes = 16;
      for (const auto& c : configs) {
        if (c.config.swap16 && M < 9) continue;
        if (c.config.swap32 != w4k::kSwap32ByDefault && (M < w4k::kSwap32MinM || M > w4k::kSwap32MaxM)) continue;
        w4k::Tiling t;
        if (ftc::gemm_w4a16_plan_config(M, s.N, s.K, kGroup, ScaleType::BF16, c.config, &t) != cudaSuccess) {
          std::printf("  %s: no launchable tiling for %s M=%d, left out\n", c.name, s.name, M);
          continue;
        }
        SweepCandidate sc_row;
        sc_row.name = c.name;
        sc_row.tiling = w4k::describe_tiling(t, M, s.N, s.K, kGroup, limits);
        for (size_t j = 0; j < tiles.size(); ++j)
          if (tiles[j] == t && sc_row.same_as < 0) sc_row.same_as = static_cast<int>(j);
        tiles.push_back(t);
        row.c.push_back(sc_row);
        ws_bytes = std::max(ws_bytes, static_cast<size_t>(w4k::workspace_bytes_for(t, M, s.N)));
      }
      void* ws = nullptr;
      CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
      std::vector<uint16_t> y_default;
      for (size_t j = 0; j < tiles.size(); ++j) {
        SweepCandidate& cand = row.c[j];
        if (cand.same_as >= 0) {
          const SweepCandidate& prev = row.c[static_cast<size_t>(cand.same_as)];
          cand.us = prev.us, cand.tbps = prev.tbps, cand.rel_diff = prev.rel_diff;
          continue;
        }
        auto launch = [&](int i) {
          const int r = i % r4;
          CHECK_CUDA(ftc::gemm_w4a16_with_tiling(
              tiles[j], x, reinterpret_cast<const uint32_t*>(w4 + r * w4_bytes),
              reinterpret_cast<const uint16_t*>(reinterpret_cast<uint8_t*>(sc) + r * sc_bytes), y, M, s.N, s.K,
              kGroup, ScaleType::BF16, ws, ws_bytes, stream));
        };
        cand.us = time_graph_us(iters, stream, launch);
        cand.tbps = (w4_bytes + sc_bytes) / (cand.us * 1e-6) / 1e12;
        // One more launch on copy 0 for the output check against the default candidate.
        CHECK_CUDA(cudaMemsetAsync(y, 0xFF, static_cast<size_t>(M) * s.N * 2, stream));
        launch(0);
        std::vector<uint16_t> out(static_cast<size_t>(M) * s.N);
        CHECK_CUDA(cudaMemcpyAsync(out.data(), y, out.size() * 2, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        if (j == 0) y_default = out;
        cand.rel_diff = max_rel_diff(out, y_default);
      }
      CHECK_CUDA(cudaFree(ws));
      for (size_t j = 1; j < row.c.size(); ++j)
        if (row.c[j].us < row.c[static_cast<size_t>(row.best)].us) row.best = static_cast<int>(j);
      std::printf("%-12s %3d |", s.name, M);
      size_t k = 0;
      for (const auto& c : configs) {
        if (k < row.c.size() && row.c[k].name == c.name) {
          const SweepCandidate& cand = row.c[k++];
          if (cand.same_as >= 0) {
            std::printf(" %9s", ("=" + row.c[static_cast<size_t>(cand.same_as)].name).c_str());
          } else {
            std::printf(" %8.2f%s", cand.us, cand.rel_diff > kSweepDiffTol ? "!" : " ");
          }
        } else {
          std::printf(" %9s", "-");
        }
      }
      const SweepCandidate& b = row.c[static_cast<size_t>(row.best)];
      std::printf(" | %-9s %8.2f %6.2f %5.0f%% %6.2fx\n", b.name.c_str(), b.us, b.tbps, 100.0 * b.tbps / kNominalTBps,
                  row.c[0].us / b.us);
      for (const SweepCandidate& cand : row.c)
        if (cand.rel_diff > kSweepDiffTol)
          std::printf("  DIFF %s: max |y - y_default| / max |y_default| = %.3g (%s)\n", cand.name.c_str(),
                      cand.rel_diff, cand.tiling.c_str());
      rows.push_back(row);
    }
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
    CHECK_CUDA(cudaFree(w4));
    CHECK_CUDA(cudaFree(sc));
  }
  std::printf("tilings of the best candidates:\n");
  for (const SweepRow& r : rows) std::printf("  %s\n", r.c[static_cast<size_t>(r.best)].tiling.c_str());
  return rows;
}

void write_sweep_json(const std::string& path, const DeviceInfo& d, int sm_mhz, double copy_tbps, int iters,
                      const std::vector<SweepRow>& rows) {
  const auto extra = [&](FILE* f) {
    std::fprintf(f,
                 "  \"group\": %d,\n  \"scale_type\": \"bf16\",\n  \"mode\": \"sweep\",\n"
                 "  \"timing\": \"us: per GEMM in a graph of %d, median of %d replays\",\n"
                 "  \"nominal_tbps\": %.2f,\n  \"l2_hot\": %s,\n",
                 kGroup, kGraphLaunches, iters, kNominalTBps, g_l2_hot ? "true" : "false");
  };
  const auto row = [&](FILE* f, size_t i) {
    const SweepRow& r = rows[i];
    const SweepCandidate& b = r.c[static_cast<size_t>(r.best)];
    std::fprintf(f,
                 "    {\"shape\": \"%s\", \"M\": %d, \"K\": %d, \"N\": %d, \"best\": \"%s\", \"best_us\": %.3f, "
                 "\"best_tbps\": %.4f, \"best_pct_of_nominal\": %.1f, \"best_speedup_over_default\": %.3f, "
                 "\"candidates\": [",
                 r.shape.c_str(), r.M, r.K, r.N, b.name.c_str(), b.us, b.tbps, 100.0 * b.tbps / kNominalTBps,
                 r.c[0].us / b.us);
    for (size_t j = 0; j < r.c.size(); ++j) {
      const SweepCandidate& c = r.c[j];
      std::fprintf(f,
                   "%s\n      {\"name\": \"%s\", \"us\": %.3f, \"tbps\": %.4f, \"pct_of_nominal\": %.1f, "
                   "\"max_rel_diff_vs_default\": %.3g, \"same_tiling_as\": \"%s\", \"tiling\": \"%s\"}",
                   j ? "," : "", c.name.c_str(), c.us, c.tbps, 100.0 * c.tbps / kNominalTBps,
                   std::isfinite(c.rel_diff) ? c.rel_diff : -1.0,
                   c.same_as >= 0 ? r.c[static_cast<size_t>(c.same_as)].name.c_str() : "", c.tiling.c_str());
    }
    std::fprintf(f, "]}");
  };
  write_json(path, "gemm_w4a16_sweep", d, sm_mhz, copy_tbps, extra, rows.size(), row);
}

}  // namespace

int main(int argc, char** argv) {
  // --sweep is taken out before the shared parser, which knows one extra flag (--probe).
  bool sweep = false;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--sweep") == 0) {
      sweep = true;
    } else if (i > 0 && i + 1 < argc && std::strcmp(argv[i], "--shapes") == 0) {
      g_sweep_shapes = argv[++i];
    } else if (i > 0 && i + 1 < argc && std::strcmp(argv[i], "--ms") == 0) {
      g_sweep_ms = argv[++i];
    } else if (i > 0 && std::strcmp(argv[i], "--l2-hot") == 0) {
      g_l2_hot = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  const Args args = parse_args(static_cast<int>(rest.size()), rest.data(), 100, 50, "--probe");
  const int iters = args.iters;
  const DeviceInfo d = query_device();
  const size_t rotate_bytes = 4 * static_cast<size_t>(d.l2_bytes);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasLtHandle_t lt;
  CHECK_CUBLAS(cublasLtCreate(&lt));
  void* lt_ws = nullptr;
  CHECK_CUDA(cudaMalloc(&lt_ws, 32u << 20));

  const double copy_tbps = device_copy_tbps(stream);
  print_device_summary(d);
  std::printf("; device copy %.2f TB/s; %d timed runs per row\n", copy_tbps, iters);
  if (args.flag) {
    run_probe(stream, iters);
    return 0;
  }
  if (sweep) {
    w4k::DeviceLimits limits;
    limits.sm_count = d.prop.multiProcessorCount;
    limits.smem_per_sm = static_cast<int64_t>(d.prop.sharedMemPerMultiprocessor);
    limits.smem_per_block = static_cast<int64_t>(d.prop.sharedMemPerBlockOptin);
    const std::vector<SweepRow> rows = run_sweep(stream, iters, rotate_bytes, limits);
    const int sm_mhz_now = report_sm_clock_after_runs(d.dev);
    if (!args.json_path.empty()) write_sweep_json(args.json_path, d, sm_mhz_now, copy_tbps, iters, rows);
    return 0;
  }
  std::printf("graph-timed (%d GEMMs per graph); 'launch' = one event pair per launch; lib = variant the library "
              "runs; TB/s and speedup (vs cuBLASLt BF16) for lib\n",
              kGraphLaunches);
  std::printf("(v4 = the library's v4 tiling where the library runs v4 (M = 17..32: the streamed warpgroup path by "
              "default), else the default tiling's v4 path; s32 = v4 swapped three/four-tile path, M = 17..32)\n");
  std::printf("%-12s %3s %6s %6s | %8s %8s %6s | %8s %7s | %8s %8s | %5s %7s %6s | %9s %9s | %7s\n", "shape", "M", "K",
              "N", "v2 us", "v4 us", "v2/v4", "s32 us", "v2/s32", "v2 lnch", "v4 lnch", "lib", "TB/s", "of4.2T",
              "bf16 us", "bf16 lnch", "speedup");

  std::vector<Row> rows;
  w4k::DeviceLimits limits;  // for the tiling description only
  limits.sm_count = d.prop.multiProcessorCount;
  limits.smem_per_sm = static_cast<int64_t>(d.prop.sharedMemPerMultiprocessor);
  limits.smem_per_block = static_cast<int64_t>(d.prop.sharedMemPerBlockOptin);
  const int max_m = *std::max_element(std::begin(kMs), std::end(kMs));
  for (const Shape& s : kShapes) {
    const size_t w4_bytes = static_cast<size_t>(s.N) * s.K / 2;
    const size_t sc_bytes = static_cast<size_t>(s.N) * (s.K / kGroup) * 2;
    const size_t bf_bytes = static_cast<size_t>(s.N) * s.K * 2;
    const int r4 = static_cast<int>(std::clamp<size_t>((rotate_bytes + w4_bytes - 1) / w4_bytes, 2, 64));
    const int rb = static_cast<int>(std::clamp<size_t>((rotate_bytes + bf_bytes - 1) / bf_bytes, 2, 16));
    // Random contents: the packed layout is a permutation of nibbles, so random words are valid weights.
    uint8_t *w4 = nullptr, *bf = nullptr;
    uint16_t* sc = nullptr;
    CHECK_CUDA(cudaMalloc(&w4, w4_bytes * r4));
    CHECK_CUDA(cudaMalloc(&sc, sc_bytes * r4));
    CHECK_CUDA(cudaMalloc(&bf, bf_bytes * rb));
    {
      std::vector<uint8_t> hw(w4_bytes);
      fill_random_bytes(hw);
      std::vector<uint16_t> hs(sc_bytes / 2);
      fill_random_bf16(hs, 0x3b00);  // scales ~ 2^-9: weights ~ 0.01
      std::vector<uint16_t> hb(bf_bytes / 2);
      fill_random_bf16(hb, 0x3c00);
      for (int r = 0; r < r4; ++r) {
        CHECK_CUDA(cudaMemcpy(w4 + r * w4_bytes, hw.data(), w4_bytes, cudaMemcpyHostToDevice));
        CHECK_CUDA(
            cudaMemcpy(reinterpret_cast<uint8_t*>(sc) + r * sc_bytes, hs.data(), sc_bytes, cudaMemcpyHostToDevice));
      }
      for (int r = 0; r < rb; ++r)
        CHECK_CUDA(cudaMemcpy(bf + r * bf_bytes, hb.data(), bf_bytes, cudaMemcpyHostToDevice));
    }
    __nv_bfloat16 *x = nullptr, *y = nullptr;
    CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(max_m) * s.K * 2));
    CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(max_m) * s.N * 2));
    {
      std::vector<uint16_t> hx(static_cast<size_t>(max_m) * s.K);
      fill_random_bf16(hx, 0x3f00);
      CHECK_CUDA(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    }
    // v2 (and the v4 column) run the default tiling without swap32, even when an FT_W4A16_* config or
    // kSwap32ByDefault changes the library's; s32 the same tiling with swap32.
    w4k::V4Config no32, with32;
    no32.swap32 = false;
    with32.swap32 = true;
    size_t ws_bytes = 0;
    for (int M : kMs) {
      for (const w4k::V4Config& c : {no32, with32}) {
        w4k::Tiling dt;
        CHECK_CUDA(futransformer::cuda::gemm_w4a16_plan_config(M, s.N, s.K, kGroup, ScaleType::BF16, c, &dt));
        ws_bytes = std::max({ws_bytes, futransformer::cuda::gemm_w4a16_workspace_bytes(M, s.N, s.K),
                             static_cast<size_t>(w4k::workspace_bytes_for(dt, M, s.N))});
      }
    }
    void* ws = nullptr;
    CHECK_CUDA(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 16)));

    for (int M : kMs) {
      // The library's tiling for its variant (with any FT_W4A16_* v4 config), the default tiling for the other;
      // [2] the swap32 tiling at M = 17..32.
      w4k::Tiling t, tiles[3];
      CHECK_CUDA(futransformer::cuda::gemm_w4a16_plan(M, s.N, s.K, kGroup, ScaleType::BF16, &t));
      const w4k::Variant lib = t.variant;
      const bool lib_s32 = t.swap32;
      const bool has_s32 = M >= w4k::kSwap32MinM && M <= w4k::kSwap32MaxM;
      CHECK_CUDA(futransformer::cuda::gemm_w4a16_plan_config(M, s.N, s.K, kGroup, ScaleType::BF16, no32, &tiles[0]));
      tiles[0].variant = w4k::Variant::v2;
      tiles[1] = tiles[0];
      tiles[1].variant = w4k::Variant::v4;
      if (!lib_s32) tiles[lib == w4k::Variant::v4 ? 1 : 0] = t;
      if (has_s32)
        CHECK_CUDA(
            futransformer::cuda::gemm_w4a16_plan_config(M, s.N, s.K, kGroup, ScaleType::BF16, with32, &tiles[2]));
      double us[3] = {0, 0, NAN}, launch_us[3] = {0, 0, NAN};
      for (int vi = 0; vi < (has_s32 ? 3 : 2); ++vi) {
        t = tiles[vi];
        auto w4_launch = [&](int i) {
          const int r = i % r4;
          CHECK_CUDA(futransformer::cuda::gemm_w4a16_with_tiling(
              t, x, reinterpret_cast<const uint32_t*>(w4 + r * w4_bytes),
              reinterpret_cast<const uint16_t*>(reinterpret_cast<uint8_t*>(sc) + r * sc_bytes), y, M, s.N, s.K,
              kGroup, ScaleType::BF16, ws, ws_bytes, stream));
        };
        launch_us[vi] = time_median_us(iters, stream, w4_launch);
        us[vi] = time_graph_us(iters, stream, w4_launch);
      }
      const int li = lib_s32 ? 2 : (lib == w4k::Variant::v4 ? 1 : 0);
      t = tiles[li];
      LtGemm lg(lt, M, s.N, s.K, lt_ws);
      auto bf_launch = [&](int i) { lg.run(bf + (i % rb) * bf_bytes, x, y, stream); };
      const double bf_launch_us = time_median_us(iters, stream, bf_launch);
      const double bf_us = time_graph_us(iters, stream, bf_launch);
      Row row{s.name,
              M,
              s.K,
              s.N,
              li == 2 ? "v4s32" : (li ? "v4" : "v2"),
              us[li],
              (w4_bytes + sc_bytes) / (us[li] * 1e-6) / 1e12,
              bf_us,
              bf_bytes / (bf_us * 1e-6) / 1e12,
              launch_us[li],
              bf_launch_us,
              us[0],
              us[1],
              launch_us[0],
              launch_us[1],
              us[2],
              launch_us[2],
              w4k::describe_tiling(t, M, s.N, s.K, kGroup, limits),
              has_s32 ? w4k::describe_tiling(tiles[2], M, s.N, s.K, kGroup, limits) : std::string()};
      char s32_cols[32] = "       - |       -";
      if (has_s32) std::snprintf(s32_cols, sizeof(s32_cols), "%8.2f | %6.2fx", row.s32_us, row.v2_us / row.s32_us);
      std::printf("%-12s %3d %6d %6d | %8.2f %8.2f %5.2fx | %s | %8.2f %8.2f | %5s %7.2f %5.0f%% | %9.2f %9.2f | "
                  "%6.2fx\n",
                  s.name, M, s.K, s.N, row.v2_us, row.v4_us, row.v2_us / row.v4_us, s32_cols, row.v2_launch_us,
                  row.v4_launch_us, row.variant, row.w4_tbps, 100.0 * row.w4_tbps / kNominalTBps, row.bf16_us,
                  row.bf16_launch_us, row.bf16_us / row.w4_us);
      rows.push_back(row);
    }
    CHECK_CUDA(cudaFree(ws));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
    CHECK_CUDA(cudaFree(w4));
    CHECK_CUDA(cudaFree(sc));
    CHECK_CUDA(cudaFree(bf));
  }
  // M = 17..32: v2 (the library's default there unless kSwap32ByDefault), the v4 16-row path and v4 swap32, all on
  // the same tiling; TB/s and % of 4.2 TB/s for swap32 (the tiling column: the swap32 one).
  std::printf("\nswap32 (M = %d..%d), graph-timed us per GEMM:\n", w4k::kSwap32MinM, w4k::kSwap32MaxM);
  std::printf("%-12s %3s | %8s %8s %8s | %7s %7s | %6s %6s | %s\n", "shape", "M", "v2 us", "v4 us", "s32 us",
              "v2/s32", "v4/s32", "TB/s", "of4.2T", "swap32 tiling");
  for (const Row& r : rows) {
    if (!std::isfinite(r.s32_us)) continue;
    const double tbps = static_cast<double>(r.N) * r.K / 2 * (1 + 4.0 / kGroup) / (r.s32_us * 1e-6) / 1e12;
    std::printf("%-12s %3d | %8.2f %8.2f %8.2f | %6.2fx %6.2fx | %6.2f %5.0f%% | %s\n", r.shape.c_str(), r.M, r.v2_us,
                r.v4_us, r.s32_us, r.v2_us / r.s32_us, r.v4_us / r.s32_us, tbps, 100.0 * tbps / kNominalTBps,
                r.s32_tiling.c_str());
  }
  const int sm_mhz_now = report_sm_clock_after_runs(d.dev);

  if (!args.json_path.empty()) {
    const auto extra = [&](FILE* f) {
      std::fprintf(f,
                   "  \"group\": %d,\n  \"scale_type\": \"bf16\",\n"
                   "  \"timing\": \"*_us: per GEMM in a graph of %d; *_launch_us: one event pair per launch\",\n"
                   "  \"timed_runs\": %d,\n",
                   kGroup, kGraphLaunches, iters);
    };
    const auto row = [&](FILE* f, size_t i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "    {\"shape\": \"%s\", \"M\": %d, \"K\": %d, \"N\": %d, \"variant\": \"%s\", "
                   "\"w4a16_us\": %.3f, \"w4a16_tbps\": %.4f, "
                   "\"cublaslt_bf16_us\": %.3f, \"cublaslt_bf16_tbps\": %.4f, \"speedup\": %.3f, "
                   "\"w4a16_launch_us\": %.3f, \"cublaslt_bf16_launch_us\": %.3f, "
                   "\"v2_us\": %.3f, \"v4_us\": %.3f, \"v2_launch_us\": %.3f, \"v4_launch_us\": %.3f, "
                   "\"v4_speedup_over_v2\": %.3f, \"v4_swap32_us\": %s, \"v4_swap32_launch_us\": %s, "
                   "\"swap32_speedup_over_v2\": %s, \"tiling\": \"%s\", \"swap32_tiling\": \"%s\"}",
                   r.shape.c_str(), r.M, r.K, r.N, r.variant, r.w4_us, r.w4_tbps, r.bf16_us, r.bf16_tbps,
                   r.bf16_us / r.w4_us, r.w4_launch_us, r.bf16_launch_us, r.v2_us, r.v4_us, r.v2_launch_us,
                   r.v4_launch_us, r.v2_us / r.v4_us, json_number(r.s32_us).c_str(),
                   json_number(r.s32_launch_us).c_str(), json_number(r.v2_us / r.s32_us).c_str(),
                   r.tiling.c_str(), r.s32_tiling.c_str());
    };
    if (!write_json(args.json_path, "gemm_w4a16", d, sm_mhz_now, copy_tbps, extra, rows.size(), row)) return 1;
  }
  CHECK_CUDA(cudaFree(lt_ws));
  cublasLtDestroy(lt);
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
