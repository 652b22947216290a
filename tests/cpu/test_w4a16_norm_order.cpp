// CPU check of the W4A16 GEMM's RMSNorm prologue order (gemm_w4a16_layout.h, "RMSNorm prologue"; the kernel is
// src/cuda/gemm_w4a16_norm.cuh): the CTA's real warps must play rmsnorm_kernel<true>'s T virtual threads exactly.
// The test walks the kernel's loops with the layout header's maps for every K up to 16384 (T = 32 .. 1024, one to
// four float4 units per virtual thread), CTAs of 128, 256 and 512 threads and M = 1 .. 8, and checks that every
// (row, float4 unit) is summed exactly once, by virtual thread unit % T, in round unit / T (index order), and every
// (row, virtual warp) partial lands in its own scratch slot inside the scratch. Then it replays the arithmetic on
// the CPU in both orders — the T-thread block as rmsnorm_kernel runs it and the prologue's pairs and batches — with
// the device's operations (one fused multiply-add per square, fp32 adds, the xor butterfly) on random rows, and the
// two row totals must agree bit for bit. (The device itself is checked in tests/gpu/test_gemm_w4a16_norm.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/gemm_w4a16_layout.h"

namespace {

namespace w4 = futransformer::cuda::w4a16;

constexpr int kWarp = 32;

// rmsnorm_threads(K, true) (src/cuda/rmsnorm_row.cuh): one thread per float4 unit in whole warps, at most 1024.
int virtual_threads(int K) {
  const int units = K / 4;
  const int t = (units + kWarp - 1) / kWarp * kWarp;
  return t < 1024 ? t : 1024;
}

// The xor butterfly of warp_sum_xor over 32 lane values (each step: v[l] + v[l ^ off] in fp32).
float butterfly(std::vector<float> v) {
  for (int off = kWarp / 2; off > 0; off >>= 1) {
    std::vector<float> n(kWarp);
    for (int l = 0; l < kWarp; ++l) n[l] = v[l] + v[l ^ off];
    v = n;
  }
  return v[0];
}

float square_add(float ss, float x) { return std::fma(x, x, ss); }  // sum_squares_add, one element

// rmsnorm_kernel<true>'s total for one row: thread v sums units v, v + T, ... (four squares each), warps reduce by
// the butterfly, the warp partials are added in warp order from 0.
float block_total(const float* row, int K) {
  const int units = K / 4, T = virtual_threads(K);
  float total = 0.0f;
  for (int w = 0; w < T / kWarp; ++w) {
    std::vector<float> lanes(kWarp, 0.0f);
    for (int l = 0; l < kWarp; ++l)
      for (int u = w * kWarp + l; u < units; u += T)
        for (int e = 0; e < 4; ++e) lanes[l] = square_add(lanes[l], row[4 * u + e]);
    total = total + butterfly(lanes);
  }
  return total;
}

// The prologue's walk for one CTA of `warps` real warps over M rows of K (wait_then_stage_norm_rows, pass 1 and the
// ordered total): visit(row, unit, virtual thread, round) for each unit summed, the partials into scratch.
struct Walk {
  std::vector<int> visits;        // [row][unit]: times summed
  std::vector<int> slot_writes;   // [scratch float]: partials written
  std::vector<float> scratch;     // kNormScratchFloats
  std::vector<float> totals;      // [row]
  bool order_ok = true;           // every unit by virtual thread unit % T, in round unit / T
};

Walk walk(const std::vector<float>& x, int M, int K, int warps) {
  const int units = K / 4, T = virtual_threads(K), vwarps = T / kWarp;
  const int rounds = (units + T - 1) / T, pairs = M * vwarps;
  Walk r;
  r.visits.assign(static_cast<size_t>(M) * units, 0);
  r.slot_writes.assign(w4::kNormScratchFloats, 0);
  r.scratch.assign(w4::kNormScratchFloats, std::nanf(""));
  for (int warp = 0; warp < warps; ++warp) {
    for (int step = 0; w4::norm_pair(warp, warps, step, 0) < pairs; ++step) {
      for (int b = 0; b < w4::kNormBatch; ++b) {
        const int p = w4::norm_pair(warp, warps, step, b);
        if (p >= pairs) continue;
        const int m = w4::norm_pair_row(p, vwarps), vw = w4::norm_pair_vwarp(p, vwarps);
        std::vector<float> lanes(kWarp, 0.0f);
        for (int lane = 0; lane < kWarp; ++lane) {
          for (int j = 0; j < rounds; ++j) {
            const int u = w4::norm_unit(vw, lane, j, T);
            if (u >= units) continue;
            ++r.visits[static_cast<size_t>(m) * units + u];
            if (u % T != vw * kWarp + lane || u / T != j) r.order_ok = false;
            const float* unit = &x[static_cast<size_t>(m) * K + 4 * static_cast<size_t>(u)];
            for (int e = 0; e < 4; ++e) lanes[lane] = square_add(lanes[lane], unit[e]);
          }
        }
        EXPECT_EQ(p, w4::norm_partial_index(m, vw, vwarps));  // the kernel stores at scratch[p]
        r.scratch[p] = butterfly(lanes);
        ++r.slot_writes[p];
      }
    }
  }
  for (int m = 0; m < M; ++m) {
    float total = 0.0f;
    for (int w = 0; w < vwarps; ++w) total = total + r.scratch[w4::norm_partial_index(m, w, vwarps)];
    r.totals.push_back(total);
  }
  return r;
}

std::vector<int> test_ks() {
  std::vector<int> ks;
  for (int K = 32; K <= 4096; K += 32) ks.push_back(K);  // T = 32 .. 1024, one unit per virtual thread
  for (int K : {4128, 5120, 8192, 8224, 12288, 14336, 16384}) ks.push_back(K);  // two to four units
  return ks;
}

TEST(W4A16NormOrder, EveryUnitOnceInRmsnormKernelOrder) {
  for (int K : test_ks()) {
    const int units = K / 4, vwarps = virtual_threads(K) / kWarp;
    ASSERT_LE(vwarps, w4::kNormMaxVirtualWarps);
    for (int warps : {4, 8, 16}) {
      for (int M = 1; M <= w4::kNormMaxRows; ++M) {
        SCOPED_TRACE(testing::Message() << "K " << K << " warps " << warps << " M " << M);
        const Walk r = walk(std::vector<float>(static_cast<size_t>(M) * K, 1.0f), M, K, warps);
        for (size_t i = 0; i < r.visits.size(); ++i)
          ASSERT_EQ(r.visits[i], 1) << "row " << i / units << " unit " << i % units;
        EXPECT_TRUE(r.order_ok);
        for (int s = 0; s < w4::kNormScratchFloats; ++s)
          ASSERT_EQ(r.slot_writes[s], s < M * vwarps ? 1 : 0) << "scratch slot " << s;
        for (int m = 0; m < M; ++m) {
          EXPECT_GE(w4::norm_scale_index(m), M * vwarps) << "scale slot overlaps a partial";
          EXPECT_LT(w4::norm_scale_index(m), w4::kNormScratchFloats);
        }
      }
    }
  }
}

// Random rows with very different magnitudes: the prologue's totals are rmsnorm_kernel's, bit for bit.
TEST(W4A16NormOrder, TotalsMatchTheBlockReductionBitForBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const float scales[] = {1.0f, 3e3f, 2e-4f, 1e-7f, 40.0f, 7e4f, 1e-2f, 1.0f};
  int differing_orders = 0;  // rows where a plain sequential sum differs: the order matters on this data
  for (int K : {576, 2048, 4096, 4128, 8192, 14336}) {
    const int M = w4::kNormMaxRows;
    std::vector<float> x(static_cast<size_t>(M) * K);
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < K; ++k) x[static_cast<size_t>(m) * K + k] = dist(rng) * scales[m];
    for (int warps : {4, 8, 16}) {
      const Walk r = walk(x, M, K, warps);
      for (int m = 0; m < M; ++m) {
        const float want = block_total(&x[static_cast<size_t>(m) * K], K);
        uint32_t a, b;
        std::memcpy(&a, &r.totals[m], 4);
        std::memcpy(&b, &want, 4);
        EXPECT_EQ(a, b) << "K " << K << " warps " << warps << " row " << m << ": " << r.totals[m] << " vs " << want;
        if (warps == 8) {
          float seq = 0.0f;
          for (int k = 0; k < K; ++k) seq = square_add(seq, x[static_cast<size_t>(m) * K + k]);
          differing_orders += seq != want;
        }
      }
    }
  }
  EXPECT_GT(differing_orders, 0) << "the data never distinguishes summation orders: the check above is too weak";
}

// The norm partials written by the residual GEMM (gemm_w4a16_reduce_residual_norm_kernel, layout "Norm partials"):
// global thread g of M * T is virtual thread v = g % T of row g / T; a real warp (32 consecutive g) is one virtual
// warp of one row (T % 32 == 0), and lane 0 stores at norm_partial_index(row, v / 32, T / 32). Walked here: every
// slot of [M][T / 32] written once, every unit summed once by virtual thread unit % T in round unit / T, and the
// partials, added in order from 0, give rmsnorm_kernel's total bit for bit.
TEST(W4A16NormOrder, ResidualKernelPartialsInRmsnormOrder) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int K : test_ks()) {
    const int units = K / 4, T = virtual_threads(K);
    ASSERT_LE(T / kWarp, w4::kNormMaxVirtualWarps);
    const int M = K % 3 == 0 ? 3 : 2;
    std::vector<float> x(static_cast<size_t>(M) * K);
    for (float& v : x) v = dist(rng) * 40.0f;
    std::vector<float> partials(static_cast<size_t>(M) * (T / kWarp), std::nanf(""));
    std::vector<int> writes(partials.size(), 0), visits(static_cast<size_t>(M) * units, 0);
    for (int g0 = 0; g0 < M * T; g0 += kWarp) {  // one real warp
      const int row = g0 / T;
      std::vector<float> lanes(kWarp, 0.0f);
      for (int lane = 0; lane < kWarp; ++lane) {
        const int g = g0 + lane, v = g % T;
        ASSERT_EQ(g / T, row) << "a warp spans two rows";
        for (int u = v; u < units; u += T) {
          ++visits[static_cast<size_t>(row) * units + u];
          for (int e = 0; e < 4; ++e)
            lanes[lane] = square_add(lanes[lane], x[static_cast<size_t>(row) * K + 4 * static_cast<size_t>(u) + e]);
        }
      }
      const int slot = w4::norm_partial_index(row, (g0 % T) / kWarp, T / kWarp);
      partials[static_cast<size_t>(slot)] = butterfly(lanes);
      ++writes[static_cast<size_t>(slot)];
    }
    for (size_t i = 0; i < writes.size(); ++i) ASSERT_EQ(writes[i], 1) << "K " << K << " slot " << i;
    for (size_t i = 0; i < visits.size(); ++i) ASSERT_EQ(visits[i], 1) << "K " << K << " unit " << i;
    for (int m = 0; m < M; ++m) {
      float total = 0.0f;
      for (int w = 0; w < T / kWarp; ++w)
        total = total + partials[static_cast<size_t>(w4::norm_partial_index(m, w, T / kWarp))];
      const float want = block_total(&x[static_cast<size_t>(m) * K], K);
      uint32_t a, b;
      std::memcpy(&a, &total, 4);
      std::memcpy(&b, &want, 4);
      ASSERT_EQ(a, b) << "K " << K << " row " << m;
    }
  }
}

}  // namespace
