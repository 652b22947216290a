// The comparison of a generic decode-attention output (BF16 bits) with its CPU twin, shared by the GPU test
// (tests/gpu/test_attention_generic.cpp) and the CPU emulation of the kernel
// (tests/cpu/test_attention_generic_emulation.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "futransformer/dtype.h"
#include "paged_kv_case.h"

namespace futransformer::test {

// Tolerances against ref::paged_decode_attention. The kernel computes in fp32 throughout and rounds once, to
// BF16, at the output: 8 significant bits, at most 2^-8 relative. The rest is fp32 against fp32 in other orders:
// each score's dot product errs by at most head_dim · 2^-24 · Σ|q_i k_i| / sqrt(head_dim) in either
// implementation (≈ 9e-5 at head_dim 256 for make_paged_kv_case's inputs: q ~ 0.5·N(0,1), k ~ N(0,1) with four
// 4x channels, Σ|q_i k_i| ≈ 90), and a logit difference δ ≤ 1.8e-4 moves the output by at most about
// 2δ · Σ_t p_t |v_t| (the twin's abs_out); expf and the summations over 1000 tokens add a few 1e-5 of the same
// scale. Worst case ≈ 4e-4 · abs_out: the bound 2^-10 · abs_out keeps a 2.5x margin over it (head_dim 512 and
// 32k-token sums reach about 2^-10 in the worst case; the CPU emulation passes with 2^-16: rounding errors do
// not add up linearly) and is 8x tighter than the fast kernel's, which rounds P to BF16.
// Whole-tensor relative L2: BF16 rounding alone gives about 1.3e-3.
constexpr double kGenericOutputRel = 1.0 / 256.0;
constexpr double kGenericFp32Rel = 1.0 / 1024.0;
constexpr double kGenericRelL2 = 3e-3;

// got: the kernel's BF16 output [batch, n_heads, head_dim]; ref / abs_ref: the twin's output and abs_out.
// Every element must be written (not NaN) and within the bound; sequences of length 0 must be exactly 0.
inline void expect_close_to_twin(const PagedKvCase& c, const std::vector<uint16_t>& got, const std::vector<float>& ref,
                                 const std::vector<float>& abs_ref) {
  ASSERT_EQ(got.size(), ref.size());
  ASSERT_EQ(abs_ref.size(), ref.size());
  const size_t per_seq = static_cast<size_t>(c.n_heads) * c.head_dim;
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double v = bf16_to_f32(got[i]);
    const size_t seq = i / per_seq, head = i / c.head_dim % c.n_heads, channel = i % c.head_dim;
    ASSERT_FALSE(std::isnan(v)) << "output " << i << " (sequence " << seq << ", head " << head
                                << ") not written or NaN";
    const double bound = kGenericOutputRel * std::fabs(ref[i]) + kGenericFp32Rel * abs_ref[i];
    ASSERT_LE(std::fabs(v - ref[i]), bound)
        << "sequence " << seq << " (length " << c.seq_lens[seq] << ") head " << head << " channel " << channel
        << ": got " << v << ", ref " << ref[i] << ", abs_out " << abs_ref[i];
    err2 += (v - ref[i]) * (v - ref[i]);
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  ASSERT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(err2 / ref2), kGenericRelL2);
}

}  // namespace futransformer::test
