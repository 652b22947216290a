// Host side of the W4A16 GEMM: shape checks, tiling choice, kernel instance dispatch and the split-K reduce
// launch (programmatic dependent launch, so its launch latency hides behind the GEMM).
#include "futransformer/cuda/gemm_w4a16.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "cuda/gemm_w4a16.cuh"
#include "cuda/gemm_w4a16_heuristics.h"
#include "cuda/fused_ops.cuh"
#include "cuda/gemm_w4a16_internal.h"
#include "cuda/gemm_w4a16_qkv.cuh"
#include "cuda/gemm_w4a16_qkv_tail.cuh"
#include "cuda/gemm_w4a16_reduce.cuh"
#include "cuda/gemm_w4a16_tuned.h"
#include "cuda/gemm_w4a16_v4_dispatch.cuh"
#include "cuda/launch_status.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/fused_ops.h"

namespace futransformer::cuda {
namespace {

using w4a16::KernelArgs;
using w4a16::Tiling;

thread_local std::string g_last_error;
static_assert(kW4A16NormMaxM == w4a16::kNormMaxRows, "the public row limit of the norm prologue is the kernel's");

// Host time matters at decode sizes: an 8 MB layer streams in ~3 us, while the tile search costs 1-7 us and the
// attribute queries ~1 us. Limits, tilings and the raised shared-memory limit are therefore remembered per thread.
constexpr int kMaxDevices = 16;

cudaError_t device_limits(w4a16::DeviceLimits* d, int* device = nullptr) {
  thread_local w4a16::DeviceLimits known[kMaxDevices];
  thread_local bool have[kMaxDevices] = {};
  int dev = 0, sms = 0, per_sm = 0, per_block = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (device) *device = dev;
  if (dev >= 0 && dev < kMaxDevices && have[dev]) {
    *d = known[dev];
    return cudaSuccess;
  }
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return e;
  d->sm_count = sms;
  d->smem_per_sm = per_sm;
  d->smem_per_block = per_block;
  if (dev >= 0 && dev < kMaxDevices) {
    known[dev] = *d;
    have[dev] = true;
  }
  return cudaSuccess;
}

// choose_tiling through a small per-thread cache (round-robin replacement; decode uses a handful of shapes).
Tiling cached_tiling(int M, int N, int K, int group, const w4a16::DeviceLimits& d, const w4a16::V4Config& cfg) {
  struct Entry {
    int M, N, K, group, sms;
    int64_t per_sm, per_block;
    w4a16::V4Config cfg;
    Tiling t;
  };
  constexpr int kEntries = 64;
  thread_local Entry cache[kEntries];
  thread_local int used = 0, next = 0;
  for (int i = 0; i < used; ++i) {
    const Entry& c = cache[i];
    if (c.M == M && c.N == N && c.K == K && c.group == group && c.sms == d.sm_count && c.per_sm == d.smem_per_sm &&
        c.per_block == d.smem_per_block && c.cfg == cfg)
      return c.t;
  }
  const Tiling t = w4a16::choose_tiling(M, N, K, group, d, cfg);
  cache[next] = Entry{M, N, K, group, d.sm_count, d.smem_per_sm, d.smem_per_block, cfg, t};
  next = (next + 1) % kEntries;
  used = std::min(used + 1, kEntries);
  return t;
}

// Raises a kernel's dynamic shared-memory limit to the device maximum once per (kernel, device); the limit does
// not change occupancy, which follows the size each launch asks for.
cudaError_t allow_smem(const void* kernel, int dev, int64_t per_block) {
  constexpr int kSlots = 64;
  thread_local const void* done_kernel[kSlots] = {};
  thread_local int done_dev[kSlots] = {};
  thread_local int used = 0;
  for (int i = 0; i < used; ++i)
    if (done_kernel[i] == kernel && done_dev[i] == dev) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(per_block));
  if (e != cudaSuccess || used == kSlots) return e;  // a full table only means the call is repeated next time
  done_kernel[used] = kernel;
  done_dev[used] = dev;
  ++used;
  return cudaSuccess;
}

using w4a16::KernelFn;

// The kernel instance for a tiling; nullptr for a v4 (warps, stages) shape or m-tile count that is not compiled
// (tiling_is_valid refuses those first).
template <bool kF16>
KernelFn pick_kernel(const Tiling& t, bool cluster) {  // cluster: the cluster-reduce instance (gemm_w4a16_cluster.cuh)
  if (t.variant == w4a16::Variant::v4) return w4a16::v4_kernel_any(t, kF16, cluster);
  if (cluster) {
    if (t.rows8) return nullptr;
    return t.m_tiles == 1 ? w4a16::gemm_w4a16_kernel<1, false, kF16, true>
                          : (t.m_tiles == 2 ? w4a16::gemm_w4a16_kernel<2, false, kF16, true> : nullptr);
  }
  if (t.rows8) return w4a16::gemm_w4a16_kernel<1, true, kF16>;
  switch (t.m_tiles) {
    case 1: return w4a16::gemm_w4a16_kernel<1, false, kF16>;
    case 2: return w4a16::gemm_w4a16_kernel<2, false, kF16>;
    case 3: return w4a16::gemm_w4a16_kernel<3, false, kF16>;
    default: return w4a16::gemm_w4a16_kernel<4, false, kF16>;
  }
}

// FT_W4A16_PRINT=1 (or FT_PRINT_HEURISTICS=1): every launch prints its tiling, and the first the v4 config.
bool print_choice() {
  static const bool on = [] {
    const char* v = std::getenv("FT_W4A16_PRINT");
    return print_heuristics() || (v != nullptr && v[0] == '1');
  }();
  return on;
}

// The v4 decode configuration from the environment (w4a16::parse_v4_config), read once per process; problems are
// reported on stderr once.
const w4a16::V4Config& env_v4_config() {
  static const w4a16::V4Config c = [] {
    std::string warnings;
    const w4a16::V4Config r = w4a16::parse_v4_config([](const char* n) -> const char* { return std::getenv(n); },
                                                      &warnings);
    if (!warnings.empty()) std::fprintf(stderr, "gemm_w4a16: %s\n", warnings.c_str());
    if (print_choice()) std::fprintf(stderr, "gemm_w4a16 %s\n", w4a16::describe_config(r).c_str());
    return r;
  }();
  return c;
}

// FT_W4A16_VARIANT, read once per process: the variant every gemm_w4a16 call runs (a bench or an experiment
// switches kernels without a rebuild).
enum class EnvVariant { unset, v2, v4 };
EnvVariant env_variant() {
  static const EnvVariant v = [] {
    const char* e = std::getenv("FT_W4A16_VARIANT");
    if (e == nullptr || e[0] == '\0') return EnvVariant::unset;
    const std::string s(e);
    if (s == "v2") return EnvVariant::v2;
    if (s == "v4") return EnvVariant::v4;
    std::fprintf(stderr, "FT_W4A16_VARIANT=%s ignored (expected v2 or v4)\n", e);
    return EnvVariant::unset;
  }();
  return v;
}

// FT_W4A16_WG32=0/1, read once per process: M = 17..32 on the streamed warpgroup path (wgmma + stream_x), default
// w4a16::kWg32ByDefault. An explicit FT_W4A16_VARIANT=v2 still wins.
bool wg32_on() {
  static const bool on = [] {
    const char* v = std::getenv("FT_W4A16_WG32");
    if (v == nullptr || v[0] == '\0') return w4a16::kWg32ByDefault;
    if ((v[0] == '0' || v[0] == '1') && v[1] == '\0') return v[0] == '1';
    std::fprintf(stderr, "FT_W4A16_WG32=%s ignored (expected 0 or 1)\n", v);
    return w4a16::kWg32ByDefault;
  }();
  return on;
}
bool wg32_range(int M) { return M >= w4a16::kSwap32MinM && M <= w4a16::kWgMaxM && wg32_on(); }
// ... and for this weight: w4a16::kWg32MinWeightBytes of INT4 codes or more.
bool wg32_for(int M, int N, int K) {
  return wg32_range(M) && int64_t{N} * K / 2 >= w4a16::kWg32MinWeightBytes;
}

// Pointer checks shared by every entry point. The output's alignment follows its widest access: BF16 pairs for y,
// float4 in the split-K reduce for the residual, four BF16 (8 bytes) there for the SwiGLU output.
cudaError_t check_pointers(const void* x, const void* w_packed, const void* scales, const void* out,
                           w4a16::Epilogue ep) {
  if (!x || !w_packed || !scales || !aligned(x, 16) || !aligned(w_packed, 16) || !aligned(scales, 16))
    return reject(&g_last_error, "gemm_w4a16: x, w_packed and scales must be non-null and 16-byte aligned");
  switch (ep) {
    case w4a16::Epilogue::store_bf16:
      if (!out || !aligned(out, 4)) return reject(&g_last_error, "gemm_w4a16: y must be non-null and 4-byte aligned");
      break;
    case w4a16::Epilogue::residual_f32:
      if (!out || !aligned(out, 16))
        return reject(&g_last_error, "gemm_w4a16_residual: residual must be non-null and 16-byte aligned");
      break;
    case w4a16::Epilogue::swiglu_bf16:
      if (!out || !aligned(out, 8))
        return reject(&g_last_error, "gemm_w4a16_swiglu: h must be non-null and 8-byte aligned");
      break;
    default: return reject(&g_last_error, "gemm_w4a16: unknown epilogue");
  }
  return cudaSuccess;
}

// The attention prologue of gemm_w4a16_qkv_rope_append: checked qkv_rope_kv_append arguments (a.qkv is the GEMM's
// BF16 output y) and the cache format, which picks the kernel instance.
struct QkvEpilogue {
  fused::QkvArgs args;
  formats::KvFormat format;
  uint32_t* head_counters = nullptr;  // the prologue in the unsplit GEMM's tail where w4a16_qkv_tail_applies
};

// The RMSNorm prologue of gemm_w4a16_rmsnorm*: the GEMM's activations are rmsnorm_bf16(x, weight, eps) of fp32 rows.
// op names the public entry point in messages.
struct NormPrologue {
  const float* x;
  const float* weight;
  float eps;
  const char* op;
  const float* partials = nullptr;  // the rows' norm partials (gemm_w4a16_residual_norm_partials), or none
};

// The RMSNorm after the residual epilogue (gemm_w4a16_residual_rmsnorm): y = rmsnorm_bf16(residual, weight, eps) of
// the rows the GEMM leaves.
struct ResidualNorm {
  const float* weight;
  __nv_bfloat16* y;
  float eps;
};
constexpr const char* kResidualNormOp = "gemm_w4a16_residual_rmsnorm";

// FT_RESIDUAL_NORM_FUSED=0: gemm_w4a16_residual_rmsnorm runs the split-K reduce and rmsnorm_bf16 as two kernels
// instead of gemm_w4a16_reduce_residual_rmsnorm_kernel (same bits), to time one against the other. Read once.
bool residual_norm_fused() {
  static const bool on = [] {
    const char* v = std::getenv("FT_RESIDUAL_NORM_FUSED");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

std::atomic<int> g_cluster_reduce_override{-1};  // set_gemm_w4a16_cluster_reduce; -1: the environment's
std::atomic<int> g_cluster_rows_override{0};     // set_gemm_w4a16_cluster_limits; 0: the environment's
std::atomic<int> g_cluster_splits_override{0};

// Whether the device can place at least one cluster of `size` CTAs of cfg's shape for this kernel (clusters must fit
// one GPC; above the portable size of 8 the kernel is first allowed non-portable ones), cached per (kernel, block,
// shared memory, cluster size). cfg carries the cluster attribute.
bool cluster_fits(const void* entry, const cudaLaunchConfig_t& cfg, unsigned size) {
  struct Key {
    const void* entry;
    unsigned threads, cluster;
    size_t smem;
    bool operator<(const Key& o) const {
      return std::tie(entry, threads, cluster, smem) < std::tie(o.entry, o.threads, o.cluster, o.smem);
    }
  };
  static std::mutex mu;
  static std::map<Key, bool> cache;
  const Key key{entry, cfg.blockDim.x, size, cfg.dynamicSmemBytes};
  std::lock_guard<std::mutex> lock(mu);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  bool ok = size <= static_cast<unsigned>(w4a16::kMaxClusterSplits) ||
            cudaFuncSetAttribute(entry, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
  int clusters = 0;
  ok = ok && cudaOccupancyMaxActiveClusters(&clusters, entry, &cfg) == cudaSuccess && clusters > 0;
  if (!ok) (void)cudaGetLastError();  // a refused query leaves no sticky error behind
  cache.emplace(key, ok);
  return ok;
}

// Makes cfg (attrs = `attrs`, room for one more) a cluster launch of `kernel` over the t.splits K slices of a column
// block when the device can place such clusters; false (cfg unchanged) when it cannot.
bool add_cluster_attribute(const void* kernel, const Tiling& t, int dev, const w4a16::DeviceLimits& d,
                           cudaLaunchConfig_t* cfg, cudaLaunchAttribute* attrs) {
  // The occupancy query needs the kernel's shared-memory allowance first.
  if (cfg->dynamicSmemBytes > 48 * 1024 && allow_smem(kernel, dev, d.smem_per_block) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  cudaLaunchAttribute& c = attrs[cfg->numAttrs];
  c.id = cudaLaunchAttributeClusterDimension;
  c.val.clusterDim.x = 1;
  c.val.clusterDim.y = static_cast<unsigned>(t.splits);
  c.val.clusterDim.z = 1;
  cfg->attrs = attrs;
  cfg->numAttrs += 1;
  if (cluster_fits(kernel, *cfg, static_cast<unsigned>(t.splits))) return true;
  cfg->numAttrs -= 1;
  return false;
}

// FT_W4A16_REDUCE_RELEASE=first|exit (first by default; thirty-first session: the 8B step −1.8 / −1.9 % at batch 4 / 8,
// the 70B step −2.3 % at batch 8): whether the split-K reduce kernels (residual, SwiGLU, BF16) release their
// programmatic dependent before their wait or when they exit (gemm_w4a16_reduce.cuh, release_then_wait). Read once
// per process; anything else is reported and ignored.
int reduce_release_first() {
  static const int first = [] {
    const char* e = std::getenv("FT_W4A16_REDUCE_RELEASE");
    if (e == nullptr || std::strcmp(e, "first") == 0) return 1;
    if (std::strcmp(e, "exit") == 0) return 0;
    std::fprintf(stderr, "FT_W4A16_REDUCE_RELEASE='%s' is not 'first' or 'exit'; using first\n", e);
    return 1;
  }();
  return first;
}

// FT_QKV_REDUCE_LANES=0: the qkv split-K reduce of an INT4 / INT4_HADAMARD cache at head_dim 128 runs the per-head
// code that re-reads the head from qkv (gemm_w4a16_reduce_qkv_kernel) instead of keeping each lane's float4 in
// registers (gemm_w4a16_reduce_qkv_lanes_kernel; same bits), to time one against the other. Read once per process.
bool qkv_reduce_lanes() {
  static const bool on = [] {
    const char* v = std::getenv("FT_QKV_REDUCE_LANES");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

// The entries of the environment list `var` as parse reads them (the w4a16::parse_* functions); problems are reported
// on stderr. Callers keep the result in a function-local static, so each list is read and reported once per process.
template <class Entry>
std::vector<Entry> env_entries(const char* var, std::vector<Entry> (*parse)(const char*, std::string*)) {
  std::string warnings;
  std::vector<Entry> r = parse(std::getenv(var), &warnings);
  if (!warnings.empty()) std::fprintf(stderr, "gemm_w4a16: %s\n", warnings.c_str());
  return r;
}

bool tuned_table_on();

// Whether the GEMM of shape (N, K) at M rows is launched without programmatic stream serialisation: where
// FT_W4A16_PLAIN_LAUNCH names it (in-step screens; w4a16::parse_plain_launch), else where the measured table does
// (w4a16::find_tuned_plain_launch; off with FT_W4A16_TUNED=0).
bool plain_launch_for(int M, int N, int K, int group, const w4a16::DeviceLimits& d) {
  static const std::vector<w4a16::ShapeRange> entries = env_entries("FT_W4A16_PLAIN_LAUNCH", w4a16::parse_plain_launch);
  for (const w4a16::ShapeRange& e : entries)
    if (w4a16::covers(e, M, N, K)) return true;
  return tuned_table_on() && w4a16::find_tuned_plain_launch(M, N, K, group, d) != nullptr;
}

// Launches a tiling that fits the device (smem checked by the callers) after the workspace check; a split K is
// finished inside clusters where w4a16::cluster_reduce_applies and gemm_w4a16_cluster_reduce(), otherwise by the
// reduce kernel; `out` is y (BF16 [M, N]), the fp32 residual [M, N] or h (BF16 [M, N / 2]) as the epilogue says.
// With qkv (ep store_bf16, out = qkv's BF16 buffer): the split-K reduce is gemm_w4a16_reduce_qkv_kernel (its lanes
// variant for INT4 caches at head_dim 128), and without
// a split the GEMM's BF16 store is followed by qkv_rope_kv_append's kernel (see gemm_w4a16_qkv_rope_append). With
// norm: the norm-prologue instance of the (v4 rows8) tiling, with kNormScratchBytes more shared memory after the
// ring. With norm_out (residual_f32 only): the residual rows' norm partials are written too, by
// gemm_w4a16_reduce_residual_norm_kernel — as the split-K reduce, or after an unsplit GEMM as a kernel that only
// reads the rows back.
cudaError_t launch(const Tiling& t, const w4a16::DeviceLimits& d, int dev, w4a16::Epilogue ep, const __nv_bfloat16* x,
                   const uint32_t* w_packed, const uint16_t* scales, void* out, int M, int N, int K, int group,
                   formats::ScaleType scale_type, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                   const QkvEpilogue* qkv = nullptr, const NormPrologue* norm = nullptr, float* norm_out = nullptr,
                   const ResidualNorm* rnorm = nullptr) {
  const int64_t smem = w4a16::smem_layout(t, K, group).total + (norm ? w4a16::kNormScratchBytes : 0);
  if (print_choice()) std::fprintf(stderr, "%s\n", w4a16::describe_tiling(t, M, N, K, group, d).c_str());
  const int64_t need = w4a16::workspace_bytes_for(t, M, N);
  if (const cudaError_t e = check_workspace("gemm_w4a16", need, workspace, workspace_bytes, &g_last_error);
      e != cudaSuccess)
    return e;

  const bool f32_out = ep == w4a16::Epilogue::residual_f32;
  __nv_bfloat16* const y = f32_out ? nullptr : static_cast<__nv_bfloat16*>(out);
  float* const residual = f32_out ? static_cast<float*>(out) : nullptr;
  const KernelArgs args{x, reinterpret_cast<const uint4*>(w_packed), scales, y, static_cast<float*>(workspace),
                        M, N, K, group, t, residual, ep};
  const bool f16 = scale_type == formats::ScaleType::F16;
  // Split-K inside clusters of the column block's slices (gemm_w4a16_cluster.cuh) where it applies and the device
  // can place such a cluster: the cluster-reduce instance, and no reduce kernel below.
  int max_rows = 0, max_splits = 0;
  gemm_w4a16_cluster_limits(&max_rows, &max_splits);  // the slice limit; the row limit is per shape:
  max_rows = gemm_w4a16_cluster_rows_for(N, K, group, d);
  bool cluster = norm == nullptr && qkv == nullptr && norm_out == nullptr && gemm_w4a16_cluster_reduce() &&
                 w4a16::cluster_reduce_applies(t, M, K, group, max_rows, max_splits);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(N / (w4a16::kBlockN * t.warps_n)), static_cast<unsigned>(t.splits));
  cfg.blockDim = dim3(static_cast<unsigned>(t.warps * w4a16::kWarpSize));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  // Under programmatic_launch() the GEMM is a programmatic dependent of the kernel before it: its CTAs fetch
  // weights and scales before griddepcontrol.wait and stage the activations after it (see the kernels).
  // plain_launch_for names shapes launched plainly instead (the kernels' griddepcontrol.wait is then a no-op).
  cudaLaunchAttribute gemm_attr[2];
  if (!plain_launch_for(M, N, K, group, d)) add_programmatic_attribute(&cfg, &gemm_attr[0]);
  KernelFn kernel = nullptr;
  if (cluster) {
    kernel = f16 ? pick_kernel<true>(t, true) : pick_kernel<false>(t, true);
    cluster = kernel != nullptr &&
              add_cluster_attribute(reinterpret_cast<const void*>(kernel), t, dev, d, &cfg, gemm_attr);
  }
  if (!cluster && norm == nullptr) kernel = f16 ? pick_kernel<true>(t, false) : pick_kernel<false>(t, false);
  // FT_SMEM_CARVEOUT_WG=p: the carveout preference of the warpgroup-path kernels alone (launch_status.h; measurement).
  if (t.wgmma && kernel != nullptr) {
    static const int wg_carveout = parse_smem_carveout(std::getenv("FT_SMEM_CARVEOUT_WG"));
    apply_smem_carveout(reinterpret_cast<const void*>(kernel), wg_carveout);
  }
  // The qkv prologue in the GEMM's own tail (gemm_w4a16_qkv_tail.cuh): no kernel after it.
  if (qkv != nullptr && qkv->head_counters != nullptr && norm == nullptr && !cluster &&
      w4a16_qkv_tail_applies(t, M, K, group, qkv->format, qkv->args.head_dim, f16, d)) {
    const w4a16::QkvTailKernelFn tail = w4a16::v4_qkv_tail_kernel_any(t, f16);
    cfg.dynamicSmemBytes = static_cast<size_t>(smem + w4a16::kQkvTailScratchBytes);
    if (cfg.dynamicSmemBytes > 48 * 1024) {
      if (const cudaError_t e = allow_smem(reinterpret_cast<const void*>(tail), dev, d.smem_per_block);
          e != cudaSuccess)
        return e;
    }
    if (print_choice()) std::fprintf(stderr, "gemm_w4a16: qkv prologue in the GEMM's tail\n");
    const w4a16::QkvTailArgs ta{args, qkv->args, qkv->head_counters,
                                qkv->format == formats::KvFormat::INT4_HADAMARD ? 1 : 0};
    return launch_kernel_ex(&cfg, tail, ta);
  }
  const w4a16::NormKernelFn norm_kernel = norm ? w4a16::v4_norm_kernel_any(t, f16) : nullptr;
  const void* const entry = norm ? reinterpret_cast<const void*>(norm_kernel) : reinterpret_cast<const void*>(kernel);
  if (entry == nullptr)
    return reject(&g_last_error, std::string(norm ? norm->op : "gemm_w4a16") + ": no kernel is compiled for " +
                                     w4a16::describe_tiling(t, M, N, K, group, d));
  if (smem > 48 * 1024) {
    if (const cudaError_t e = allow_smem(entry, dev, d.smem_per_block); e != cudaSuccess) return e;
  }
  const cudaError_t launched =
      norm ? launch_kernel_ex(&cfg, norm_kernel,
                              w4a16::NormKernelArgs{args, norm->x, norm->weight, norm->eps, norm->partials})
           : launch_kernel_ex(&cfg, kernel, args);
  if (launched != cudaSuccess) return launched;
  if (norm_out) {
    // The residual rows' norm partials: rows * T threads of rmsnorm_kernel<true>'s T per row, whole warps.
    const int vthreads = ops::rmsnorm_threads(N, true);
    const int threads = M * vthreads;
    cudaLaunchAttribute nattr;
    cudaLaunchConfig_t ncfg{};
    ncfg.gridDim = dim3(static_cast<unsigned>((threads + 255) / 256));
    ncfg.blockDim = dim3(256);
    ncfg.stream = stream;
    add_programmatic_attribute(&ncfg, &nattr, /*always=*/true);
    return launch_kernel_ex(&ncfg, w4a16::gemm_w4a16_reduce_residual_norm_kernel,
                            static_cast<const float4*>(workspace), reinterpret_cast<float4*>(residual), norm_out, M,
                            N / 4, vthreads, t.splits == 1 ? 0 : t.splits);
  }
  // The RMSNorm after the residual epilogue: its own kernel where the GEMM (or its clusters) finished the sums, else
  // fused with the split-K reduce below.
  const auto norm_kernel_after = [&] {
    return cuda::rmsnorm_bf16(residual, rnorm->weight, rnorm->y, M, N, rnorm->eps, stream);
  };
  if (t.splits == 1) {
    if (rnorm) return norm_kernel_after();
    return qkv ? fused::launch_qkv_kernel(qkv->args, qkv->format, M, true, stream) : cudaSuccess;
  }
  if (cluster) return rnorm ? norm_kernel_after() : cudaSuccess;  // finished inside the clusters

  // The reduce kernel applies the epilogue: one launch either way (N % 32 == 0, so M * N / 4 is exact).
  const int64_t count4 = static_cast<int64_t>(M) * N / 4;
  const int64_t items = ep == w4a16::Epilogue::swiglu_bf16 ? count4 / 2 : count4;
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t rcfg{};
  rcfg.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>((items + 255) / 256, int64_t{d.sm_count} * 8)));
  rcfg.blockDim = dim3(256);
  rcfg.stream = stream;
  add_programmatic_attribute(&rcfg, &attr, /*always=*/true);
  const auto* partial = static_cast<const float4*>(workspace);
  if (qkv) {
    const int items = qkv->args.n_heads + 2 * qkv->args.n_kv_heads;
    rcfg.gridDim = dim3(static_cast<unsigned>((items + w4a16::kQkvReduceWarps - 1) / w4a16::kQkvReduceWarps),
                        static_cast<unsigned>(M));
    rcfg.blockDim = dim3(static_cast<unsigned>(w4a16::kQkvReduceWarps * fused::kWarp));
    const auto* p = static_cast<const float*>(workspace);
    if (qkv->args.head_dim == fused::kQuadHeadDim && qkv_reduce_lanes()) {
      if (qkv->format == formats::KvFormat::INT4)
        return launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_qkv_lanes_kernel<formats::KvFormat::INT4>, p,
                                count4, t.splits, qkv->args);
      if (qkv->format == formats::KvFormat::INT4_HADAMARD)
        return launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_qkv_lanes_kernel<formats::KvFormat::INT4_HADAMARD>,
                                p, count4, t.splits, qkv->args);
    }
    switch (qkv->format) {
      case formats::KvFormat::BF16:
        return launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_qkv_kernel<formats::KvFormat::BF16>, p, count4,
                                t.splits, qkv->args);
      case formats::KvFormat::FP8:
        return launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_qkv_kernel<formats::KvFormat::FP8>, p, count4,
                                t.splits, qkv->args);
      case formats::KvFormat::INT4:
        return launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_qkv_kernel<formats::KvFormat::INT4>, p, count4,
                                t.splits, qkv->args);
      case formats::KvFormat::INT4_HADAMARD:
        return launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_qkv_kernel<formats::KvFormat::INT4_HADAMARD>, p,
                                count4, t.splits, qkv->args);
    }
    return reject(&g_last_error, "gemm_w4a16_qkv_rope_append: unknown KV format");  // unreachable: checked
  }
  if (rnorm && residual_norm_fused()) {
    // One CTA per row in rmsnorm_bf16's launch shape (the sum of squares in its order).
    rcfg.gridDim = dim3(static_cast<unsigned>(M));
    rcfg.blockDim = dim3(static_cast<unsigned>(ops::rmsnorm_threads(N, true)));
    return launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_residual_rmsnorm_kernel, partial,
                            reinterpret_cast<float4*>(residual), count4, t.splits,
                            reinterpret_cast<const float4*>(rnorm->weight), rnorm->y, N, rnorm->eps);
  }
  switch (ep) {
    case w4a16::Epilogue::residual_f32:
      if (rnorm) {
        if (const cudaError_t e = launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_residual_kernel, partial,
                                                   reinterpret_cast<float4*>(residual), count4, t.splits,
                                                   reduce_release_first());
            e != cudaSuccess)
          return e;
        return norm_kernel_after();
      }
      return launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_residual_kernel, partial,
                              reinterpret_cast<float4*>(residual), count4, t.splits,
                              reduce_release_first());
    case w4a16::Epilogue::swiglu_bf16:
      return launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_swiglu_kernel, partial, y, count4, N / 8, t.splits,
                              reduce_release_first());
    default: return launch_kernel_ex(&rcfg, w4a16::gemm_w4a16_reduce_kernel, partial, y, count4, t.splits,
                                            reduce_release_first());
  }
}

// FT_W4A16_TUNED=0: ignore the measured per-shape table (gemm_w4a16_tuned.h), e.g. to time the default next to it.
bool tuned_table_on() {
  static const bool on = [] {
    const char* v = std::getenv("FT_W4A16_TUNED");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

// The first FT_W4A16_TUNED_EXTRA entry (experiments; w4a16::parse_tuned_extra) for this shape and M, or nullptr.
const w4a16::ExtraTunedEntry* extra_tuned_entry(int M, int N, int K) {
  static const std::vector<w4a16::ExtraTunedEntry> entries =
      env_entries("FT_W4A16_TUNED_EXTRA", w4a16::parse_tuned_extra);
  for (const w4a16::ExtraTunedEntry& e : entries)
    if (w4a16::covers(e, M, N, K)) return &e;
  return nullptr;
}

// The tiling gemm_w4a16 runs, with the variant set. For v4 decode sizes: the environment's v4 config when one is
// set, else the measured table's entry for the shape (gemm_w4a16_tuned.h) if any — either only when its tiling
// fits the device; otherwise, and for v2 or M > 16, the default configuration. For M = 17..32 swap32 is the
// environment's (FT_W4A16_SWAP32, else kSwap32ByDefault) when the variant is v4, and off for v2; the streamed
// warpgroup path runs there when wg32_on() (FT_W4A16_WG32, else kWg32ByDefault), the weight has kWg32MinWeightBytes
// (or an FT_W4A16_TUNED_EXTRA entry with a streamed ring names the shape and M) and the shape has such a tiling, v2
// where not.
Tiling library_tiling(int M, int N, int K, int group, const w4a16::DeviceLimits& d) {
  const w4a16::Variant v = gemm_w4a16_variant_for(M);
  // An FT_W4A16_TUNED_EXTRA entry with a streamed ring (8 or 16 slots; other entries do not apply here) at M = 17..32
  // puts the shape on the warpgroup path also below kWg32MinWeightBytes, so an in-step screen can try it there.
  const w4a16::ExtraTunedEntry* wg_extra = wg32_range(M) ? extra_tuned_entry(M, N, K) : nullptr;
  if (wg_extra != nullptr && !w4a16::wg_stream_stages_ok(wg_extra->config.stages)) wg_extra = nullptr;
  const bool wg32 = v == w4a16::Variant::v4 && (wg32_for(M, N, K) || wg_extra != nullptr);
  w4a16::V4Config base;
  base.swap32 = v == w4a16::Variant::v4 && env_v4_config().swap32;
  base.wgmma = v == w4a16::Variant::v4 && (env_v4_config().wgmma || wg32);
  base.stream_x = v == w4a16::Variant::v4 && (env_v4_config().stream_x || wg32);
  base.stream_stages = env_v4_config().stream_stages;
  Tiling t = cached_tiling(M, N, K, group, d, base);
  if (v == w4a16::Variant::v4 && wg32_range(M) && !t.wgmma && !t.swap32 && env_variant() == EnvVariant::unset) {
    // The weight is too small for the warpgroup path or the shape has no such tiling: v2, the default of M > 16.
    t.variant = w4a16::Variant::v2;
    return t;
  }
  if (v == w4a16::Variant::v4 && M > w4a16::kV4DefaultMaxM && t.wgmma && t.stream_x &&
      env_v4_config() == w4a16::V4Config{}) {
    // M = 17..32 on the streamed warpgroup path: an FT_W4A16_TUNED_EXTRA entry whose stages are a streamed ring
    // (8 or 16) gives the ring, CTAs per SM and split, else the measured M = 17..32 table's entry if any.
    const w4a16::TunedWg32Entry* tuned =
        wg_extra == nullptr && tuned_table_on() ? w4a16::find_tuned_wg32(M, N, K, group, d) : nullptr;
    if (wg_extra != nullptr || tuned != nullptr) {
      w4a16::V4Config c = base;
      c.stream_stages = wg_extra ? wg_extra->config.stages : tuned->stream_stages;
      c.ctas_per_sm = wg_extra ? wg_extra->config.ctas_per_sm : tuned->ctas_per_sm;
      c.splits = wg_extra ? wg_extra->config.splits : tuned->splits;
      Tiling ct = cached_tiling(M, N, K, group, d, c);
      ct.variant = v;
      if (ct.wgmma && ct.stream_x && w4a16::tiling_is_valid(ct, M, N, K, group, d, nullptr)) t = ct;
    }
  }
  if (v == w4a16::Variant::v4 && M <= w4a16::kV4DefaultMaxM) {
    const w4a16::TunedV4Entry* tuned = nullptr;
    const w4a16::V4Config* extra = nullptr;
    if (env_v4_config() == w4a16::V4Config{}) {
      if (const w4a16::ExtraTunedEntry* e = extra_tuned_entry(M, N, K)) extra = &e->config;
      if (extra == nullptr && tuned_table_on()) tuned = w4a16::find_tuned_v4(M, N, K, group, d);
    }
    if (!(env_v4_config() == w4a16::V4Config{}) || tuned != nullptr || extra != nullptr) {
      Tiling c = cached_tiling(M, N, K, group, d,
                               extra ? *extra : (tuned ? w4a16::tuned_config(*tuned) : env_v4_config()));
      c.variant = v;
      if (w4a16::tiling_is_valid(c, M, N, K, group, d, nullptr)) t = c;
    }
  }
  t.variant = v;
  return t;
}

// Argument checks of the norm prologue that need no device: M, the fp32 rows and weight (rmsnorm_vec's conditions:
// the order reproduced is rmsnorm_kernel<true>'s), eps (rmsnorm_bf16's rule).
cudaError_t check_norm(const NormPrologue& n, int M) {
  using std::to_string;
  if (M < 1 || M > w4a16::kNormMaxRows)
    return reject(&g_last_error, std::string(n.op) + ": M = " + to_string(M) + " rows, expected 1.." +
                                     to_string(w4a16::kNormMaxRows) + " (the norm prologue runs on the swapped M <= " +
                                     to_string(w4a16::kNormMaxRows) + " path)");
  if (!n.x || !aligned(n.x, 16))
    return reject(&g_last_error, std::string(n.op) + ": x (fp32 rows) must be non-null and 16-byte aligned");
  if (!n.weight || !aligned(n.weight, 16))
    return reject(&g_last_error, std::string(n.op) + ": norm_weight must be non-null and 16-byte aligned");
  if (n.partials && !aligned(n.partials, 4))
    return reject(&g_last_error, std::string(n.op) + ": norm_partials must be 4-byte aligned");
  if (!std::isfinite(n.eps) || n.eps < 0.0f)
    return reject(&g_last_error, std::string(n.op) + ": eps = " + std::to_string(n.eps) +
                                     ", expected a finite value >= 0");
  return cudaSuccess;
}

// The norm prologue has one instance per compiled v4 shape, for the swapped M <= 8 path only.
cudaError_t check_norm_tiling(const NormPrologue& n, const Tiling& t) {
  if (t.variant != w4a16::Variant::v4 || !t.rows8 || t.wgmma)
    return reject(&g_last_error, std::string(n.op) + ": the tiling must be v4 with rows8 and without wgmma (M <= 8; " +
                                     "FT_W4A16_VARIANT=v2 selects v2, FT_W4A16_WGMMA=1 the warpgroup path, neither " +
                                     "has the norm prologue)");
  return cudaSuccess;
}

// The caller's tiling (checked) or the library's (planned), then the launch: every entry point runs through here.
// With norm, x is unused (norm->x holds the fp32 rows).
// With norm_out (residual_f32): the residual rows' norm partials as well (see launch).
cudaError_t run(const Tiling* tiling, w4a16::Epilogue ep, const __nv_bfloat16* x, const uint32_t* w_packed,
                const uint16_t* scales, void* out, int M, int N, int K, int group, formats::ScaleType scale_type,
                void* workspace, size_t workspace_bytes, cudaStream_t stream, const QkvEpilogue* qkv = nullptr,
                const NormPrologue* norm = nullptr, float* norm_out = nullptr, const ResidualNorm* rnorm = nullptr) {
  g_last_error.clear();
  if (gemm_w4a16_can_implement(M, N, K, group, scale_type, &g_last_error) != cudaSuccess) return cudaErrorInvalidValue;
  if (norm) {
    if (const cudaError_t e = check_norm(*norm, M); e != cudaSuccess) return e;
  }
  const void* const rows_in = norm ? static_cast<const void*>(norm->x) : static_cast<const void*>(x);
  if (const cudaError_t e = check_pointers(rows_in, w_packed, scales, out, ep); e != cudaSuccess) return e;
  if (norm_out && ep != w4a16::Epilogue::residual_f32)
    return reject(&g_last_error, "gemm_w4a16: norm partials are written by the residual epilogue only");
  if (norm_out && !aligned(norm_out, 4))
    return reject(&g_last_error, "gemm_w4a16_residual_norm_partials: norm_partials must be 4-byte aligned");
  if (rnorm) {
    const std::string op = kResidualNormOp;
    if (ep != w4a16::Epilogue::residual_f32 || norm_out || norm || qkv)
      return reject(&g_last_error, op + ": the norm follows the residual epilogue alone");
    if (rnorm->weight == nullptr || rnorm->y == nullptr || !aligned(rnorm->weight, 16) || !aligned(rnorm->y, 8))
      return reject(&g_last_error, op + ": norm_weight must be non-null and 16-byte aligned, y non-null and 8-byte aligned");
    static_assert(kW4A16ResidualNormMaxN == w4a16::kResidualNormMaxUnits * ops::kMaxBlockThreads * 4,
                  "the public bound is the kernel's");
    if (N > kW4A16ResidualNormMaxN)
      return reject(&g_last_error, op + ": N = " + std::to_string(N) + " exceeds the fused norm's " +
                                       std::to_string(kW4A16ResidualNormMaxN));
    if (!std::isfinite(rnorm->eps) || rnorm->eps < 0.0f)
      return reject(&g_last_error, op + ": eps = " + std::to_string(rnorm->eps) + ", expected a finite value >= 0");
    const int64_t n = int64_t{M} * N;
    const auto lo = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
    if (lo(rnorm->y) < lo(out) + n * 4 && lo(out) < lo(rnorm->y) + n * 2)
      return reject(&g_last_error, op + ": y overlaps the residual; expected separate buffers");
  }
  if (norm && tiling) {
    if (const cudaError_t e = check_norm_tiling(*norm, *tiling); e != cudaSuccess) return e;
  }
  w4a16::DeviceLimits d;
  int dev = 0;
  if (const cudaError_t e = device_limits(&d, &dev); e != cudaSuccess) return e;
  const int64_t extra = norm ? w4a16::kNormScratchBytes : 0;
  if (tiling) {
    if (!w4a16::tiling_is_valid(*tiling, M, N, K, group, d, &g_last_error)) return cudaErrorInvalidValue;
    if (w4a16::smem_layout(*tiling, K, group).total + extra > d.smem_per_block)
      return reject(&g_last_error, std::string(norm ? norm->op : "gemm_w4a16") +
                                       ": the tiling and the norm scratch need more shared memory than the device's " +
                                       std::to_string(d.smem_per_block) + " bytes");
    return launch(*tiling, d, dev, ep, x, w_packed, scales, out, M, N, K, group, scale_type, workspace,
                  workspace_bytes, stream, qkv, norm, norm_out, rnorm);
  }
  Tiling t = library_tiling(M, N, K, group, d);
  if (norm && t.wgmma) {
    // The norm prologue exists on the swapped mma.sync path only: a table entry on the warpgroup path gives way to
    // the default tiling (gemm_w4a16_workspace_bytes covers both).
    t = cached_tiling(M, N, K, group, d, w4a16::V4Config{});
    t.variant = w4a16::Variant::v4;
  }
  if (norm) {
    if (const cudaError_t e = check_norm_tiling(*norm, t); e != cudaSuccess) return e;
  }
  const int64_t smem = w4a16::smem_layout(t, K, group).total + extra;
  if (smem > d.smem_per_block) {
    return reject(&g_last_error, "gemm_w4a16: the chosen tiling needs " + std::to_string(smem) +
                                     " bytes of shared memory, the device allows " + std::to_string(d.smem_per_block));
  }
  return launch(t, d, dev, ep, x, w_packed, scales, out, M, N, K, group, scale_type, workspace, workspace_bytes,
                stream, qkv, norm, norm_out, rnorm);
}

constexpr const char* kQkvOp = "gemm_w4a16_qkv_rope_append";

// gemm_w4a16_qkv_rope_append and its explicit-tiling twin: the combined shape check, qkv_rope_kv_append's argument
// checks (messages naming this op), then run() with the QKV epilogue.
// With norm (gemm_w4a16_rmsnorm_qkv_rope_append), messages name norm->op instead.
cudaError_t run_qkv(const Tiling* tiling, const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales,
                    int M, int K, int group, formats::ScaleType scale_type, void* workspace, size_t workspace_bytes,
                    formats::KvFormat format, __nv_bfloat16* qkv, int n_heads, int n_kv_heads, int head_dim,
                    const int32_t* positions, const float* inv_freq, const int32_t* row_page,
                    const int32_t* row_slot, const uint16_t* key_anchors, const int32_t* row_anchor,
                    uint8_t* kv_pool, int hadamard_block, __nv_bfloat16* q_out, cudaStream_t stream,
                    const NormPrologue* norm = nullptr, uint32_t* head_counters = nullptr) {
  g_last_error.clear();
  const char* const op = norm ? norm->op : kQkvOp;
  if (gemm_w4a16_qkv_rope_append_can_implement(M, K, group, scale_type, format, n_heads, n_kv_heads, head_dim,
                                               hadamard_block, &g_last_error) != cudaSuccess) {
    // Its messages begin with kQkvOp's name.
    if (norm) g_last_error = op + g_last_error.substr(std::string_view(kQkvOp).size());
    return cudaErrorInvalidValue;
  }
  QkvEpilogue q{};
  q.format = format;
  if (head_counters != nullptr && !aligned(head_counters, 4))
    return reject(&g_last_error, std::string(op) + ": head_counters must be 4-byte aligned");
  q.head_counters = head_counters;
  if (const cudaError_t e = fused::make_qkv_args(op, true, format, qkv, M, n_heads, n_kv_heads, head_dim, positions,
                                                 inv_freq, row_page, row_slot, key_anchors, row_anchor, kv_pool,
                                                 hadamard_block, q_out, &q.args, &g_last_error);
      e != cudaSuccess)
    return e;
  // The reduce stores BF16 pairs into qkv (gemm_w4a16's y rule): 4-byte alignment, checked again by run().
  if (!aligned(qkv, 4)) return reject(&g_last_error, std::string(op) + ": qkv must be 4-byte aligned");
  return run(tiling, w4a16::Epilogue::store_bf16, x, w_packed, scales, qkv, M, q.args.row_width, K, group, scale_type,
             workspace, workspace_bytes, stream, &q, norm);
}

constexpr const char* kNormOp = "gemm_w4a16_rmsnorm";
constexpr const char* kNormSwiGluOp = "gemm_w4a16_rmsnorm_swiglu";
constexpr const char* kNormQkvOp = "gemm_w4a16_rmsnorm_qkv_rope_append";

}  // namespace

w4a16::Variant gemm_w4a16_variant_for(int M) {
  switch (env_variant()) {
    case EnvVariant::v2: return w4a16::Variant::v2;
    case EnvVariant::v4: return w4a16::Variant::v4;
    default: return w4a16::choose_variant(M, env_v4_config().swap32, env_v4_config().wgmma || wg32_range(M));
  }
}

cudaError_t gemm_w4a16_can_implement(int M, int N, int K, int group, formats::ScaleType scale_type, std::string* why) {
  using std::to_string;
  if (M < 1 || M > kW4A16MaxM) return reject(why, "gemm_w4a16: M = " + to_string(M) + " rows, expected 1..64");
  if (group != 32 && group != 64 && group != 128)
    return reject(why, "gemm_w4a16: group size " + to_string(group) + " is not supported (expected 32, 64 or 128)");
  if (scale_type != formats::ScaleType::F16 && scale_type != formats::ScaleType::BF16)
    return reject(why, "gemm_w4a16: scale type must be FP16 or BF16");
  if (N < kW4A16TileN || N > kW4A16MaxDim || N % kW4A16TileN != 0)
    return reject(why, "gemm_w4a16: N = " + to_string(N) + " output columns, expected a positive multiple of " +
                           to_string(kW4A16TileN) + " up to " + to_string(kW4A16MaxDim));
  if (K < group || K > kW4A16MaxDim || K % group != 0 || K % kW4A16TileK != 0)
    return reject(why, "gemm_w4a16: K = " + to_string(K) + " input columns, expected a positive multiple of the " +
                           "group size " + to_string(group) + " and of " + to_string(kW4A16TileK) + " up to " +
                           to_string(kW4A16MaxDim));
  const w4a16::DeviceLimits hopper;
  const Tiling t = cached_tiling(M, N, K, group, hopper, w4a16::V4Config{});
  const int64_t smem = w4a16::smem_layout(t, K, group).total;
  if (smem > hopper.smem_per_block)
    return reject(why, "gemm_w4a16: K = " + to_string(K) + " is too long for M = " + to_string(M) +
                           ": the activations of one K slice need " + to_string(smem) + " bytes of shared memory");
  if (why) why->clear();
  return cudaSuccess;
}

size_t gemm_w4a16_workspace_bytes(int M, int N, int K) {
  w4a16::DeviceLimits d;
  if (device_limits(&d) != cudaSuccess) {
    cudaGetLastError();  // a missing device is answered with 0, not left as a sticky error
    return 0;
  }
  size_t bytes = 0;
  for (int group : {32, 64, 128}) {
    if (gemm_w4a16_can_implement(M, N, K, group, formats::ScaleType::BF16, nullptr) != cudaSuccess) continue;
    const Tiling t = library_tiling(M, N, K, group, d);
    bytes = std::max(bytes, static_cast<size_t>(w4a16::workspace_bytes_for(t, M, N)));
    // The default tiling too: the norm prologue falls back to it where the library's is on the warpgroup path.
    const Tiling def = cached_tiling(M, N, K, group, d, w4a16::V4Config{});
    bytes = std::max(bytes, static_cast<size_t>(w4a16::workspace_bytes_for(def, M, N)));
  }
  return bytes;
}

const char* gemm_w4a16_last_error() { return g_last_error.c_str(); }

cudaError_t gemm_w4a16_plan(int M, int N, int K, int group, formats::ScaleType scale_type, Tiling* tiling) {
  if (gemm_w4a16_can_implement(M, N, K, group, scale_type, nullptr) != cudaSuccess) return cudaErrorInvalidValue;
  w4a16::DeviceLimits d;
  if (const cudaError_t e = device_limits(&d); e != cudaSuccess) return e;
  *tiling = library_tiling(M, N, K, group, d);
  return cudaSuccess;
}

cudaError_t gemm_w4a16_plan_config(int M, int N, int K, int group, formats::ScaleType scale_type,
                                   const w4a16::V4Config& config, Tiling* tiling) {
  if (gemm_w4a16_can_implement(M, N, K, group, scale_type, nullptr) != cudaSuccess) return cudaErrorInvalidValue;
  w4a16::DeviceLimits d;
  if (const cudaError_t e = device_limits(&d); e != cudaSuccess) return e;
  Tiling t = cached_tiling(M, N, K, group, d, config);
  t.variant = w4a16::Variant::v4;
  if (!w4a16::tiling_is_valid(t, M, N, K, group, d, nullptr)) return cudaErrorInvalidValue;
  *tiling = t;
  return cudaSuccess;
}

cudaError_t gemm_w4a16(const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales, __nv_bfloat16* y,
                       int M, int N, int K, int group, formats::ScaleType scale_type, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
  return run(nullptr, w4a16::Epilogue::store_bf16, x, w_packed, scales, y, M, N, K, group, scale_type, workspace,
             workspace_bytes, stream);
}

cudaError_t gemm_w4a16_residual(const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales,
                                float* residual, int M, int N, int K, int group, formats::ScaleType scale_type,
                                void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return run(nullptr, w4a16::Epilogue::residual_f32, x, w_packed, scales, residual, M, N, K, group, scale_type,
             workspace, workspace_bytes, stream);
}

cudaError_t gemm_w4a16_residual_rmsnorm(const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales,
                                        float* residual, int M, int N, int K, int group, formats::ScaleType scale_type,
                                        const float* norm_weight, float eps, __nv_bfloat16* y, void* workspace,
                                        size_t workspace_bytes, cudaStream_t stream) {
  const ResidualNorm rn{norm_weight, y, eps};
  return run(nullptr, w4a16::Epilogue::residual_f32, x, w_packed, scales, residual, M, N, K, group, scale_type,
             workspace, workspace_bytes, stream, nullptr, nullptr, nullptr, &rn);
}

cudaError_t gemm_w4a16_residual_rmsnorm_with_tiling(const Tiling& tiling, const __nv_bfloat16* x,
                                                    const uint32_t* w_packed, const uint16_t* scales, float* residual,
                                                    int M, int N, int K, int group, formats::ScaleType scale_type,
                                                    const float* norm_weight, float eps, __nv_bfloat16* y,
                                                    void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const ResidualNorm rn{norm_weight, y, eps};
  return run(&tiling, w4a16::Epilogue::residual_f32, x, w_packed, scales, residual, M, N, K, group, scale_type,
             workspace, workspace_bytes, stream, nullptr, nullptr, nullptr, &rn);
}

int gemm_w4a16_norm_partials_per_row(int K) {
  return K >= 4 && K % 4 == 0 ? ops::rmsnorm_threads(K, true) / w4a16::kWarpSize : 0;
}

cudaError_t gemm_w4a16_residual_norm_partials(const __nv_bfloat16* x, const uint32_t* w_packed,
                                              const uint16_t* scales, float* residual, float* norm_partials, int M,
                                              int N, int K, int group, formats::ScaleType scale_type, void* workspace,
                                              size_t workspace_bytes, cudaStream_t stream) {
  if (norm_partials == nullptr) {
    g_last_error = "gemm_w4a16_residual_norm_partials: norm_partials must be non-null";
    return cudaErrorInvalidValue;
  }
  return run(nullptr, w4a16::Epilogue::residual_f32, x, w_packed, scales, residual, M, N, K, group, scale_type,
             workspace, workspace_bytes, stream, nullptr, nullptr, norm_partials);
}

cudaError_t gemm_w4a16_swiglu(const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales,
                              __nv_bfloat16* h, int M, int N, int K, int group, formats::ScaleType scale_type,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return run(nullptr, w4a16::Epilogue::swiglu_bf16, x, w_packed, scales, h, M, N, K, group, scale_type, workspace,
             workspace_bytes, stream);
}

cudaError_t gemm_w4a16_with_tiling(const Tiling& tiling, const __nv_bfloat16* x, const uint32_t* w_packed,
                                   const uint16_t* scales, __nv_bfloat16* y, int M, int N, int K, int group,
                                   formats::ScaleType scale_type, void* workspace, size_t workspace_bytes,
                                   cudaStream_t stream) {
  return run(&tiling, w4a16::Epilogue::store_bf16, x, w_packed, scales, y, M, N, K, group, scale_type, workspace,
             workspace_bytes, stream);
}

cudaError_t gemm_w4a16_epilogue_with_tiling(const Tiling& tiling, w4a16::Epilogue epilogue, const __nv_bfloat16* x,
                                            const uint32_t* w_packed, const uint16_t* scales, void* out, int M, int N,
                                            int K, int group, formats::ScaleType scale_type, void* workspace,
                                            size_t workspace_bytes, cudaStream_t stream, float* norm_partials) {
  return run(&tiling, epilogue, x, w_packed, scales, out, M, N, K, group, scale_type, workspace, workspace_bytes,
             stream, nullptr, nullptr, norm_partials);
}

cudaError_t gemm_w4a16_qkv_rope_append_can_implement(int M, int K, int group, formats::ScaleType scale_type,
                                                     formats::KvFormat format, int n_heads, int n_kv_heads,
                                                     int head_dim, int hadamard_block, std::string* why) {
  std::string w;
  if (qkv_rope_kv_append_can_implement(format, M, n_heads, n_kv_heads, head_dim, hadamard_block, &w) != cudaSuccess)
    return reject(why, kQkvOp + w.substr(w.find(':')));
  const int64_t N = (int64_t{n_heads} + 2 * int64_t{n_kv_heads}) * head_dim;
  const std::string n_text = std::string(kQkvOp) + ": the qkv width (n_heads + 2 n_kv_heads) * head_dim = (" +
                             std::to_string(n_heads) + " + 2 * " + std::to_string(n_kv_heads) + ") * " +
                             std::to_string(head_dim) + " = " + std::to_string(N);
  if (N > kW4A16MaxDim) return reject(why, n_text + " exceeds the W4A16 GEMM's " + std::to_string(kW4A16MaxDim));
  if (gemm_w4a16_can_implement(M, static_cast<int>(N), K, group, scale_type, &w) != cudaSuccess)
    return reject(why, n_text + " as N: " + w);
  if (why) why->clear();
  return cudaSuccess;
}

bool gemm_w4a16_splits_k(int M, int N, int K, int group) {
  if (gemm_w4a16_can_implement(M, N, K, group, formats::ScaleType::BF16, nullptr) != cudaSuccess) return false;
  w4a16::DeviceLimits d;
  if (device_limits(&d) != cudaSuccess) {
    cudaGetLastError();  // a missing device is answered with false, not left as a sticky error
    return false;
  }
  return library_tiling(M, N, K, group, d).splits > 1;
}

cudaError_t gemm_w4a16_qkv_rope_append(const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales,
                                       int M, int K, int group, formats::ScaleType scale_type, void* workspace,
                                       size_t workspace_bytes, formats::KvFormat format, __nv_bfloat16* qkv,
                                       int n_heads, int n_kv_heads, int head_dim, const int32_t* positions,
                                       const float* inv_freq, const int32_t* row_page, const int32_t* row_slot,
                                       const uint16_t* key_anchors, const int32_t* row_anchor, uint8_t* kv_pool,
                                       int hadamard_block, __nv_bfloat16* q_out, cudaStream_t stream,
                                       uint32_t* head_counters) {
  return run_qkv(nullptr, x, w_packed, scales, M, K, group, scale_type, workspace, workspace_bytes, format, qkv,
                 n_heads, n_kv_heads, head_dim, positions, inv_freq, row_page, row_slot, key_anchors, row_anchor,
                 kv_pool, hadamard_block, q_out, stream, nullptr, head_counters);
}

bool w4a16_qkv_tail_applies(const Tiling& t, int M, int K, int group, formats::KvFormat format, int head_dim,
                            bool f16_scales, const w4a16::DeviceLimits& limits) {
  if (format != formats::KvFormat::INT4 && format != formats::KvFormat::INT4_HADAMARD) return false;
  static_assert(w4a16::kQkvTailHeadDim == fused::kQuadHeadDim, "the tail runs the lane code of 128-channel heads");
  if (head_dim != w4a16::kQkvTailHeadDim || M < 1 || M > w4a16::kQkvTailMaxRows || t.splits != 1) return false;
  if (!w4a16::qkv_tail_columns_ok(t.warps_n)) return false;
  if (w4a16::smem_layout(t, K, group).total + w4a16::kQkvTailScratchBytes > limits.smem_per_block) return false;
  return w4a16::v4_qkv_tail_kernel_any(t, f16_scales) != nullptr;
}

bool gemm_w4a16_qkv_prologue_in_tail(int M, int K, int group, formats::ScaleType scale_type, formats::KvFormat format,
                                     int n_heads, int n_kv_heads, int head_dim) {
  if (gemm_w4a16_qkv_rope_append_can_implement(M, K, group, scale_type, format, n_heads, n_kv_heads, head_dim, 0,
                                               nullptr) != cudaSuccess)
    return false;
  w4a16::DeviceLimits d;
  if (device_limits(&d) != cudaSuccess) {
    cudaGetLastError();  // a missing device is answered with false, not left as a sticky error
    return false;
  }
  const int N = (n_heads + 2 * n_kv_heads) * head_dim;
  return w4a16_qkv_tail_applies(library_tiling(M, N, K, group, d), M, K, group, format, head_dim,
                                scale_type == formats::ScaleType::F16, d);
}

cudaError_t gemm_w4a16_qkv_rope_append_with_tiling(
    const Tiling& tiling, const __nv_bfloat16* x, const uint32_t* w_packed, const uint16_t* scales, int M, int K,
    int group, formats::ScaleType scale_type, void* workspace, size_t workspace_bytes, formats::KvFormat format,
    __nv_bfloat16* qkv, int n_heads, int n_kv_heads, int head_dim, const int32_t* positions, const float* inv_freq,
    const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors, const int32_t* row_anchor,
    uint8_t* kv_pool, int hadamard_block, __nv_bfloat16* q_out, cudaStream_t stream, uint32_t* head_counters) {
  return run_qkv(&tiling, x, w_packed, scales, M, K, group, scale_type, workspace, workspace_bytes, format, qkv,
                 n_heads, n_kv_heads, head_dim, positions, inv_freq, row_page, row_slot, key_anchors, row_anchor,
                 kv_pool, hadamard_block, q_out, stream, nullptr, head_counters);
}

cudaError_t gemm_w4a16_rmsnorm_can_implement(int M, int N, int K, int group, formats::ScaleType scale_type,
                                             std::string* why) {
  using std::to_string;
  if (gemm_w4a16_can_implement(M, N, K, group, scale_type, why) != cudaSuccess) return cudaErrorInvalidValue;
  if (M > w4a16::kNormMaxRows)
    return reject(why, std::string(kNormOp) + ": M = " + to_string(M) + " rows, expected 1.." +
                           to_string(w4a16::kNormMaxRows) + " (the norm prologue runs on the swapped M <= " +
                           to_string(w4a16::kNormMaxRows) + " path)");
  if (gemm_w4a16_variant_for(M) != w4a16::Variant::v4)
    return reject(why, std::string(kNormOp) + ": FT_W4A16_VARIANT=v2 is set; the norm prologue exists in v4 only");
  const w4a16::DeviceLimits hopper;
  const Tiling t = cached_tiling(M, N, K, group, hopper, w4a16::V4Config{});
  const int64_t smem = w4a16::smem_layout(t, K, group).total + w4a16::kNormScratchBytes;
  if (smem > hopper.smem_per_block)
    return reject(why, std::string(kNormOp) + ": K = " + to_string(K) + " is too long for M = " + to_string(M) +
                           ": one K slice and the norm scratch need " + to_string(smem) + " bytes of shared memory");
  if (why) why->clear();
  return cudaSuccess;
}

cudaError_t gemm_w4a16_rmsnorm(const float* x, const float* norm_weight, float eps, const uint32_t* w_packed,
                               const uint16_t* scales, __nv_bfloat16* y, int M, int N, int K, int group,
                               formats::ScaleType scale_type, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream, const float* norm_partials) {
  const NormPrologue norm{x, norm_weight, eps, kNormOp, norm_partials};
  return run(nullptr, w4a16::Epilogue::store_bf16, nullptr, w_packed, scales, y, M, N, K, group, scale_type, workspace,
             workspace_bytes, stream, nullptr, &norm);
}

cudaError_t gemm_w4a16_rmsnorm_swiglu(const float* x, const float* norm_weight, float eps, const uint32_t* w_packed,
                                      const uint16_t* scales, __nv_bfloat16* h, int M, int N, int K, int group,
                                      formats::ScaleType scale_type, void* workspace, size_t workspace_bytes,
                                      cudaStream_t stream, const float* norm_partials) {
  const NormPrologue norm{x, norm_weight, eps, kNormSwiGluOp, norm_partials};
  return run(nullptr, w4a16::Epilogue::swiglu_bf16, nullptr, w_packed, scales, h, M, N, K, group, scale_type,
             workspace, workspace_bytes, stream, nullptr, &norm);
}

cudaError_t gemm_w4a16_rmsnorm_qkv_rope_append(
    const float* x, const float* norm_weight, float eps, const uint32_t* w_packed, const uint16_t* scales, int M,
    int K, int group, formats::ScaleType scale_type, void* workspace, size_t workspace_bytes, formats::KvFormat format,
    __nv_bfloat16* qkv, int n_heads, int n_kv_heads, int head_dim, const int32_t* positions, const float* inv_freq,
    const int32_t* row_page, const int32_t* row_slot, const uint16_t* key_anchors, const int32_t* row_anchor,
    uint8_t* kv_pool, int hadamard_block, __nv_bfloat16* q_out, cudaStream_t stream, const float* norm_partials) {
  const NormPrologue norm{x, norm_weight, eps, kNormQkvOp, norm_partials};
  return run_qkv(nullptr, nullptr, w_packed, scales, M, K, group, scale_type, workspace, workspace_bytes, format, qkv,
                 n_heads, n_kv_heads, head_dim, positions, inv_freq, row_page, row_slot, key_anchors, row_anchor,
                 kv_pool, hadamard_block, q_out, stream, &norm);
}

cudaError_t gemm_w4a16_rmsnorm_epilogue_with_tiling(const Tiling& tiling, w4a16::Epilogue epilogue, const float* x,
                                                    const float* norm_weight, float eps, const uint32_t* w_packed,
                                                    const uint16_t* scales, void* out, int M, int N, int K, int group,
                                                    formats::ScaleType scale_type, void* workspace,
                                                    size_t workspace_bytes, cudaStream_t stream,
                                                    const float* norm_partials) {
  const NormPrologue norm{x, norm_weight, eps, kNormOp, norm_partials};
  return run(&tiling, epilogue, nullptr, w_packed, scales, out, M, N, K, group, scale_type, workspace, workspace_bytes,
             stream, nullptr, &norm);
}

cudaError_t gemm_w4a16_rmsnorm_qkv_rope_append_with_tiling(
    const Tiling& tiling, const float* x, const float* norm_weight, float eps, const uint32_t* w_packed,
    const uint16_t* scales, int M, int K, int group, formats::ScaleType scale_type, void* workspace,
    size_t workspace_bytes, formats::KvFormat format, __nv_bfloat16* qkv, int n_heads, int n_kv_heads, int head_dim,
    const int32_t* positions, const float* inv_freq, const int32_t* row_page, const int32_t* row_slot,
    const uint16_t* key_anchors, const int32_t* row_anchor, uint8_t* kv_pool, int hadamard_block,
    __nv_bfloat16* q_out, cudaStream_t stream, const float* norm_partials) {
  const NormPrologue norm{x, norm_weight, eps, kNormQkvOp, norm_partials};
  return run_qkv(&tiling, nullptr, w_packed, scales, M, K, group, scale_type, workspace, workspace_bytes, format, qkv,
                 n_heads, n_kv_heads, head_dim, positions, inv_freq, row_page, row_slot, key_anchors, row_anchor,
                 kv_pool, hadamard_block, q_out, stream, &norm);
}


bool gemm_w4a16_cluster_reduce() {
  static const bool env = [] {
    const char* v = std::getenv("FT_W4A16_CLUSTER_REDUCE");
    return v == nullptr || v[0] != '0';
  }();
  const int o = g_cluster_reduce_override.load();
  return o >= 0 ? o == 1 : env;
}

void set_gemm_w4a16_cluster_reduce(int on) { g_cluster_reduce_override.store(on < 0 ? -1 : (on ? 1 : 0)); }

namespace {
// The limits FT_W4A16_CLUSTER_MAX_ROWS / FT_W4A16_CLUSTER_MAX_SPLITS or set_gemm_w4a16_cluster_limits chose; rows -1
// where neither chose them.
void cluster_limits_chosen(int* max_rows, int* max_splits) {
  auto env_int = [](const char* name, int lo, int hi, int fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || v[0] == '\0') return fallback;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    return *end == '\0' && x >= lo && x <= hi ? static_cast<int>(x) : fallback;
  };
  static const int env_rows =
      env_int("FT_W4A16_CLUSTER_MAX_ROWS", w4a16::kClusterMaxRows, w4a16::kClusterLimitRows, 0);
  static const int env_splits =
      env_int("FT_W4A16_CLUSTER_MAX_SPLITS", 2, w4a16::kClusterLimitSplits, w4a16::kMaxClusterSplits);
  const int r = g_cluster_rows_override.load(), s = g_cluster_splits_override.load();
  *max_rows = r > 0 ? r : env_rows > 0 ? env_rows : -1;
  *max_splits = s > 0 ? s : env_splits;
}
}  // namespace

void gemm_w4a16_cluster_limits(int* max_rows, int* max_splits) {
  cluster_limits_chosen(max_rows, max_splits);
  if (*max_rows < 0) *max_rows = w4a16::kClusterMaxRows;
}

int gemm_w4a16_cluster_rows_for(int N, int K, int group, const w4a16::DeviceLimits& d) {
  int rows = 0, splits = 0;
  cluster_limits_chosen(&rows, &splits);
  if (rows > 0) return rows;
  // FT_W4A16_CLUSTER_ROWS_EXTRA (in-step screens of one shape).
  static const std::vector<w4a16::ClusterRowsEntry> extra =
      env_entries("FT_W4A16_CLUSTER_ROWS_EXTRA", w4a16::parse_cluster_rows_extra);
  for (const w4a16::ClusterRowsEntry& e : extra)
    if (e.N == N && e.K == K) return e.max_rows;
  return tuned_table_on() ? w4a16::tuned_cluster_max_rows(N, K, group, d) : w4a16::kClusterMaxRows;
}

void set_gemm_w4a16_cluster_limits(int max_rows, int max_splits) {
  g_cluster_rows_override.store(max_rows > 0 ? std::min(max_rows, w4a16::kClusterLimitRows) : 0);
  g_cluster_splits_override.store(max_splits > 0 ? std::min(max_splits, w4a16::kClusterLimitSplits) : 0);
}

}  // namespace futransformer::cuda
