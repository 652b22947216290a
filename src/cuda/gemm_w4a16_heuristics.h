// Launch configuration of the W4A16 GEMM as a pure function of the problem shape and the device's limits,
// kept apart from the kernel so it can be read, printed (FT_PRINT_HEURISTICS=1) and tested on its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/gemm_w4a16_layout.h"

namespace futransformer::cuda::w4a16 {

struct DeviceLimits {
  int sm_count = 132;                   // H100/H200 SXM
  int64_t smem_per_sm = 228 * 1024;     // shared memory per multiprocessor
  int64_t smem_per_block = 227 * 1024;  // opt-in maximum for one CTA
};

// Whether M = 17..32 runs v4's swapped three/four-tile path (swap32) by default instead of v2's 16-row path with
// two m tiles. Off: per 512-byte block swap32 issues the same 16 weight mma as v2 (M = 32 fills every MMA row on
// both paths), trading v2's 16 sub.bf16x2 for 4 offset mma and 8 shuffles per group flush, so its static count
// does not clearly beat v2 (docs/notes/w4a16-tuning.md, "v5"); FT_W4A16_SWAP32=1 or V4Config::swap32 turn it on
// until a measurement says otherwise.
constexpr bool kSwap32ByDefault = false;

// Whether gemm_w4a16 runs M = 17..32 on the warpgroup path with streamed activations (wgmma + stream_x) where the
// shape allows it (N a multiple of 256), instead of v2's 16-row path. On: in the H200 sweep
// (docs/results/bench_gemm_w4a16-v10-sweep-stream.json) it was 1.03-1.45x faster at M = 32 on seven of the eight
// Llama-3.1 shapes (0.92x on 8B o). FT_W4A16_WG32=0 turns it off (gemm_w4a16.cu).
constexpr bool kWg32ByDefault = true;
// ... for weights of at least this many INT4 code bytes. The tenth session set it at 10 MB because 8B o (4096 x 4096,
// 8.4 MB) was 0.91-0.99x alone at M = 17..32 (docs/results/bench_gemm_w4a16-v10.json). Inside the 8B step the
// streamed path won for it in the twenty-seventh session (H100, four alternating pairs per batch: -2.5, -2.9, -1.0,
// -2.5, -0.3 % at batch 17, 20, 24, 28, 32; docs/results.md), so 8B o now takes it too. Below it (the small models'
// projections, < 1 MB) M = 17..32 stays on v2.
constexpr int64_t kWg32MinWeightBytes = 8'000'000;

// The tunable part of the v4 decode launch (M <= kV4DefaultMaxM), swept by `bench_gemm_w4a16 --sweep`. The default
// value is the configuration the library has always run; gemm_w4a16 reads overrides from the environment
// (v4_config_from_env). A config applies to v4 launches with M <= 16 only (v2 and M > 16 use the default), except
// swap32, which applies to M = 17..32 only.
struct V4Config {
  int warps = kWarps;    // warps per CTA; (warps, stages) must be one of kV4KernelShapes
  int stages = kStages;  // cp.async ring slots per thread
  int ctas_per_sm = 0;   // 0: the cost model decides; c > 0: prefer tilings whose shared memory lets c CTAs share
                         // an SM and whose grid gives every SM c of them (relaxed in that order when none does)
  int splits = 0;        // 0: the cost model decides; s > 0: s K slices (clamped to what the shape allows)
  bool swap16 = false;   // M = 9..16 on the swapped two-tile path instead of the 16-row path
  bool swap32 = kSwap32ByDefault;  // M = 17..32 on v4's swapped three/four-tile path (variant v4 there)
  bool wgmma = false;  // M <= 32 on the warpgroup path (gemm_w4a16_wg.cuh; variant v4, default CTA shape, warps_n a
                       // multiple of 4, N a multiple of 128); overrides swap16 / swap32
  bool stream_x = false;  // with wgmma: activations streamed through a panel ring (warps_k = 1)
  int stream_stages = kWgStreamStages;  // with stream_x: the weight ring's slots, kWgStreamStages (8) or
                                        // kWgStreamDeepStages (16); `stages` is ignored on the warpgroup path
  int warps_n = 0;        // 0: the cost model decides; n > 0: only tilings with n warps side by side along N (warps_k
                          // = warps / n), e.g. 1 on N = 4096 layers so every one of the N / 32 CTAs has all its warps
                          // on one column block (more warps per SM than the model's wider CTAs); ignored (the model
                          // decides) where N / 32 is not a multiple of n or warps is not

  bool operator==(const V4Config&) const = default;
};

// The tiling for a shape that gemm_w4a16_can_implement accepts (M in 1..64, N % 32 == 0, K % group == 0,
// group in {32, 64, 128}). Always returns a launchable tiling for such shapes. The variant is left at v2 for the
// caller to set; with a config the warps, stages and swap16 fields come from it when M <= kV4DefaultMaxM (a
// non-default one is then only launchable as v4), swap32 when M = 17..32 (only launchable as v4; the tiling is
// otherwise the default one), and without one (or with V4Config{}) the result is the same.
Tiling choose_tiling(int M, int N, int K, int group, const DeviceLimits& limits);
Tiling choose_tiling(int M, int N, int K, int group, const DeviceLimits& limits, const V4Config& config);

// V4Config from environment strings (get(name) returns the value or nullptr): FT_W4A16_V4_WARPS,
// FT_W4A16_V4_STAGES, FT_W4A16_V4_CTAS_PER_SM, FT_W4A16_V4_WARPS_N, FT_W4A16_SPLITK, FT_W4A16_SWAP16 (0/1), FT_W4A16_SWAP32 (0/1,
// unset: kSwap32ByDefault), FT_W4A16_WGMMA (0/1), FT_W4A16_STREAM_X (0/1, with WGMMA). A value that is not
// accepted (a (warps, stages) pair that is not compiled, ctas_per_sm outside 0..8, splits outside 0..64) is
// left at its default and a sentence per problem is appended to *warnings.
V4Config parse_v4_config(const char* (*get)(const char*), std::string* warnings);
std::string describe_config(const V4Config& c);

// Whether a table or environment entry (fields N, K, m_lo, m_hi) covers shape (N, K) at M rows.
template <class Entry>
constexpr bool covers(const Entry& e, int M, int N, int K) {
  return e.N == N && e.K == K && M >= e.m_lo && M <= e.m_hi;
}

// One entry of FT_W4A16_TUNED_EXTRA: a configuration for shape (N, K) at M = m_lo..m_hi, searched before the
// measured table (gemm_w4a16_tuned.h), so a candidate can be tried inside the whole decode step without a rebuild.
struct ExtraTunedEntry {
  int N = 0, K = 0, m_lo = 0, m_hi = 0;
  V4Config config;  // warps, stages, ctas_per_sm, warps_n, splits from the entry; the rest default
};
// Entries "N:K:m_lo:m_hi:warps:stages:ctas_per_sm:warps_n:splits[:path]" separated by commas, in order (e.g.
// "4096:4096:1:2:16:16:0:1:0": the 8B o projection at M = 1..2 on 16-warp CTAs with every warp on one column block).
// path 1 (M <= 16) is the warpgroup path with streamed activations, as the table's "wgmma_sx" entries: 8 warps and a
// ring of 8 or 16 slots, e.g. "28672:4096:9:16:8:8:0:0:0:1"; 0 or no path field is v4.
// An entry that does not parse, has N or K below 1, m_lo > m_hi, a (warps, stages) pair that is not compiled, or
// ctas_per_sm / warps_n / splits outside parse_v4_config's ranges (0..8, 0..kMaxWarpsN, 0..kMaxSplits) is skipped
// with a sentence in *warnings. null or empty text: none. At M = 17..32, where the library runs the streamed
// warpgroup path, an entry whose stages are 8 or 16 gives that path's weight ring (V4Config::stream_stages), CTAs
// per SM and split (its warps and warps_n are the path's own), e.g. "28672:4096:25:32:8:16:0:0:0".
std::vector<ExtraTunedEntry> parse_tuned_extra(const char* text, std::string* warnings);

// A row limit for the split-K cluster rule (cluster_reduce_applies) for one shape (N, K): from the measured table
// (w4a16::tuned_cluster_max_rows) or from FT_W4A16_CLUSTER_ROWS_EXTRA.
struct ClusterRowsEntry {
  int N, K;
  int max_rows;
};
// FT_W4A16_CLUSTER_ROWS_EXTRA, for in-step screens of one shape at a time: entries "N:K:max_rows" separated by commas,
// searched in order before the table (e.g. "57344:8192:24": the 70B gate_up finishes its split in clusters up to
// M = 24). max_rows is kClusterMinRows - 1 (never: the shape keeps the reduce kernel) .. kClusterLimitRows. An entry
// that does not parse, has N or K below 1 or max_rows outside that range is skipped with a sentence in *warnings.
// null or empty text: none.
std::vector<ClusterRowsEntry> parse_cluster_rows_extra(const char* text, std::string* warnings);

// A shape (N, K) at M = m_lo..m_hi.
struct ShapeRange {
  int N, K;
  int m_lo, m_hi;
};
// FT_W4A16_PLAIN_LAUNCH, for in-step screens: entries "N:K:m_lo:m_hi" separated by commas; the GEMMs they name are
// launched without programmatic stream serialisation, so none of their CTAs is resident (or prefetches weights) before
// the kernel ahead of them has finished (the twenty-sixth session's idea (a): a GEMM whose early CTAs share the SMs of
// a predecessor that fills every SM). An entry that does not parse, has N or K below 1 or m_lo outside 1..m_hi is
// skipped with a sentence in *warnings. null or empty text: none.
std::vector<ShapeRange> parse_plain_launch(const char* text, std::string* warnings);

// The candidates `bench_gemm_w4a16 --sweep` times side by side and the GPU tests check against the CPU twin; the
// first is the default. Names: w<warps>s<stages>, c<n> for ctas_per_sm = n, swap16 for the two-tile path, swap32
// for the three/four-tile path (M = 17..32).
struct NamedV4Config {
  const char* name;
  V4Config config;
};
std::vector<NamedV4Config> v4_sweep_configs();

// The kernel variant for M rows (the tiling is the same for both): v4 for decode sizes, M <= kV4DefaultMaxM, and
// for M = 17..32 when swap32 is on (the swapped path exists in v4 only). gemm_w4a16 passes the environment's swap32
// (FT_W4A16_SWAP32) and lets FT_W4A16_VARIANT=v2|v4 override the result (see gemm_w4a16_internal.h).
constexpr int kV4DefaultMaxM = 16;
Variant choose_variant(int M, bool swap32 = kSwap32ByDefault, bool wgmma = false);

// Whether a tiling (any variant) is launchable for this shape on a device with these limits: m_tiles, rows and
// rows8 match M, (warps, stages) compiled for the variant and M (only the default for v2 and M > 16),
// warps_n x warps_k = warps with N a multiple of 32 * warps_n, 1 <= splits <= min(K / group, 64), swap16 only for
// v4 with M = 9..16, swap32 only for v4 with M = 17..32 (and neither rows8 nor swap16), shared memory within the
// limit. Otherwise false and, when why is not null, a sentence naming the field.
bool tiling_is_valid(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& limits, std::string* why);

// Bytes of fp32 workspace a tiling needs (0 when it does not split K).
int64_t workspace_bytes_for(const Tiling& t, int M, int N);

// One line describing the choice, for FT_PRINT_HEURISTICS.
std::string describe_tiling(const Tiling& t, int M, int N, int K, int group, const DeviceLimits& limits);

}  // namespace futransformer::cuda::w4a16
