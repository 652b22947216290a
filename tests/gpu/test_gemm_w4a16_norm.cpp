// GPU tests of the W4A16 GEMM's RMSNorm prologue (gemm_w4a16_rmsnorm, _swiglu, _qkv_rope_append and the internal
// _with_tiling twins) against the two launches it replaces, on the device, on the same inputs and the same tiling:
// rmsnorm_bf16 (fp32 rows -> BF16) followed by the plain GEMM launcher (gemm_w4a16 / _swiglu / _residual /
// _qkv_rope_append). The prologue sums each row's squares in rmsnorm_kernel<true>'s order and rounds y = bf16(w ·
// (s · x)) as it does, so the staged activations, and therefore every output, are bit for bit the unfused chain's:
// no tolerance. Cases: K = 576, 2048, 4096, 8192, 14336 (2 to 32 virtual warps, one to four float4 units per virtual
// thread), groups 32 / 64 / 128, FP16 and BF16 scales, M = 1..8, each compiled v4 (warps, stages) shape, one K slice
// and split-K; rows of very different magnitudes (1e-7 .. 7e4, and outliers) so that s differs widely between rows.
// Outputs, the normalised rows and the split-K workspace are poisoned (0xFF: NaN) before each launch. rmsnorm_bf16
// and the plain GEMMs are checked against their CPU twins elsewhere (test_decoder_ops.cpp, test_gemm_w4a16*.cpp),
// which makes them the oracle here. The GemmW4A16NormHost tests need no device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/gemm_w4a16_heuristics.h"
#include "cuda/gemm_w4a16_internal.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/fused_ops.h"
#include "futransformer/cuda/gemm_w4a16.h"
#include "futransformer/dtype.h"
#include "futransformer/formats/int4_mma.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/model.h"
#include "gpu_test_util.h"
#include "qkv_prologue_case.h"
#include "ref/ops.h"
#include "w4a16_cases.h"

namespace {

using namespace futransformer;
using formats::Int4MmaRows;
using formats::Int4Weight;
using formats::KvFormat;
using formats::ScaleType;
using test::DeviceBuffer;
using test::w4a16::random_weight;
namespace w4 = futransformer::cuda::w4a16;

// Tolerance: none. Every comparison is bit for bit (the contract of gemm_w4a16_rmsnorm*).
constexpr float kEps = 1e-5f;
const int kKs[] = {576, 2048, 4096, 8192, 14336};
constexpr int kMaxM = cuda::kW4A16NormMaxM;

__nv_bfloat16* bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
const __nv_bfloat16* bf(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }


// fp32 rows [M, K]: normal values times a per-row magnitude from 5e-8 to 7e4, row 3 with outliers 1e4 times larger
// every 97th element. The magnitudes make s (and the rounding of s · x) differ widely from row to row.
std::vector<float> random_rows(int M, int K, uint32_t seed) {
  static const float kRowScale[] = {1.0f, 3e3f, 2e-4f, 1.0f, 5e-8f, 40.0f, 1e-2f, 7e4f};
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M) * K);
  for (int m = 0; m < M; ++m) {
    for (int k = 0; k < K; ++k) {
      float v = dist(rng) * kRowScale[m % 8];
      if (m % 8 == 3 && k % 97 == 5) v *= 1e4f;
      x[static_cast<size_t>(m) * K + k] = v;
    }
  }
  return x;
}

std::vector<float> random_norm_weight(int K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(1.0f, 0.2f);
  std::vector<float> w(static_cast<size_t>(K));
  for (float& v : w) v = dist(rng);
  return w;
}

std::string describe(const w4::Tiling& t) {
  return std::string(t.variant == w4::Variant::v4 ? "v4" : "v2") + (t.rows8 ? " rows8" : "") + " w" +
         std::to_string(t.warps) + "s" + std::to_string(t.stages) + " warps_n " + std::to_string(t.warps_n) +
         " warps_k " + std::to_string(t.warps_k) + " splits " + std::to_string(t.splits);
}

// The tilings one (M, N, K, group) runs: each compiled v4 shape as the planner lays it out for that config, with one K
// slice, with 3 and with the planner's own split count. A tiling whose shared memory (plus the norm scratch) does not
// fit is left out — only when the reason is shared memory (long K at one slice); `left_out` counts them.
std::vector<w4::Tiling> norm_tilings(int M, int N, int K, int group, ScaleType st, int* left_out) {
  std::vector<w4::Tiling> out;
  const w4::DeviceLimits hopper;
  const int groups = K / group;
  for (const w4::KernelShape& shape : w4::kV4KernelShapes) {
    w4::V4Config c;
    c.warps = shape.warps;
    c.stages = shape.stages;
    w4::Tiling base;
    if (cuda::gemm_w4a16_plan_config(M, N, K, group, st, c, &base) != cudaSuccess) {
      ++*left_out;  // the shape does not fit this K at all (the planner found no split that does)
      continue;
    }
    EXPECT_TRUE(base.rows8 && base.variant == w4::Variant::v4) << describe(base);
    std::vector<int> splits = {1, std::min(3, groups), base.splits};
    std::sort(splits.begin(), splits.end());
    splits.erase(std::unique(splits.begin(), splits.end()), splits.end());
    bool split_ran = false;
    for (int s : splits) {
      w4::Tiling t = base;
      t.splits = s;
      std::string why;
      const bool valid = w4::tiling_is_valid(t, M, N, K, group, hopper, &why) &&
                         w4::smem_layout(t, K, group).total + w4::kNormScratchBytes <= hopper.smem_per_block;
      if (!valid) {
        EXPECT_TRUE(why.empty() || why.find("shared memory") != std::string::npos) << describe(t) << ": " << why;
        ++*left_out;
        continue;
      }
      split_ran |= s > 1;
      out.push_back(t);
    }
    if (groups > 1) EXPECT_TRUE(split_ran) << "no split-K tiling of shape w" << shape.warps << "s" << shape.stages;
  }
  return out;
}

size_t workspace_for(const w4::Tiling* t, int M, int N, int K) {
  size_t bytes = cuda::gemm_w4a16_workspace_bytes(M, N, K);
  if (t) bytes = std::max<size_t>(bytes, static_cast<size_t>(w4::workspace_bytes_for(*t, M, N)));
  return bytes;
}

// One weight with both packings, its norm weight, and the fp32 rows for M = kMaxM (smaller M use the first rows).
struct Case {
  Int4Weight w;
  DeviceBuffer<uint32_t> words, words_swiglu;
  DeviceBuffer<uint16_t> scales, scales_swiglu;
  std::vector<float> x_host;  // x's values, for the norm partials' twin
  DeviceBuffer<float> gamma, x;
  Case(int N, int K, int group, ScaleType st, uint32_t seed)
      : w(random_weight(N, K, group, st, seed)),
        words(formats::repack_int4_for_mma(w, Int4MmaRows::canonical)),
        words_swiglu(formats::repack_int4_for_mma(w, Int4MmaRows::swiglu_interleaved)),
        scales(formats::repack_int4_scales_for_mma(w, Int4MmaRows::canonical)),
        scales_swiglu(formats::repack_int4_scales_for_mma(w, Int4MmaRows::swiglu_interleaved)),
        x_host(random_rows(kMaxM, K, seed + 2)),
        gamma(random_norm_weight(K, seed + 1)),
        x(x_host) {}
  int N() const { return static_cast<int>(w.rows); }
  int K() const { return static_cast<int>(w.cols); }
  int group() const { return static_cast<int>(w.group); }
  ScaleType st() const { return w.spec.scale_type; }
};

// CPU twin of the RMSNorm partials (gemm_w4a16_reduce_residual_norm_kernel, and the warp sums of rmsnorm_kernel<true>
// they stand for): virtual thread v of T = 32 x gemm_w4a16_norm_partials_per_row(K) threads per row sums fmaf(x, x,
// ss) from 0 over its float4 units v, v + T, ... element by element; each virtual warp reduces by the xor butterfly
// 16, 8, 4, 2, 1 (every lane adds its partner's value, one fp32 rounding); lane 0's value is the partial.
std::vector<float> norm_partials_twin(const float* x, int M, int K) {
  const int per_row = cuda::gemm_w4a16_norm_partials_per_row(K), T = 32 * per_row, units = K / 4;
  std::vector<float> out(static_cast<size_t>(M) * per_row);
  for (int m = 0; m < M; ++m) {
    const float* row = x + static_cast<size_t>(m) * K;
    for (int vw = 0; vw < per_row; ++vw) {
      float lanes[32];
      for (int l = 0; l < 32; ++l) {
        float ss = 0.0f;
        for (int u = 32 * vw + l; u < units; u += T)
          for (int e = 0; e < 4; ++e) ss = std::fmaf(row[4 * u + e], row[4 * u + e], ss);
        lanes[l] = ss;
      }
      for (int off = 16; off > 0; off /= 2) {
        float next[32];
        for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ off];
        std::copy(next, next + 32, lanes);
      }
      out[static_cast<size_t>(m) * per_row + vw] = lanes[0];
    }
  }
  return out;
}

// The case's first M rows' partials (twin), on the device: what gemm_w4a16_residual_norm_partials writes for them.
DeviceBuffer<float> case_partials(const Case& c, int M) {
  return DeviceBuffer<float>(norm_partials_twin(c.x_host.data(), M, c.K()));
}

// rmsnorm_bf16 of the case's first M rows into a poisoned BF16 buffer (the unfused chain's first launch).
void reference_norm(const Case& c, int M, DeviceBuffer<uint16_t>& xn) {
  ASSERT_EQ(xn.poison(), cudaSuccess);
  const cudaError_t e = cuda::rmsnorm_bf16(c.x.p, c.gamma.p, bf(xn.p), M, c.K(), kEps, nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::decoder_ops_last_error();
}

// Epilogue ep (store_bf16, swiglu_bf16 or residual_f32) of the case on tiling t (or the public launchers when t is
// null): norm prologue vs rmsnorm_bf16 + the plain GEMM, bit for bit; the output is written everywhere.
// With partials: the norm-prologue launch is given the rows' partials (the twin's, which the residual GEMM's are
// checked equal to below) instead of summing the rows itself.
void check_epilogue(const w4::Tiling* t, w4::Epilogue ep, const Case& c, int M, uint32_t seed, bool partials = false) {
  const int N = c.N(), K = c.K(), group = c.group();
  const ScaleType st = c.st();
  SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " group " << group << " scales "
                                  << (st == ScaleType::F16 ? "fp16" : "bf16") << " epilogue " << static_cast<int>(ep)
                                  << " tiling " << (t ? describe(*t) : std::string("library"))
                                  << (partials ? " with norm partials" : ""));
  const DeviceBuffer<float> sums = partials ? case_partials(c, M) : DeviceBuffer<float>(1);
  const float* const np = partials ? sums.p : nullptr;
  const bool swiglu = ep == w4::Epilogue::swiglu_bf16, residual = ep == w4::Epilogue::residual_f32;
  const uint32_t* words = swiglu ? c.words_swiglu.p : c.words.p;
  const uint16_t* scales = swiglu ? c.scales_swiglu.p : c.scales.p;
  const size_t ws_bytes = workspace_for(t, M, N, K);
  DeviceBuffer<unsigned char> ws_ref(ws_bytes), ws_got(ws_bytes);
  ASSERT_EQ(ws_ref.poison(), cudaSuccess);
  ASSERT_EQ(ws_got.poison(), cudaSuccess);
  DeviceBuffer<uint16_t> xn(static_cast<size_t>(M) * K);
  reference_norm(c, M, xn);

  const size_t out_elems = static_cast<size_t>(M) * (swiglu ? N / 2 : N);
  std::vector<float> r0;
  if (residual) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    r0.resize(out_elems);
    for (float& v : r0) v = dist(rng);
  }
  DeviceBuffer<uint16_t> y_ref(residual ? 1 : out_elems), y_got(residual ? 1 : out_elems);
  DeviceBuffer<float> r_ref(residual ? r0 : std::vector<float>(1)), r_got(residual ? r0 : std::vector<float>(1));
  ASSERT_EQ(y_ref.poison(), cudaSuccess);
  ASSERT_EQ(y_got.poison(), cudaSuccess);
  void* out_ref = residual ? static_cast<void*>(r_ref.p) : static_cast<void*>(y_ref.p);
  void* out_got = residual ? static_cast<void*>(r_got.p) : static_cast<void*>(y_got.p);

  cudaError_t e;
  if (t) {
    e = cuda::gemm_w4a16_epilogue_with_tiling(*t, ep, bf(xn.p), words, scales, out_ref, M, N, K, group, st, ws_ref.p,
                                              ws_bytes, nullptr);
  } else if (swiglu) {
    e = cuda::gemm_w4a16_swiglu(bf(xn.p), words, scales, bf(y_ref.p), M, N, K, group, st, ws_ref.p, ws_bytes,
                                nullptr);
  } else {
    ASSERT_FALSE(residual) << "the public norm launchers have no residual variant";
    e = cuda::gemm_w4a16(bf(xn.p), words, scales, bf(y_ref.p), M, N, K, group, st, ws_ref.p, ws_bytes, nullptr);
  }
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  if (t) {
    e = cuda::gemm_w4a16_rmsnorm_epilogue_with_tiling(*t, ep, c.x.p, c.gamma.p, kEps, words, scales, out_got, M, N, K,
                                                      group, st, ws_got.p, ws_bytes, nullptr, np);
  } else if (swiglu) {
    e = cuda::gemm_w4a16_rmsnorm_swiglu(c.x.p, c.gamma.p, kEps, words, scales, bf(y_got.p), M, N, K, group, st,
                                        ws_got.p, ws_bytes, nullptr, np);
  } else {
    e = cuda::gemm_w4a16_rmsnorm(c.x.p, c.gamma.p, kEps, words, scales, bf(y_got.p), M, N, K, group, st, ws_got.p,
                                 ws_bytes, nullptr, np);
  }
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  if (residual) {
    const std::vector<float> a = r_ref.download(), b = r_got.download();
    for (size_t i = 0; i < a.size(); ++i) ASSERT_FALSE(std::isnan(a[i])) << "reference element " << i;
    EXPECT_SAME_BITS(b, a, "residual");
  } else {
    const std::vector<uint16_t> a = y_ref.download(), b = y_got.download();
    // Finite rows and weights give no NaN: a NaN is a poisoned element nobody wrote.
    for (size_t i = 0; i < a.size(); ++i) ASSERT_FALSE((a[i] & 0x7fff) > 0x7f80) << "reference element " << i;
    EXPECT_SAME_BITS(b, a, swiglu ? "h" : "y");
  }
}

// Store epilogue over the full sweep: every K, group, scale type, M = 1..8, compiled shape and split.
TEST(GemmW4A16NormGpu, StoreMatchesRmsnormThenGemmBitForBit) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 1000;
  int runs = 0, left_out = 0;
  for (int K : kKs) {
    for (int group : {32, 64, 128}) {
      if (K % group != 0) continue;  // 576 = 9 * 64
      for (ScaleType st : {ScaleType::F16, ScaleType::BF16}) {
        const int N = K == 576 ? 96 : 512;  // three 32-column blocks (one warp column per block) or 16
        const Case c(N, K, group, st, seed += 10);
        for (int M = 1; M <= kMaxM; ++M) {
          for (const w4::Tiling& t : norm_tilings(M, N, K, group, st, &left_out)) {
            check_epilogue(&t, w4::Epilogue::store_bf16, c, M, ++seed);
            ++runs;
          }
        }
      }
    }
  }
  // 14 (K, group) pairs x 2 scale types x 8 M x 4 shapes, one to three splits each (a shape the planner cannot fit
  // to a long K runs none: a lower bound, not an exact count).
  EXPECT_GE(runs, 14 * 2 * 8 * 4) << left_out << " tilings left out for shared memory";
}

// SwiGLU (interleaved gate|up packing) and the residual add on the norm prologue, over the compiled shapes and
// splits at two K.
TEST(GemmW4A16NormGpu, SwiGluAndResidualMatchRmsnormThenGemmBitForBit) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 5000;
  int runs = 0, left_out = 0;
  for (int K : {576, 4096}) {
    for (int group : {32, 64}) {
      for (ScaleType st : {ScaleType::F16, ScaleType::BF16}) {
        const int N = K == 576 ? 96 : 1024;  // inter 48 (three 16-column runs) and 512
        const Case c(N, K, group, st, seed += 10);
        for (int M = 1; M <= kMaxM; ++M) {
          for (const w4::Tiling& t : norm_tilings(M, N, K, group, st, &left_out)) {
            check_epilogue(&t, w4::Epilogue::swiglu_bf16, c, M, ++seed);
            check_epilogue(&t, w4::Epilogue::residual_f32, c, M, ++seed);
            ++runs;
          }
        }
      }
    }
  }
  EXPECT_GE(runs, 2 * 2 * 2 * 8 * 4) << left_out << " tilings left out for shared memory";
}

// The public launchers on the library's tiling at the 8B decode shapes (qkv 4096 -> 6144, gate|up 4096 -> 2 x 14336)
// and at SmolLM2's hidden 576.
TEST(GemmW4A16NormGpu, PublicLaunchersLlamaShapes) {
  FT_REQUIRE_HOPPER();
  const Case qkv(6144, 4096, 128, ScaleType::BF16, 71);
  const Case gate_up(2 * 14336, 4096, 128, ScaleType::F16, 72);
  const Case small(1536 * 2, 576, 64, ScaleType::F16, 73);
  uint32_t seed = 7000;
  for (int M = 1; M <= kMaxM; ++M) {
    check_epilogue(nullptr, w4::Epilogue::store_bf16, qkv, M, ++seed);
    check_epilogue(nullptr, w4::Epilogue::swiglu_bf16, gate_up, M, ++seed);
    check_epilogue(nullptr, w4::Epilogue::swiglu_bf16, small, M, ++seed);
  }
}

// --- qkv prologue ---------------------------------------------------------------------------------------------------

using test::QkvShape;
using QkvSide = test::QkvCaseOutputs;

// The metadata of one case, as test_gemm_w4a16_qkv.cpp makes it (test::make_qkv_case_meta).
test::QkvCaseMeta make_qkv_inputs(const QkvShape& s, int M, uint32_t seed) {
  std::mt19937 rng(seed);
  return test::make_qkv_case_meta(s, M, rng, 131072, 500000.0);
}

// gemm_w4a16_rmsnorm_qkv_rope_append (tiling t, or the library's when null) vs rmsnorm_bf16 then
// gemm_w4a16_qkv_rope_append on the same tiling: qkv, q_out and every page-pool byte.
void check_qkv(const w4::Tiling* t, KvFormat format, const QkvShape& s, const Case& c, int M, uint32_t seed,
               bool partials = false) {
  const DeviceBuffer<float> sums = partials ? case_partials(c, M) : DeviceBuffer<float>(1);
  const float* const np = partials ? sums.p : nullptr;
  const int N = c.N(), K = c.K(), group = c.group();
  const ScaleType st = c.st();
  const int hb = static_cast<int>(formats::kv_hadamard_block(format, s.head_dim));
  const bool hadamard = format == KvFormat::INT4_HADAMARD;
  SCOPED_TRACE(testing::Message() << formats::kv_format_name(format) << " heads " << s.n_heads << "/" << s.n_kv
                                  << " head_dim " << s.head_dim << " M " << M << " K " << K << " group " << group
                                  << " tiling " << (t ? describe(*t) : std::string("library")) << " seed " << seed
                                  << (partials ? " with norm partials" : ""));
  const test::QkvCaseMeta in = make_qkv_inputs(s, M, seed);
  const formats::KvPageLayout L = formats::kv_page_layout(format, s.head_dim);
  const size_t pool_bytes = static_cast<size_t>(in.n_pages) * s.n_kv * static_cast<size_t>(L.page_bytes);
  const size_t q_elems = static_cast<size_t>(M) * s.n_heads * s.head_dim, qkv_elems = static_cast<size_t>(M) * N;
  const size_t ws_bytes = workspace_for(t, M, N, K);
  DeviceBuffer<uint16_t> anchors(in.anchors);
  DeviceBuffer<int32_t> positions(in.positions), page(in.page), slot(in.slot), row_anchor(in.anchor);
  DeviceBuffer<float> inv_freq(in.inv_freq);
  QkvSide ref(qkv_elems, q_elems, pool_bytes, ws_bytes), got(qkv_elems, q_elems, pool_bytes, ws_bytes);
  const uint16_t* key_anchors = hadamard ? anchors.p : nullptr;
  const int32_t* ra = hadamard ? row_anchor.p : nullptr;
  DeviceBuffer<uint16_t> xn(static_cast<size_t>(M) * K);
  reference_norm(c, M, xn);

  cudaError_t e =
      t ? cuda::gemm_w4a16_qkv_rope_append_with_tiling(*t, bf(xn.p), c.words.p, c.scales.p, M, K, group, st, ref.ws.p,
                                                       ws_bytes, format, bf(ref.qkv.p), s.n_heads, s.n_kv, s.head_dim,
                                                       positions.p, inv_freq.p, page.p, slot.p, key_anchors, ra,
                                                       ref.pool.p, hb, bf(ref.q_out.p), nullptr)
        : cuda::gemm_w4a16_qkv_rope_append(bf(xn.p), c.words.p, c.scales.p, M, K, group, st, ref.ws.p, ws_bytes,
                                           format, bf(ref.qkv.p), s.n_heads, s.n_kv, s.head_dim, positions.p,
                                           inv_freq.p, page.p, slot.p, key_anchors, ra, ref.pool.p, hb,
                                           bf(ref.q_out.p), nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  e = t ? cuda::gemm_w4a16_rmsnorm_qkv_rope_append_with_tiling(
              *t, c.x.p, c.gamma.p, kEps, c.words.p, c.scales.p, M, K, group, st, got.ws.p, ws_bytes, format,
              bf(got.qkv.p), s.n_heads, s.n_kv, s.head_dim, positions.p, inv_freq.p, page.p, slot.p, key_anchors, ra,
              got.pool.p, hb, bf(got.q_out.p), nullptr, np)
        : cuda::gemm_w4a16_rmsnorm_qkv_rope_append(c.x.p, c.gamma.p, kEps, c.words.p, c.scales.p, M, K, group, st,
                                                   got.ws.p, ws_bytes, format, bf(got.qkv.p), s.n_heads, s.n_kv,
                                                   s.head_dim, positions.p, inv_freq.p, page.p, slot.p, key_anchors,
                                                   ra, got.pool.p, hb, bf(got.q_out.p), nullptr, np);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<uint16_t> qkv_g = got.qkv.download(), qkv_r = ref.qkv.download();
  const std::vector<uint16_t> q_g = got.q_out.download(), q_r = ref.q_out.download();
  const std::vector<uint8_t> pool_g = got.pool.download(), pool_r = ref.pool.download();
  for (size_t i = 0; i < qkv_r.size(); ++i) ASSERT_FALSE((qkv_r[i] & 0x7fff) > 0x7f80) << "reference qkv " << i;
  EXPECT_SAME_BITS(qkv_g, qkv_r, "qkv");
  EXPECT_SAME_BITS(q_g, q_r, "q_out");
  EXPECT_SAME_BITS(pool_g, pool_r, "page pool byte");
  const int64_t written = static_cast<int64_t>(pool_r.size()) - std::count(pool_r.begin(), pool_r.end(), uint8_t{0xFF});
  EXPECT_GT(written, 0) << "the reference wrote no cache byte";
}

// Every KV format, GQA 4, M = 1..8, the default shape with 1 (GEMM store + prologue kernel), 2 and 3 K slices (the
// prologue in the reduce), and the other compiled shapes with one slice and with the planner's split.
TEST(GemmW4A16NormGpu, QkvRopeAppendMatchesRmsnormThenQkvGemmBitForBit) {
  FT_REQUIRE_HOPPER();
  const QkvShape s{8, 2, 64};
  const int N = (s.n_heads + 2 * s.n_kv) * s.head_dim;
  uint32_t seed = 9000;
  for (int K : {576, 2048}) {
    const int group = 64;
    const ScaleType st = K == 576 ? ScaleType::F16 : ScaleType::BF16;
    const Case c(N, K, group, st, seed += 10);
    for (int M = 1; M <= kMaxM; ++M) {
      std::vector<w4::Tiling> tilings;
      w4::Tiling base;
      ASSERT_EQ(cuda::gemm_w4a16_plan_config(M, N, K, group, st, w4::V4Config{}, &base), cudaSuccess);
      for (int splits : {1, 2, 3}) {
        base.splits = splits;
        tilings.push_back(base);
      }
      int left_out = 0;
      for (const w4::Tiling& t : norm_tilings(M, N, K, group, st, &left_out))
        if (!(t.warps == w4::kWarps && t.stages == w4::kStages)) tilings.push_back(t);
      for (KvFormat f : {KvFormat::BF16, KvFormat::FP8, KvFormat::INT4, KvFormat::INT4_HADAMARD}) {
        for (const w4::Tiling& t : tilings) check_qkv(&t, f, s, c, M, ++seed);
        check_qkv(nullptr, f, s, c, M, ++seed);
      }
    }
  }
}

// The 8B layer's qkv (32 / 8 heads of 128, K 4096) through the public launcher.
TEST(GemmW4A16NormGpu, QkvRopeAppendLlama8BShape) {
  FT_REQUIRE_HOPPER();
  const QkvShape s{32, 8, 128};
  const Case c((s.n_heads + 2 * s.n_kv) * s.head_dim, 4096, 128, ScaleType::BF16, 77);
  uint32_t seed = 9900;
  for (KvFormat f : {KvFormat::INT4_HADAMARD, KvFormat::BF16})
    for (int M : {1, 3, 8}) check_qkv(nullptr, f, s, c, M, ++seed);
}

// --- norm partials -------------------------------------------------------------------------------------------------

// The residual GEMM with norm partials (tiling t, or the public launcher when null) on fp32 rows r0 [M, N]: the
// residual equals gemm_w4a16_residual's bit for bit, and the partials equal the twin's of those rows bit for bit;
// nothing past [M, per_row] is written. Residual, partials and workspaces are poisoned first.
void check_residual_partials(const w4::Tiling* t, const Case& c, int M, uint32_t seed) {
  const int N = c.N(), K = c.K(), group = c.group();
  const ScaleType st = c.st();
  SCOPED_TRACE(testing::Message() << "residual with norm partials: M " << M << " N " << N << " K " << K << " group "
                                  << group << " tiling " << (t ? describe(*t) : std::string("library")));
  const int per_row = cuda::gemm_w4a16_norm_partials_per_row(N);
  ASSERT_GT(per_row, 0);
  const std::vector<float> r0 = random_rows(M, N, seed);
  std::mt19937 rng(seed + 1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(M) * K);
  for (uint16_t& v : x) v = f32_to_bf16(dist(rng));
  DeviceBuffer<uint16_t> xd(x);
  const size_t ws_bytes = workspace_for(t, M, N, K);
  DeviceBuffer<unsigned char> ws_ref(ws_bytes), ws_got(ws_bytes);
  DeviceBuffer<float> r_ref(r0), r_got(r0), sums(static_cast<size_t>(M) * per_row + 16);
  ASSERT_EQ(ws_ref.poison(), cudaSuccess);
  ASSERT_EQ(ws_got.poison(), cudaSuccess);
  ASSERT_EQ(sums.poison(), cudaSuccess);
  cudaError_t e = t ? cuda::gemm_w4a16_epilogue_with_tiling(*t, w4::Epilogue::residual_f32, bf(xd.p), c.words.p,
                                                            c.scales.p, r_ref.p, M, N, K, group, st, ws_ref.p,
                                                            ws_bytes, nullptr)
                    : cuda::gemm_w4a16_residual(bf(xd.p), c.words.p, c.scales.p, r_ref.p, M, N, K, group, st, ws_ref.p,
                                                ws_bytes, nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  e = t ? cuda::gemm_w4a16_epilogue_with_tiling(*t, w4::Epilogue::residual_f32, bf(xd.p), c.words.p, c.scales.p,
                                                r_got.p, M, N, K, group, st, ws_got.p, ws_bytes, nullptr, sums.p)
        : cuda::gemm_w4a16_residual_norm_partials(bf(xd.p), c.words.p, c.scales.p, r_got.p, sums.p, M, N, K, group,
                                                  st, ws_got.p, ws_bytes, nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": " << cuda::gemm_w4a16_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> a = r_ref.download(), b = r_got.download(), got = sums.download();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_FALSE(std::isnan(a[i])) << "reference element " << i;
  EXPECT_SAME_BITS(b, a, "residual");
  std::vector<float> want = norm_partials_twin(a.data(), M, N);
  const std::vector<float> got_rows(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(want.size()));
  EXPECT_SAME_BITS(got_rows, want, "norm partial");
  for (size_t i = want.size(); i < got.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &got[i], 4);
    EXPECT_EQ(bits, 0xFFFFFFFFu) << "partial " << i << " past the rows was written";
  }
}

// The twin itself: its partials add up to the rows' sum of squares (fp64, relative 1e-5: fp32 sums of <= 4096 terms
// of one sign), and a row of width K has rmsnorm_bf16's warps per row.
TEST(GemmW4A16NormPartialsHost, TwinSumsTheSquares) {
  EXPECT_EQ(cuda::gemm_w4a16_norm_partials_per_row(576), 5);    // 144 float4: 160 threads
  EXPECT_EQ(cuda::gemm_w4a16_norm_partials_per_row(64), 1);     // 16 float4: one warp
  EXPECT_EQ(cuda::gemm_w4a16_norm_partials_per_row(4096), 32);  // 1024 threads
  EXPECT_EQ(cuda::gemm_w4a16_norm_partials_per_row(8192), 32);  // capped at 1024 threads, two units each
  EXPECT_EQ(cuda::gemm_w4a16_norm_partials_per_row(6), 0);
  for (int K : {576, 4096, 8192, 14336}) {
    const std::vector<float> x = random_rows(kMaxM, K, 5u + static_cast<uint32_t>(K));
    const std::vector<float> p = norm_partials_twin(x.data(), kMaxM, K);
    const int per_row = cuda::gemm_w4a16_norm_partials_per_row(K);
    for (int m = 0; m < kMaxM; ++m) {
      double want = 0.0, got = 0.0;
      for (int k = 0; k < K; ++k) {
        const double v = x[static_cast<size_t>(m) * K + k];
        want += v * v;
      }
      for (int w = 0; w < per_row; ++w) got += p[static_cast<size_t>(m) * per_row + w];
      EXPECT_NEAR(got, want, 1e-5 * want) << "K " << K << " row " << m;
    }
  }
}

// The residual GEMM's partials: N = 576 (5 virtual warps, a part-empty last one), 2048, 4096 (one unit per thread)
// and 8192 (two), M = 1..8, one K slice (the partials kernel reads the rows back) and split K (the reduce writes
// them), then the public launcher on the 8B o and down shapes.
TEST(GemmW4A16NormPartialsGpu, ResidualGemmWritesTheTwinsPartials) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 12000;
  for (int N : {576, 2048, 4096, 8192}) {
    const Case c(N, 1024, 64, N == 576 ? ScaleType::F16 : ScaleType::BF16, seed += 10);
    for (int M = 1; M <= kMaxM; ++M) {
      w4::Tiling base;
      ASSERT_EQ(cuda::gemm_w4a16_plan_config(M, N, 1024, 64, c.st(), w4::V4Config{}, &base), cudaSuccess);
      std::vector<int> splits = {1, 3, base.splits};
      for (int sp : splits) {
        w4::Tiling t = base;
        t.splits = sp;
        check_residual_partials(&t, c, M, ++seed);
      }
    }
  }
  const Case o(4096, 4096, 128, ScaleType::BF16, 81), down(4096, 14336, 128, ScaleType::BF16, 82);
  for (int M = 1; M <= kMaxM; ++M) {
    check_residual_partials(nullptr, o, M, ++seed);
    check_residual_partials(nullptr, down, M, ++seed);
  }
}

// The norm-prologue GEMMs given the partials: bit for bit rmsnorm_bf16 + the GEMM, for every K of the sweep, the
// three epilogues, M = 1..8, the default shape with one slice and the planner's split, and the public launchers.
TEST(GemmW4A16NormPartialsGpu, PrologueWithPartialsMatchesRmsnormThenGemm) {
  FT_REQUIRE_HOPPER();
  uint32_t seed = 13000;
  for (int K : kKs) {
    const Case c(256, K, 64, K % 128 == 0 ? ScaleType::BF16 : ScaleType::F16, seed += 10);
    for (int M = 1; M <= kMaxM; ++M) {
      w4::Tiling base;
      ASSERT_EQ(cuda::gemm_w4a16_plan_config(M, 256, K, 64, c.st(), w4::V4Config{}, &base), cudaSuccess);
      for (int sp : {1, base.splits}) {
        w4::Tiling t = base;
        t.splits = sp;
        if (w4::smem_layout(t, K, 64).total + w4::kNormScratchBytes > w4::DeviceLimits{}.smem_per_block) continue;
        for (w4::Epilogue ep : {w4::Epilogue::store_bf16, w4::Epilogue::swiglu_bf16, w4::Epilogue::residual_f32})
          check_epilogue(&t, ep, c, M, ++seed, true);
      }
    }
  }
  const Case qkv(6144, 4096, 128, ScaleType::BF16, 71);
  const Case gate_up(2 * 14336, 4096, 128, ScaleType::F16, 72);
  for (int M = 1; M <= kMaxM; ++M) {
    check_epilogue(nullptr, w4::Epilogue::store_bf16, qkv, M, ++seed, true);
    check_epilogue(nullptr, w4::Epilogue::swiglu_bf16, gate_up, M, ++seed, true);
  }
  const QkvShape s{32, 8, 128};
  const Case c8b((s.n_heads + 2 * s.n_kv) * s.head_dim, 4096, 128, ScaleType::BF16, 77);
  for (KvFormat f : {KvFormat::INT4_HADAMARD, KvFormat::BF16})
    for (int M : {1, 3, 8}) check_qkv(nullptr, f, s, c8b, M, ++seed, true);
  const QkvShape small{8, 2, 64};
  const Case c576((small.n_heads + 2 * small.n_kv) * small.head_dim, 576, 64, ScaleType::F16, 78);
  for (int M : {1, 5, 8}) check_qkv(nullptr, KvFormat::INT4, small, c576, M, ++seed, true);
}

// --- host checks (no device) -----------------------------------------------------------------------------------------

TEST(GemmW4A16NormHost, CanImplementNamesTheParameter) {
  std::string why;
  EXPECT_EQ(cuda::gemm_w4a16_rmsnorm_can_implement(1, 6144, 4096, 128, ScaleType::BF16, &why), cudaSuccess) << why;
  EXPECT_TRUE(why.empty());
  EXPECT_EQ(cuda::gemm_w4a16_rmsnorm_can_implement(8, 96, 576, 64, ScaleType::F16, &why), cudaSuccess) << why;
  EXPECT_EQ(cuda::gemm_w4a16_rmsnorm_can_implement(9, 6144, 4096, 128, ScaleType::BF16, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("gemm_w4a16_rmsnorm: M = 9"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_w4a16_rmsnorm_can_implement(0, 6144, 4096, 128, ScaleType::BF16, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("M = 0"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_w4a16_rmsnorm_can_implement(1, 250, 4096, 128, ScaleType::BF16, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("N = 250"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_w4a16_rmsnorm_can_implement(1, 6144, 4000, 128, ScaleType::BF16, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("K = 4000"), std::string::npos) << why;
  EXPECT_EQ(cuda::gemm_w4a16_rmsnorm_can_implement(1, 6144, 4096, 256, ScaleType::BF16, &why), cudaErrorInvalidValue);
  EXPECT_NE(why.find("group size 256"), std::string::npos) << why;
}

// Rejected before any CUDA call: M past 8, null or misaligned fp32 rows / norm weight, a bad eps, a bad output. The
// message names the op and the argument.
TEST(GemmW4A16NormHost, RejectsBadArguments) {
  constexpr int M = 2, N = 256, K = 256, group = 64;
  alignas(16) static float x[8 * K + 4], gamma[K + 4];
  alignas(16) static uint16_t y[8 * N + 2], scales[N * K / group];
  alignas(16) static uint32_t words[N * K / 8];
  auto call = [&](const float* xp, const float* gp, float eps, uint16_t* yp, int m) {
    return cuda::gemm_w4a16_rmsnorm(xp, gp, eps, words, scales, bf(yp), m, N, K, group, ScaleType::F16, nullptr, 0,
                                    nullptr);
  };
  auto expect_message = [](const char* part) {
    EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find(part), std::string::npos)
        << cuda::gemm_w4a16_last_error();
  };
  EXPECT_EQ(call(x, gamma, kEps, y, 9), cudaErrorInvalidValue);
  expect_message("gemm_w4a16_rmsnorm: M = 9");
  EXPECT_EQ(call(nullptr, gamma, kEps, y, M), cudaErrorInvalidValue);
  expect_message("gemm_w4a16_rmsnorm: x (fp32 rows)");
  EXPECT_EQ(call(x + 1, gamma, kEps, y, M), cudaErrorInvalidValue);
  expect_message("16-byte aligned");
  EXPECT_EQ(call(x, nullptr, kEps, y, M), cudaErrorInvalidValue);
  expect_message("gemm_w4a16_rmsnorm: norm_weight");
  EXPECT_EQ(call(x, gamma + 2, kEps, y, M), cudaErrorInvalidValue);
  expect_message("norm_weight must be non-null and 16-byte aligned");
  EXPECT_EQ(call(x, gamma, -1.0f, y, M), cudaErrorInvalidValue);
  expect_message("eps = -1");
  EXPECT_EQ(call(x, gamma, std::nanf(""), y, M), cudaErrorInvalidValue);
  expect_message("eps = nan");
  EXPECT_EQ(call(x, gamma, kEps, nullptr, M), cudaErrorInvalidValue);
  expect_message("y must be");
  EXPECT_EQ(cuda::gemm_w4a16_rmsnorm_swiglu(x, gamma, kEps, words, scales, bf(y + 2), M, N, K, group, ScaleType::F16,
                                            nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  expect_message("h must be");
  EXPECT_EQ(cuda::gemm_w4a16_rmsnorm_swiglu(x, gamma, kEps, words, scales, bf(y), 12, N, K, group, ScaleType::F16,
                                            nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  expect_message("gemm_w4a16_rmsnorm_swiglu: M = 12");
  EXPECT_EQ(cuda::gemm_w4a16_rmsnorm(x, gamma, kEps, words, scales, bf(y), M, N, K, group, ScaleType::F16, nullptr, 0,
                                     nullptr, reinterpret_cast<const float*>(reinterpret_cast<const char*>(gamma) + 2)),
            cudaErrorInvalidValue);
  expect_message("norm_partials must be 4-byte aligned");
  alignas(16) static float residual[8 * N];
  EXPECT_EQ(cuda::gemm_w4a16_residual_norm_partials(bf(y), words, scales, residual, nullptr, M, N, K, group,
                                                    ScaleType::F16, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  expect_message("gemm_w4a16_residual_norm_partials: norm_partials must be non-null");
}

// The qkv variant's checks name it: qkv_rope_kv_append's pointer rules, the shape rules and M.
TEST(GemmW4A16NormHost, QkvRejectsBadArguments) {
  constexpr int M = 2, K = 256, group = 64, nh = 4, nkv = 2, hd = 64, N = (nh + 2 * nkv) * hd;
  alignas(16) static float x[16 * K], gamma[K];
  alignas(16) static uint16_t qkv[16 * N + 2], q[16 * nh * hd], scales[N * K / group];
  alignas(16) static uint32_t words[N * K / 8];
  alignas(16) static int32_t pos[16], page[16], slot[16], ra[16];
  alignas(16) static float inv[hd / 2];
  alignas(16) static uint8_t pool[64];
  auto call = [&](int m, int head_dim, uint16_t* q_p, const float* xp) {
    return cuda::gemm_w4a16_rmsnorm_qkv_rope_append(xp, gamma, kEps, words, scales, m, K, group, ScaleType::F16,
                                                    nullptr, 0, KvFormat::INT4, bf(qkv), nh, nkv, head_dim, pos, inv,
                                                    page, slot, nullptr, ra, pool, 0, bf(q_p), nullptr);
  };
  auto expect_message = [](const char* part) {
    EXPECT_NE(std::string(cuda::gemm_w4a16_last_error()).find(part), std::string::npos)
        << cuda::gemm_w4a16_last_error();
  };
  EXPECT_EQ(call(M, hd, nullptr, x), cudaErrorInvalidValue);
  expect_message("gemm_w4a16_rmsnorm_qkv_rope_append: qkv, row_page");
  EXPECT_EQ(call(M, 48, q, x), cudaErrorInvalidValue);
  expect_message("gemm_w4a16_rmsnorm_qkv_rope_append: head_dim = 48");
  EXPECT_EQ(call(9, hd, q, x), cudaErrorInvalidValue);
  expect_message("gemm_w4a16_rmsnorm_qkv_rope_append: M = 9");
  EXPECT_EQ(call(M, hd, q, x + 2), cudaErrorInvalidValue);
  expect_message("gemm_w4a16_rmsnorm_qkv_rope_append: x (fp32 rows)");
}

}  // namespace
