// W4A16 GEMM: the packed weight/scale layouts and every index map the kernel uses, in one plain C++ header
// shared by the CUDA kernel (src/cuda/gemm_w4a16.cuh), the CPU repacker (src/formats/int4_mma.cpp) and the CPU
// emulation test (tests/cpu/test_repack_int4.cpp), so that the three cannot drift apart. docs/kernels.md draws
// the layouts.
//
// mma.sync.m16n8k16 (bf16, fp32 accumulate) fragments, PTX ISA "Matrix Fragments for mma.m16n8k16"; a lane has
// g = lane / 4 (groupID) and t = lane % 4 (threadID_in_group); the lower-indexed element sits in the low 16 bits:
//   A (16x16, row major) reg r in 0..3: row g + 8 * (r & 1), cols 2t + 8 * (r >> 1) + {0, 1}
//   B (16x8, K x N)      reg r in 0..1: rows (k) 2t + 8 * r + {0, 1}, col (n) g
//   C (16x8, fp32)       elem i in 0..3: row g + 8 * (i >> 1), col 2t + (i & 1)
//
// Packed weights: the [N, K] weight is cut into 32 x 32 blocks (32 output rows n, 32 input columns k). A block
// is 512 bytes: lane L of a warp owns the 16 bytes at L * 16, four 32-bit words. Word w covers k16 step
// ks = w >> 1 and the n8 tile pair np = w & 1 (tiles 2np, 2np + 1). Within a word, slot p (bits 4p..4p+3 and
// 16+4p..16+4p+3) is B register (p & 1) of tile 2np + (p >> 1): its low half holds the lower k. So
//   ((word >> 4p) & 0x000f000f) | 0x43004300
// is a bf16x2 pair 128 + u (0x4300 is bf16 128.0, whose last mantissa bit weighs 1), and subtracting 136 gives
// the exact integers u - 8 as the B register. Blocks are stored [n block][k block], so a warp walking K for one
// n block reads consecutive 512-byte blocks.
//
// Packed scales: [n block][group][t (4)][tile (4)][half (2)] 16-bit values, i.e. 64 bytes per (n block, group);
// lane t finds the eight scales of its C-fragment columns (tile * 8 + 2t + half) in one 16-byte vector.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/host_device.h"

namespace futransformer::cuda::w4a16 {

constexpr int kWarpSize = 32;
constexpr int kBlockN = 32;            // output columns of one packed block
constexpr int kBlockK = 32;            // input columns of one packed block
constexpr int kWordsPerLane = 4;       // 16 bytes: one cp.async per lane per block
constexpr int kBlockWords = kWarpSize * kWordsPerLane;
constexpr int kTilesPerBlock = kBlockN / 8;   // n8 MMA tiles per block
constexpr int kScalesPerGroupBlock = kBlockN;  // one scale per output column per group
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
// Per-thread cp.async ring depth: 15 blocks (240 bytes per lane, 60 KB per CTA) in flight. Little's law on the
// H200: ~4 TB/s x ~1.5-2 us loaded DRAM latency is 6-8 MB in flight, 45-60 KB per SM; the first version's 8 slots
// (28 KB per CTA, one CTA per SM on the large layers) reached only ~2 TB/s (docs/notes/w4a16-tuning.md).
constexpr int kStages = 16;
constexpr int kMaxM = 64;
constexpr int kMaxMTiles = kMaxM / 16;
constexpr int kMaxSplits = 64;
// Padding of each staged activation row (bf16 elements): ldmatrix reads 8 rows of 16 bytes at once, and a row
// pitch that is an odd multiple of 16 bytes modulo 128 puts them in distinct bank groups.
constexpr int kAPadElems = 8;

constexpr uint32_t kMagicMask = 0x000f000fu;   // one nibble per bf16 half
constexpr uint32_t kMagicBias = 0x43004300u;   // bf16x2 {128, 128}
constexpr uint32_t kMagicSub = 0x43084308u;    // bf16x2 {136, 136}: 128 + the symmetric zero point 8

struct NK {
  int n, k;
};

// The (row n, column k) inside a 32 x 32 block held by slot p (0..3), half h (0 low, 1 high) of word w of lane.
FT_HD NK nibble_coords(int lane, int w, int p, int h) {
  const int g = lane >> 2, t = lane & 3;
  const int ks = w >> 1, np = w & 1;
  const int tile = np * 2 + (p >> 1);
  const int reg = p & 1;
  return NK{tile * 8 + g, ks * 16 + reg * 8 + t * 2 + h};
}
FT_HD int nibble_shift(int p, int h) { return 4 * p + 16 * h; }
// Word index of word w of lane in block (nb, kb); k_blocks = K / 32.
FT_HD int64_t packed_word_index(int64_t nb, int64_t kb, int64_t k_blocks, int lane, int w) {
  return ((nb * k_blocks + kb) * kWarpSize + lane) * kWordsPerLane + w;
}
// Index of the scale of column (tile * 8 + 2t + half) of block nb for group g; groups = K / group.
FT_HD int64_t packed_scale_index(int64_t nb, int64_t g, int64_t groups, int t, int tile, int half) {
  return ((nb * groups + g) * 4 + t) * 8 + tile * 2 + half;
}
FT_HD int scale_column(int t, int tile, int half) { return tile * 8 + t * 2 + half; }

// Rows/columns of the fragments a lane holds (see the table at the top).
FT_HD int c_frag_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
FT_HD int c_frag_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }
// Row/column (in the 16 x 16 A tile) whose address lane supplies to ldmatrix.x4: matrices 0..3 are
// (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = A registers 0..3.
FT_HD int ldmatrix_x4_row(int lane) { return lane & 15; }
FT_HD int ldmatrix_x4_col(int lane) { return (lane >> 4) * 8; }
// ldmatrix.x2 for M <= 8: matrices (rows 0-7, k 0-7), (rows 0-7, k 8-15) = A registers 0 and 2; lanes 16..31
// supply addresses that are ignored, kept in range by the mask.
FT_HD int ldmatrix_x2_row(int lane) { return lane & 7; }
FT_HD int ldmatrix_x2_col(int lane) { return ((lane >> 3) & 1) * 8; }

// Part i of `parts` nearly equal parts of [0, total): sizes differ by at most one.
struct Range {
  int64_t begin, end;
};
FT_HD Range split_range(int64_t total, int64_t parts, int64_t i) {
  return Range{total * i / parts, total * (i + 1) / parts};
}

// Kernel variant (docs/notes/w4a16-tuning.md). v2: B operand u - 8 (lop3 + sub.bf16x2 per register), one block
// per loop iteration. v4: B (or A) operand 128 + u straight from the lop3, the offset 136 * sum(x) removed per
// group in fp32; for M <= 8 weights are the 16 x 16 A operand and activations the n = 8 B operand ("swapped");
// two blocks per loop iteration. Both read the same packed weights and scales.
enum class Variant : uint8_t { v2, v4 };

// The (warps per CTA, ring slots per thread) pairs the v4 kernel is compiled for (gemm_w4a16_v4_*.cu); the first
// is the default and the only one for v2 and for M > 16. More slots or more warps put more weight bytes in flight
// per CTA: 8 warps x 16 slots keep 14 blocks (56 KB) per CTA in flight, 8 x 32 keep 30 (120 KB), 16 x 16 keep
// 14 per warp (112 KB) and give the SM twice the warps to hide the dependent LDS -> lop3 -> mma chains; 24 x 8 keep
// 6 per warp (72 KB) with three times the default's warps in one CTA (the register file's limit at ~72 registers),
// for layers whose N / 32 column blocks give one CTA per SM (N = 4096: 128 CTAs); 28 x 8 (28 warps: 896 threads at 72
// registers fill the register file) for N / 32 = 7 · 128 (gate|up: warps_n 7 or 14 give 128 CTAs).
struct KernelShape {
  int warps, stages;
};
constexpr KernelShape kV4KernelShapes[] = {{8, 16}, {8, 32}, {16, 16}, {8, 8}, {24, 8}, {28, 8}};
// Widest warps_n a tiling may have (any divisor of its warps up to this; the warpgroup path wants multiples of 4).
constexpr int kMaxWarpsN = 16;
constexpr bool v4_kernel_compiled(int warps, int stages) {
  for (const KernelShape& k : kV4KernelShapes)
    if (k.warps == warps && k.stages == stages) return true;
  return false;
}
static_assert(kV4KernelShapes[0].warps == kWarps && kV4KernelShapes[0].stages == kStages,
              "the first compiled shape is the default one");

// One launch configuration (chosen by gemm_w4a16_heuristics.cpp).
struct Tiling {
  int m_tiles = 1;     // 16-row MMA tiles covering M (1..4)
  bool rows8 = false;  // M <= 8: ldmatrix.x2 feeds MMA rows 0..7; its rows 8..15 are zero registers
  int rows = 1;        // staged activation rows (= M): MMA rows past M read row M - 1 and their outputs are dropped
  int warps_n = 8;     // warps side by side along N: a CTA covers 32 * warps_n output columns
  int warps_k = 1;     // warps sharing those columns, each on its own part of the CTA's K slice
  int splits = 1;      // K slices (grid.y); more than one needs the fp32 workspace and the reduce kernel
  Variant variant = Variant::v2;  // v4 with rows8: the swapped (weights as A) path
  int warps = kWarps;    // warps per CTA (warps_n * warps_k); other than kWarps only for v4 with M <= 16
  int stages = kStages;  // cp.async ring slots per thread (a power of two); likewise
  bool swap16 = false;   // v4, 9 <= M <= 16: swapped path with two n = 8 activation tiles (rows 0-7, 8-15)
  bool swap32 = false;   // v4, 17 <= M <= 32: swapped path with three (M <= 24) or four n = 8 activation tiles
  bool wgmma = false;    // v4, M <= 32: the warpgroup path (gemm_w4a16_wg.cuh), warps_n a multiple of 4
  bool stream_x = false;  // wgmma with warps_k = 1 and 8 stages: activations streamed through a ring of panels

  bool operator==(const Tiling&) const = default;
};

// The swapped paths serve M <= 32 (kSwap32MaxM): rows8 M <= 8, swap16 M = 9..16, swap32 M = 17..32.
constexpr int kSwap32MinM = 17;
constexpr int kSwap32MaxM = 32;
// n = 8 activation tiles of the swapped paths for a tiling (0: the 16-row path): the kernel's kSwapTiles. swap32
// runs three tiles when the rows fit in 24, so M = 17..24 issues no mma for a fourth tile of clamped rows.
FT_HD constexpr int swap_tiles(bool rows8, bool swap16, bool swap32, int rows) {
  return rows8 ? 1 : (swap16 ? 2 : (swap32 ? (rows <= 24 ? 3 : 4) : 0));
}

// Register cap for __launch_bounds__: decode (one m tile) wants three CTAs per SM for bytes in flight; the
// larger accumulator sets of M > 32 need the registers more. The swapped four-tile path (swap32) has the
// accumulators of two m tiles (m_tiles = 2, 32 + 32 partial sums) and is capped like them.
FT_HD constexpr int min_blocks_per_sm(int m_tiles) { return m_tiles == 1 ? 3 : (m_tiles == 2 ? 2 : 1); }
// The same for a CTA of `warps` warps: one m tile keeps 24 warps per SM resident (65536 registers / 768 threads
// = 85 per thread, above v4's 72-80), so 3 CTAs of 8 warps and 1 of 16 (two would need 64 registers: spills).
// The swapped two-tile path (swap16) holds 16 accumulators, 16 partial sums and 8 activation registers: capped at
// 80 registers ptxas spilled 44 bytes per thread, so it keeps 16 warps per SM (128 registers; it uses about 92).
FT_HD constexpr int min_blocks_per_sm(int m_tiles, int warps, bool swap16 = false) {
  return m_tiles != 1 ? min_blocks_per_sm(m_tiles) : ((swap16 ? 16 : 24) / warps > 0 ? (swap16 ? 16 : 24) / warps : 1);
}

// --- Warpgroup path (gemm_w4a16_wg.cuh, Tiling::wgmma, M <= 32) ------------------------------------------------
// Four consecutive warps of a CTA (same wk, warps_n a multiple of 4) are one warpgroup. Each still streams its own
// n block exactly as the swapped paths do, and its packed word (ks, np) is the A fragment of a 16 x 16 weight tile
// (v4_slot): warp w of the warpgroup supplies rows 16 w .. 16 w + 15 of the A operand of
// wgmma.m64nNk16 (A from registers, the mma.m16n8k16 A fragment per warp), so one wgmma multiplies the four warps'
// tiles (ks, np) with the same activations, N = 8 * ceil(M / 8) token columns. The accumulator of warp w is then the
// swapped paths' 16 (n) x 8 (m) tiles side by side (register 4 j + e = element e of token tile j), stored by
// store_swapped. Weights are dequantised exactly (u - 8, lop3 + sub.bf16x2): no offset chain.
// Activations are staged K-major with the 128-byte swizzle (gemm_fp8_layout.h's descriptors): panel p (slice
// columns 64 p .. 64 p + 63) is N rows of 128 bytes, 1024-byte aligned; 16-byte chunk c of row r sits at chunk
// c ^ (r & 7). Rows M .. N - 1 are never written: their columns of the product are never stored.
constexpr int kWgWarps = 4;            // warps per warpgroup
constexpr int kWgPanelK = 64;          // bf16 columns per 128-byte swizzled row
constexpr int64_t kWgAlign = 1024;     // swizzle atom: the staged activations start 1024-byte aligned
constexpr int kWgMaxM = 32;
FT_HD constexpr int wg_tokens(int rows) { return (rows + 7) / 8 * 8; }
FT_HD constexpr int wg_tiles(int rows) { return (rows + 7) / 8; }
// Byte offset (from the aligned base) of 16-byte chunk c8 (slice columns 8 c8 .. 8 c8 + 7) of token row r.
FT_HD int64_t wg_x_offset(int r, int c8, int n_tokens) {
  const int p = c8 / (kWgPanelK / 8), c = c8 % (kWgPanelK / 8);
  return int64_t{p} * n_tokens * 128 + r * 128 + ((c ^ (r & 7)) << 4);
}
// Byte offset of the start address of the B descriptor of the k16 step at slice column k (a multiple of 16): the
// panel, then 32 bytes per k16 step inside the swizzled row (the XOR acts on address bits 4..6 from bits 7..9,
// which the step leaves alone, as in the FP8 GEMM's k steps).
FT_HD int64_t wg_b_desc_offset(int64_t k, int n_tokens) {
  return (k / kWgPanelK) * n_tokens * 128 + (k % kWgPanelK) * 2;
}
// Bytes of staged activations for the longest slice (without the alignment slack).
FT_HD int64_t wg_a_bytes(int64_t slice_cols, int rows) {
  return (slice_cols + kWgPanelK - 1) / kWgPanelK * wg_tokens(rows) * 128;
}
// Streamed activations (Tiling::stream_x): instead of the whole slice, a ring of wg_stream_panels(stages) panels
// (one per pair of blocks: panel j holds slice columns 64 j .. 64 j + 63), refilled stages / 2 - 1 pairs ahead like
// the weights; the extra slot lets a panel be overwritten only after the CTA barrier that follows every warp's wait
// for the wgmmas that read it. Needs warps_k = 1 (every warp on the same pairs) and a weight ring of
// kWgStreamStages (8) slots, so that with the smaller staging two or three CTAs share an SM where the staged slice
// allowed one, or of kWgStreamDeepStages (16): 56 KB of weights in flight per CTA, an option for tilings where one
// CTA per SM keeps the SMs busy without a split (8B gate|up at M = 32, 112 CTAs: 9.5 % faster alone on an H100, but
// the decode step was not; docs/results.md, twenty-sixth session).
constexpr int kWgStreamStages = 8;
constexpr int kWgStreamDeepStages = 16;
FT_HD constexpr bool wg_stream_stages_ok(int stages) {
  return stages == kWgStreamStages || stages == kWgStreamDeepStages;
}
FT_HD constexpr int wg_stream_panels(int stages) { return stages / 2 + 1; }
FT_HD int64_t wg_stream_panel_bytes(int rows) { return int64_t{wg_tokens(rows)} * 128; }

// Register cap: two 8-warp CTAs per SM (the four-tile instance holds 32 partial sums, 32 sums and two sets of 16 A
// registers, about 120 registers).
constexpr int kWgMinBlocksPerSm = 2;

// Only the M real rows are staged: zero rows up to the MMA's 8 or 16 would cost shared memory (occupancy) at
// decode sizes and feed only outputs that are never stored.
FT_HD int a_rows(const Tiling& t) { return t.rows; }
// Groups in the longest K slice.
FT_HD int64_t slice_groups_max(int64_t groups, int splits) { return (groups + splits - 1) / splits; }
// Pitch (elements) of a staged activation row: the longest slice plus padding.
FT_HD int64_t a_pitch(int64_t groups, int group, int splits) {
  return slice_groups_max(groups, splits) * group + kAPadElems;
}

// Dynamic shared memory: [activations | scales] overlapped by the cross-warp reduction buffer (used after
// the main loop), followed by the per-thread weight ring.
struct SmemLayout {
  int64_t a_bytes, s_bytes, red_bytes, ring_offset, total;
};
FT_HD SmemLayout smem_layout(const Tiling& t, int64_t K, int group) {
  const int64_t groups = K / group;
  SmemLayout s{};
  s.a_bytes = t.wgmma ? kWgAlign + (t.stream_x ? wg_stream_panels(t.stages) * wg_stream_panel_bytes(t.rows)
                                                : wg_a_bytes(slice_groups_max(groups, t.splits) * group, t.rows))
                      : a_rows(t) * a_pitch(groups, group, t.splits) * 2;
  s.s_bytes = t.warps_n * slice_groups_max(groups, t.splits) * kScalesPerGroupBlock * 2;
  s.red_bytes = t.warps_k > 1 ? int64_t{t.warps} * t.m_tiles * 16 * kWarpSize * 4 : 0;
  const int64_t front = s.a_bytes + s.s_bytes > s.red_bytes ? s.a_bytes + s.s_bytes : s.red_bytes;
  s.ring_offset = (front + 15) / 16 * 16;
  s.total = s.ring_offset + int64_t{t.stages} * t.warps * kWarpSize * 16;
  return s;
}

// Split-K inside thread-block clusters (gemm_w4a16_cluster.cuh): the largest cluster the launcher forms by default
// (the portable cluster size; more slices keep the reduce kernel), the rows it is used for, and the shared memory a
// CTA needs for its tile of sums, M rows x 32 warps_n columns of fp32, which must fit in the tiling's own
// (smem_layout). Rows: the 8B decode step (nineteenth session, docs/results.md) was 4.3 % faster at batch 16 with it
// (the o and gate|up GEMMs split 4 and 2 ways) and 0.5-1 % slower at batch 8 (the down GEMM's 6 slices on the M <= 8
// path) and at batch 32; so M = 9..16 (per shape up to more rows where an in-step screen found it faster:
// w4a16::tuned_cluster_max_rows, gemm_w4a16_tuned.h — the 8B o, gate_up and down up to 24). For measurements the launcher can raise both limits (up to
// kClusterLimitRows rows and kClusterLimitSplits slices, non-portable clusters above 8; gemm_w4a16_internal.h).
constexpr int kMaxClusterSplits = 8;
constexpr int kClusterMinRows = 9;
constexpr int kClusterMaxRows = 16;
constexpr int kClusterLimitRows = 32;    // the cluster-reduce instances cover M <= 32
constexpr int kClusterLimitSplits = 16;  // the largest non-portable cluster on Hopper
FT_HD constexpr int64_t cluster_tile_bytes(int M, int warps_n) { return int64_t{M} * kBlockN * warps_n * 4; }
// Whether a launch of tiling t for M rows finishes its split inside clusters, with the default limits or raised ones
// (the launcher also needs an epilogue other than the qkv prologue and the norm partials, the switch on, and a device
// that can place the cluster).
FT_HD bool cluster_reduce_applies(const Tiling& t, int M, int64_t K, int group, int max_rows = kClusterMaxRows,
                                  int max_splits = kMaxClusterSplits) {
  return t.splits >= 2 && t.splits <= max_splits && M >= kClusterMinRows && M <= max_rows &&
         smem_layout(t, K, group).total >= cluster_tile_bytes(M, t.warps_n);
}

// Element offset in staged activations of the address a lane gives ldmatrix for m tile mt at slice column k;
// rows past the `rows` staged ones are clamped to the last (their MMA rows give outputs that are dropped).
FT_HD int64_t a_frag_offset(int lane, int mt, int64_t k, int64_t pitch, bool rows8, int rows) {
  const int r = rows8 ? ldmatrix_x2_row(lane) : mt * 16 + ldmatrix_x4_row(lane);
  const int c = rows8 ? ldmatrix_x2_col(lane) : ldmatrix_x4_col(lane);
  return (r < rows ? r : rows - 1) * pitch + k + c;
}
// Element offset in staged scales of lane t's eight scales for warp column wn, slice-local group gl.
FT_HD int64_t s_frag_offset(int wn, int64_t gl, int64_t slice_groups, int t) {
  return (wn * slice_groups + gl) * kScalesPerGroupBlock + t * 8;
}

// --- v4 index maps ---------------------------------------------------------------------------------------
// v4 commits one cp.async group per pair of blocks: a ring of S slots holds S / 2 pairs, S / 2 - 1 in flight (with
// the default 16 slots: 14 blocks, 56 KB per CTA) while the last is consumed. Block i of a warp lives in slot
// i % S.
constexpr int kPairStages = kStages / 2;
static_assert(kStages % 2 == 0, "v4 consumes the ring in pairs of blocks");

// Register j (0..3) of the fragment built from one packed word comes from slot v4_slot(swap, j) (shift 4 * slot).
// Not swapped, j = 0, 1 are the B registers of tile 2np and j = 2, 3 those of tile 2np + 1 (slot order). Swapped,
// the word (ks, np) is the A fragment of the 16 x 16 weight tile (rows n = 16np .. 16np + 15, k = 16ks ..):
// A register r holds row g + 8 (r & 1), columns 2t + 8 (r >> 1); slot p holds row 8 (p >> 1) + g, columns
// 2t + 8 (p & 1), so register r is slot 2 (r & 1) + (r >> 1): {0, 2, 1, 3}.
FT_HD int v4_slot(bool swap, int j) { return swap ? ((j & 1) << 1) | (j >> 1) : j; }

// Swapped B operand (activations, k x m with m = 8): one ldmatrix.x4 per 32-column block and n8 tile mt (rows
// 8 mt .. 8 mt + 7; mt = 1 only on the two-tile path, M = 9..16); lane gives the address of row 8 mt + (lane & 7)
// (clamped to the staged rows), columns 8 (lane >> 3) .. + 7. Register j then holds x[8 mt + g][8j + 2t, 8j + 2t + 1]:
// B registers {0, 1} of k16 step 0 and {2, 3} of step 1.
FT_HD int64_t xb_frag_offset(int lane, int64_t k, int64_t pitch, int rows, int mt = 0) {
  const int r = 8 * mt + (lane & 7);
  return (r < rows ? r : rows - 1) * pitch + k + (lane >> 3) * 8;
}
// Two-tile path: the B registers of tiles 0 and 1 for k16 step ks, {x0[2ks], x0[2ks+1]} and {x1[2ks], x1[2ks+1]},
// are together the A fragment of the 16 (m) x 16 (k) activation tile: A register r holds row g + 8 (r & 1), columns
// 2t + 8 (r >> 1), i.e. tile r & 1, B register r >> 1. One mma of that A with the constant 136 as B gives
// 136 * sum_k x[m] for rows m = g (elements 0, 1) and g + 8 (elements 2, 3) of every lane.
FT_HD int swap16_a_tile(int r) { return r & 1; }
FT_HD int swap16_a_breg(int r) { return r >> 1; }
// ... and the accumulator element (tile mt, e) of lane needs row m = 8 mt + 2t + (e & 1), which lane
// 4 (2t + (e & 1)) holds as its element 2 mt (read with a warp shuffle at the flush).
FT_HD int swap16_corr_src_lane(int lane, int e) { return 4 * (2 * (lane & 3) + (e & 1)); }
FT_HD int swap16_corr_src_elem(int mt) { return 2 * mt; }
// Three- / four-tile path (swap32, M = 17..32): per k16 step, n = 8 tiles 2p and 2p + 1 come from one
// ldmatrix.x4 (tile 2p alone, for three tiles: .x2, whose addresses are lanes 0..15) at swap32_xb_offset: lane gives
// the address of token row 16p + 8 ((lane >> 4) & 1) + (lane & 7) (clamped to the staged rows), columns
// 16 ks + 8 ((lane >> 3) & 1), so register 2q + b holds B register b of tile 2p + q, x[16p + 8q + g][16 ks + 8b + 2t,
// + 1]: every B operand is a pair of adjacent registers as the mma wants it (a 16-row A-layout load would need two
// moves per weight mma), and only this step's 8 registers are live.
FT_HD int64_t swap32_xb_offset(int lane, int p, int64_t k, int64_t pitch, int rows) {
  const int r = 16 * p + 8 * ((lane >> 4) & 1) + (lane & 7);
  return (r < rows ? r : rows - 1) * pitch + k + 8 * ((lane >> 3) & 1);
}
// The offsets of swap32 come from one mma per tile and k16 step with the constant 136 as A and the tile's B
// registers as B (the M <= 8 path's chain, once per tile): its C element e is 136 * sum_k x[8j + 2t + (e & 1)], the
// token row of accumulator element e of tile j in the same lane, so the flush needs no shuffle. (Four such mma per
// step against two activations-as-A ones, which would need the A-layout registers: moves or a second load.)
// Swapped accumulator element e (0..3) of 16-row tile np: output column n (within the 32-column block) and row m.
FT_HD int swap_c_n(int lane, int np, int e) { return 16 * np + 8 * (e >> 1) + (lane >> 2); }
FT_HD int swap_c_m(int lane, int e) { return 2 * (lane & 3) + (e & 1); }
// Swapped lane g = lane / 4 needs the scales of columns 8 tile + g (tile 0..3): in the packed scale vector of
// t' = g / 2 they are the halves g % 2 of its four words (column 8 tile + 2t' + half).
FT_HD int swap_scale_t(int lane) { return (lane >> 2) >> 1; }
FT_HD int swap_scale_half(int lane) { return (lane >> 2) & 1; }
// prmt.b32 selector (second source 0) that turns half `half` of a staged scale pair into what the flush needs:
// an FP16 half in bits 0..15 with zeros above (then cvt.f32.f16), a BF16 half in bits 16..31 with zeros below
// (which is its fp32 value).
FT_HD uint32_t scale_prmt_selector(int half, bool f16) {
  return f16 ? (half ? 0x4432u : 0x4410u) : (half ? 0x3244u : 0x1044u);
}

// --- RMSNorm prologue (gemm_w4a16_rmsnorm*, M <= 8, v4 swapped path) ---------------------------------------
// The GEMM stages bf16(w · (s · x)) of fp32 rows x instead of BF16 rows, with each row's s exactly as rmsnorm_kernel
// <true> computes it with T = rmsnorm_threads(K, true) threads (src/cuda/rmsnorm_row.cuh states that order): T / 32
// virtual warps per row, virtual thread v = 32 vw + lane summing float4 units v, v + T, ... The CTA's W real warps
// share the rows x virtual warps "pairs" p = row * (T / 32) + vw: real warp w takes p = w, w + W, w + 2W, ..., in
// steps of kNormBatch pairs (one independent load chain each, so a warp has that many L2 loads in flight). Its lane
// l is lane l of the virtual warp, so the xor butterfly over the real warp is the virtual warp's; lane 0 stores the
// partial at scratch[p], and thread r < rows adds row r's partials in virtual-warp order from 0.0f.
constexpr int kNormMaxRows = 8;
constexpr int kNormMaxVirtualWarps = 32;  // rmsnorm_threads <= 1024
constexpr int kNormBatch = 8;
// fp32 scratch after the ring (dynamic shared memory): the partials [rows][T / 32], then one scale per row.
constexpr int kNormScratchFloats = kNormMaxRows * kNormMaxVirtualWarps + kNormMaxRows;
constexpr int64_t kNormScratchBytes = int64_t{kNormScratchFloats} * 4;
// Pair of real warp `warp` (of `warps`), step `step`, slot b of the batch; the pair's row and virtual warp.
FT_HD int norm_pair(int warp, int warps, int step, int b) { return warp + (step * kNormBatch + b) * warps; }
FT_HD int norm_pair_row(int p, int vwarps) { return p / vwarps; }
FT_HD int norm_pair_vwarp(int p, int vwarps) { return p % vwarps; }
// The float4 unit (within its row) lane `lane` of virtual warp vw sums in round j (< ceil(units / T)).
FT_HD int norm_unit(int vw, int lane, int j, int vthreads) { return vw * kWarpSize + lane + j * vthreads; }
// Scratch index of pair p's partial (row-major [row][vwarp]) and of row r's scale.
FT_HD int norm_partial_index(int row, int vw, int vwarps) { return row * vwarps + vw; }
FT_HD int norm_scale_index(int row) { return kNormMaxRows * kNormMaxVirtualWarps + row; }
// Norm partials in global memory (gemm_w4a16_residual_norm_partials writes them, a norm-prologue GEMM given them
// reads them instead of running its pass 1): for each row of width K, the T / 32 virtual-warp partials above, row-major
// at norm_partial_index(row, vw, T / 32), T = rmsnorm_threads(K, true) as everywhere in this section.

// --- The qkv prologue in the unsplit GEMM (gemm_w4a16_qkv_tail.cuh, M <= 8, v4 swapped path) ---------------
// Shared memory after the layout's total: each row's RoPE table (64 float2 at head_dim 128), three ints of cache
// metadata per row and the completed-heads word. A CTA covers 32 warps_n columns, which must divide the head (128)
// or be a multiple of it (at most kQkvTailMaxHeadsPerCta heads).
constexpr int kQkvTailMaxRows = 8;
constexpr int kQkvTailHeadDim = 128;
constexpr int kQkvTailMaxHeadsPerCta = 2;
constexpr int64_t kQkvTailScratchBytes = int64_t{kQkvTailMaxRows} * (kQkvTailHeadDim / 2) * 8 + 128;
// Whether a CTA of warps_n column blocks lines up with the heads as the tail needs.
FT_HD constexpr bool qkv_tail_columns_ok(int warps_n) {
  const int cols = kBlockN * warps_n;
  return cols > 0 && (cols <= kQkvTailHeadDim ? kQkvTailHeadDim % cols == 0
                                              : cols % kQkvTailHeadDim == 0 &&
                                                    cols / kQkvTailHeadDim <= kQkvTailMaxHeadsPerCta);
}

// --- Fused epilogues --------------------------------------------------------------------------------------
// What the GEMM does with an output element acc[m, n] instead of storing bf16(acc) (with one K slice in the final
// store of the GEMM kernel; with split-K in the reduce kernel, after the slice sum): nothing else changes, so the
// rounding points are those of the plain GEMM followed by the separate op.
//   store_bf16:   y[m, n] = bf16(acc)                                   (the plain GEMM)
//   residual_f32: r[m, n] = r[m, n] + float(bf16(acc)), one fp32 rounding (= GEMM + add_residual_bf16)
//   swiglu_bf16:  h[m, j] = bf16(silu(g) * u), g, u = float(bf16(acc)) of gate and up column j of a weight packed
//                 in the SwiGLU-interleaved row order below (= GEMM on the canonical weight + swiglu_bf16)
enum class Epilogue : uint8_t { store_bf16, residual_f32, swiglu_bf16 };

// SwiGLU-interleaved row order of a gate|up weight [gate rows 0 .. inter - 1 | up rows inter .. 2 inter - 1]: in
// every run of 16 packed rows, rows 0..7 are gate rows 8q .. 8q + 7 and rows 8..15 the up rows of the same
// q. Every fragment layout the kernels store from gives one thread an accumulator of column c and of column c + 8
// (c % 16 < 8) for the same token row (C tiles 2p and 2p + 1, element e; swapped: elements e and e + 2 of one
// 16-row tile), so the thread that holds gate j also holds up j and no data moves between threads.
constexpr int kSwiGluRun = 8;
// The canonical row of packed row n (inter = packed rows / 2, a multiple of 16 since N is a multiple of 32).
FT_HD int64_t swiglu_source_row(int64_t n, int64_t inter) {
  const int64_t q = n / (2 * kSwiGluRun), r = n % (2 * kSwiGluRun);
  return r < kSwiGluRun ? q * kSwiGluRun + r : inter + q * kSwiGluRun + (r - kSwiGluRun);
}
// Packed column of gate j (up j is kSwiGluRun further), and the output column of a packed gate column n.
FT_HD int64_t swiglu_gate_col(int64_t j) { return (j / kSwiGluRun) * (2 * kSwiGluRun) + j % kSwiGluRun; }
FT_HD int64_t swiglu_out_col(int64_t n) { return (n / (2 * kSwiGluRun)) * kSwiGluRun + n % (2 * kSwiGluRun); }
// Where a thread finds the up partner of its gate accumulators: 16-row path, C tile 2p (gate) pairs with 2p + 1;
// swapped path, element e < 2 (gate, column 16np + g) with e + 2 (column 16np + 8 + g), same token row.
FT_HD int swiglu_gate_tile(int p) { return 2 * p; }
FT_HD int swiglu_up_tile(int p) { return 2 * p + 1; }
FT_HD int swiglu_up_elem(int e) { return e + 2; }

// The units of a cluster tile (gemm_w4a16_cluster.cuh): float4 u of an [M][C] fp32 tile (C = 32 warps_n) holds row
// cluster_unit_row, columns cluster_unit_col .. + 3; rank r of `splits` CTAs of T threads finishes units r T + tid,
// r T + tid + splits T, ... With SwiGLU, a unit whose columns are up columns is read by the thread of its gate unit,
// cluster_up_unit(gate) (kSwiGluRun columns further, same row: C is a multiple of 2 kSwiGluRun).
FT_HD int cluster_unit_row(int u, int C) { return u * 4 / C; }
FT_HD int cluster_unit_col(int u, int C) { return u * 4 % C; }
FT_HD bool cluster_unit_is_up(int c) { return c % (2 * kSwiGluRun) >= kSwiGluRun; }
FT_HD int cluster_up_unit(int u) { return u + kSwiGluRun / 4; }

// QKV epilogue (gemm_w4a16_reduce_qkv_kernel): float4 j (< head_dim / 4) of head item `item` of token row r, in a
// qkv row of row_width = (n_heads + 2 n_kv_heads) * head_dim columns, is float4 index qkv_head_float4(...) of the
// [M, N = row_width] partial sums — the index gemm_w4a16_reduce_kernel gives the same four elements (its BF16 pairs
// go to y pairs 2 i, 2 i + 1). Needs head_dim % 4 == 0 (the formats' head_dim is a multiple of 8).
FT_HD int64_t qkv_head_float4(int r, int item, int j, int row_width, int head_dim) {
  return (static_cast<int64_t>(r) * row_width + static_cast<int64_t>(item) * head_dim) / 4 + j;
}

}  // namespace futransformer::cuda::w4a16
