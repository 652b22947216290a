// The decode step's greedy tail at LM-head shapes: argmax_rows_f32 over fp32 logits, and the INT4 head's BF16 logits
// widened to fp32 and reduced to ids either in one kernel (widen_argmax_rows_bf16, what the engine runs) or in two
// (widen_rows_bf16_to_f32, then argmax_rows_f32: the path before it, FT_HEAD_WIDEN_ARGMAX=0). Rows = the decode batch,
// vocabularies of stories / SmolLM2 / Llama-3, the BF16 rows padded to the W4A16 GEMM's column tile as the
// engine's are. Times are medians of back-to-back launches with the logits in L2 (the head GEMM has just written them
// in a step), in µs; GB/s counts the bytes read (and, widening, written). The one-CTA argmax that the cluster split
// replaced, or another cluster size: run the binary again with FT_ARGMAX_CLUSTER=0 (or 2, 4, 8) in the same device call.
//
//   bench_argmax [--json PATH] [--iters N]
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/engine/engine_kernels.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/gemm_w4a16.h"

#define FT_BENCH_LAST_ERROR() futransformer::cuda::decoder_ops_last_error()
#include "bench_common.h"

using namespace futransformer::bench;
namespace ftc = futransformer::cuda;

namespace {

constexpr int kBatches[] = {1, 8, 16, 24, 32};
constexpr int kVocabs[] = {512, 49152, 128256};
constexpr int kPadColumns = ftc::kW4A16TileN;  // the INT4 head writes N rounded up to this (the engine's head_cols)

struct Row {
  int rows, vocab;
  double argmax_us, fused_us, two_kernel_us;
};

__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 200, 10);
  const DeviceInfo d = query_device();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  print_device_summary(d);
  // What the library reads FT_ARGMAX_CLUSTER as (decoder_ops.cu): one of these values forces the CTAs per row.
  const char* env = std::getenv("FT_ARGMAX_CLUSTER");
  const std::string e = env != nullptr ? env : "";
  const char* cluster_env = e == "0" || e == "1" || e == "2" || e == "4" || e == "8" ? env : nullptr;
  std::printf("; %d back-to-back launches per row, logits in L2; argmax CTAs per row: %s\n", args.iters,
              cluster_env != nullptr ? cluster_env : "the library's rule (8 from 16384 entries)");
  std::printf("%5s %7s | %10s %8s | %12s %8s | %14s %8s\n", "rows", "vocab", "argmax us", "GB/s", "widen+am us",
              "GB/s", "two kernels us", "GB/s");
  std::vector<Row> out;
  for (int rows : kBatches) {
    for (int vocab : kVocabs) {
      const int stride = (vocab + kPadColumns - 1) / kPadColumns * kPadColumns;
      const size_t n = static_cast<size_t>(rows) * stride;
      float *x = nullptr, *widened = nullptr;
      __nv_bfloat16* xb = nullptr;
      int32_t* ids = nullptr;
      CHECK_CUDA(cudaMalloc(&x, n * 4));
      CHECK_CUDA(cudaMalloc(&widened, static_cast<size_t>(rows) * vocab * 4));
      CHECK_CUDA(cudaMalloc(&xb, n * 2));
      CHECK_CUDA(cudaMalloc(&ids, static_cast<size_t>(rows) * 4));
      fill_spread_f32_kernel<<<1024, 256, 0, stream>>>(x, n, static_cast<uint32_t>(rows * 131 + vocab));
      to_bf16_kernel<<<1024, 256, 0, stream>>>(x, xb, n);
      CHECK_CUDA(cudaGetLastError());
      // argmax_rows_f32 reads unpadded fp32 rows (the engine's widened logits): the first rows * vocab floats.
      const double argmax_us = time_median_us(args.iters, stream, [&](int) {
        CHECK_CUDA(ftc::argmax_rows_f32(x, ids, rows, vocab, stream));
      });
      const double fused_us = time_median_us(args.iters, stream, [&](int) {
        CHECK_CUDA(ftc::widen_argmax_rows_bf16(xb, stride, widened, ids, rows, vocab, stream));
      });
      const double two_us = time_median_us(args.iters, stream, [&](int) {
        CHECK_CUDA(ftc::widen_rows_bf16_to_f32(xb, stride, widened, rows, vocab, stream));
        CHECK_CUDA(ftc::argmax_rows_f32(widened, ids, rows, vocab, stream));
      });
      // The two paths must name the same ids (the GPU tests check both against the CPU twin; this guards the bench).
      std::vector<int32_t> a(static_cast<size_t>(rows)), b(static_cast<size_t>(rows));
      CHECK_CUDA(ftc::widen_argmax_rows_bf16(xb, stride, widened, ids, rows, vocab, stream));
      CHECK_CUDA(cudaMemcpyAsync(a.data(), ids, a.size() * 4, cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaMemsetAsync(ids, 0xFF, b.size() * 4, stream));
      CHECK_CUDA(ftc::widen_rows_bf16_to_f32(xb, stride, widened, rows, vocab, stream));
      CHECK_CUDA(ftc::argmax_rows_f32(widened, ids, rows, vocab, stream));
      CHECK_CUDA(cudaMemcpyAsync(b.data(), ids, b.size() * 4, cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      if (a != b) {
        std::fprintf(stderr, "rows %d vocab %d: the fused and two-kernel paths disagree on the ids\n", rows, vocab);
        return 1;
      }
      const Row r{rows, vocab, argmax_us, fused_us, two_us};
      const double f32_bytes = static_cast<double>(rows) * vocab * 4, bf16_bytes = static_cast<double>(rows) * vocab * 2;
      std::printf("%5d %7d | %10.2f %8.1f | %12.2f %8.1f | %14.2f %8.1f\n", rows, vocab, argmax_us,
                  f32_bytes / (argmax_us * 1e3), fused_us, (bf16_bytes + f32_bytes) / (fused_us * 1e3), two_us,
                  (bf16_bytes + 2 * f32_bytes) / (two_us * 1e3));
      out.push_back(r);
      for (void* p : {static_cast<void*>(x), static_cast<void*>(widened), static_cast<void*>(xb),
                      static_cast<void*>(ids)})
        CHECK_CUDA(cudaFree(p));
    }
  }
  const int sm_mhz_now = report_sm_clock_after_runs(d.dev);
  if (!args.json_path.empty()) {
    const auto extra = [&](FILE* f) {
      std::fprintf(f, "  \"timed_runs\": %d,\n  \"argmax_cluster_env\": \"%s\",\n  \"pad_columns\": %d,\n", args.iters,
                   cluster_env != nullptr ? cluster_env : "rule", kPadColumns);
    };
    const auto row = [&](FILE* f, size_t i) {
      const Row& r = out[i];
      std::fprintf(f,
                   "    {\"rows\": %d, \"vocab\": %d, \"argmax_us\": %.3f, \"widen_argmax_us\": %.3f, "
                   "\"widen_then_argmax_us\": %.3f}",
                   r.rows, r.vocab, r.argmax_us, r.fused_us, r.two_kernel_us);
    };
    if (!write_json(args.json_path, "argmax", d, sm_mhz_now, std::nullopt, extra, out.size(), row)) return 1;
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
