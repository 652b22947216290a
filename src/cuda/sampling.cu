// Host side of the GPU sampler: argument checks, workspace layout, the three launches (prepare, CUB's segmented
// radix sort, walk). Kernels: src/cuda/sampling.cuh. Nothing here allocates or synchronises.
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/launch_status.h"
#include "cuda/sampling.cuh"
#include "futransformer/cuda/sampling.h"

namespace futransformer::cuda {
namespace {

using std::to_string;

thread_local std::string g_last_error;

constexpr int64_t kAlign = 256;  // every workspace array starts on a 256-byte boundary (CUB asks for it)

int64_t round_up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Workspace: keys in / out (p's bits, u64), ids in / out (i32), offsets (i32, rows + 1), CUB scratch.
struct Layout {
  int64_t keys_in = 0, keys_out = 0, ids_in = 0, ids_out = 0, offsets = 0, cub = 0, total = 0;
  size_t cub_bytes = 0;
};

// The sort: keys descending over all 64 bits, ids carried along; LSD radix sorting is stable, so equal p keep the
// ids' initial ascending order (the CPU's std::stable_sort). Also the size query (null workspace).
cudaError_t sort(void* scratch, size_t& scratch_bytes, const unsigned long long* keys_in, unsigned long long* keys_out,
                 const int32_t* ids_in, int32_t* ids_out, int rows, int vocab, const int32_t* offsets,
                 cudaStream_t stream) {
  return cub::DeviceSegmentedRadixSort::SortPairsDescending(scratch, scratch_bytes, keys_in, keys_out, ids_in, ids_out,
                                                            rows * vocab, rows, offsets, offsets + 1, 0, 64, stream);
}

cudaError_t plan(int rows, int vocab, Layout* l) {
  const int64_t n = int64_t{rows} * vocab;
  l->keys_in = 0;
  l->keys_out = round_up(l->keys_in + n * 8);
  l->ids_in = round_up(l->keys_out + n * 8);
  l->ids_out = round_up(l->ids_in + n * 4);
  l->offsets = round_up(l->ids_out + n * 4);
  l->cub = round_up(l->offsets + (int64_t{rows} + 1) * 4);
  l->cub_bytes = 0;
  const cudaError_t e = sort(nullptr, l->cub_bytes, nullptr, nullptr, nullptr, nullptr, rows, vocab, nullptr, nullptr);
  l->total = round_up(l->cub + static_cast<int64_t>(l->cub_bytes));
  return e;
}

}  // namespace

cudaError_t sample_rows_f32_can_implement(int rows, int vocab, float temperature, int top_k, float top_p,
                                          std::string* why) {
  constexpr const char* op = "sample_rows_f32";
  if (rows < 1 || rows > kSamplingMaxRows)
    return reject(why, std::string(op) + ": rows = " + to_string(rows) + ", expected 1.." +
                           to_string(kSamplingMaxRows));
  if (vocab < 1) return reject(why, std::string(op) + ": vocab = " + to_string(vocab) + ", expected >= 1");
  if (int64_t{rows} * vocab > kSamplingMaxElements)
    return reject(why, std::string(op) + ": rows * vocab = " + to_string(int64_t{rows} * vocab) + ", expected <= " +
                           to_string(kSamplingMaxElements));
  if (!std::isfinite(temperature) || temperature < 0.0f)
    return reject(why, std::string(op) + ": temperature = " + to_string(temperature) + ", expected finite and >= 0");
  if (top_k < 0) return reject(why, std::string(op) + ": top_k = " + to_string(top_k) + ", expected >= 0 (0: off)");
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return reject(why, std::string(op) + ": top_p = " + to_string(top_p) + ", expected in (0, 1]");
  return cudaSuccess;
}

size_t sample_rows_f32_workspace_bytes(int rows, int vocab) {
  if (sample_rows_f32_can_implement(rows, vocab, 1.0f, 0, 1.0f, nullptr) != cudaSuccess) return 0;
  Layout l;
  if (plan(rows, vocab, &l) != cudaSuccess) {
    cudaGetLastError();  // a missing device is answered with 0, not left as a sticky error
    return 0;
  }
  return static_cast<size_t>(l.total);
}

cudaError_t sample_rows_f32(const float* logits, const double* uniforms, int32_t* out, int rows, int vocab,
                            float temperature, int top_k, float top_p, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream) {
  constexpr const char* op = "sample_rows_f32";
  g_last_error.clear();
  if (sample_rows_f32_can_implement(rows, vocab, temperature, top_k, top_p, &g_last_error) != cudaSuccess)
    return cudaErrorInvalidValue;
  const bool greedy = temperature == 0.0f;
  if (!logits || !out || (!greedy && !uniforms))
    return reject(&g_last_error, std::string(op) + ": logits, out and (temperature > 0) uniforms must be non-null "
                                                   "device pointers");
  if (!aligned(logits, 4) || !aligned(out, 4) || (!greedy && !aligned(uniforms, 8)))
    return reject(&g_last_error, std::string(op) + ": logits and out must be 4-byte aligned, uniforms 8-byte aligned");
  const dim3 row_grid(static_cast<unsigned>(rows));
  if (greedy) {
    sampling_ops::prepare_kernel<<<row_grid, sampling_ops::kPrepareThreads, 0, stream>>>(
        logits, uniforms, out, nullptr, nullptr, nullptr, rows, vocab, 0.0, true);
    return cudaGetLastError();
  }
  Layout l;
  if (const cudaError_t e = plan(rows, vocab, &l); e != cudaSuccess) return e;
  if (const cudaError_t e = check_workspace(op, l.total, workspace, workspace_bytes, &g_last_error); e != cudaSuccess)
    return e;
  auto* base = static_cast<unsigned char*>(workspace);
  auto* keys_in = reinterpret_cast<unsigned long long*>(base + l.keys_in);
  auto* keys_out = reinterpret_cast<unsigned long long*>(base + l.keys_out);
  auto* ids_in = reinterpret_cast<int32_t*>(base + l.ids_in);
  auto* ids_out = reinterpret_cast<int32_t*>(base + l.ids_out);
  auto* offsets = reinterpret_cast<int32_t*>(base + l.offsets);
  // The CPU's 1.0 / double(T), computed on the host with the same IEEE division.
  const double inv_t = 1.0 / static_cast<double>(temperature);
  sampling_ops::prepare_kernel<<<row_grid, sampling_ops::kPrepareThreads, 0, stream>>>(
      logits, uniforms, out, keys_in, ids_in, offsets, rows, vocab, inv_t, false);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  size_t cub_bytes = l.cub_bytes;
  if (const cudaError_t e = sort(base + l.cub, cub_bytes, keys_in, keys_out, ids_in, ids_out, rows, vocab, offsets,
                                 stream);
      e != cudaSuccess)
    return e;
  const dim3 walk_grid(static_cast<unsigned>((rows + sampling_ops::kWalkThreads - 1) / sampling_ops::kWalkThreads));
  sampling_ops::walk_kernel<<<walk_grid, sampling_ops::kWalkThreads, 0, stream>>>(
      keys_out, reinterpret_cast<double*>(keys_in), ids_out, uniforms, out, rows, vocab, top_k, top_p);
  return cudaGetLastError();
}

const char* sampling_last_error() { return g_last_error.c_str(); }

}  // namespace futransformer::cuda
