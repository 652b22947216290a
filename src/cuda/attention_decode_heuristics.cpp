// Split choice for the paged decode attention: how many CTAs share one (sequence, KV head).
//
// Occupancy rule (PlanModel::kOccupancy, the default):
//   splits = clamp(min(floor(kTargetCtasPerSm * SMs / (batch * KV heads)), kMaxPlanSplits,
//                      tiles / (warps * kMinTilesPerWarp)),
//                  1, min(tiles, kMaxSplits))
// Measured on the H200 by
//   bench_attention_decode --sweep-splits 1,2,3,4,6,8,12,16   (docs/results/bench_attention_decode-v10-splits.json)
// over the 8B attention (32 / 8 heads, head_dim 128, INT4 cache) at contexts 1k / 8k / 32k x batch 1 / 8 / 32: the
// best count follows the grid's occupancy, not the bytes in flight nor the per-warp walk. Batch 32 (256 CTAs
// unsplit) gains at most 2% from splitting: the SM's own throughput inside the kernel (~6.5 tiles of 16 tokens per
// us per SM) is the limit, and more warps only add the combine. The rule picks 8 / 4 / 1, 16 / 4 / 1, 16 / 4 / 1
// (batch 1 / 8 / 32 at 1k, 8k, 32k), within 1.02x of the best measured count in all nine rows (docs/kernels.md,
// "Split choice", has the table). That sweep, and every constant below, predates the thirty-fifth session's stage
// layout (stage_code_offset), which halved the copies' L2 requests and took batch 32 at 8k from ~180 to ~117 us on
// an H100: the "SM's own throughput" above was partly that request limit. The thirty-sixth session re-ran the sweep
// on an H100 (docs/results/v36/call1/sweep-splits.json): the rule's count was still the best or within 1.04x in all
// nine rows. In the whole step (scripts/sweep_decode_tilings.sh with FT_ATTN_DECODE_SPLITS, docs/results.md
// "Thirty-sixth session") the one change that paid was rounding the CTA target down instead of to the nearest:
// 6 / 5 / 4 / 3 / 2 / 1 splits instead of 7 / 6 / 5 / 4 / 3 / 2 at batch 5 / 6 / 7 / 9 / 12-13 / 17-22 (8B,
// context 1024), -0.9 to -3.7 %, and -1.8 / -2.3 % for 70B at batch 17 / 20; unsplit at batch 14 and 16 (where floor
// still gives 2) was +0.9 / +1.4 % slower.
//
// DRAM model (PlanModel::kDram, the choice before; FT_ATTN_DECODE_MODEL=dram, kept for A/B runs), counted in
// DRAM-byte equivalents like the W4A16 GEMM's; the cheapest split count wins (ties: fewer):
//   - a CTA streams its split's tiles; while c CTAs are resident the DRAM delivers its full rate once c reaches
//     the saturating count (enough bytes in flight: kBytesInFlightPerSm per SM), proportionally less below;
//     so a wave of c CTAs costs bytes_per_cta * max(c, saturation);
//   - each wave adds a fixed ramp (pipeline fill: one DRAM latency);
//   - splitting adds the combine kernel (launch mostly hidden by programmatic dependent launch) and the fp32
//     partial outputs written and read back through L2.
// Sequences of one batch may differ in length; the plan is made for the longest (max_seq_len).
#include "cuda/attention_decode_heuristics.h"

#include <algorithm>
#include <atomic>
#include <cmath>
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

// --- Occupancy rule (the default); each constant measured on the H200 by the sweep above ---
// CTAs per SM over the whole grid: batch 8 (64 CTAs a split) is best at 4 splits at 8k and 32k (256 CTAs, ~2 per
// SM) and 1.01-1.12x slower at 6 (a third CTA per SM); batch 32 (256 CTAs unsplit, ~2 per SM) is best unsplit at
// 1k and 8k and within 2% of the best at 32k.
// The same target holds for 8-warp CTAs (cta_warps), measured in the whole decode step: aiming at one 8-warp CTA per
// SM instead (2 / 1 splits at batch 8 / 16, the best counts of their standalone sweep) made the 8B step 1.5 / 3.3 %
// slower than 4-warp CTAs, and 1.7 / 4.6 % slower than two 8-warp CTAs per SM (twenty-first session).
constexpr int kTargetCtasPerSm = 2;
// Splits at most: batch 1 (8 CTAs a split) gains 13% / 22% from 12 to 16 splits at 8k / 32k, while 18 / 19 (the
// DRAM model's choices in the same run) put a second CTA on some SMs and were 1.22-1.26x slower than 16.
constexpr int kMaxPlanSplits = 16;
// 16-token tiles each warp walks at least (a CTA's tiles go to its kWarps warps round-robin): batch 1 at 1k (64
// tiles) is best at 8 splits, 2 tiles a warp, and 1.07-1.08x slower at 12 and 16 (1-2 and 1 tile a warp): below
// two the ring's fill and the warps' merge are not amortised.
constexpr int kMinTilesPerWarp = 2;
// Warps per CTA (cta_warps): the INT4 head_dim 128 instances take 8-warp CTAs once one split's grid has at least this
// many CTAs. In the whole decode step (scripts/sweep_decode_tilings.sh, FT_ATTN_DECODE_WARPS=8 against 4, two
// alternating pairs; docs/results.md, twenty-first session) 8 warps gave 8B -0.2 / -1.4 / -0.6 % at batch 8 / 16 / 32
// (64 / 128 / 256 CTAs a split) and +1.3 % at batch 1, 70B -1.0 / -0.5 % at batch 8 / 32. There the attention copies
// its first tiles per warp before its griddepcontrol.wait (early copies: kStages - 1 = 4 a warp, 3 for 8 warps since
// the twenty-fourth session's pipelined loop), so 8 warps have more of the cache in flight (24 tiles against 16)
// while the kernel before runs. Alone and without early copies (bench_attention_decode) 8 warps were 1-10 %
// slower at batch 8-32: the rule follows the step. One rule for every launcher, so the fused-prologue, early-copy and
// plain launches keep the same bits. Lowered from 64 to 48 in the thirty-sixth session (8B step on an H100, context
// 1024, FT_ATTN_DECODE_WARPS=8 against the rule's 4, four alternating pairs): batch 6 / 7 (48 / 56 groups) -1.8 /
// -1.0 %, batch 4 / 5 (32 / 40) +0.2 / +1.2 %.
constexpr int64_t kEightWarpMinGroups = 48;

struct KernelShape {
  int stage_bytes, stages, smem, max_ctas_per_sm;  // the last: the register cap of __launch_bounds__
};

KernelShape kernel_shape(bool int4, int head_dim, int warps) {
  auto make = [](auto cta) {
    using Cta = decltype(cta);
    return KernelShape{Cta::Geo::kStageBytes, Cta::Geo::kStages, Cta::kSmemBytes, Cta::kMinCtasPerSm};
  };
  if (int4 && head_dim == 128) return warps == 8 ? make(CtaShape<true, 128, 8>{}) : make(CtaShape<true, 128>{});
  if (int4) return make(CtaShape<true, 64>{});
  return head_dim == 128 ? make(CtaShape<false, 128>{}) : make(CtaShape<false, 64>{});
}

// What the models need about one problem.
struct Problem {
  KernelShape k;
  int warps;  // per CTA (kWarps, or 8 for the INT4 head_dim 128 instances)
  int head_dim, batch, n_kv_heads, tiles;
  int ctas_per_sm;    // resident CTAs per SM (shared memory, then the register cap)
  int64_t cap;        // resident CTAs on the device
  double saturation;  // resident CTAs that saturate the DRAM
  int sm_count;
};

Problem make_problem(bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len, const DeviceLimits& d,
                     int warps) {
  Problem p{};
  p.warps = warps;
  p.k = kernel_shape(int4, head_dim, warps);
  p.head_dim = head_dim;
  p.batch = batch;
  p.n_kv_heads = n_kv_heads;
  p.tiles = std::max(1, tiles_for(max_seq_len));
  p.sm_count = d.sm_count;
  p.ctas_per_sm =
      static_cast<int>(std::clamp<int64_t>(d.smem_per_sm / (p.k.smem + kSmemReservePerCta), 1, p.k.max_ctas_per_sm));
  p.cap = int64_t{d.sm_count} * p.ctas_per_sm;
  const double in_flight_per_cta = static_cast<double>(p.warps) * (p.k.stages - 1) * p.k.stage_bytes;
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

Plan base_plan(const Problem& p) {
  Plan plan;
  plan.smem_bytes = p.k.smem;
  plan.ctas_per_sm = p.ctas_per_sm;
  plan.warps = p.warps;
  return plan;
}

// The DRAM model's choice: the cheapest split count.
Plan dram_plan(const Problem& p) {
  Plan best = base_plan(p);
  double best_cost = std::numeric_limits<double>::infinity();
  for (int splits = 1; splits <= max_splits(p); ++splits) {
    const double c = dram_cost_bytes(splits, p);
    if (c < best_cost) {  // strict: ties keep the fewer splits
      best_cost = c;
      best.splits = splits;
    }
  }
  best.model = PlanModel::kDram;
  return best;
}

// The occupancy rule's choice.
Plan occupancy_plan(const Problem& p) {
  Plan plan = base_plan(p);
  const double groups = static_cast<double>(p.batch) * p.n_kv_heads;  // CTAs of one split
  // Rounded down: a grid of more than kTargetCtasPerSm CTAs per SM puts a third CTA on some SMs, which then finish
  // last (thirty-sixth session: floor against round, 8B step, H100, -0.9 to -3.7 % wherever the two differ).
  const auto fill = static_cast<int64_t>(std::floor(kTargetCtasPerSm * static_cast<double>(p.sm_count) / groups));
  const int64_t walk = p.tiles / (p.warps * kMinTilesPerWarp);
  const int64_t s = std::min<int64_t>({fill, kMaxPlanSplits, walk});
  plan.splits = static_cast<int>(std::clamp<int64_t>(s, 1, max_splits(p)));
  plan.model = PlanModel::kOccupancy;
  return plan;
}

Plan best_plan(PlanModel model, const Problem& p) {
  return model == PlanModel::kDram ? dram_plan(p) : occupancy_plan(p);
}

// Process-wide knobs: an explicit set_* wins; otherwise the environment, read once.
constexpr int kUnset = -1;
std::atomic<int> g_forced_splits{kUnset};
std::atomic<int> g_model{kUnset};
std::atomic<int> g_forced_warps{kUnset};
std::atomic<int> g_cluster_splits{kUnset};

int env_forced_warps() {
  static const int v = [] {
    const char* e = std::getenv("FT_ATTN_DECODE_WARPS");
    if (e == nullptr || e[0] == '\0' || std::strcmp(e, "0") == 0) return 0;
    if (std::strcmp(e, "4") == 0) return 4;
    if (std::strcmp(e, "8") == 0) return 8;
    std::fprintf(stderr, "FT_ATTN_DECODE_WARPS='%s' is not 0 (the rule), 4 or 8; ignored\n", e);
    return 0;
  }();
  return v;
}

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

int env_cluster_splits() {
  static const int v = [] {
    const char* e = std::getenv("FT_ATTN_CLUSTER_COMBINE");
    if (e == nullptr || e[0] == '\0') return kDefaultClusterCombineSplits;
    char* end = nullptr;
    const long n = std::strtol(e, &end, 10);
    if (*end != '\0' || n < 0 || n > kMaxClusterCombineSplits) {
      std::fprintf(stderr, "FT_ATTN_CLUSTER_COMBINE='%s' is not a split count 0..%d; using %d\n", e,
                   kMaxClusterCombineSplits, kDefaultClusterCombineSplits);
      return kDefaultClusterCombineSplits;
    }
    return static_cast<int>(n);
  }();
  return v;
}

PlanModel env_model() {
  static const PlanModel m = [] {
    const char* e = std::getenv("FT_ATTN_DECODE_MODEL");
    if (e == nullptr || e[0] == '\0' || std::strcmp(e, "occupancy") == 0) return PlanModel::kOccupancy;
    if (std::strcmp(e, "dram") == 0) return PlanModel::kDram;
    std::fprintf(stderr, "FT_ATTN_DECODE_MODEL='%s' is not 'occupancy' or 'dram'; using occupancy\n", e);
    return PlanModel::kOccupancy;
  }();
  return m;
}

}  // namespace

const char* plan_model_name(PlanModel model) { return model == PlanModel::kDram ? "dram" : "occupancy"; }

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

int forced_warps() {
  const int v = g_forced_warps.load(std::memory_order_relaxed);
  return v == kUnset ? env_forced_warps() : v;
}

void set_forced_warps(int n) { g_forced_warps.store(n == 4 || n == 8 ? n : 0, std::memory_order_relaxed); }

int cluster_combine_splits() {
  const int v = g_cluster_splits.load(std::memory_order_relaxed);
  return v == kUnset ? env_cluster_splits() : v;
}

void set_cluster_combine_splits(int n) {
  g_cluster_splits.store(std::clamp(n, 0, kMaxClusterCombineSplits), std::memory_order_relaxed);
}

bool combines_in_cluster(int splits) { return splits >= 2 && splits <= cluster_combine_splits(); }

void reset_plan_knobs() {
  g_cluster_splits.store(kUnset, std::memory_order_relaxed);
  g_forced_splits.store(kUnset, std::memory_order_relaxed);
  g_model.store(kUnset, std::memory_order_relaxed);
  g_forced_warps.store(kUnset, std::memory_order_relaxed);
}

bool has_eight_warp_instances(bool int4, int head_dim) { return int4 && head_dim == 128; }

int cta_warps(bool int4, int head_dim, int batch, int n_kv_heads) {
  if (!has_eight_warp_instances(int4, head_dim)) return kWarps;
  if (const int forced = forced_warps(); forced > 0) return forced;
  return int64_t{batch} * n_kv_heads >= kEightWarpMinGroups ? 8 : kWarps;
}

int smem_bytes_for(bool int4, int head_dim, int warps) { return kernel_shape(int4, head_dim, warps).smem; }

Plan model_plan(PlanModel model, bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len,
                const DeviceLimits& d) {
  const int warps = cta_warps(int4, head_dim, batch, n_kv_heads);
  return best_plan(model, make_problem(int4, head_dim, batch, n_kv_heads, max_seq_len, d, warps));
}

Plan choose_plan(bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len, const DeviceLimits& d) {
  const int warps = cta_warps(int4, head_dim, batch, n_kv_heads);
  const Problem p = make_problem(int4, head_dim, batch, n_kv_heads, max_seq_len, d, warps);
  if (const int forced = forced_splits(); forced > 0) {
    Plan plan = base_plan(p);
    plan.splits = std::min(forced, max_splits(p));
    plan.forced = true;
    plan.model = plan_model();
    return plan;
  }
  return best_plan(plan_model(), p);
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
                "grid=%dx%dx%d warps=%d smem=%d B ctas/sm=%d combine=%s workspace=%lld B (sm=%d)",
                int4 ? "int4" : "bf16", batch, n_heads, n_kv_heads, head_dim, max_seq_len, p.splits,
                p.forced ? "forced" : plan_model_name(p.model), p.splits, n_kv_heads, batch, p.warps, p.smem_bytes,
                p.ctas_per_sm,
                p.splits == 1 ? "none" : (combines_in_cluster(p.splits) ? "cluster" : "kernel"),
                static_cast<long long>(workspace_bytes_for(p, batch, n_heads, head_dim)), d.sm_count);
  return buf;
}

}  // namespace futransformer::cuda::attn
