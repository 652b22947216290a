// The reference engine's ops: plain fp32 math (fp64 where a long sum would lose accuracy), one function per op.
// Every GPU kernel is checked against these, so each says exactly what it computes. Row-major throughout.
#pragma once

#include <cstdint>
#include <vector>

#include "futransformer/model.h"

namespace futransformer::ref {

// y[M, N] = x[M, K] · W[N, K]ᵀ, i.e. y[m, n] = Σ_k x[m, k] · W[n, k] (a linear layer with HF [out, in] weights).
// Uses cblas_sgemm when built with BLAS, else an OpenMP loop with fp32 accumulation.
void matmul_nt(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k);

// One row: y[i] = x[i] / sqrt(mean_j(x[j]²) + eps) · w[i]. The mean is accumulated in fp64. y may alias x.
void rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps);

// RoPE inverse frequencies for i < head_dim/2: f[i] = theta^(−2i/head_dim), computed in fp64, rounded to fp32.
// With llama3 scaling (as HF `_compute_llama3_parameters`), wavelen = 2π/f and orig = original_max_position_embeddings:
//   wavelen < orig/high_freq_factor → f;   wavelen > orig/low_freq_factor → f/factor;
//   otherwise smooth = (orig/wavelen − low_freq_factor)/(high_freq_factor − low_freq_factor),
//             f' = (1 − smooth)·f/factor + smooth·f.
// Throws Error on an odd/non-positive head_dim, theta <= 0 or a scaling type other than "" and "llama3".
std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling);

// HF rotate-half RoPE on `n_heads` heads of `head_dim` values at absolute position `pos`, in place. For each head
// and i < d/2, with a = pos·inv_freq[i] (angle, cos and sin evaluated in fp64):
//   x'[i] = x[i]·cos a − x[i + d/2]·sin a,   x'[i + d/2] = x[i + d/2]·cos a + x[i]·sin a.
void apply_rope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const float* inv_freq);

// In place: x[i] = exp(x[i] − max x) / Σ_j exp(x[j] − max x) (max subtraction keeps exp finite; sum in fp64).
void softmax(float* x, int64_t n);

// silu(x) = x / (1 + exp(−x)) = x·sigmoid(x).
float silu(float x);

// out[i] = silu(gate[i]) · up[i] (the Llama MLP's gated activation). out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n);

// Causal GQA attention of one sequence. q: [n_q, n_heads·d] for the queries at absolute positions
// q_pos0 … q_pos0 + n_q − 1; k, v: [n_kv, n_kv_heads·d] for positions 0 … n_kv − 1 (the sequence's cache, which
// already holds the queries' own keys). Query head h reads KV head g = h / (n_heads / n_kv_heads). For query i:
//   s[t] = (q_i,h · k_t,g) / sqrt(d) for t ≤ q_pos0 + i,   p = softmax(s),   out[i, h·d + j] = Σ_t p[t] · v_t,g[j].
// Scores and the softmax are fp32 (max subtracted); with BLAS, blocks of 4+ queries use sgemm for both products.
// Throws Error if the shapes are inconsistent.
void attention(const float* q, const float* k, const float* v, float* out, int64_t n_q, int64_t q_pos0, int64_t n_kv,
               int64_t n_heads, int64_t n_kv_heads, int64_t head_dim);

}  // namespace futransformer::ref
