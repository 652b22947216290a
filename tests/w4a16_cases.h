// Shared by the CPU emulation (tests/cpu/test_w4a16_v4_emulation.cpp) and the GPU tests
// (tests/gpu/test_gemm_w4a16.cpp) of the W4A16 GEMM: random inputs, the scale of each output's rounding errors,
// the tolerances derived from the number formats, and a table of explicit tilings that reach the awkward paths
// (warp ranges starting inside a group, single-block last pairs, idle warps, ring wrap-around, split-K).
#pragma once

#include <cmath>
#include <cstdint>
#include <iterator>
#include <random>
#include <vector>

#include "cuda/gemm_w4a16_layout.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/int4.h"

namespace futransformer::test::w4a16 {

namespace w4 = futransformer::cuda::w4a16;

// y is rounded once to BF16: at most 2^-8 relative.
constexpr double kBf16Rounding = 1.0 / 256.0;
// fp32 accumulation with exact products: per mma the hardware sum errs by at most 2^-22 of the magnitudes it adds
// (truncating alignment and normalisation); over K <= 16384 (1024 k16 steps), group flushes and warp/split sums
// this stays below 2^-12 of sum |x w| even added linearly. (v2 and v4.)
constexpr double kAccumulationRel = 1.0 / 4096.0;
// v4 only: per group it accumulates x (128 + u) and x 136 (each at most 143 |x|) in two fp32 chains of at most
// group / 16 <= 8 mma and subtracts them at the flush. With the same per-mma model a chain errs by at most
// 2^-22 (8 + 1) 143 sum_g |x|, both together by 2^-10.7 sum_g |x|; scaled by s_g and summed over the groups:
// at most 2^-10 of offset_dot = sum_k s(k) |x_k|. (sum |x w| is about 2 to 3 times offset_dot for RTN weights,
// so this roughly doubles the accumulation term; the BF16 output rounding still dominates on typical data.)
constexpr double kOffsetRel = 1.0 / 1024.0;
// Whole-tensor relative L2 error; BF16 output rounding alone gives about 2e-3.
constexpr double kRelL2Tol = 1e-2;

inline formats::Int4Weight random_weight(int64_t N, int64_t K, int64_t group, formats::ScaleType st, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(N * K));
  for (float& v : w) v = dist(rng);
  formats::Int4Spec spec;
  spec.group_size = group;
  spec.symmetric = true;
  spec.scale_type = st;
  return formats::int4_quantize_rtn(w, N, K, spec, "test.weight");
}

inline std::vector<uint16_t> random_x(int64_t M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = f32_to_bf16(dist(rng));
  return x;
}

inline float scale_value(uint16_t bits, formats::ScaleType st) {
  return st == formats::ScaleType::F16 ? f16_to_f32(bits) : bf16_to_f32(bits);
}

// offset_dot[m * N + n] = sum_k |x[m, k]| * |scale(n, k / group)|: the scale of v4's offset-cancellation error.
inline std::vector<double> offset_dot(const std::vector<uint16_t>& x, int64_t M, const formats::Int4Weight& w) {
  const int64_t N = w.rows, K = w.cols, groups = K / w.group;
  std::vector<double> xg(static_cast<size_t>(M * groups), 0.0);  // sum of |x| per (row, group)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      xg[static_cast<size_t>(m * groups + k / w.group)] += std::fabs(bf16_to_f32(x[static_cast<size_t>(m * K + k)]));
  std::vector<double> out(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0;
      for (int64_t g = 0; g < groups; ++g)
        s += xg[static_cast<size_t>(m * groups + g)] *
             std::fabs(scale_value(w.scales[static_cast<size_t>(n * groups + g)], w.spec.scale_type));
      out[static_cast<size_t>(m * N + n)] = s;
    }
  return out;
}

// Per-element bound of |y - ref| for a variant.
inline double error_bound(w4::Variant v, double ref, double abs_dot, double off_dot) {
  return kBf16Rounding * std::fabs(ref) + kAccumulationRel * abs_dot + (v == w4::Variant::v4 ? kOffsetRel * off_dot : 0);
}

struct TilingCase {
  int M, N, K, group;
  formats::ScaleType st;
  w4::Tiling t;
  const char* why;
};

inline w4::Tiling make_tiling(int M, int warps_n, int splits, bool rows8) {
  w4::Tiling t;
  t.m_tiles = (M + 15) / 16;
  t.rows8 = rows8;
  t.rows = M;
  t.warps_n = warps_n;
  t.warps_k = w4::kWarps / warps_n;
  t.splits = splits;
  return t;
}

// Explicit tilings (variant left at v2; callers set it). rows8 = M <= 8 unless the case says otherwise.
inline std::vector<TilingCase> tiling_cases() {
  using formats::ScaleType;
  auto c = [](int M, int N, int K, int group, ScaleType st, int warps_n, int splits, const char* why,
              bool rows8 = true) {
    return TilingCase{M, N, K, group, st, make_tiling(M, warps_n, splits, rows8 && M <= 8), why};
  };
  return {
      c(1, 256, 256, 128, ScaleType::BF16, 8, 1, "decode: 8-row / swapped path, one slice"),
      c(5, 256, 640, 128, ScaleType::F16, 8, 3, "uneven split-K slices (5 groups / 3)"),
      c(8, 128, 640, 64, ScaleType::BF16, 4, 2, "warps_k = 2, 5 blocks each: odd pairs, warp 1 starts mid-group"),
      c(3, 64, 640, 32, ScaleType::F16, 2, 3, "warps_k = 4, group 32 flushes every block"),
      c(2, 32, 384, 128, ScaleType::BF16, 1, 2, "warps_k = 8 over 4 and 8 blocks: idle and one-block warps"),
      c(7, 32, 128, 128, ScaleType::BF16, 1, 1, "more K warps than blocks"),
      c(1, 256, 1120, 32, ScaleType::BF16, 8, 1, "35 blocks per warp: ring wrap-around, single last block"),
      c(4, 256, 2176, 64, ScaleType::F16, 8, 1, "68 blocks per warp, FP16 scales"),
      c(6, 64, 1408, 128, ScaleType::BF16, 2, 1, "11 blocks per warp (44 / 4): ranges start inside groups"),
      c(3, 64, 256, 128, ScaleType::BF16, 2, 1, "M <= 8 through the 16-row path (rows8 off)", false),
      c(9, 64, 256, 64, ScaleType::BF16, 2, 1, "one m tile, rows 9..15 clamped"),
      c(16, 32, 384, 128, ScaleType::BF16, 1, 2, "warps_k = 8, some warps with one block"),
      c(17, 64, 256, 64, ScaleType::BF16, 2, 1, "two m tiles, rows 17..31 clamped to row 16"),
      c(33, 128, 256, 128, ScaleType::F16, 4, 2, "three m tiles"),
      c(64, 256, 512, 32, ScaleType::BF16, 8, 4, "four m tiles, group 32"),
  };
}

// The swapped three/four-tile path (swap32, variant v4, M = 17..32, default CTA shape): the explicit tiling above
// with M in that range, plus three-tile (M <= 24) and four-tile cases with clamped rows, odd group counts, uneven
// splits, warps starting inside groups, idle K warps and ring wrap-around.
inline std::vector<TilingCase> swap32_cases() {
  using formats::ScaleType;
  std::vector<TilingCase> out;
  for (const TilingCase& c : tiling_cases())
    if (c.M >= w4::kSwap32MinM && c.M <= w4::kSwap32MaxM) out.push_back(c);
  auto c = [](int M, int N, int K, int group, ScaleType st, int warps_n, int splits, const char* why) {
    return TilingCase{M, N, K, group, st, make_tiling(M, warps_n, splits, false), why};
  };
  const TilingCase extra[] = {
      c(17, 64, 256, 32, ScaleType::F16, 2, 1, "M = 17: three tiles, rows 17..23 clamped, group 32"),
      c(20, 32, 576, 64, ScaleType::F16, 1, 1, "M = 20: 9 groups over 8 K warps"),
      c(24, 256, 1120, 32, ScaleType::BF16, 8, 1, "M = 24: three full tiles, 35 blocks per warp, single last block"),
      c(25, 128, 640, 64, ScaleType::F16, 4, 3, "M = 25: four tiles, rows 25..31 clamped, 10 groups in 3 slices"),
      c(28, 128, 576, 32, ScaleType::BF16, 4, 2, "M = 28: 18 groups of 32 in 2 slices, warps_k = 2"),
      c(31, 64, 1408, 128, ScaleType::BF16, 2, 1, "M = 31: 11 groups, warps_k = 4, ranges start inside groups"),
      c(32, 32, 384, 128, ScaleType::BF16, 1, 2, "M = 32: warps_k = 8 over 4 and 8 blocks, idle warps"),
      c(32, 256, 2176, 64, ScaleType::F16, 8, 1, "M = 32: 68 blocks per warp, FP16 scales"),
  };
  out.insert(out.end(), std::begin(extra), std::end(extra));
  for (TilingCase& d : out) {
    d.t.variant = w4::Variant::v4;
    d.t.swap32 = true;
  }
  return out;
}

// The v4 configurations beyond the default (variant v4): every explicit tiling above with M <= 16 again on each
// other compiled (warps, stages) shape (warps_k scaled so warps_n stays), and on the swapped two-tile path where
// M = 9..16, plus cases for that path alone (M = 10..15, odd group counts, uneven splits, ring wrap-around); then
// the swap32 cases (M = 17..32).
inline std::vector<TilingCase> v4_config_cases() {
  using formats::ScaleType;
  std::vector<TilingCase> base;
  for (const TilingCase& c : tiling_cases())
    if (c.M <= 16) base.push_back(c);
  auto c = [](int M, int N, int K, int group, ScaleType st, int warps_n, int splits, const char* why) {
    return TilingCase{M, N, K, group, st, make_tiling(M, warps_n, splits, false), why};
  };
  const TilingCase extra[] = {
           c(12, 64, 640, 64, ScaleType::F16, 2, 3, "M = 12: uneven split-K slices, warps start inside groups"),
           c(15, 256, 1120, 32, ScaleType::BF16, 8, 1, "M = 15: 35 blocks per warp, group 32"),
           c(13, 128, 1408, 128, ScaleType::BF16, 4, 1, "M = 13: 11 groups, warps_k = 2"),
           c(10, 32, 576, 64, ScaleType::F16, 1, 1, "M = 10: 9 groups over 8 K warps"),
           c(14, 64, 2176, 64, ScaleType::BF16, 2, 2, "M = 14: 17 groups in 2 slices"),
  };
  const size_t n_explicit = base.size();  // these already run on the default shape in tiling_cases()
  base.insert(base.end(), std::begin(extra), std::end(extra));
  std::vector<TilingCase> out;
  for (size_t i = 0; i < base.size(); ++i) {
    for (const w4::KernelShape& k : w4::kV4KernelShapes) {
      for (bool swap16 : {false, true}) {
        const bool is_default = k.warps == w4::kWarps && k.stages == w4::kStages && !swap16;
        if ((swap16 && base[i].M < 9) || (is_default && i < n_explicit)) continue;
        if (k.warps % base[i].t.warps_n != 0) continue;  // 28 warps: a case's warps_n of 8 cannot be laid out
        TilingCase d = base[i];
        d.t.variant = w4::Variant::v4;
        d.t.warps = k.warps;
        d.t.stages = k.stages;
        d.t.warps_k = k.warps / d.t.warps_n;
        d.t.swap16 = swap16;
        out.push_back(d);
      }
    }
  }
  for (const TilingCase& d : swap32_cases()) out.push_back(d);
  return out;
}

// The warpgroup path (wgmma, variant v4, M <= 32, default CTA shape, warps_n a multiple of 4): the explicit tilings
// and swap32 cases above that have such a warps_n, plus cases for what is new there: one to four activation tiles
// with rows past M never staged, a warpgroup on warps_k = 2 whose ranges start inside groups, a group ending after
// the first block of a pair (group 32, odd ranges), a single last block, ring wrap-around and uneven split-K.
inline std::vector<TilingCase> wgmma_cases() {
  using formats::ScaleType;
  std::vector<TilingCase> base;
  for (const TilingCase& c : tiling_cases())
    if (c.M <= w4::kWgMaxM && c.t.warps_n % w4::kWgWarps == 0) base.push_back(c);
  for (const TilingCase& c : swap32_cases())
    if (c.t.warps_n % w4::kWgWarps == 0) base.push_back(c);
  auto c = [](int M, int N, int K, int group, ScaleType st, int warps_n, int splits, const char* why) {
    return TilingCase{M, N, K, group, st, make_tiling(M, warps_n, splits, M <= 8), why};
  };
  const TilingCase extra[] = {
      c(1, 128, 1408, 128, ScaleType::BF16, 4, 1, "M = 1: warps_k = 2, 22 blocks each, ranges start inside groups"),
      c(2, 256, 608, 32, ScaleType::F16, 4, 1, "M = 2: 19 blocks over warps_k = 2 (9 / 10), a flush after every block"),
      c(8, 512, 4096, 128, ScaleType::BF16, 8, 4, "M = 8: one full tile, split-K 4"),
      c(11, 256, 640, 64, ScaleType::F16, 8, 3, "M = 11: two tiles, uneven split-K"),
      c(16, 256, 2176, 64, ScaleType::BF16, 8, 1, "M = 16: 68 blocks per warp, ring wrap-around"),
      c(19, 128, 1120, 32, ScaleType::BF16, 4, 1, "M = 19: three tiles, 35 blocks over warps_k = 2, group 32"),
      c(29, 256, 576, 64, ScaleType::F16, 8, 2, "M = 29: four tiles, 9 groups in 2 slices"),
      c(32, 128, 14336, 128, ScaleType::BF16, 4, 8, "M = 32: the 8B down projection's K, split-K 8"),
  };
  base.insert(base.end(), std::begin(extra), std::end(extra));
  // Streamed activations (stream_x: warps_k = 1, 8 weight slots): every case with 8 warps side by side again.
  std::vector<TilingCase> streamed;
  for (const TilingCase& d : base) {
    if (d.t.warps_n != w4::kWarps) continue;
    TilingCase s = d;
    s.t.stages = w4::kWgStreamStages;
    s.t.stream_x = true;
    streamed.push_back(s);
  }
  const TilingCase extra_streamed[] = {
      c(32, 256, 4096, 128, ScaleType::BF16, 8, 1, "streamed M = 32: 128 blocks, 64 panels through the panel ring"),
      c(1, 256, 1088, 32, ScaleType::F16, 8, 1, "streamed M = 1: 34 blocks, group 32"),
      c(24, 512, 1120, 32, ScaleType::BF16, 8, 3, "streamed M = 24: 35 groups of 32 in 3 slices (odd block counts)"),
      c(13, 256, 14336, 128, ScaleType::BF16, 8, 2, "streamed M = 13: the down projection's K in 2 slices"),
  };
  for (TilingCase s : extra_streamed) {
    s.t.stages = w4::kWgStreamStages;
    s.t.stream_x = true;
    streamed.push_back(s);
  }
  // The 16-slot streamed ring (kWgStreamDeepStages): the extra streamed cases again (panel ring of 9 slots, wrap
  // at 128 blocks, single last blocks) plus one four-tile case with many pairs.
  const size_t n_streamed = streamed.size();
  for (size_t i = n_streamed - std::size(extra_streamed); i < n_streamed; ++i) {
    TilingCase s = streamed[i];
    s.t.stages = w4::kWgStreamDeepStages;
    streamed.push_back(s);
  }
  {
    TilingCase s = c(27, 512, 8192, 128, ScaleType::F16, 8, 1, "16-slot streamed M = 27: 256 blocks, 128 panels");
    s.t.stages = w4::kWgStreamDeepStages;
    s.t.stream_x = true;
    streamed.push_back(s);
  }
  base.insert(base.end(), streamed.begin(), streamed.end());
  for (TilingCase& d : base) {
    d.t.variant = w4::Variant::v4;
    d.t.swap32 = false;
    d.t.swap16 = false;
    d.t.wgmma = true;
  }
  return base;
}

}  // namespace futransformer::test::w4a16
