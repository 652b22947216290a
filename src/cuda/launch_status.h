// Host-side argument-check helpers shared by the CUDA launchers (gemm_w4a16, gemm_fp8, attention_decode). Each
// launcher keeps its own thread-local "last error" message (its public *_last_error()); these helpers only fill it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace futransformer::cuda {

// Records why a call was refused (when the caller asked) and returns the status every launcher uses for it.
inline cudaError_t reject(std::string* why, std::string message) {
  if (why) *why = std::move(message);
  return cudaErrorInvalidValue;
}

inline bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// FT_PRINT_HEURISTICS=1: each launcher prints its tiling / split choice to stderr (read once per process).
inline bool print_heuristics() {
  static const bool on = [] {
    const char* v = std::getenv("FT_PRINT_HEURISTICS");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

// FT_PDL=1: the small decoder ops and the fused ops (decoder_ops.cu, fused_ops.cu) are launched with programmatic
// stream serialization, so each may be scheduled while the kernel before it on the stream still runs; their kernels
// begin with griddepcontrol.wait (a no-op without the attribute). Read once per process.
inline bool programmatic_launch() {
  static const bool on = [] {
    const char* v = std::getenv("FT_PDL");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

// A launcher whose plan needs `need` bytes of scratch refuses a missing, misaligned or short workspace.
inline cudaError_t check_workspace(const char* op, int64_t need, const void* workspace, size_t workspace_bytes,
                                   std::string* why) {
  if (need > 0 && (workspace == nullptr || !aligned(workspace, 16) || workspace_bytes < static_cast<size_t>(need)))
    return reject(why, std::string(op) + ": needs a 16-byte aligned workspace of " + std::to_string(need) +
                           " bytes, got " + std::to_string(workspace_bytes) + " (see " + op + "_workspace_bytes)");
  return cudaSuccess;
}

}  // namespace futransformer::cuda
