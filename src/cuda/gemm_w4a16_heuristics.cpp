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
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

namespace futransformer::cuda::w4a16 {
namespace {

constexpr double kDramBytesPerUs = 4.0e6;   // ~4 TB/s sustained
constexpr double kL2BytesPerUs = 8.0e6;
constexpr double kLatencyUs = 2.0;          // loaded DRAM latency + issue, per wave
constexpr double kReduceUs = 2.0;           // split-K reduce kernel: drain, dependent start, fp32 round trip
constexpr int64_t kSmemReservePerCta = 1024;  // the driver keeps 1 KB per resident CTA

// CTAs of this tiling that can share an SM: shared memory and the kernel's register cap (launch bounds).
int64_t resident_per_sm(const Tiling& t, const DeviceLimits& d, int64_t smem) {
  const int cap = t.wgmma ? kWgMinBlocksPerSm : min_blocks_per_sm(t.m_tiles, t.warps, t.swap16);
  return std::min<int64_t>(d.smem_per_sm / (smem + kSmemReservePerCta), cap);
}

double cost(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& d, int64_t smem) {
  const int64_t n_blocks = N / (kBlockN * t.warps_n);
  const int64_t ctas = n_blocks * t.splits;
  const int64_t per_sm = resident_per_sm(t, d, smem);
  const int64_t cap = int64_t{d.sm_count} * std::max<int64_t>(per_sm, 1);
  const double weight_bytes = static_cast<double>(N) * K / 2 + static_cast<double>(N) * (K / group) * 2;
  const double per_cta = weight_bytes / static_cast<double>(ctas);
  // A warp keeps at most stages - 1 blocks in flight, and no more than it has.
  const int64_t warp_blocks = K / t.splits / kBlockK / t.warps_k;
  const double in_flight = static_cast<double>(std::min<int64_t>(std::max<int64_t>(warp_blocks, 1), t.stages - 1)) *
                           kBlockN * kBlockK / 2 * t.warps;
  auto wave = [&](int64_t c) {
    return std::max(static_cast<double>(c) * per_cta / kDramBytesPerUs, per_cta * kLatencyUs / in_flight) + kLatencyUs;
  };
  const int64_t full = ctas / cap, rem = ctas % cap;
  double us = static_cast<double>(full) * wave(cap) + (rem > 0 ? wave(rem) : 0.0);
  us += static_cast<double>(n_blocks) * M * K * 2 / kL2BytesPerUs;
  if (t.splits > 1) us += kReduceUs + 2.0 * static_cast<double>(workspace_bytes_for(t, M, N)) / kL2BytesPerUs;
  return us;
}

// The warps_n values a CTA of `warps` warps can have, widest first: the divisors of warps up to kMaxWarpsN
// (8: 8, 4, 2, 1 and 16: 16, 8, 4, 2, 1 as before the other shapes; 24: 12, 8, 6, 4, 3, 2, 1; 28: 14, 7, 4, 2, 1).
std::vector<int> candidate_warps_n(int warps) {
  std::vector<int> out;
  for (int n = kMaxWarpsN; n >= 1; --n)
    if (n <= warps && warps % n == 0) out.push_back(n);
  return out;
}

}  // namespace

int64_t workspace_bytes_for(const Tiling& t, int M, int N) {
  return t.splits > 1 ? int64_t{t.splits} * M * N * 4 : 0;
}

Tiling choose_tiling(int M, int N, int K, int group, const DeviceLimits& d) {
  return choose_tiling(M, N, K, group, d, V4Config{});
}

Tiling choose_tiling(int M, int N, int K, int group, const DeviceLimits& d, const V4Config& config) {
  // Above kV4DefaultMaxM only swap32 comes from the config (the tiling is otherwise the default one).
  // The warpgroup path: M <= 32, the default CTA shape, four warps side by side (N a multiple of 4 blocks).
  const bool wgmma = config.wgmma && M <= kWgMaxM && (N / kBlockN) % kWgWarps == 0;
  V4Config cfg = config;
  if (M > kV4DefaultMaxM) {
    cfg = V4Config{};
    cfg.swap32 = config.swap32;
    if (wgmma) {  // the warpgroup path keeps its occupancy, split and streaming wishes up to M = 32
      cfg.ctas_per_sm = config.ctas_per_sm;
      cfg.splits = config.splits;
      cfg.stream_x = config.stream_x;
      cfg.stream_stages = config.stream_stages;
    }
  }
  const bool stream_x = wgmma && cfg.stream_x && (N / kBlockN) % kWarps == 0;  // warps_n = 8, warps_k = 1
  if (wgmma) {
    cfg.warps = kWarps;
    cfg.stages = !stream_x ? kStages : wg_stream_stages_ok(cfg.stream_stages) ? cfg.stream_stages : kWgStreamStages;
  }
  Tiling base;
  base.m_tiles = (M + 15) / 16;
  base.rows8 = M <= 8;
  base.rows = M;
  base.warps = cfg.warps;
  base.stages = cfg.stages;
  base.swap16 = cfg.swap16 && M > 8 && !wgmma;
  base.swap32 = cfg.swap32 && M >= kSwap32MinM && M <= kSwap32MaxM && !wgmma;
  base.wgmma = wgmma;
  base.stream_x = stream_x;
  const int64_t groups = K / group;
  const int64_t max_splits = std::min<int64_t>(groups, kMaxSplits);
  // Phase 0 keeps tilings that meet both occupancy wishes of cfg.ctas_per_sm, phase 1 those whose shared memory
  // allows it, phase 2 everything; the first phase with a candidate wins (without the wish, only phase 2).
  constexpr int kPhases = 3;
  Tiling best[kPhases] = {base, base, base};
  double best_cost[kPhases];
  bool found[kPhases] = {};
  for (double& c : best_cost) c = std::numeric_limits<double>::infinity();
  const int64_t split_lo = cfg.splits > 0 ? std::min<int64_t>(cfg.splits, max_splits) : 1;
  const int64_t split_hi = cfg.splits > 0 ? split_lo : max_splits;
  // A forced warps_n is honoured where the shape and the CTA allow it; otherwise the model chooses.
  const bool forced_n = cfg.warps_n > 0 && cfg.warps % cfg.warps_n == 0 && (N / kBlockN) % cfg.warps_n == 0 &&
                        !(wgmma && cfg.warps_n % kWgWarps != 0) && !(stream_x && cfg.warps_n != cfg.warps);
  for (int warps_n : candidate_warps_n(cfg.warps)) {
    if ((N / kBlockN) % warps_n != 0) continue;
    if (forced_n && warps_n != cfg.warps_n) continue;
    if (wgmma && warps_n % kWgWarps != 0) continue;
    if (stream_x && warps_n != cfg.warps) continue;  // warps_k = 1
    for (int64_t splits = split_lo; splits <= split_hi; ++splits) {
      Tiling t = base;
      t.warps_n = warps_n;
      t.warps_k = cfg.warps / warps_n;
      t.splits = static_cast<int>(splits);
      const int64_t smem = smem_layout(t, K, group).total;
      if (smem > d.smem_per_block) continue;
      // Every warp should get at least one block of the shortest slice.
      const int64_t shortest_blocks = (groups / splits) * group / kBlockK;
      if (shortest_blocks < t.warps_k) continue;
      const double c = cost(t, M, N, K, group, d, smem);
      const int64_t resident = resident_per_sm(t, d, smem);
      const int64_t ctas = int64_t{N} / (kBlockN * warps_n) * splits;
      const bool fits = cfg.ctas_per_sm == 0 || resident >= cfg.ctas_per_sm;
      const bool fills = cfg.ctas_per_sm == 0 || ctas >= int64_t{cfg.ctas_per_sm} * d.sm_count;
      const bool in_phase[kPhases] = {fits && fills && cfg.ctas_per_sm > 0, fits && cfg.ctas_per_sm > 0, true};
      for (int p = 0; p < kPhases; ++p) {
        if (in_phase[p] && c < best_cost[p]) {  // strict: ties keep the fewer splits / wider CTA found first
          best_cost[p] = c;
          best[p] = t;
          found[p] = true;
        }
      }
    }
  }
  for (int p = 0; p < kPhases; ++p)
    if (found[p]) return best[p];
  if (forced_n) {  // no tiling with the forced warps_n fits: let the model choose it
    V4Config free_n = cfg;
    free_n.warps_n = 0;
    return choose_tiling(M, N, K, group, d, free_n);
  }
  if (cfg.splits > 0) {  // the forced split leaves some warp without a block: let the model choose it
    V4Config free_splits = cfg;
    free_splits.splits = 0;
    return choose_tiling(M, N, K, group, d, free_splits);
  }
  // Either K has fewer blocks than a CTA has K warps (some warps idle), or no split makes the staged
  // activations fit (gemm_w4a16_can_implement rejects that case by checking the smem of this tiling).
  Tiling t = base;
  for (int warps_n : candidate_warps_n(cfg.warps)) {
    if ((N / kBlockN) % warps_n == 0 && (!wgmma || warps_n % kWgWarps == 0) && (!stream_x || warps_n == cfg.warps)) {
      t.warps_n = warps_n;
      break;
    }
  }
  t.warps_k = cfg.warps / t.warps_n;
  t.splits = static_cast<int>(max_splits);
  if (groups / t.splits * group / kBlockK < t.warps_k) t.splits = 1;
  return t;
}

Variant choose_variant(int M, bool swap32, bool wgmma) {
  return M <= kV4DefaultMaxM || (swap32 && M >= kSwap32MinM && M <= kSwap32MaxM) || (wgmma && M <= kWgMaxM)
             ? Variant::v4
             : Variant::v2;
}

bool tiling_is_valid(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& d, std::string* why) {
  auto fail = [&](const std::string& m) {
    if (why) *why = "gemm_w4a16 tiling: " + m;
    return false;
  };
  using std::to_string;
  if (t.m_tiles != (M + 15) / 16) return fail("m_tiles = " + to_string(t.m_tiles) + ", expected ceil(M / 16)");
  if (t.rows != M) return fail("rows = " + to_string(t.rows) + ", expected M = " + to_string(M));
  if (t.rows8 && M > 8) return fail("rows8 needs M <= 8, M = " + to_string(M));
  if (!v4_kernel_compiled(t.warps, t.stages))
    return fail("warps = " + to_string(t.warps) + " with stages = " + to_string(t.stages) +
                " is not a compiled kernel shape (warps x stages: 8 x 16, 8 x 32, 16 x 16, 8 x 8, 24 x 8, 28 x 8)");
  if ((t.warps != kWarps || t.stages != kStages) && (t.variant != Variant::v4 || M > kV4DefaultMaxM) &&
      !(t.stream_x && t.variant == Variant::v4 && M <= kWgMaxM))
    return fail("warps = " + to_string(t.warps) + ", stages = " + to_string(t.stages) +
                " need variant v4 and M <= " + to_string(kV4DefaultMaxM) + " (v2 and larger M run 8 x 16 only)");
  if (t.swap32 && (t.variant != Variant::v4 || t.rows8 || t.swap16 || M < kSwap32MinM || M > kSwap32MaxM))
    return fail("swap32 needs variant v4, rows8 and swap16 off and M = " + to_string(kSwap32MinM) + ".." +
                to_string(kSwap32MaxM) + ", M = " + to_string(M) + (t.variant != Variant::v4 ? " (variant v2)" : ""));
  if (t.swap16 && (t.variant != Variant::v4 || t.rows8 || M < 9 || M > 16))
    return fail("swap16 needs variant v4, rows8 off and M = 9..16, M = " + to_string(M));
  if (t.wgmma && (t.variant != Variant::v4 || M > kWgMaxM || t.warps != kWarps ||
                  (t.stream_x ? !wg_stream_stages_ok(t.stages) : t.stages != kStages) || t.swap16 || t.swap32 ||
                  t.warps_n % kWgWarps != 0 || (t.stream_x && t.warps_k != 1)))
    return fail("wgmma needs variant v4, M <= " + to_string(kWgMaxM) + ", 8 warps with 16 stages (8 or 16 and " +
                "warps_k = 1 with stream_x), swap16 and swap32 off and warps_n a multiple of 4; M = " + to_string(M) +
                ", warps = " + to_string(t.warps) + ", stages = " + to_string(t.stages) + ", warps_n = " +
                to_string(t.warps_n) + ", stream_x = " + to_string(t.stream_x ? 1 : 0));
  if (t.stream_x && !t.wgmma) return fail("stream_x needs wgmma");
  if (t.warps_n < 1 || t.warps_n > kMaxWarpsN)
    return fail("warps_n = " + to_string(t.warps_n) + ", expected 1.." + to_string(kMaxWarpsN));
  if (t.warps_n * t.warps_k != t.warps)
    return fail("warps_n * warps_k must be warps = " + to_string(t.warps) + " (warps_n = " + to_string(t.warps_n) +
                ", warps_k = " + to_string(t.warps_k) + ")");
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
  // Weight bytes a CTA keeps in flight (each warp up to stages - 2 blocks in the v4 pair loop).
  const int64_t in_flight_kb = int64_t{t.warps} * (t.stages - 2) * kBlockN * kBlockK / 2 / 1024;
  char buf[400];
  std::snprintf(buf, sizeof(buf),
                "gemm_w4a16 M=%d N=%d K=%d group=%d: %s%s%s%s%s m_tiles=%d rows8=%d warps=%d stages=%d warps_n=%d "
                "warps_k=%d splits=%d grid=%dx%d smem=%lld B ctas/sm<=%lld in_flight/cta=%lld KB workspace=%lld B "
                "(sm=%d)",
                M, N, K, group, t.variant == Variant::v4 ? "v4" : "v2", t.wgmma ? " wgmma" : "", t.stream_x ? " stream_x" : "", t.swap16 ? " swap16" : "",
                t.swap32 ? (swap_tiles(t.rows8, t.swap16, t.swap32, t.rows) == 3 ? " swap32x3" : " swap32x4") : "",
                t.m_tiles,
                t.rows8 ? 1 : 0, t.warps, t.stages, t.warps_n, t.warps_k, t.splits, N / (kBlockN * t.warps_n),
                t.splits, static_cast<long long>(smem), static_cast<long long>(resident_per_sm(t, d, smem)),
                static_cast<long long>(in_flight_kb), static_cast<long long>(workspace_bytes_for(t, M, N)),
                d.sm_count);
  return buf;
}

std::string describe_config(const V4Config& c) {
  char buf[180];
  std::snprintf(buf, sizeof(buf),
                "v4 config: warps=%d stages=%d ctas_per_sm=%d splits=%d swap16=%d swap32=%d wgmma=%d stream_x=%d "
                "stream_stages=%d warps_n=%d",
                c.warps, c.stages, c.ctas_per_sm, c.splits, c.swap16 ? 1 : 0, c.swap32 ? 1 : 0, c.wgmma ? 1 : 0,
                c.stream_x ? 1 : 0, c.stream_stages, c.warps_n);
  return buf;
}

std::vector<NamedV4Config> v4_sweep_configs() {
  auto make = [](const char* name, int warps, int stages, int ctas, bool swap16, bool swap32 = kSwap32ByDefault,
                 bool wgmma = false) {
    V4Config c;
    c.warps = warps;
    c.stages = stages;
    c.ctas_per_sm = ctas;
    c.swap16 = swap16;
    c.swap32 = swap32;
    c.wgmma = wgmma;
    return NamedV4Config{name, c};
  };
  auto stream = [](const char* name, int stages = kWgStreamStages) {
    V4Config c;
    c.stages = stages;
    c.wgmma = true;
    c.stream_x = true;
    c.stream_stages = stages;
    return NamedV4Config{name, c};
  };
  auto n_forced = [&make](const char* name, int warps, int stages, int warps_n) {
    NamedV4Config c = make(name, warps, stages, 0, false);
    c.config.warps_n = warps_n;
    return c;
  };
  // Bytes in flight per SM, as the default has them on the large layers (one or two CTAs of 56 KB): c2 / c3 ask
  // for 2 or 3 such CTAs on every SM (more K slices, less staging each); w8s32 and w16s16 double the bytes per
  // CTA (120 / 112 KB), c1 with them keeps all SMs busy where the model would leave some idle. The last entry flips
  // swap32 (M = 17..32; the others keep its default): "swap32" when that turns it on, "no_swap32" when off. w8s8
  // quarters the ring (32 KB per CTA) so three 8-warp CTAs (24 warps) fit an SM where the default's shared memory
  // allows two (16 warps): the same bytes in flight, 1.5x the warps to hide the dequant -> MMA latency chains
  // (ncu, 8B gate_up at M = 1: 3.2 active and 0.97 eligible warps per scheduler, issue slots idle half the time).
  // wgmma runs M <= 32 on the warpgroup path (one wgmma per four warps' blocks and k16 step, whatever M); wgmma_c2
  // asks for two CTAs per SM also at M = 17..32, where the staged activations of a long K slice otherwise leave one
  // (more K slices, so less staging per CTA, against the split-K reduce's traffic). wgmma_sx / wgmma_sx16 stream the
  // activations through a panel ring beside an 8- / 16-slot weight ring (24 / 56 KB in flight per CTA).
  // w16s16n1 / w24s8n1 put all 16 / 24 warps of a CTA on one 32-column block (warps_k = 16 / 24): on N = 4096 layers
  // the 128 CTAs then run 16 / 24 warps per SM with 1/16 / 1/24 of K each, where the default's 8 warps per SM each
  // work through 1/8 of K one block after another (M = 1 looked bound by that per-warp chain: 0.3-0.45 µs per block
  // and warp on every shape of the v5 sweep). w24s8 lets the model lay out the 24-warp CTA. w28s8n7 / n14: 28 warps
  // (the register file's limit at 72 registers) on 7 / 14 column blocks, so gate|up's N / 32 = 896 (8B) or 1792
  // (70B) column blocks make 128 CTAs: every SM but four busy, where w24s8's 8 column blocks left 20 idle.
  return {make("w8s16", 8, 16, 0, false),  make("w8s16c2", 8, 16, 2, false), make("w8s16c3", 8, 16, 3, false),
          make("w8s32", 8, 32, 0, false),  make("w8s32c1", 8, 32, 1, false), make("w16s16", 16, 16, 0, false),
          make("w16s16c1", 16, 16, 1, false), make("swap16", 8, 16, 0, true),  make("swap16c2", 8, 16, 2, true),
          make(kSwap32ByDefault ? "no_swap32" : "swap32", 8, 16, 0, false, !kSwap32ByDefault),
          make("w8s8", 8, 8, 0, false),    make("w8s8c3", 8, 8, 3, false),
          make("wgmma", 8, 16, 0, false, kSwap32ByDefault, true),
          make("wgmma_c2", 8, 16, 2, false, kSwap32ByDefault, true), stream("wgmma_sx"),
          stream("wgmma_sx16", kWgStreamDeepStages),
          n_forced("w16s16n1", 16, 16, 1), make("w24s8", 24, 8, 0, false), n_forced("w24s8n1", 24, 8, 1),
          make("w28s8", 28, 8, 0, false), n_forced("w28s8n7", 28, 8, 7), n_forced("w28s8n14", 28, 8, 14)};
}

V4Config parse_v4_config(const char* (*get)(const char*), std::string* warnings) {
  V4Config c;
  auto warn = [&](const std::string& m) {
    if (warnings) *warnings += (warnings->empty() ? "" : " ") + m;
  };
  // An integer in [lo, hi] from variable `name`; false (and *out untouched) when unset, empty or not accepted.
  auto read = [&](const char* name, int lo, int hi, int* out) {
    const char* v = get(name);
    if (v == nullptr || v[0] == '\0') return false;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end != '\0' || x < lo || x > hi) {
      warn(std::string(name) + "=" + v + " ignored (expected an integer in " + std::to_string(lo) + ".." +
           std::to_string(hi) + ").");
      return false;
    }
    *out = static_cast<int>(x);
    return true;
  };
  int warps = c.warps, stages = c.stages, flag = 0;
  const bool set_w = read("FT_W4A16_V4_WARPS", 1, 32, &warps);
  const bool set_s = read("FT_W4A16_V4_STAGES", 2, 64, &stages);
  if ((set_w || set_s) && !v4_kernel_compiled(warps, stages)) {
    warn("FT_W4A16_V4_WARPS / FT_W4A16_V4_STAGES = " + std::to_string(warps) + " / " + std::to_string(stages) +
         " ignored (compiled: 8 / 16, 8 / 32, 16 / 16, 8 / 8, 24 / 8, 28 / 8).");
  } else {
    c.warps = warps;
    c.stages = stages;
  }
  read("FT_W4A16_V4_CTAS_PER_SM", 0, 8, &c.ctas_per_sm);
  read("FT_W4A16_V4_WARPS_N", 0, kMaxWarpsN, &c.warps_n);
  read("FT_W4A16_SPLITK", 0, kMaxSplits, &c.splits);
  if (read("FT_W4A16_SWAP16", 0, 1, &flag)) c.swap16 = flag == 1;
  if (read("FT_W4A16_SWAP32", 0, 1, &flag)) c.swap32 = flag == 1;
  if (read("FT_W4A16_WGMMA", 0, 1, &flag)) c.wgmma = flag == 1;
  if (read("FT_W4A16_STREAM_X", 0, 1, &flag)) c.stream_x = flag == 1;
  if (read("FT_W4A16_STREAM_STAGES", kWgStreamStages, kWgStreamDeepStages, &flag)) {
    if (wg_stream_stages_ok(flag))
      c.stream_stages = flag;
    else
      warn("FT_W4A16_STREAM_STAGES=" + std::to_string(flag) + " ignored (expected 8 or 16).");
  }
  return c;
}

namespace {
// Splits an environment list "item,item,..." into its non-empty items and hands each to take(item), which returns the
// problem with it (nullptr when it took the item); a problem is reported in *warnings as "VAR: 'item' problem;
// skipped.".
template <class Take>
void parse_env_list(const char* text, const char* var, std::string* warnings, Take take) {
  if (text == nullptr) return;
  const std::string all(text);
  size_t start = 0;
  while (start < all.size()) {
    const size_t end = std::min(all.find(',', start), all.size());
    const std::string item = all.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    const char* problem = take(item);
    if (problem != nullptr && warnings != nullptr) {
      if (!warnings->empty()) warnings->push_back(' ');
      warnings->append(var).append(": '").append(item).append("' ").append(problem).append("; skipped.");
    }
  }
}
}  // namespace

std::vector<ExtraTunedEntry> parse_tuned_extra(const char* text, std::string* warnings) {
  std::vector<ExtraTunedEntry> out;
  parse_env_list(text, "FT_W4A16_TUNED_EXTRA", warnings, [&](const std::string& item) -> const char* {
    // Nine fields, or ten with the path (0: v4, 1: the warpgroup path with streamed activations, "wgmma_sx").
    int f[10] = {};
    char tail = 0;
    int fields = std::sscanf(item.c_str(), "%d:%d:%d:%d:%d:%d:%d:%d:%d%c", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5],
                             &f[6], &f[7], &f[8], &tail);
    if (fields == 10 && tail == ':')
      fields = std::sscanf(item.c_str(), "%d:%d:%d:%d:%d:%d:%d:%d:%d:%d%c", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5],
                           &f[6], &f[7], &f[8], &f[9], &tail) == 10
                   ? 10
                   : -1;
    else if (fields != 9)
      fields = -1;
    const bool wg = fields == 10 && f[9] == 1;
    const char* problem = fields < 0 ? "is not N:K:m_lo:m_hi:warps:stages:ctas_per_sm:warps_n:splits[:path]"
                          : fields == 10 && f[9] != 0 && f[9] != 1 ? "has a path other than 0 (v4) or 1 (wgmma_sx)"
                          : f[0] < 1 || f[1] < 1                   ? "has N or K below 1"
                          : f[2] < 1 || f[2] > f[3]                ? "has m_lo < 1 or m_lo > m_hi"
                          : wg && (f[4] != kWarps || !wg_stream_stages_ok(f[5]))
                              ? "names the warpgroup path without 8 warps and a streamed ring of 8 or 16 slots"
                          : !wg && !v4_kernel_compiled(f[4], f[5]) ? "names a (warps, stages) pair that is not compiled"
                          : f[6] < 0 || f[6] > 8 || f[7] < 0 || f[7] > kMaxWarpsN || f[8] < 0 || f[8] > kMaxSplits
                              ? "has ctas_per_sm, warps_n or splits outside parse_v4_config's ranges"
                              : nullptr;
    if (problem != nullptr) return problem;
    ExtraTunedEntry e;
    e.N = f[0], e.K = f[1], e.m_lo = f[2], e.m_hi = f[3];
    e.config.warps = f[4], e.config.stages = f[5], e.config.ctas_per_sm = f[6], e.config.warps_n = f[7];
    e.config.splits = f[8];
    if (wg) e.config.wgmma = e.config.stream_x = true, e.config.stream_stages = f[5];
    out.push_back(e);
    return nullptr;
  });
  return out;
}

std::vector<ClusterRowsEntry> parse_cluster_rows_extra(const char* text, std::string* warnings) {
  std::vector<ClusterRowsEntry> out;
  parse_env_list(text, "FT_W4A16_CLUSTER_ROWS_EXTRA", warnings, [&](const std::string& item) -> const char* {
    ClusterRowsEntry e{};
    char tail = 0;
    const int fields = std::sscanf(item.c_str(), "%d:%d:%d%c", &e.N, &e.K, &e.max_rows, &tail);
    const char* problem = fields != 3          ? "is not N:K:max_rows"
                          : e.N < 1 || e.K < 1 ? "has N or K below 1"
                          : e.max_rows < kClusterMinRows - 1 || e.max_rows > kClusterLimitRows
                              ? "has max_rows outside kClusterMinRows - 1 .. kClusterLimitRows"
                              : nullptr;
    if (problem == nullptr) out.push_back(e);
    return problem;
  });
  return out;
}

std::vector<ShapeRange> parse_plain_launch(const char* text, std::string* warnings) {
  std::vector<ShapeRange> out;
  parse_env_list(text, "FT_W4A16_PLAIN_LAUNCH", warnings, [&](const std::string& item) -> const char* {
    ShapeRange e{};
    char tail = 0;
    const int fields = std::sscanf(item.c_str(), "%d:%d:%d:%d%c", &e.N, &e.K, &e.m_lo, &e.m_hi, &tail);
    const char* problem = fields != 4                      ? "is not N:K:m_lo:m_hi"
                          : e.N < 1 || e.K < 1             ? "has N or K below 1"
                          : e.m_lo < 1 || e.m_lo > e.m_hi  ? "has m_lo < 1 or m_lo > m_hi"
                                                           : nullptr;
    if (problem == nullptr) out.push_back(e);
    return problem;
  });
  return out;
}

}  // namespace futransformer::cuda::w4a16
