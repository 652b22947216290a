// The H200 table of gemm_w4a16_tuned.h. Source: `bench_gemm_w4a16 --sweep --iters 30` at 2b49c03 (median of 30 CUDA
// graph replays of 20 launches each, weights rotated through 4x the L2; docs/results/bench_gemm_w4a16-sweep-v5.json).
// Buckets: the sweep measured M = 1, 4, 8, 16; M = 1..2 use the M = 1 row, 3..5 the M = 4 row, 6..8 the M = 8 row,
// 9..16 the M = 16 row. Rows whose best configuration was the default, or beat it by less than 4 %, are
// absent. The µs in the comments are (default -> listed). Later rows came from in-step screens (each says which
// session and card; the H100 SXM has the H200's SM count and shared memory, so the table applies on both).
#include "cuda/gemm_w4a16_tuned.h"

#include <cstddef>
#include <iterator>

namespace futransformer::cuda::w4a16 {

namespace {

constexpr TunedV4Entry kEntries[] = {
    // Llama-3.1-8B. The sweep also preferred w8s8 for qkv (7.58 -> 7.16) and w16s16 for o (7.04 -> 6.65) and down
    // (18.79 -> 17.95) at M = 1, but with those three the whole 8B decode step at batch 1 was 1 % slower (2724.2 ->
    // 2753.7 µs, same call): the sweep times one GEMM back to back, the step chains it behind other kernels (a
    // guess, not measured: a one-CTA-per-SM w16s16 ring has less room to start in the previous kernel's tail under
    // programmatic launch). They are left out.
    // The wgmma_sx entries (warpgroup path, streamed activations) come from the tenth session's sweep
    // (docs/results/bench_gemm_w4a16-v10-sweep-stream.json, graph-timed µs, default -> entry); the w24s8 ones (24
    // warps, 8 slots) from the eleventh session's (docs/results/bench_gemm_w4a16-v11-sweep.json, M = 1 and 8 only), the
    // w28s8 ones (28 warps; n7: 7 column blocks per CTA) from its second gate|up sweep (bench_gemm_w4a16-v11b-sweep.json).
    {6144, 4096, 9, 16, "wgmma_sx", 8, 8, 0, true, true},   // qkv M=16: 13.30 -> 12.23 (w16s16c1 12.93)
    // o M=1: the sweep's w16s16 (7.04 -> 6.65), taken in the twelfth session when the whole 8B step at batch 1 (with
    // the decode attention's early copies) measured 2115, 2122 -> 2099, 2101 µs with it, same call; w24s8 was level.
    {4096, 4096, 1, 1, "w16s16", 16, 16, 0},
    // o and down at M = 2 with K split in two (the split-K reduce then also runs the RMSNorm after them:
    // CudaEngineOptions::fused_residual_norm): the forty-first session's in-step screen on an H100 (FT_W4A16_TUNED_EXTRA,
    // 8B step at batch 2, four alternating pairs: 2246.3, 2239.9, 2241.4, 2240.5 -> 2173.1, 2175.0, 2177.0, 2169.1 µs,
    // -3.0 %; o alone -1.4 %, the down tilings w16s16 / w8s16 / w28s8 unsplit +5.1 / +2.0 / +1.3 %).
    {4096, 4096, 2, 2, "w16s16", 16, 16, 0, false, false, 0, 2},
    // M = 4 (thirteenth session, bench_gemm_w4a16-v13-sweep-m4-m8.json): o 8.71 -> 7.44 (w16s16n1), qkv 9.74 -> 9.21
    // (w24s8); at M = 8 neither beat the default by 4 % (qkv w24s8 10.38 -> 10.01, o level).
    {4096, 4096, 3, 5, "w16s16n1", 16, 16, 0, false, false, 1},
    // qkv M = 1..8 on 24 warps, 8 slots: M = 4 from the thirteenth session's sweep (9.74 -> 9.21); M = 1..2 and 6..8
    // from the eighteenth session's in-step sweep (FT_W4A16_TUNED_EXTRA, whole 8B step at batch 1 and 8, three
    // alternating pairs: 1944, 1946, 1937 -> 1903, 1904, 1894 µs at batch 1 together with the down entry below,
    // 2568, 2569, 2565 -> 2474, 2474, 2470 µs at batch 8; docs/results.md). Standalone the sweep had preferred w8s8
    // at M = 1, which the step did not.
    {6144, 4096, 1, 8, "w24s8", 24, 8, 0},
    {28672, 4096, 1, 2, "w28s8n7", 28, 8, 0, false, false, 7},  // gate_up M=1: 22.28 -> 19.87 (v11b; w24s8 21.27)
    // gate_up M=4 and M=16 on w28s8, down M=4 on w28s8 and o M=16 on w16s16: the eighteenth session's in-step sweep,
    // three alternating pairs each (8B step µs): batch 4 2443.9, 2439.8, 2441.3 -> 2292.2, 2295.8, 2295.7 (gate|up and
    // down together; gate|up alone 2337.9); batch 16 3183.1, 3190.7, 3186.7 -> 3115.5, 3118.9, 3120.2 (gate|up and o;
    // the M = 16 gate|up entry was w16s16, 33.23 -> 30.38 standalone).
    {28672, 4096, 3, 5, "w28s8", 28, 8, 0},
    {28672, 4096, 6, 8, "w28s8", 28, 8, 0},                 // gate_up M=8: 26.98 -> 20.97 (v11b; w24s8 22.52)
    // gate_up M = 9..16 on the streamed warpgroup path: the twenty-eighth session's in-step screen on an H100 after
    // that path's loop got 3-10 % faster (4d0c05a), three alternating pairs, 8B step at batch 12 / 14 / 16: -2.2 /
    // -3.0 / -0.2 %; at batch 9 / 10 then level (+0.3 / -0.7 %), so 9..11 stayed on w28s8 until the thirty-sixth
    // session's screen on an H100 (after the decode attention's stage layout and split floor; four alternating pairs,
    // FT_W4A16_TUNED_EXTRA=28672:4096:9:11:8:8:0:0:0:1 against w28s8): -2.5 / -1.2 / -5.4 % at batch 9 / 10 / 11.
    {28672, 4096, 9, 16, "wgmma_sx", 8, 8, 0, true, true},
    {4096, 14336, 3, 5, "w28s8", 28, 8, 0},
    // o M = 9..16 on the streamed warpgroup path: the thirty-third session's in-step screen on an H100
    // (FT_W4A16_TUNED_EXTRA=4096:4096:9:16:8:8:0:0:0:1 against w16s16, three alternating pairs, 8B step at batch 10 /
    // 12 / 16: -1.7 / -1.2 / -1.2 %; w24s8 there +0.7 to +2.7 %).
    {4096, 4096, 9, 16, "wgmma_sx", 8, 8, 0, true, true},
    {4096, 14336, 1, 1, "w24s8", 24, 8, 0},                 // down M=1: 18.52 -> 13.07 (v11; w16s16n1 14.85)
    {4096, 14336, 2, 2, "w24s8", 24, 8, 0, false, false, 0, 2},  // down M=2, K in two: see the o entry at M = 2
    // down M=8: the warpgroup path measured 21.97 -> 17.39 µs standalone (w8s8 19.37), but in the step w24s8 took the
    // 8B step at batch 8 from 2564, 2565 to 2490 µs (eighteenth session, same call).
    {4096, 14336, 6, 8, "w24s8", 24, 8, 0},
    {4096, 14336, 9, 16, "wgmma_sx", 8, 8, 0, true, true},  // down M=16: 19.54 -> 18.87
    // INT4 LM head (vocabulary 128256), thirteenth session (bench_gemm_w4a16-v13-sweep-lm-head.json): at M = 1 the
    // default is best (82.90 µs, 78 % of 4.2 TB/s); at M = 32 the default is already wgmma_sx.
    {128256, 4096, 6, 8, "w8s8", 8, 8, 0},                  // lm_head M=8: 108.95 -> 85.85 (w24s8 90.97)
    // Llama-3.1-70B
    // qkv M=1: w8s8 measured 21.72 -> 17.14 standalone; in the 70B step w24s8 is faster (eighteenth session: 12216,
    // 12233 -> 12001 µs at batch 1; with the o entry at M = 8 below, 12153, 12195 -> 12027, 12028 µs).
    {10240, 8192, 1, 2, "w24s8", 24, 8, 0},
    {10240, 8192, 3, 5, "w16s16", 16, 16, 0},               // qkv M=4: 25.87 -> 23.41
    {10240, 8192, 6, 8, "w24s8", 24, 8, 0},                 // qkv M=8: 26.38 -> 20.29 (v11; wgmma_sx 22.44)
    {10240, 8192, 9, 16, "wgmma_sx", 8, 8, 0, true, true},  // qkv M=16: 26.06 -> 24.62
    {8192, 8192, 1, 2, "w24s8", 24, 8, 0},                  // o M=1: 20.33 -> 13.68 (v11; w16s16 14.47)
    {8192, 8192, 3, 5, "w24s8", 24, 8, 0},                  // o M=4: 16.76 -> 15.17 (v13; w28s8 15.47)
    // o M=8: the 70B step at batch 8, 14400, 14404 -> 14150 µs (eighteenth session's in-step sweep; confirmed with the
    // qkv entry above: 14395, 14381 -> 14072, 14067 µs).
    {8192, 8192, 6, 8, "w24s8", 24, 8, 0},
    // o and down at M = 9..16: the twentieth session's in-step sweep (70B step, batch 10 / 16, three alternating
    // pairs: 18549, 18520, 18521 -> 16598, 16604, 16546 µs and 18994, 18983, 18992 -> 17006, 16999, 17024 µs, −10.4 %
    // and −10.5 %; screened alone at batch 16: down w8s8 −7.4 %, o w24s8 −2.0 %). Standalone the warpgroup path had
    // won both (o 21.03 -> 20.06, down 62.05 -> 52.35 µs); the step disagrees with the standalone sweep here as it did
    // for the 8B entries of the eighteenth session (why was not measured).
    {8192, 8192, 9, 16, "w24s8", 24, 8, 0},
    {57344, 8192, 1, 2, "w28s8n7", 28, 8, 0, false, false, 7},  // gate_up M=1: 78.36 -> 73.97 (v11b; w28s8 75.44)
    {57344, 8192, 3, 5, "w16s16", 16, 16, 0},               // gate_up M=4: 90.64 -> 84.70
    {57344, 8192, 6, 8, "w28s8", 28, 8, 0},                 // gate_up M=8: 89.24 -> 80.72 (v11b; w8s8 86.65)
    {57344, 8192, 9, 16, "wgmma_sx", 8, 8, 0, true, true},  // gate_up M=16: 114.66 -> 105.46 (w8s8 108.49)
    {8192, 28672, 1, 2, "w24s8", 24, 8, 0},                 // down M=1: 43.95 -> 36.51 (v11; w16s16 38.10)
    {8192, 28672, 6, 8, "w8s8", 8, 8, 0},                   // down M=8: 49.09 -> 41.38
    {8192, 28672, 9, 16, "w8s8", 8, 8, 0},                  // down M=16: see the o entry at M = 9..16
    {128256, 8192, 6, 8, "w8s8", 8, 8, 0},                  // lm_head M=8: 203.83 -> 184.93 (w8s16c2 186.87)
};

// The device the table was measured on: 132 SMs, 228 KB of shared memory per SM, 227 KB per CTA.
constexpr DeviceLimits kMeasuredOn{};

// M = 17..32 (streamed warpgroup path). The twenty-eighth session's in-step screens on an H100 (docs/results.md), after
// the streamed loop's group iterations (4d0c05a): 8B step, three alternating pairs each, defaults -> candidate.
constexpr TunedWg32Entry kWg32Entries[] = {
    // 8B o at M = 24..32 in 8 K slices (the cost model's 16) together with gate_up on the 16-slot ring at M = 25..32
    // (one CTA per SM, no split): -1.5 / -1.1 / -2.7 % at batch 24 / 28 / 32 (o alone -1.6 / -0.6 / -1.4 %; at
    // batch 17 level). The twenty-sixth session had measured the 16-slot gate_up +3 % in the step with the loop before.
    {4096, 4096, 24, 32, kWgStreamStages, 0, 8},
    {28672, 4096, 25, 32, kWgStreamDeepStages, 0, 0},
};

// Split-K finished in clusters up to M = 24 (the rule's 16 elsewhere): the twenty-ninth session's in-step screens on an
// H100 (docs/results.md), FT_W4A16_CLUSTER_MAX_ROWS=24 for every shape, 8B step, four alternating pairs: -2.2 / -1.9 /
// -4.2 % at batch 17 / 20 / 24 (up to 28: +1.3 % at batch 28; up to 32: +1.1 % at batch 32). The 70B step lost 9-10 % at
// batch 20 / 24 with the same limit, so only the 8B shapes whose epilogue can take clusters (o and down with the
// residual, gate_up with SwiGLU; the qkv epilogue keeps its reduce kernel) are listed; they were screened together.
constexpr TunedClusterRowsEntry kClusterRowsEntries[] = {
    {4096, 4096, 24},
    {28672, 4096, 24},
    {4096, 14336, 24},
};

// Launched plainly (no programmatic serialisation): the thirty-second session's in-step screens on an H200
// (docs/results.md), FT_W4A16_PLAIN_LAUNCH, 8B step, four alternating pairs: the 8B down projection behind the 16-slot
// gate_up (kWg32Entries, one CTA per SM at M = 25..32) -1.4 / -1.5 / -0.6 % at batch 25 / 28 / 32. Under programmatic
// launch its CTAs sat beside gate_up's and fetched their weights early; at M = 17..24 (gate_up on 8 slots, two CTAs
// per SM) the same costs +1.5 to +3.1 %, the 70B down at M = 25..32 +1.7 %, the 8B gate_up or o at M = 25..32 +2.3 % /
// level.
constexpr TunedPlainLaunchEntry kPlainLaunchEntries[] = {
    {4096, 14336, 25, 32},
};

// Whether the tables apply: group 128 on the device they were measured on.
bool measured_here(int group, const DeviceLimits& d) {
  return group == 128 && d.sm_count == kMeasuredOn.sm_count && d.smem_per_sm == kMeasuredOn.smem_per_sm &&
         d.smem_per_block == kMeasuredOn.smem_per_block;
}

// The first entry of a table for this shape and M, where the table applies, else nullptr.

template <class Entry, size_t kCount>
const Entry* find_entry(const Entry (&table)[kCount], int M, int N, int K, int group, const DeviceLimits& d) {
  if (!measured_here(group, d)) return nullptr;
  for (const Entry& e : table)
    if (covers(e, M, N, K)) return &e;
  return nullptr;
}

}  // namespace

const TunedWg32Entry* tuned_wg32_entries(int* count) {
  *count = static_cast<int>(std::size(kWg32Entries));
  return kWg32Entries;
}

const TunedWg32Entry* find_tuned_wg32(int M, int N, int K, int group, const DeviceLimits& d) {
  return find_entry(kWg32Entries, M, N, K, group, d);
}

const TunedClusterRowsEntry* tuned_cluster_rows_entries(int* count) {
  *count = static_cast<int>(std::size(kClusterRowsEntries));
  return kClusterRowsEntries;
}

int tuned_cluster_max_rows(int N, int K, int group, const DeviceLimits& d) {
  if (!measured_here(group, d)) return kClusterMaxRows;
  for (const TunedClusterRowsEntry& e : kClusterRowsEntries)
    if (e.N == N && e.K == K) return e.max_rows;
  return kClusterMaxRows;
}

const TunedPlainLaunchEntry* tuned_plain_launch_entries(int* count) {
  *count = static_cast<int>(std::size(kPlainLaunchEntries));
  return kPlainLaunchEntries;
}

const TunedPlainLaunchEntry* find_tuned_plain_launch(int M, int N, int K, int group, const DeviceLimits& d) {
  return find_entry(kPlainLaunchEntries, M, N, K, group, d);
}

const TunedV4Entry* tuned_v4_entries(int* count) {
  *count = static_cast<int>(std::size(kEntries));
  return kEntries;
}

const TunedV4Entry* find_tuned_v4(int M, int N, int K, int group, const DeviceLimits& d) {
  return find_entry(kEntries, M, N, K, group, d);
}

V4Config tuned_config(const TunedV4Entry& e) {
  V4Config c;
  c.warps = e.warps;
  c.stages = e.stages;
  c.ctas_per_sm = e.ctas_per_sm;
  c.wgmma = e.wgmma;
  c.stream_x = e.stream_x;
  if (e.stream_x) c.stream_stages = e.stages;
  c.warps_n = e.warps_n;
  c.splits = e.splits;
  return c;
}

}  // namespace futransformer::cuda::w4a16
