// Split choice for the paged decode attention. The kernel streams the cache, so the choice is driven by a small
// model of a memory-bound launch counted in DRAM-byte equivalents (the same model as the W4A16 GEMM's):
//   - a CTA streams its split's tiles; while c CTAs are resident the DRAM delivers its full rate once c reaches
//     the saturating count (enough bytes in flight: kBytesInFlightPerSm per SM), proportionally less below;
//     so a wave of c CTAs costs bytes_per_cta * max(c, saturation);
//   - each wave adds a fixed ramp (pipeline fill: one DRAM latency);
//   - splitting adds the combine kernel (launch mostly hidden by programmatic dependent launch) and the fp32
//     partial outputs written and read back through L2.
// Sequences of one batch may differ in length; the plan is made for the longest (max_seq_len). The constants
// are first estimates for H100/H200, to be calibrated with bench/bench_attention_decode.
#include "cuda/attention_decode_heuristics.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "cuda/attention_decode_layout.h"

namespace futransformer::cuda::attn {
namespace {

constexpr double kBytesInFlightPerSm = 40.0 * 1024;
constexpr double kWaveRampBytes = 2.0e6;      // ~0.5 us at 4 TB/s
constexpr double kCombineFixedBytes = 3.0e6;  // ~0.7 us: the combine kernel's share of a decode step
constexpr double kL2Weight = 0.5;             // L2 traffic costs about half of DRAM traffic
constexpr int64_t kSmemReservePerCta = 1024;  // the driver keeps 1 KB per resident CTA

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

double cost(int splits, const KernelShape& k, int head_dim, int batch, int n_kv_heads, int tiles, int cap,
            double saturation, const DeviceLimits& d) {
  const int64_t ctas = int64_t{batch} * n_kv_heads * splits;
  const double per_cta = static_cast<double>((tiles + splits - 1) / splits) * k.stage_bytes;
  const int64_t full = ctas / cap, rem = ctas % cap;
  double c = per_cta * (static_cast<double>(full) * std::max<double>(static_cast<double>(cap), saturation) +
                        (rem > 0 ? std::max<double>(static_cast<double>(rem), saturation) : 0.0));
  c += kWaveRampBytes * static_cast<double>(full + (rem > 0 ? 1 : 0));
  if (splits > 1) {
    const double partials = static_cast<double>(ctas) * kMaxGqa * (head_dim + 1) * 4.0;
    c += kCombineFixedBytes + kL2Weight * 2.0 * partials;
  }
  return c;
}

}  // namespace

int smem_bytes_for(bool int4, int head_dim) { return kernel_shape(int4, head_dim).smem; }

Plan choose_plan(bool int4, int head_dim, int batch, int n_kv_heads, int max_seq_len, const DeviceLimits& d) {
  const KernelShape k = kernel_shape(int4, head_dim);
  Plan best;
  best.smem_bytes = k.smem;
  best.ctas_per_sm =
      static_cast<int>(std::clamp<int64_t>(d.smem_per_sm / (k.smem + kSmemReservePerCta), 1, k.max_ctas_per_sm));
  const int cap = d.sm_count * best.ctas_per_sm;
  const double in_flight_per_cta = static_cast<double>(kWarps) * (k.stages - 1) * k.stage_bytes;
  const double saturation = d.sm_count * std::max(1.0, kBytesInFlightPerSm / in_flight_per_cta);
  const int tiles = std::max(1, tiles_for(max_seq_len));
  double best_cost = std::numeric_limits<double>::infinity();
  for (int splits = 1; splits <= std::min(tiles, kMaxSplits); ++splits) {
    const double c = cost(splits, k, head_dim, batch, n_kv_heads, tiles, cap, saturation, d);
    if (c < best_cost) {  // strict: ties keep the fewer splits
      best_cost = c;
      best.splits = splits;
    }
  }
  return best;
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
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "attention_decode %s B=%d heads=%d kv_heads=%d head_dim=%d max_seq_len=%d: splits=%d "
                "grid=%dx%dx%d smem=%d B ctas/sm=%d workspace=%lld B (sm=%d)",
                int4 ? "int4" : "bf16", batch, n_heads, n_kv_heads, head_dim, max_seq_len, p.splits, p.splits,
                n_kv_heads, batch, p.smem_bytes, p.ctas_per_sm,
                static_cast<long long>(workspace_bytes_for(p, batch, n_heads, head_dim)), d.sm_count);
  return buf;
}

}  // namespace futransformer::cuda::attn
