// Tile choice for the W4A16 GEMM. The kernel streams weights, so the choice is driven by a small model of a
// memory-bound launch, counted in DRAM-byte equivalents:
//   - a CTA streams bytes_per_cta = weight bytes / CTAs; while c CTAs are resident the DRAM delivers its full
//     rate once c >= kSaturatingCtasPerSm * SMs (enough bytes in flight), proportionally less below that;
//     so a wave of c CTAs costs bytes_per_cta * max(c, saturation);
//   - each wave adds a fixed ramp (pipeline fill: one DRAM latency);
//   - staged activations cost their L2 traffic at half weight (L2 is about twice as fast as DRAM);
//   - split-K adds the reduce kernel (launch mostly hidden by programmatic dependent launch) and the fp32
//     partial sums written and read back through L2.
// The constants are first estimates for H100/H200, to be calibrated with bench/bench_gemm_w4a16.
#include "cuda/gemm_w4a16_heuristics.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace futransformer::cuda::w4a16 {
namespace {

constexpr double kSaturatingCtasPerSm = 1.0;
constexpr double kWaveRampBytes = 2.0e6;     // ~0.5 us at 4 TB/s
constexpr double kReduceFixedBytes = 4.0e6;  // ~1 us: the reduce kernel's share of a decode step
constexpr double kL2Weight = 0.5;
constexpr int64_t kSmemReservePerCta = 1024;  // the driver keeps 1 KB per resident CTA

double cost(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& d, int64_t smem) {
  const int64_t n_blocks = N / (kBlockN * t.warps_n);
  const int64_t ctas = n_blocks * t.splits;
  const int64_t per_sm = std::min<int64_t>(d.smem_per_sm / (smem + kSmemReservePerCta), min_blocks_per_sm(t.m_tiles));
  const int64_t cap = int64_t{d.sm_count} * per_sm;
  const double sat = kSaturatingCtasPerSm * d.sm_count;
  const double weight_bytes = static_cast<double>(N) * K / 2 + static_cast<double>(N) * (K / group) * 2;
  const double per_cta = weight_bytes / static_cast<double>(ctas);
  const int64_t full = ctas / cap, rem = ctas % cap;
  double c = per_cta * (static_cast<double>(full) * std::max<double>(static_cast<double>(cap), sat) +
                        (rem > 0 ? std::max<double>(static_cast<double>(rem), sat) : 0.0));
  c += kWaveRampBytes * static_cast<double>(full + (rem > 0 ? 1 : 0));
  c += kL2Weight * static_cast<double>(n_blocks) * a_rows(t) * K * 2;
  if (t.splits > 1) c += kReduceFixedBytes + kL2Weight * 2.0 * static_cast<double>(workspace_bytes_for(t, M, N));
  return c;
}

}  // namespace

int64_t workspace_bytes_for(const Tiling& t, int M, int N) {
  return t.splits > 1 ? int64_t{t.splits} * M * N * 4 : 0;
}

Tiling choose_tiling(int M, int N, int K, int group, const DeviceLimits& d) {
  Tiling base;
  base.m_tiles = (M + 15) / 16;
  base.rows8 = M <= 8;
  const int64_t groups = K / group;
  Tiling best = base;
  double best_cost = std::numeric_limits<double>::infinity();
  bool found = false;
  for (int warps_n : {8, 4, 2, 1}) {
    if ((N / kBlockN) % warps_n != 0) continue;
    for (int splits = 1; splits <= std::min<int64_t>(groups, kMaxSplits); ++splits) {
      Tiling t = base;
      t.warps_n = warps_n;
      t.warps_k = kWarps / warps_n;
      t.splits = splits;
      const int64_t smem = smem_layout(t, K, group).total;
      if (smem > d.smem_per_block) continue;
      // Every warp should get at least one block of the shortest slice.
      const int64_t shortest_blocks = (groups / splits) * group / kBlockK;
      if (shortest_blocks < t.warps_k) continue;
      const double c = cost(t, M, N, K, group, d, smem);
      if (c < best_cost) {  // strict: ties keep the fewer splits / wider CTA found first
        best_cost = c;
        best = t;
        found = true;
      }
    }
  }
  if (!found) {
    // Either K has fewer blocks than a CTA has K warps (some warps idle), or no split makes the staged
    // activations fit (gemm_w4a16_can_implement rejects that case by checking the smem of this tiling).
    for (int warps_n : {8, 4, 2, 1}) {
      if ((N / kBlockN) % warps_n == 0) {
        best.warps_n = warps_n;
        break;
      }
    }
    best.warps_k = kWarps / best.warps_n;
    best.splits = static_cast<int>(std::min<int64_t>(groups, kMaxSplits));
    if (groups / best.splits * group / kBlockK < best.warps_k) best.splits = 1;
  }
  return best;
}

std::string describe_tiling(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& d) {
  const int64_t smem = smem_layout(t, K, group).total;
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "gemm_w4a16 M=%d N=%d K=%d group=%d: m_tiles=%d rows8=%d warps_n=%d warps_k=%d splits=%d "
                "grid=%dx%d smem=%lld B workspace=%lld B (sm=%d)",
                M, N, K, group, t.m_tiles, t.rows8 ? 1 : 0, t.warps_n, t.warps_k, t.splits,
                N / (kBlockN * t.warps_n), t.splits, static_cast<long long>(smem),
                static_cast<long long>(workspace_bytes_for(t, M, N)), d.sm_count);
  return buf;
}

}  // namespace futransformer::cuda::w4a16
