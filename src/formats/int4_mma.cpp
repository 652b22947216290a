// Offline repack of canonical INT4 weights into the W4A16 GEMM layout, and the GEMM's CPU twin.
#include "futransformer/formats/int4_mma.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/gemm_w4a16_layout.h"
#include "futransformer/dtype.h"
#include "futransformer/error.h"

namespace futransformer::formats {

namespace w4 = cuda::w4a16;

void check_int4_mma_compatible(const Int4Weight& w, const std::string& what) {
  check(w.spec.symmetric, what, ": the W4A16 GEMM needs symmetric INT4 (zero point 8); this weight is asymmetric");
  check(w.group == 32 || w.group == 64 || w.group == 128, what, ": the W4A16 GEMM supports group sizes 32, 64 and ",
        "128, this weight has ", w.group);
  check(w.rows > 0 && w.rows % w4::kBlockN == 0 && w.rows <= (int64_t{1} << 18), what, ": the W4A16 GEMM needs ",
        "a row count (N) that is a positive multiple of ", w4::kBlockN, " up to 2^18, got ", w.rows);
  check(w.cols > 0 && w.cols % w4::kBlockK == 0 && w.cols % w.group == 0 && w.cols <= (int64_t{1} << 18), what,
        ": the W4A16 GEMM needs a column count (K) that is a positive multiple of ", w4::kBlockK,
        " and of the group size ", w.group, " up to 2^18, got ", w.cols);
  check(static_cast<int64_t>(w.qweight.size()) == w.rows * w.cols / 2, what, ": qweight holds ", w.qweight.size(),
        " bytes, expected ", w.rows * w.cols / 2);
  check(static_cast<int64_t>(w.scales.size()) == w.rows * w.groups_per_row(), what, ": scales holds ",
        w.scales.size(), " values, expected ", w.rows * w.groups_per_row());
}

namespace {

// The canonical row whose values go to packed row n.
int64_t source_row(const Int4Weight& w, Int4MmaRows rows, int64_t n) {
  return rows == Int4MmaRows::swiglu_interleaved ? w4::swiglu_source_row(n, w.rows / 2) : n;
}

// N is a multiple of kBlockN (check_int4_mma_compatible), so inter = N / 2 is a whole number of runs of 16 packed
// rows and no run mixes gate rows with up rows of another q.
static_assert((w4::kBlockN / 2) % (2 * w4::kSwiGluRun) == 0, "inter = N / 2 must be a multiple of 2 * kSwiGluRun");

}  // namespace

std::vector<uint32_t> repack_int4_for_mma(const Int4Weight& w, Int4MmaRows rows) {
  check_int4_mma_compatible(w, "repack_int4_for_mma");
  const int64_t n_blocks = w.rows / w4::kBlockN, k_blocks = w.cols / w4::kBlockK;
  std::vector<uint32_t> out(static_cast<size_t>(w.rows * w.cols / 8));
  // Runs once per weight at upload, over billions of nibbles for a large model: blocks are independent.
#pragma omp parallel for schedule(static)
  for (int64_t nb = 0; nb < n_blocks; ++nb) {
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      for (int lane = 0; lane < w4::kWarpSize; ++lane) {
        for (int word = 0; word < w4::kWordsPerLane; ++word) {
          uint32_t v = 0;
          for (int p = 0; p < 4; ++p) {
            for (int h = 0; h < 2; ++h) {
              const w4::NK c = w4::nibble_coords(lane, word, p, h);
              const uint32_t u = w.nibble(source_row(w, rows, nb * w4::kBlockN + c.n), kb * w4::kBlockK + c.k);
              v |= u << w4::nibble_shift(p, h);
            }
          }
          out[static_cast<size_t>(w4::packed_word_index(nb, kb, k_blocks, lane, word))] = v;
        }
      }
    }
  }
  return out;
}

std::vector<uint16_t> repack_int4_scales_for_mma(const Int4Weight& w, Int4MmaRows rows) {
  check_int4_mma_compatible(w, "repack_int4_scales_for_mma");
  const int64_t n_blocks = w.rows / w4::kBlockN, groups = w.groups_per_row();
  std::vector<uint16_t> out(w.scales.size());
  for (int64_t nb = 0; nb < n_blocks; ++nb) {
    for (int64_t g = 0; g < groups; ++g) {
      for (int t = 0; t < 4; ++t) {
        for (int tile = 0; tile < w4::kTilesPerBlock; ++tile) {
          for (int half = 0; half < 2; ++half) {
            const int64_t n = source_row(w, rows, nb * w4::kBlockN + w4::scale_column(t, tile, half));
            out[static_cast<size_t>(w4::packed_scale_index(nb, g, groups, t, tile, half))] =
                w.scales[static_cast<size_t>(n * groups + g)];
          }
        }
      }
    }
  }
  return out;
}

Int4Weight int4_swiglu_interleave_rows(const Int4Weight& w) {
  check_int4_mma_compatible(w, "int4_swiglu_interleave_rows");
  Int4Weight out = w;
  const int64_t row_bytes = w.cols / 2, groups = w.groups_per_row();
  for (int64_t n = 0; n < w.rows; ++n) {
    const int64_t src = w4::swiglu_source_row(n, w.rows / 2);
    std::copy_n(w.qweight.begin() + src * row_bytes, row_bytes, out.qweight.begin() + n * row_bytes);
    std::copy_n(w.scales.begin() + src * groups, groups, out.scales.begin() + n * groups);
  }
  return out;
}

std::vector<uint16_t> int4_dequantize_bf16_mma_order(const Int4Weight& w, Int4MmaRows rows) {
  check_int4_mma_compatible(w, "int4_dequantize_bf16_mma_order");
  const int64_t groups = w.groups_per_row();
  std::vector<uint16_t> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t n = 0; n < w.rows; ++n) {
    const int64_t src = source_row(w, rows, n);
    for (int64_t g = 0; g < groups; ++g) {
      const float s = w.scale(src, g);
      for (int64_t k = g * w.group; k < (g + 1) * w.group; ++k) {
        // (u - 8) * s is exact in fp32 (at most 4 + 11 significant bits): f32_to_bf16 is the only rounding.
        const float v = static_cast<float>(static_cast<int>(w.nibble(src, k)) - 8) * s;
        out[static_cast<size_t>(n * w.cols + k)] = f32_to_bf16(v);
      }
    }
  }
  return out;
}

std::vector<float> gemm_w4a16_reference(std::span<const uint16_t> x_bf16, int64_t M, const Int4Weight& w,
                                        std::vector<float>* abs_dot) {
  const int64_t N = w.rows, K = w.cols;
  check(M > 0 && static_cast<int64_t>(x_bf16.size()) == M * K, "gemm_w4a16_reference: x holds ", x_bf16.size(),
        " values, expected M * K = ", M, " * ", K);
  const std::vector<float> wd = int4_dequantize(w);
  std::vector<float> x(x_bf16.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(x_bf16[i]);
  std::vector<float> y(static_cast<size_t>(M * N));
  if (abs_dot) abs_dot->assign(y.size(), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* wr = wd.data() + n * K;
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x.data() + m * K;
      double s = 0.0, a = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(xr[k]) * wr[k];
        s += p;
        a += std::fabs(p);
      }
      y[static_cast<size_t>(m * N + n)] = static_cast<float>(s);
      if (abs_dot) (*abs_dot)[static_cast<size_t>(m * N + n)] = static_cast<float>(a);
    }
  }
  return y;
}

}  // namespace futransformer::formats
