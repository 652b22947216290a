// Temperature / top-k / top-p sampling of fp32 logit rows on the GPU, choosing exactly the token that
// futransformer::sample_with_uniform (futransformer/sampling.h) chooses for the same parameters and the same
// uniform draw. The caller supplies one draw u in [0, 1) per row (e.g. from its seeded host generator), so the GPU
// and the CPU sampler can be compared token for token.
//
//   logits    fp32 [rows, vocab], rows contiguous.
//   uniforms  fp64 [rows]; unused (may be null) when temperature == 0.
//   out       int32 [rows]: the chosen token id, or -1 for a row the CPU sampler would reject with an Error: a NaN
//             logit, a u outside [0, 1) (temperature > 0), or a largest logit that is not finite (temperature > 0).
//
// Temperature 0 is greedy: the lowest index of the largest logit (futransformer::argmax), no workspace. Otherwise
// p[i] = sampling_exp((double(logit) - max) · (1 / double(T))) in fp64 (src/engine/sampling_exp.h, the same code
// as the CPU), then a stable segmented radix sort (CUB) orders each row by p descending, equal p by token id
// ascending (std::stable_sort's order on the CPU), and one thread per row walks the sorted row adding p in that
// order in fp64, exactly the CPU's summation order, for the top-k cut, the top-p cut and the draw. Deterministic.
//
// Cost: the sort is over the whole row; the walk is sequential but stops at the first p < 2^-53 (from there on no
// addition changes a running sum that is >= 1), so it visits only tokens within 36.7 · T of the largest logit.
// Includable from plain C++: no CUDA device types beyond cuda_runtime_api.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace futransformer::cuda {

constexpr int kSamplingMaxRows = 65535;              // rows go on a grid dimension
constexpr int64_t kSamplingMaxElements = INT32_MAX;  // rows · vocab: CUB's item count and segment offsets are int

// cudaSuccess when the call can run, else cudaErrorInvalidValue with the reason in *why (when non-null). Checks
// only sizes and parameters (rows 1..65535, vocab >= 1, rows · vocab <= 2^31 - 1, temperature finite and >= 0,
// top_k >= 0, top_p in (0, 1]), so it needs no device.
cudaError_t sample_rows_f32_can_implement(int rows, int vocab, float temperature, int top_k, float top_p,
                                          std::string* why);

// Workspace bytes for `rows` rows of `vocab` logits at temperature > 0 (greedy needs none): sort keys and ids
// twice over, the segment offsets and CUB's scratch (whose size CUB computes for the current device). 0 for
// sizes that sample_rows_f32_can_implement rejects, or when CUB's size query fails (no device).
size_t sample_rows_f32_workspace_bytes(int rows, int vocab);

// Enqueues the sampling of `rows` rows on `stream` (three kernels and CUB's sort; no allocation, no host
// synchronisation, so it can be captured in a CUDA graph). workspace: 16-byte aligned, at least
// sample_rows_f32_workspace_bytes(rows, vocab) bytes, not used by a concurrent launch; may be null at
// temperature 0. Returns cudaErrorInvalidValue (message in sampling_last_error()) for rejected sizes or parameters,
// null or misaligned pointers or a short workspace; otherwise the first launch error, if any.
cudaError_t sample_rows_f32(const float* logits, const double* uniforms, int32_t* out, int rows, int vocab,
                            float temperature, int top_k, float top_p, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream);

// Why the last sample_rows_f32 call on this thread returned cudaErrorInvalidValue ("" after an accepted call).
const char* sampling_last_error();

}  // namespace futransformer::cuda
