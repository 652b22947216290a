// INT4 weights in the layout of the W4A16 tensor-core GEMM (futransformer/cuda/gemm_w4a16.h), and the GEMM's
// CPU twin. The layouts are defined in src/cuda/gemm_w4a16_layout.h and drawn in docs/kernels.md. CPU code:
// available (and tested) in builds without CUDA.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "futransformer/formats/int4.h"

namespace futransformer::formats {

// Throws Error unless the GEMM handles this weight: symmetric, group 32/64/128, rows (N) and columns (K)
// multiples of 32, buffers sized as the header of int4.h says. `what` names the tensor in the message.
void check_int4_mma_compatible(const Int4Weight& w, const std::string& what);

// Row order of a packed weight. swiglu_interleaved: w is a gate|up weight (gate rows 0 .. N/2 - 1, then the up
// rows) for cuda::gemm_w4a16_swiglu, packed with its rows reordered so that in every run of 16 packed rows the
// first 8 are gate rows 8q .. 8q + 7 and the next 8 the same up rows (cuda::w4a16::swiglu_source_row): the GEMM
// thread that computes gate column j then also computes up column j.
enum class Int4MmaRows : uint8_t { canonical, swiglu_interleaved };

// Nibbles regrouped so that each lane's 16-byte load of a 32 x 32 block holds exactly its mma.m16n8k16 B
// fragments (N * K / 8 words).
std::vector<uint32_t> repack_int4_for_mma(const Int4Weight& w, Int4MmaRows rows = Int4MmaRows::canonical);
// Scale bit patterns (FP16 or BF16 as in w.spec) regrouped per 32-column block and group so that a lane reads
// the scales of its accumulator columns as one 16-byte vector (N * K / group values).
std::vector<uint16_t> repack_int4_scales_for_mma(const Int4Weight& w, Int4MmaRows rows = Int4MmaRows::canonical);
// w with its rows in the SwiGLU-interleaved order (row n of the result is row swiglu_source_row(n) of w): the
// canonical packing of it is the interleaved packing of w. Checks as the repackers.
Int4Weight int4_swiglu_interleave_rows(const Int4Weight& w);

// CPU twin of cuda::int4_dequant_bf16: the weight as BF16 bit patterns, row-major [N, K], in the row order of its
// packing under `rows` (row n holds canonical row swiglu_source_row(n) when interleaved; for canonical output of an
// interleaved packing pass Int4MmaRows::canonical): bf16_rn((u − 8) · s), the fp32 product exact, one rounding.
// Checks as the repackers.
std::vector<uint16_t> int4_dequantize_bf16_mma_order(const Int4Weight& w, Int4MmaRows rows = Int4MmaRows::canonical);

// CPU twin of gemm_w4a16: y[M, N] = x[M, K] * dequant(W)^T with x given as BF16 bit patterns, products summed
// in fp64, returned in fp32 before the BF16 output rounding (callers round with f32_to_bf16 to compare).
// When abs_dot is not null it receives sum_k |x[m, k] * W[n, k]|, the scale of rounding errors in y[m, n].
std::vector<float> gemm_w4a16_reference(std::span<const uint16_t> x_bf16, int64_t M, const Int4Weight& w,
                                        std::vector<float>* abs_dot = nullptr);

}  // namespace futransformer::formats
