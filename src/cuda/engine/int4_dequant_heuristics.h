// When the CUDA engine runs an INT4 projection as "dequantise to BF16 + cuBLAS" instead of the W4A16 decode GEMM
// (DeviceLinear::forward for M >= the threshold; docs/design.md "INT4 projections at prefill sizes").
//
// The W4A16 GEMM takes at most 64 rows per launch and reads the whole packed weight each time; at M = 64 it is
// already limited by instruction issue, not bytes (8B block at 2048 tokens: 32 launches per projection, ~136
// TFLOP/s). The other path reads the packed weight once, writes and re-reads a BF16 copy (4 + 2 · 16 bits per
// weight: about 0.15 ms for an 8B block's 0.22 G weights at ~3.5 TB/s) and then runs one tensor-core GEMM at
// cuBLAS's speed. Estimated from those numbers the two cross near 128 rows; 192 leaves a margin until measured
// (bench_prefill prints both paths; FT_INT4_DEQUANT_MIN_ROWS moves the threshold without a rebuild).
// Plain C++ (no CUDA): the CPU tests check the parsing.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "futransformer/error.h"

namespace futransformer::cuda {

constexpr int64_t kInt4DequantMinRows = 192;

// The threshold an engine uses: `option` (CudaEngineOptions::int4_dequant_min_rows) when >= 0; else the value of
// env (the FT_INT4_DEQUANT_MIN_ROWS variable, may be null) when set; else kInt4DequantMinRows. 0 means never.
// Throws Error for an env value that is not a non-negative decimal integer.
inline int64_t int4_dequant_min_rows(int64_t option, const char* env) {
  if (option >= 0) return option;
  if (env == nullptr || *env == '\0') return kInt4DequantMinRows;
  const std::string s(env);
  check(!s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos,
        "FT_INT4_DEQUANT_MIN_ROWS = '", env, "': expected a non-negative integer of at most 9 digits (rows per pass; ",
        "0 disables the dequantise + cuBLAS path)");
  return std::stoll(s);
}

// The same, reading FT_INT4_DEQUANT_MIN_ROWS; with FT_PRINT_HEURISTICS=1 (print = true) the choice goes to stderr.
inline int64_t int4_dequant_min_rows_from_env(int64_t option, bool print) {
  const char* env = std::getenv("FT_INT4_DEQUANT_MIN_ROWS");
  const int64_t rows = int4_dequant_min_rows(option, env);
  if (print) {
    const char* source = option >= 0 ? "engine option" : (env && *env ? "FT_INT4_DEQUANT_MIN_ROWS" : "default");
    if (rows == 0)
      std::fprintf(stderr, "[int4 projections] W4A16 GEMM at every M, dequantise + cuBLAS off (%s)\n", source);
    else
      std::fprintf(stderr, "[int4 projections] dequantise + cuBLAS from %lld rows per pass (%s)\n",
                   static_cast<long long>(rows), source);
  }
  return rows;
}

}  // namespace futransformer::cuda
