// Split choice for the paged decode attention. Two models of a launch with `splits` CTAs per (sequence, KV head):
//
// DRAM model (PlanModel::kDram, the choice before the latency model; FT_ATTN_DECODE_MODEL=dram), counted in
// DRAM-byte equivalents like the W4A16 GEMM's:
//   - a CTA streams its split's tiles; while c CTAs are resident the DRAM delivers its full rate once c reaches
//     the saturating count (enough bytes in flight: kBytesInFlightPerSm per SM), proportionally less below;
//     so a wave of c CTAs costs bytes_per_cta * max(c, saturation);
//   - each wave adds a fixed ramp (pipeline fill: one DRAM latency);
//   - splitting adds the combine kernel (launch mostly hidden by programmatic dependent launch) and the fp32
//     partial outputs written and read back through L2.
//
// Latency model (PlanModel::kLatency, the default), in microseconds: the slowest of three limits plus the combine.
//   - DRAM stream: the DRAM model's stream and ramp terms above, at kDramBytesPerUs;
//   - per-warp walk: a warp consumes its tiles one after another (wait for the stage, dequantise, two mma chains,
//     online softmax with shuffles), a dependent chain of ~kTileUs per tile that more resident warps overlap but
//     do not shorten. The H200 at batch 32, context 1024 and one split (256 CTAs, 16 tiles per warp, a third of
//     the CTA slots idle) ran at 1.34 of its 4.25 TB/s: this term, not the DRAM, set the time. So a launch costs
//     waves * (kWaveFixedUs + tiles_per_warp * t_tile), waves = ceil(CTAs / resident CTA slots);
//   - SM throughput: all warp-tiles of the launch over the SMs at kSmTilesPerUs each (the issue / tensor-pipe
//     roof once enough warps hide the chain's latency);
//   - combine (splits > 1): kCombineUs (launch and drain of the combine kernel, partly hidden by programmatic
//     dependent launch) plus its fp32 partials through L2.
// Sequences of one batch may differ in length; the plan is made for the longest (max_seq_len).
//
// The constants are estimates for the H200 (H100 is close), to be calibrated with
//   bench_attention_decode --sweep-splits 1,2,3,4,6,8,12,16
// which prints the measured and modelled microseconds of every forced split count side by side (docs/kernels.md,
// "Split choice", says which measurement fixes which constant).
#include "cuda/attention_decode_heuristics.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "cuda/attention_decode_layout.h"

namespace futransformer::cuda::attn {
namespace {

// --- DRAM model (unchanged, so FT_ATTN_DECODE_MODEL=dram reproduces the earlier choice) ---
constexpr double kBytesInFlightPerSm = 40.0 * 1024;
constexpr double kWaveRampBytes = 2.0e6;      // ~0.5 us at 4 TB/s
constexpr double kCombineFixedBytes = 3.0e6;  // ~0.7 us: the combine kernel's share of a decode step
constexpr double kL2Weight = 0.5;             // L2 traffic costs about half of DRAM traffic
constexpr int64_t kSmemReservePerCta = 1024;  // the driver keeps 1 KB per resident CTA

// --- Latency model: first estimates, to be calibrated from bench_attention_decode --sweep-splits on the H200 ---
// DRAM rate the byte terms above convert at (H200: 4.25 TB/s copy roof, ~4 TB/s reached by streaming kernels).
constexpr double kDramBytesPerUs = 4.0e6;
// Fitted to the four H200 points known before the sweep (INT4, head_dim 128, 8 KV heads, single-wave launches):
// batch 32 at contexts 1024 / 8192, one split: 29.8 / 158 us, so 1.15 us a tile (16 -> 128 tiles per warp) and
// ~10 us of intercept; batch 8 (4 splits, 4 tiles per warp) 15.8 us and batch 1 (16 splits, 1 tile) 10.7 us agree
// with that intercept. How it divides between kLaunchUs and kWaveFixedUs is a guess (no multi-wave point yet), and
// that division decides whether more waves of shorter walks pay: the sweep's batch 32 rows settle it.
//
// One 16-token tile of one warp, INT4 cache at head_dim 128, latency-bound.
constexpr double kTileUs = 1.15;
// BF16 tiles relative to INT4 ones at the same head_dim: no dequantisation, 3.4x the bytes through cp.async and
// ldmatrix. head_dim 64 halves every per-tile step (scaled by head_dim / 128).
constexpr double kBf16TileScale = 0.7;
// Per wave of CTAs: the ring's fill (every warp of the wave issues kStages - 1 tiles at once and waits for the
// first under that burst) and the cross-warp merge and store at the end.
constexpr double kWaveFixedUs = 6.0;
// Per launch, whatever the split: the launch gap and grid start seen by the bench's per-launch event pair. It
// never changes the choice; it makes the modelled time comparable with the measured one.
constexpr double kLaunchUs = 4.0;
// Warp-tiles one SM retires per microsecond once latency is hidden: ~370 instructions a tile (the 1.5 us a tile
// first estimated at ~1 IPC with 8 warps per SM) at ~2 IPC of 1.98 GHz.
constexpr double kSmTilesPerUs = 10.0;
// The combine kernel: ~2 us launch and drain, about half of it hidden behind the attention kernel by PDL.
constexpr double kCombineUs = 1.0;

struct KernelShape {
  int stage_bytes, stages, smem, max_ctas_per_sm;  // the last: the register cap of __launch_bounds__
};

KernelShape kernel_shape(bool int4, int head_dim) {
  auto make = [](auto geo) {
    using Geo = decltype(geo);
    return KernelShape{Geo::kStageBytes, Geo::kStages, Geo::kSmemBytes, Geo::kMinCtasPerSm};
  };
  if (int4) return head_dim == 128 ? make(Geometry<true, 128>{}) : make(Geometry<true, 64>{});
  return head_dim == 128 ? make(Geometry<false, 128>{}) : make(Geometry<false, 64>{});
}

// What both models need about one problem.
struct Problem {
  KernelShape k;
  bool int4;
  int head_dim, batch, n_kv_heads, tiles;
  int ctas_per_sm;    // resident CTAs per SM (shared memory, then the register cap)
  int64_t cap;        // resident CTAs on the device
  double saturation;  // resident CTAs that saturate the DRAM
  int sm_count;
};

Problem make_problem(bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len, const DeviceLimits& d) {
  Problem p{};
  p.k = kernel_shape(int4, head_dim);
  p.int4 = int4;
  p.head_dim = head_dim;
  p.batch = batch;
  p.n_kv_heads = n_kv_heads;
  p.tiles = std::max(1, tiles_for(max_seq_len));
  p.sm_count = d.sm_count;
  p.ctas_per_sm =
      static_cast<int>(std::clamp<int64_t>(d.smem_per_sm / (p.k.smem + kSmemReservePerCta), 1, p.k.max_ctas_per_sm));
  p.cap = int64_t{d.sm_count} * p.ctas_per_sm;
  const double in_flight_per_cta = static_cast<double>(kWarps) * (p.k.stages - 1) * p.k.stage_bytes;
  p.saturation = d.sm_count * std::max(1.0, kBytesInFlightPerSm / in_flight_per_cta);
  return p;
}

int max_splits(const Problem& p) { return std::min(p.tiles, kMaxSplits); }

// DRAM stream and per-wave ramps, in DRAM-byte equivalents.
double stream_bytes(int splits, const Problem& p) {
  const int64_t ctas = int64_t{p.batch} * p.n_kv_heads * splits;
  const double per_cta = static_cast<double>((p.tiles + splits - 1) / splits) * p.k.stage_bytes;
  const int64_t full = ctas / p.cap, rem = ctas % p.cap;
  double c = per_cta * (static_cast<double>(full) * std::max<double>(static_cast<double>(p.cap), p.saturation) +
                        (rem > 0 ? std::max<double>(static_cast<double>(rem), p.saturation) : 0.0));
  return c + kWaveRampBytes * static_cast<double>(full + (rem > 0 ? 1 : 0));
}

// The combine's fp32 partials (written by the attention kernel, read by the combine), weighted as L2 traffic.
double partials_bytes(int splits, const Problem& p) {
  if (splits == 1) return 0.0;
  const double partials = static_cast<double>(p.batch) * p.n_kv_heads * splits * kMaxGqa * (p.head_dim + 1) * 4.0;
  return kL2Weight * 2.0 * partials;
}

double dram_cost_bytes(int splits, const Problem& p) {
  return stream_bytes(splits, p) + (splits > 1 ? kCombineFixedBytes + partials_bytes(splits, p) : 0.0);
}

double latency_cost_us(int splits, const Problem& p) {
  const int64_t ctas = int64_t{p.batch} * p.n_kv_heads * splits;
  const int64_t waves = (ctas + p.cap - 1) / p.cap;
  const int tiles_per_cta = (p.tiles + splits - 1) / splits;
  const int tiles_per_warp = (tiles_per_cta + kWarps - 1) / kWarps;
  const double t_tile = kTileUs * p.head_dim / 128.0 * (p.int4 ? 1.0 : kBf16TileScale);
  const double walk = static_cast<double>(waves) * (kWaveFixedUs + tiles_per_warp * t_tile);
  // Every tile of every split is one warp-tile (split_range covers the sequence exactly).
  const double sm = static_cast<double>(p.batch) * p.n_kv_heads * p.tiles / (p.sm_count * kSmTilesPerUs);
  const double stream = stream_bytes(splits, p) / kDramBytesPerUs;
  const double combine = splits > 1 ? kCombineUs + partials_bytes(splits, p) / kDramBytesPerUs : 0.0;
  return kLaunchUs + std::max({stream, walk, sm}) + combine;
}

Plan base_plan(const Problem& p) {
  Plan plan;
  plan.smem_bytes = p.k.smem;
  plan.ctas_per_sm = p.ctas_per_sm;
  return plan;
}

Plan best_plan(PlanModel model, const Problem& p) {
  Plan best = base_plan(p);
  double best_cost = std::numeric_limits<double>::infinity();
  for (int splits = 1; splits <= max_splits(p); ++splits) {
    const double c = model == PlanModel::kDram ? dram_cost_bytes(splits, p) : latency_cost_us(splits, p);
    if (c < best_cost) {  // strict: ties keep the fewer splits
      best_cost = c;
      best.splits = splits;
    }
  }
  best.model = model;
  best.model_us = latency_cost_us(best.splits, p);
  return best;
}

// Process-wide knobs: an explicit set_* wins; otherwise the environment, read once.
constexpr int kUnset = -1;
std::atomic<int> g_forced_splits{kUnset};
std::atomic<int> g_model{kUnset};

int env_forced_splits() {
  static const int v = [] {
    const char* e = std::getenv("FT_ATTN_DECODE_SPLITS");
    if (e == nullptr || e[0] == '\0') return 0;
    char* end = nullptr;
    const long n = std::strtol(e, &end, 10);
    if (*end != '\0' || n < 0) {
      std::fprintf(stderr, "FT_ATTN_DECODE_SPLITS='%s' is not a count >= 0; ignored\n", e);
      return 0;
    }
    return static_cast<int>(std::min<long>(n, kMaxSplits));
  }();
  return v;
}

PlanModel env_model() {
  static const PlanModel m = [] {
    const char* e = std::getenv("FT_ATTN_DECODE_MODEL");
    if (e == nullptr || e[0] == '\0' || std::strcmp(e, "latency") == 0) return PlanModel::kLatency;
    if (std::strcmp(e, "dram") == 0) return PlanModel::kDram;
    std::fprintf(stderr, "FT_ATTN_DECODE_MODEL='%s' is not 'latency' or 'dram'; using latency\n", e);
    return PlanModel::kLatency;
  }();
  return m;
}

}  // namespace

const char* plan_model_name(PlanModel model) { return model == PlanModel::kDram ? "dram" : "latency"; }

int forced_splits() {
  const int v = g_forced_splits.load(std::memory_order_relaxed);
  return v == kUnset ? env_forced_splits() : v;
}

void set_forced_splits(int n) { g_forced_splits.store(std::max(0, n), std::memory_order_relaxed); }

PlanModel plan_model() {
  const int v = g_model.load(std::memory_order_relaxed);
  return v == kUnset ? env_model() : static_cast<PlanModel>(v);
}

void set_plan_model(PlanModel model) { g_model.store(static_cast<int>(model), std::memory_order_relaxed); }

void reset_plan_knobs() {
  g_forced_splits.store(kUnset, std::memory_order_relaxed);
  g_model.store(kUnset, std::memory_order_relaxed);
}

int smem_bytes_for(bool int4, int head_dim) { return kernel_shape(int4, head_dim).smem; }

Plan model_plan(PlanModel model, bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len,
                const DeviceLimits& d) {
  return best_plan(model, make_problem(int4, head_dim, batch, n_kv_heads, max_seq_len, d));
}

Plan choose_plan(bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len, const DeviceLimits& d) {
  const Problem p = make_problem(int4, head_dim, batch, n_kv_heads, max_seq_len, d);
  if (const int forced = forced_splits(); forced > 0) {
    Plan plan = base_plan(p);
    plan.splits = std::min(forced, max_splits(p));
    plan.forced = true;
    plan.model = plan_model();
    plan.model_us = latency_cost_us(plan.splits, p);
    return plan;
  }
  return best_plan(plan_model(), p);
}

double modelled_us(int splits, bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len,
                   const DeviceLimits& d) {
  const Problem p = make_problem(int4, head_dim, batch, n_kv_heads, max_seq_len, d);
  return latency_cost_us(std::clamp(splits, 1, max_splits(p)), p);
}

int64_t workspace_lse_offset(const Plan& p, int batch, int n_heads, int head_dim) {
  return p.splits > 1 ? int64_t{batch} * n_heads * p.splits * head_dim * 4 : 0;
}

int64_t workspace_bytes_for(const Plan& p, int batch, int n_heads, int head_dim) {
  if (p.splits == 1) return 0;
  return workspace_lse_offset(p, batch, n_heads, head_dim) + int64_t{batch} * n_heads * p.splits * 4;
}

std::string describe_plan(const Plan& p, bool int4, int head_dim, int batch, int n_heads, int n_kv_heads,
                          int max_seq_len, const DeviceLimits& d) {
  char buf[384];
  std::snprintf(buf, sizeof(buf),
                "attention_decode %s B=%d heads=%d kv_heads=%d head_dim=%d max_seq_len=%d: splits=%d (%s) "
                "grid=%dx%dx%d smem=%d B ctas/sm=%d workspace=%lld B model=%.1f us (sm=%d)",
                int4 ? "int4" : "bf16", batch, n_heads, n_kv_heads, head_dim, max_seq_len, p.splits,
                p.forced ? "forced" : plan_model_name(p.model), p.splits, n_kv_heads, batch, p.smem_bytes,
                p.ctas_per_sm, static_cast<long long>(workspace_bytes_for(p, batch, n_heads, head_dim)), p.model_us,
                d.sm_count);
  return buf;
}

}  // namespace futransformer::cuda::attn
