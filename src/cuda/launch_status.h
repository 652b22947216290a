// Host-side argument-check helpers shared by the CUDA launchers (gemm_w4a16, gemm_fp8, attention_decode). Each
// launcher keeps its own thread-local "last error" message (its public *_last_error()); these helpers only fill it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

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

// The L1 / shared-memory split an SM is configured with while a kernel's CTAs run on it (percent of the maximum
// shared memory; cudaFuncAttributePreferredSharedMemoryCarveout). By default the driver picks a split per kernel from
// what that kernel needs, and an SM configured for a small kernel's split cannot take a 147-172 KB W4A16 GEMM CTA.
// FT_SMEM_CARVEOUT=p (0..100) sets the preference of every kernel launched through launch_kernel_ex or
// launch_maybe_programmatic (the decode step's kernels, the FP8 GEMM, the prefill attention and the small ops around
// them) to p; unset or -1: the driver's choice (the default). A measurement knob: with 100 the o GEMM's CTAs became
// resident earlier at batch 2, but the 8B step was 1-2 % slower at batch 1-4 and 2-2.5 % faster at 12-16, the 70B
// step and the FP8 prefill level (forty-first session, docs/results.md). Read once per process.
//
// parse_smem_carveout: the value of such a text, a whole number 0..100, else (null, empty, -1, anything else) -1.
inline int parse_smem_carveout(const char* e) {
  if (e == nullptr || e[0] == '\0') return -1;
  char* end = nullptr;
  const long p = std::strtol(e, &end, 10);
  return (*end == '\0' && p >= 0 && p <= 100) ? static_cast<int>(p) : -1;
}
inline int smem_carveout() {
  static const int v = parse_smem_carveout(std::getenv("FT_SMEM_CARVEOUT"));
  return v;
}

// Applies preference p (default smem_carveout()) to `kernel` once per (kernel, device) when p >= 0: the first
// preference applied to a kernel stays. A hint: a failure is ignored (and cleared), the launch then runs with the
// driver's split.
inline void apply_smem_carveout(const void* kernel, int p = smem_carveout()) {
  if (p < 0) return;
  constexpr int kSlots = 128;
  thread_local const void* done_kernel[kSlots] = {};
  thread_local int done_dev[kSlots] = {};
  thread_local int used = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  for (int i = 0; i < used; ++i)
    if (done_kernel[i] == kernel && done_dev[i] == dev) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (used == kSlots) return;  // a full table only means the call is repeated next time
  done_kernel[used] = kernel;
  done_dev[used] = dev;
  ++used;
}

// cudaLaunchKernelEx after apply_smem_carveout(kernel): the launch the decode-step launchers use.
template <typename... ExpTypes, typename... ActTypes>
cudaError_t launch_kernel_ex(const cudaLaunchConfig_t* cfg, void (*kernel)(ExpTypes...), ActTypes&&... args) {
  apply_smem_carveout(reinterpret_cast<const void*>(kernel));
  return cudaLaunchKernelEx(cfg, kernel, std::forward<ActTypes>(args)...);
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
  apply_smem_carveout(reinterpret_cast<const void*>(kernel));
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
