// Does a weight stream that never waits on the chain's data bring a decode step's GEMMs to their bytes?
// (docs/notes/decode-batch1-fixed-cost.md, "A weight stream that runs ahead".) For L Llama layers' four W4A16 GEMMs
// (qkv, o on the first hidden columns, gate|up, SwiGLU into down; 8B or 70B shapes, INT4 g128, BF16 scales, random
// bytes) it times
//   - the persistent chain kernel (cuda::w4a16::w4a16_chain: one cooperative launch, the producer warp of each SM
//     streaming every weight slot it will need while the consumers wait on the previous GEMM), with delays between
//     the GEMMs standing in for the latency-bound ops of a layer (attention chain before o, RMSNorms before gate|up
//     and qkv);
//   - the same GEMMs as the engine launches them (gemm_w4a16, gemm_w4a16_swiglu; its tuned tilings, programmatic
//     launch) in one CUDA graph, with one-CTA spin kernels of the same delays between them (released at their start,
//     as the engine's attention kernels release the next GEMM);
// and prints µs per layer against the bytes at the measured copy bandwidth and at 4.25 TB/s.
//
//   bench_w4a16_chain [--json PATH] [--iters N] [--layers L] [--m M] [--shape 8b|70b] [--delays A:N,A:N,...]
//
// --delays: attention:norm nanoseconds pairs (default 0:0,4000:1500,8000:2000). At M > 1 the engine-style baseline's
// o GEMM reads the qkv rows as if they were 4096 wide (its timing is the o GEMM's; its values are not the chain's).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"
#include "cuda/ptx/griddep.cuh"
#include "cuda/w4a16_chain.h"
#include "futransformer/cuda/gemm_w4a16.h"

using namespace futransformer;
using namespace futransformer::bench;
namespace w4 = futransformer::cuda::w4a16;

namespace {

constexpr double kH200ReadTbps = 4.25;

__global__ void fill_words_kernel(uint32_t* p, size_t n, uint32_t salt) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = hash_index(i, salt);
}

__global__ void fill_u16_kernel(uint16_t* p, size_t n, uint16_t v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

// One CTA that releases the next kernel at once, waits for the previous one, then spins `ns` on %globaltimer.
__global__ void spin_kernel(long long ns) {
  futransformer::cuda::ptx::griddepcontrol_launch_dependents();
  futransformer::cuda::ptx::griddepcontrol_wait();
  if (threadIdx.x != 0 || ns <= 0) return;
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < static_cast<unsigned long long>(ns));
}

struct Gemm {
  int N, K;
  uint32_t* w = nullptr;
  uint16_t* s = nullptr;
  __nv_bfloat16* y = nullptr;  // chain output [M][N]
  __nv_bfloat16* yb = nullptr;  // baseline output [M][N] (gate|up: [M][N / 2])
  size_t weight_bytes() const { return static_cast<size_t>(N) * K / 2 + static_cast<size_t>(N) * (K / 128) * 2; }
};

struct Delay {
  int attn_ns, norm_ns;
};

struct Row {
  std::string method;
  Delay d;
  double us, us_per_layer, tbps;
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--json PATH] [--iters N (>= 5)] [--layers L] [--m M (1..8)] [--shape 8b|70b] "
               "[--delays A:N,...]\n",
               argv0);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, shape = "8b", delays_arg = "0:0,4000:1500,8000:2000";
  int iters = 20, layers = 0, M = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::max(5, std::atoi(argv[++i]));
    else if (a == "--layers" && i + 1 < argc) layers = std::atoi(argv[++i]);
    else if (a == "--m" && i + 1 < argc) M = std::atoi(argv[++i]);
    else if (a == "--shape" && i + 1 < argc) shape = argv[++i];
    else if (a == "--delays" && i + 1 < argc) delays_arg = argv[++i];
    else usage(argv[0]);
  }
  if (shape != "8b" && shape != "70b") usage(argv[0]);
  const int hidden = shape == "8b" ? 4096 : 8192, inter = shape == "8b" ? 14336 : 28672;
  const int qkv_n = shape == "8b" ? 6144 : 10240;
  if (layers <= 0) layers = shape == "8b" ? 32 : 16;
  std::vector<Delay> delays;
  for (const std::string& p : split_list(delays_arg)) {
    const size_t c = p.find(':');
    if (c == std::string::npos) usage(argv[0]);
    delays.push_back({std::atoi(p.substr(0, c).c_str()), std::atoi(p.substr(c + 1).c_str())});
  }
  if (M < 1 || M > w4::kChainMaxRows || layers < 1 || delays.empty()) usage(argv[0]);

  const DeviceInfo d = query_device();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_tbps = device_copy_tbps(stream);

  // Weights: random bytes, scales 1 / (4.6 sqrt(K)) so the activations keep their size through the layers.
  std::vector<Gemm> g;
  size_t bytes = 0;
  for (int l = 0; l < layers; ++l) {
    for (auto [N, K] : {std::pair{qkv_n, hidden}, {hidden, hidden}, {2 * inter, hidden}, {hidden, inter}}) {
      Gemm x{N, K};
      const size_t words = static_cast<size_t>(N) * K / 8, nscales = static_cast<size_t>(N) * (K / 128);
      CHECK_CUDA(cudaMalloc(&x.w, words * 4));
      CHECK_CUDA(cudaMalloc(&x.s, nscales * 2));
      CHECK_CUDA(cudaMalloc(&x.y, static_cast<size_t>(M) * N * 2));
      CHECK_CUDA(cudaMalloc(&x.yb, static_cast<size_t>(M) * N * 2));
      fill_words_kernel<<<1024, 256, 0, stream>>>(x.w, words, static_cast<uint32_t>(g.size() * 7919 + 1));
      const __nv_bfloat16 sv = __float2bfloat16(static_cast<float>(1.0 / (4.6 * std::sqrt(double(K)))));
      uint16_t sbits;
      std::memcpy(&sbits, &sv, 2);
      fill_u16_kernel<<<256, 256, 0, stream>>>(x.s, nscales, sbits);
      bytes += x.weight_bytes();
      g.push_back(x);
    }
  }
  __nv_bfloat16 *x0 = nullptr, *h = nullptr;
  CHECK_CUDA(cudaMalloc(&x0, static_cast<size_t>(M) * hidden * 2));
  CHECK_CUDA(cudaMalloc(&h, static_cast<size_t>(M) * inter * 2));
  {
    std::vector<__nv_bfloat16> hx(static_cast<size_t>(M) * hidden);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = __float2bfloat16(std::sin(0.37 * static_cast<double>(i)));
    CHECK_CUDA(cudaMemcpy(x0, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  }
  size_t gemm_ws_bytes = 0;
  for (const Gemm& x : g) gemm_ws_bytes = std::max(gemm_ws_bytes, cuda::gemm_w4a16_workspace_bytes(M, x.N, x.K));
  void* gemm_ws = nullptr;
  CHECK_CUDA(cudaMalloc(&gemm_ws, std::max<size_t>(gemm_ws_bytes, 16)));
  const int n_stages = 4 * layers;
  const size_t chain_ws_bytes = w4::w4a16_chain_workspace_bytes(n_stages);
  void* chain_ws = nullptr;
  CHECK_CUDA(cudaMalloc(&chain_ws, chain_ws_bytes));
  CHECK_CUDA(cudaStreamSynchronize(stream));

  std::vector<Row> rows;
  auto add_row = [&](const char* method, Delay dl, double us) {
    rows.push_back({method, dl, us, us / layers, static_cast<double>(bytes) / (us * 1e-6) / 1e12});
  };
  for (const Delay& dl : delays) {
    // The chain: qkv (first or the previous down), o on the qkv output's first `hidden` columns after the attention
    // delay, gate|up after a norm delay, down on SwiGLU of gate|up, the next qkv after a norm delay.
    std::vector<w4::ChainStage> st;
    for (int l = 0; l < layers; ++l) {
      for (int k = 0; k < 4; ++k) {
        const Gemm& x = g[4 * l + k];
        w4::ChainStage c;
        c.w = x.w;
        c.scales = x.s;
        c.y = x.y;
        c.N = x.N;
        c.K = x.K;
        c.group = 128;
        c.input = k == 3 ? w4::ChainInput::swiglu : w4::ChainInput::previous;
        if (l == 0 && k == 0) c.input = w4::ChainInput::first;
        c.delay_ns = k == 1 ? dl.attn_ns : (k == 2 || (k == 0 && l > 0)) ? dl.norm_ns : 0;
        st.push_back(c);
      }
    }
    // The producer unlimited (only the ring holds it back), one stage ahead of its consumers (about what a
    // programmatic launch's ring fill allows), and held to their stage (weights wait for data).
    // Last, each consumer warp copying its own slots with cp.async (no producer warp), unlimited.
    for (int variant = 0; variant < 4; ++variant) {
      const int ahead = variant == 1 ? 1 : variant == 2 ? 0 : w4::kChainAnyStagesAhead;
      const w4::ChainCopies copies = variant == 3 ? w4::ChainCopies::warp : w4::ChainCopies::bulk;
      std::string why;
      const cudaError_t e = w4::w4a16_chain(st, x0, M, formats::ScaleType::BF16, chain_ws, chain_ws_bytes, true, 0,
                                            ahead, stream, &why, copies);
      if (e != cudaSuccess) {
        std::fprintf(stderr, "bench_w4a16_chain: %s %s\n", cudaGetErrorString(e), why.c_str());
        return 1;
      }
      const double chain_us = time_median_us(iters, stream, [&](int) {
        CHECK_CUDA(w4::w4a16_chain(st, x0, M, formats::ScaleType::BF16, chain_ws, chain_ws_bytes, false, 0, ahead,
                                   stream, nullptr, copies));
      });
      add_row(variant == 3   ? "chain kernel, warps copy their own slots"
              : ahead == 0 ? "chain kernel, producer held to its stage"
              : ahead == 1 ? "chain kernel, producer one stage ahead"
                           : "chain kernel",
              dl, chain_us);
    }

    // The engine's kernels in one graph.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    auto spin = [&](int ns) {
      if (ns <= 0) return;
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(1);
      cfg.blockDim = dim3(32);
      cfg.stream = stream;
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr.val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      CHECK_CUDA(cudaLaunchKernelEx(&cfg, spin_kernel, static_cast<long long>(ns)));
    };
    const __nv_bfloat16* in = x0;
    for (int l = 0; l < layers; ++l) {
      const Gemm &q = g[4 * l], &o = g[4 * l + 1], &gu = g[4 * l + 2], &dn = g[4 * l + 3];
      if (l > 0) spin(dl.norm_ns);
      CHECK_CUDA(cuda::gemm_w4a16(in, q.w, q.s, q.yb, M, q.N, q.K, 128, formats::ScaleType::BF16, gemm_ws,
                                  gemm_ws_bytes, stream));
      spin(dl.attn_ns);
      CHECK_CUDA(cuda::gemm_w4a16(q.yb, o.w, o.s, o.yb, M, o.N, o.K, 128, formats::ScaleType::BF16, gemm_ws,
                                  gemm_ws_bytes, stream));
      spin(dl.norm_ns);
      CHECK_CUDA(cuda::gemm_w4a16_swiglu(o.yb, gu.w, gu.s, h, M, gu.N, gu.K, 128, formats::ScaleType::BF16, gemm_ws,
                                         gemm_ws_bytes, stream));
      CHECK_CUDA(cuda::gemm_w4a16(h, dn.w, dn.s, dn.yb, M, dn.N, dn.K, 128, formats::ScaleType::BF16, gemm_ws,
                                  gemm_ws_bytes, stream));
      in = dn.yb;
    }
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    const double base_us = time_median_us(iters, stream, [&](int) { CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
    add_row("separate kernels (engine's GEMMs, graph, programmatic launch)", dl, base_us);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }

  print_device_summary(d);
  const double bytes_us_copy = static_cast<double>(bytes) / (copy_tbps * 1e12) * 1e6;
  const double bytes_us_h200 = static_cast<double>(bytes) / (kH200ReadTbps * 1e12) * 1e6;
  std::printf("; %s shapes, %d layers, M = %d, %.1f MB of INT4 weights + scales; bytes take %.1f µs at the copy "
              "bandwidth (%.2f TB/s), %.1f µs at %.2f TB/s; median of %d runs\n",
              shape.c_str(), layers, M, bytes / 1e6, bytes_us_copy, copy_tbps, bytes_us_h200, kH200ReadTbps, iters);
  std::printf("| method | attention delay ns | norm delay ns | µs | µs per layer | weight TB/s | × bytes at copy BW |\n"
              "|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows)
    std::printf("| %s | %d | %d | %.1f | %.2f | %.2f | %.2f |\n", r.method.c_str(), r.d.attn_ns, r.d.norm_ns, r.us,
                r.us_per_layer, r.tbps, r.us / bytes_us_copy);
  const int mhz = report_sm_clock_after_runs(d.dev);
  if (!json_path.empty()) {
    write_json(
        json_path, "w4a16_chain", d, mhz, copy_tbps,
        [&](FILE* f) {
          std::fprintf(f,
                       "  \"shape\": \"%s\",\n  \"layers\": %d,\n  \"m\": %d,\n  \"weight_bytes\": %zu,\n"
                       "  \"timed_runs\": %d,\n",
                       shape.c_str(), layers, M, bytes, iters);
        },
        rows.size(), [&](FILE* f, size_t i) {
          const Row& r = rows[i];
          std::fprintf(f,
                       "    {\"method\": \"%s\", \"attn_delay_ns\": %d, \"norm_delay_ns\": %d, \"us\": %.2f, "
                       "\"us_per_layer\": %.3f, \"weight_tbps\": %.4f}",
                       r.method.c_str(), r.d.attn_ns, r.d.norm_ns, r.us, r.us_per_layer, r.tbps);
        });
  }
  for (Gemm& x : g) {
    cudaFree(x.w);
    cudaFree(x.s);
    cudaFree(x.y);
    cudaFree(x.yb);
  }
  cudaFree(x0);
  cudaFree(h);
  cudaFree(gemm_ws);
  cudaFree(chain_ws);
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
