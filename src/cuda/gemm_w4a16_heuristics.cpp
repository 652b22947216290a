// Tile choice for the W4A16 GEMM. The kernel streams weights, so the choice is driven by a small model of a
// memory-bound launch, in microseconds (docs/notes/w4a16-tuning.md derives it):
//   - a wave of c resident CTAs, each streaming B bytes with F bytes in flight, runs at
//     min(DRAM bandwidth, c * F / latency) (Little's law), i.e. takes max(c * B / BW, B * latency / F);
//   - each wave adds one DRAM latency of pipeline fill;
//   - staged activations are read from L2 by every CTA (at about twice the DRAM rate);
//   - split-K adds the reduce kernel (a dependent launch: about one grid drain plus its fp32 traffic).
// Constants: H200 measurements (4.2 TB/s device copy); the latency is a loaded-DRAM estimate on the high side,
// which favours tilings with more bytes in flight.
#include "cuda/gemm_w4a16_heuristics.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

namespace futransformer::cuda::w4a16 {
namespace {

constexpr double kDramBytesPerUs = 4.0e6;   // ~4 TB/s sustained
constexpr double kL2BytesPerUs = 8.0e6;
constexpr double kLatencyUs = 2.0;          // loaded DRAM latency + issue, per wave
constexpr double kReduceUs = 2.0;           // split-K reduce kernel: drain, dependent start, fp32 round trip
constexpr int64_t kSmemReservePerCta = 1024;  // the driver keeps 1 KB per resident CTA

double cost(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& d, int64_t smem) {
  const int64_t n_blocks = N / (kBlockN * t.warps_n);
  const int64_t ctas = n_blocks * t.splits;
  const int64_t per_sm = std::min<int64_t>(d.smem_per_sm / (smem + kSmemReservePerCta), min_blocks_per_sm(t.m_tiles));
  const int64_t cap = int64_t{d.sm_count} * std::max<int64_t>(per_sm, 1);
  const double weight_bytes = static_cast<double>(N) * K / 2 + static_cast<double>(N) * (K / group) * 2;
  const double per_cta = weight_bytes / static_cast<double>(ctas);
  // A warp keeps at most kStages - 1 blocks in flight, and no more than it has.
  const int64_t warp_blocks = K / t.splits / kBlockK / t.warps_k;
  const double in_flight = static_cast<double>(std::min<int64_t>(std::max<int64_t>(warp_blocks, 1), kStages - 1)) *
                           kBlockN * kBlockK / 2 * kWarps;
  auto wave = [&](int64_t c) {
    return std::max(static_cast<double>(c) * per_cta / kDramBytesPerUs, per_cta * kLatencyUs / in_flight) + kLatencyUs;
  };
  const int64_t full = ctas / cap, rem = ctas % cap;
  double us = static_cast<double>(full) * wave(cap) + (rem > 0 ? wave(rem) : 0.0);
  us += static_cast<double>(n_blocks) * M * K * 2 / kL2BytesPerUs;
  if (t.splits > 1) us += kReduceUs + 2.0 * static_cast<double>(workspace_bytes_for(t, M, N)) / kL2BytesPerUs;
  return us;
}

}  // namespace

int64_t workspace_bytes_for(const Tiling& t, int M, int N) {
  return t.splits > 1 ? int64_t{t.splits} * M * N * 4 : 0;
}

Tiling choose_tiling(int M, int N, int K, int group, const DeviceLimits& d) {
  Tiling base;
  base.m_tiles = (M + 15) / 16;
  base.rows8 = M <= 8;
  base.rows = M;
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

Variant choose_variant(int M) { return M <= kV4DefaultMaxM ? Variant::v4 : Variant::v2; }

bool tiling_is_valid(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& d, std::string* why) {
  auto fail = [&](const std::string& m) {
    if (why) *why = "gemm_w4a16 tiling: " + m;
    return false;
  };
  using std::to_string;
  if (t.m_tiles != (M + 15) / 16) return fail("m_tiles = " + to_string(t.m_tiles) + ", expected ceil(M / 16)");
  if (t.rows != M) return fail("rows = " + to_string(t.rows) + ", expected M = " + to_string(M));
  if (t.rows8 && M > 8) return fail("rows8 needs M <= 8, M = " + to_string(M));
  if (t.warps_n != 1 && t.warps_n != 2 && t.warps_n != 4 && t.warps_n != 8)
    return fail("warps_n = " + to_string(t.warps_n) + ", expected 1, 2, 4 or 8");
  if (t.warps_n * t.warps_k != kWarps) return fail("warps_n * warps_k must be " + to_string(kWarps));
  if (N % (kBlockN * t.warps_n) != 0) return fail("N = " + to_string(N) + " is not a multiple of 32 * warps_n");
  const int64_t groups = K / group;
  if (t.splits < 1 || t.splits > std::min<int64_t>(groups, kMaxSplits))
    return fail("splits = " + to_string(t.splits) + ", expected 1 .. min(K / group, " + to_string(kMaxSplits) + ")");
  const int64_t smem = smem_layout(t, K, group).total;
  if (smem > d.smem_per_block)
    return fail("needs " + to_string(smem) + " bytes of shared memory, the device allows " +
                to_string(d.smem_per_block));
  if (why) why->clear();
  return true;
}

std::string describe_tiling(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& d) {
  const int64_t smem = smem_layout(t, K, group).total;
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "gemm_w4a16 M=%d N=%d K=%d group=%d: %s m_tiles=%d rows8=%d warps_n=%d warps_k=%d splits=%d "
                "grid=%dx%d smem=%lld B workspace=%lld B (sm=%d)",
                M, N, K, group, t.variant == Variant::v4 ? "v4" : "v2", t.m_tiles, t.rows8 ? 1 : 0, t.warps_n,
                t.warps_k, t.splits,
                N / (kBlockN * t.warps_n), t.splits, static_cast<long long>(smem),
                static_cast<long long>(workspace_bytes_for(t, M, N)), d.sm_count);
  return buf;
}

}  // namespace futransformer::cuda::w4a16
