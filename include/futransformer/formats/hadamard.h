// Normalised Walsh–Hadamard transform over independent blocks, used to rotate KV-cache vectors before INT4
// quantisation (QuaRot/QServe style): the rotation spreads a few outlier channels over the whole block, so the
// per-group INT4 scales stop being dictated by them. H (Sylvester order, normalised by 1/sqrt(block)) is
// symmetric and orthogonal, hence its own inverse: q·k = (Hq)·(Hk), and H(Hv) = v.
//
// Exact fp32 operation order (a GPU implementation must follow it to produce the same bits):
//   for h = 1, 2, 4, ..., block/2:                       (butterfly stages, smallest stride first)
//     for every pair (j, j + h) with (j / h) even:  a = x[j], b = x[j+h];  x[j] = a + b;  x[j+h] = a - b;
//   then  x[j] = x[j] * hadamard_scale(block)          (one fp32 multiply per element, after all stages)
// Every add/sub/mul is a single IEEE fp32 op rounded to nearest even (no FMA contraction is possible: the
// stages contain no products and the final step is a lone multiply).
#pragma once

#include <cstdint>

namespace futransformer::formats {

// The largest block hadamard_block_for chooses: one warp's 32 lanes x 4 values, so a GPU rotates a block in
// registers with shuffles; 128 is also the largest Llama head_dim.
inline constexpr int64_t kHadamardMaxBlock = 128;

// The fp32 constant 1/sqrt(block): static_cast<float>(1.0 / std::sqrt(double(block))). docs/formats.md lists
// its bit patterns for block 2 .. 128 so device code can use them as literals. block must be a power of two.
float hadamard_scale(int64_t block);

// In place over x[0 .. n): blocks x[i*block .. (i+1)*block) are transformed independently. block must be a
// positive power of two dividing n (block 1 is the identity); otherwise an Error is thrown.
void hadamard_blocks(float* x, int64_t n, int64_t block);

// The block used for a head of head_dim values: the largest power of two <= 128 that divides head_dim
// (128 -> 128, 64 -> 64, 96 -> 32, 80 -> 16). head_dim must be positive.
int64_t hadamard_block_for(int64_t head_dim);

}  // namespace futransformer::formats
