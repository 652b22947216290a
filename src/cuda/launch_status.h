// Host-side argument-check helpers shared by the CUDA launchers (gemm_w4a16, gemm_fp8, attention_decode). Each
// launcher keeps its own thread-local "last error" message (its public *_last_error()); these helpers only fill it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

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

// Programmatic dependent launch, on by default (FT_PDL=0 turns it off): the small decoder ops, the fused ops, the
// FP8 producers, the W4A16 GEMMs and decode attention are launched with programmatic stream serialization, so each
// may be scheduled while the kernel before it on the stream still runs. Their kernels begin with
// griddepcontrol.wait before touching anything the previous kernel writes (the W4A16 GEMMs first prefetch their
// constant weights); the wait is a no-op without the attribute. Read once per process.
inline bool programmatic_launch() {
  static const bool on = [] {
    const char* v = std::getenv("FT_PDL");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

// Makes the launch of `cfg` a programmatic dependent of the kernel before it on its stream (programmatic stream
// serialization) when `always` is set or programmatic_launch() is on; `attr` holds the attribute and must live until
// the launch call. The kernel must wait (griddepcontrol.wait) before touching what earlier kernels write.
inline void add_programmatic_attribute(cudaLaunchConfig_t* cfg, cudaLaunchAttribute* attr, bool always = false) {
  if (!always && !programmatic_launch()) return;
  attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr->val.programmaticStreamSerializationAllowed = 1;
  cfg->attrs = attr;
  cfg->numAttrs = 1;
}

// Launches `kernel` on `stream`, with programmatic stream serialization when programmatic_launch() is on (the
// kernel must then begin with griddepcontrol.wait, as the decoder, fused and FP8 producer ops do).
template <typename... Args>
cudaError_t launch_maybe_programmatic(void (*kernel)(Args...), dim3 grid, dim3 block, cudaStream_t stream,
                                      std::type_identity_t<Args>... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  add_programmatic_attribute(&cfg, &attr);
  return cudaLaunchKernelEx(&cfg, kernel, args...);
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
