// The CUDA engine: the Llama forward pass on a Hopper GPU, behind the same Engine interface as the CPU reference
// engine so one test drives both. docs/design.md ("CUDA engine") describes the data flow.
//
// Weights: a recipe's INT4 projections run the W4A16 tensor-core GEMM (futransformer/cuda/gemm_w4a16.h; symmetric
// groups, repacked once at upload) — in passes of >= int4_dequant_min_rows rows dequantised to BF16 and run through
// cuBLAS instead (futransformer/cuda/int4_dequant.h); full-precision projections, the embedding and the LM head are
// BF16 (cuBLAS, fp32 accumulation). q/k/v and gate/up are fused into one GEMM each. The residual stream stays fp32;
// every GEMM reads and writes BF16. KV cache: the paged formats of formats/kv_cache.h (bf16, int4, int4-hadamard)
// written by cuda/kv_append.h and read by the decode attention kernels; prompt tokens attend over the cache they have
// just written, exactly as the reference engine does. A batch whose chunks are all single tokens of existing sequences
// (a decode step) runs as one CUDA graph per (batch size, context bucket), captured on first use and replayed.
// A head-int4 recipe's LM head runs the W4A16 GEMM instead of cuBLAS (BF16 logits, widened to fp32 on the GPU
// before the argmax, the sampler and the copy to the host).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "futransformer/engine.h"
#include "futransformer/formats/kv_cache.h"
#include "futransformer/model.h"
#include "futransformer/recipe.h"
#include "futransformer/sampling.h"

namespace futransformer {
namespace quant {
struct QuantizedModel;
}

struct CudaEngineOptions {
  int64_t max_sequence_length = 0;  // 0: min(config.max_position_embeddings, 4096)
  int64_t max_sequences = 32;       // sequences cached at once (their ids are free)
  int64_t max_batch_tokens = 1024;  // rows of one internal pass; longer prompts run as consecutive passes
  int64_t kv_cache_tokens = 0;      // page-pool token slots; 0: max_sequences · max_sequence_length, in whole pages
  formats::KvFormat kv = formats::KvFormat::BF16;  // fp8 is not run by the GPU attention kernels
  bool cuda_graphs = true;          // replay decode steps as CUDA graphs
  bool generic_attention = false;   // always use the generic attention kernel (comparisons, diagnosis)
  // Prompt passes attend with attention_prefill (one CTA per 64 query vectors of a chunk) where it takes the model;
  // false: every row as its own decode query (comparisons, diagnosis).
  bool prefill_attention = true;
  bool synthetic_fp8_prefill = false;  // make_synthetic_cuda_engine: also random FP8 prefill weights (FP8 prefill)
  // make_synthetic_cuda_engine: a random INT4 LM head (head_int4_spec's group, BF16 scales) instead of one tied to
  // the BF16 embedding. make_cuda_engine ignores it: a loaded model's recipe decides (cuda_engine_options sets it
  // from the recipe's head part, so a report's synthetic rows follow their recipe).
  bool synthetic_int4_head = false;
  // INT4 projections with the W4A16 GEMM's fused epilogues (BF16 passes): the o and down GEMMs add into the fp32
  // residual stream and the gate|up GEMM applies SwiGLU (its weight is then packed gate/up-interleaved), so no
  // separate residual or SwiGLU kernel runs; false: the GEMMs write BF16 and the separate kernels follow (residual
  // adds fused with the next RMSNorm). FP8 prefill passes: the o and down FP8 GEMMs add into the residual stream
  // in their epilogue (gemm_fp8_residual) instead of storing BF16 for a separate add. Both settings give
  // bit-identical results; the flag exists to compare and measure them.
  bool fused_epilogues = true;
  // With fused_epilogues and an int4-hadamard cache: decode attention launches un-rotate their output themselves
  // (cuda::attention_decode_int4_unrotated: in the combine kernel when they split the sequences, in the decode kernel
  // when they do not) instead of a separate rotate_heads_bf16 (bit-identical by construction; GPU-tested, one kernel
  // fewer per layer: 8B step at context 1024 1.5 % faster at batch 1 and 8 on the H200, 2.8 % at batch 32 on the
  // H100, docs/results.md). false: the separate kernel (kept to compare).
  bool fused_attention_unrotation = true;
  // Decode steps (one new token per sequence): the decode attention copies every cache tile but the one holding each
  // sequence's new token before its griddepcontrol.wait (cuda::attention_decode_*'s early_copies), so the copies
  // overlap the attention prologue kernel before it. Same bits. Measured on the H200 (8B step, context 1024): batch 1
  // 2153 -> 2121 µs, batch 8 2832 -> 2760 µs with the release-late knob, docs/results.md twelfth session. false:
  // everything read after the wait (kept to compare).
  bool decode_attention_early_copies = true;
  // With fused_epilogues, decode steps on an INT4 or int4-hadamard cache at head_dim 128 whose qkv GEMM splits K: the
  // decode attention kernel runs the attention prologue (cuda::attention_decode_int4_with_prologue: RoPE, the q
  // rotation, and the new token's cache append by the CTA that reads it; bit-identical to qkv_rope_kv_append + the
  // attention by construction, GPU-tested) instead of the GEMM's split-K reduce (fused_qkv_prologue), whose reduce is
  // then the plain one. Off by default: on the H200 (same call, docs/results.md twelfth session) it made the 8B step
  // at batch 32 0.4-0.6 % faster but the 70B step at batch 8 2.1 % slower (each attention CTA rotates its G query
  // heads, 8 for 70B, before its first tile); batch 1 and the other points level.
  bool fused_attention_prologue = false;
  // With fused_attention_prologue: also decode steps whose qkv GEMM does not split K (instead of the separate prologue
  // kernel). Off by default because it is slower there: every attention CTA waits for the prologue's dependent chain
  // before its first tile, which costs more than the separate two-CTA kernel whose launch the attention's early
  // copies overlap (8B step, batch 1: 2120 -> ~2200 µs). Kept to compare and test.
  bool attention_prologue_unsplit = false;
  // With fused_epilogues and an int4-hadamard cache: prompt passes that attend with attention_prefill un-rotate its
  // output in the kernel's store (cuda::attention_prefill_int4_unrotated; bit-identical to the separate
  // rotate_heads_bf16 by construction). GPU-tested in the eighth session; it saved ~1 us per 8B layer and did not move
  // the whole prefill, so off by default; bench_prefill turns it on with FT_PREFILL_UNROTATE=1.
  bool fused_prefill_unrotation = false;
  // FP8 prefill passes with an int4-hadamard cache whose attention output still needs its un-rotation: one kernel
  // un-rotates and quantises it for the o GEMM (cuda::unrotate_rows_fp8; the same codes and scales as
  // rotate_heads_bf16 + quantize_rows_fp8 by construction, GPU-tested), so the un-rotated BF16 rows are never
  // written. Measured on the H200 (8B, 2048 tokens): 12.3 + 11.5 -> 17.8 us per layer. false: the two kernels.
  bool fused_unrotate_fp8 = true;
  // FP8 prefill passes with an INT4 or int4-hadamard cache at head_dim 128: the qkv GEMM runs RoPE, the q rotation
  // and the INT4 cache placement in its epilogue (cuda::gemm_fp8_qkv; bit for bit the GEMM + rope_qk_bf16 +
  // kv_append_rotate_q). A pass that starts int4-hadamard sequences gets the RoPE'd keys as BF16 from it, then the
  // key anchors and a keys-only append (kv_append_keys). Built after the ninth session's first device call: off by
  // default until measured; bench_prefill turns it on with FT_FP8_QKV_EPILOGUE=1.
  bool fused_fp8_qkv = false;
  // FP8 prefill passes at head_dim 128 that run RoPE as its own kernel (passes that start int4-hadamard sequences,
  // whose keys wait for the anchors; models qkv_rope_kv_append does not take): the qkv GEMM applies RoPE to q and k
  // in its epilogue instead (cuda::gemm_fp8_rope; bit for bit forward_fp8 + rope_qk_bf16 by construction, GPU-tested).
  // Off: on the H200 (twenty-first session, docs/results.md) it was 1.08x faster than the two kernels alone, but in a
  // whole 8B pass the RoPE kernel mostly overlaps the GEMM's tail and the gain (~3 µs per layer in a CUPTI trace) stayed
  // inside the run-to-run spread (34.18 vs 34.27 ms). bench_prefill turns it on with FT_FP8_ROPE=1.
  bool fused_fp8_rope = false;
  // With fused_epilogues: run the attention prologue (RoPE, cache append, q rotation) inside the qkv GEMM's split-K
  // reduce when every W4A16 launch of the pass splits K (gemm_w4a16_qkv_rope_append; bit-identical by construction,
  // GPU-tested against the two-kernel order). false: the two kernels always (kept to compare and measure).
  bool fused_qkv_prologue = true;
  // With fused_qkv_prologue: decode passes of fused_qkv_tail_min_rows..fused_qkv_tail_max_rows rows (at most 8) whose
  // qkv GEMM does not split K, on an INT4 or int4-hadamard cache at head_dim 128, run the prologue in the GEMM's own
  // tail (the CTA that completes a head runs it; gemm_w4a16_qkv_rope_append's head_counters) instead of
  // qkv_rope_kv_append's kernel after it. Same bits (GPU-tested). Rows 3..5: the forty-first session's screen (H100,
  // the tail releasing the attention after its store) had the 8B step -0.5 / -2.0 / -0.8 % at batch 3 / 4 / 5 and
  // +1.9 / +1.2 / +1.3 % at 1 / 2 / 6 (+1.3 % at 8); 70B -1.7 / -2.8 / 0.0 / -0.1 % at 3 / 4 / 5 / 6, +0.6 % at 1
  // (docs/results.md). bench_decode_step: FT_QKV_TAIL=0|1, FT_QKV_TAIL_ROWS=lo:hi.
  bool fused_qkv_tail = true;
  int fused_qkv_tail_min_rows = 3;
  int fused_qkv_tail_max_rows = 5;
  // With fused_epilogues, INT4 W4A16 passes of at most 8 rows: the attention RMSNorm (every layer but the first) and
  // the MLP RMSNorm run inside the qkv and gate|up GEMMs' activation staging (gemm_w4a16_rmsnorm*, bit-identical to
  // rmsnorm_bf16 + the GEMM by construction), two kernels fewer per layer. GPU-tested, but off by default because it
  // is slower: every CTA of the GEMM recomputes the rows' sum of squares before its first MMA, which costs more than
  // the two kernels it removes (8B step on the H200: +2 % at batch 1, +14 % at batch 8; docs/results.md). FP8,
  // dequantise + cuBLAS and BF16 passes keep the separate norm kernels either way.
  bool fused_norm_prologue = false;
  // fused_norm_prologue's GEMMs without the row sums: the o and down W4A16 GEMMs before them also write the new
  // residual rows' RMSNorm partials (rmsnorm_bf16's warp sums, from their split-K reduce or a small kernel after an
  // unsplit GEMM; gemm_w4a16_residual_norm_partials), and each CTA of the qkv / gate|up GEMM adds those instead of
  // reading its rows in full. Same bits as the norm kernels. Implies fused_norm_prologue's fusions (same conditions).
  // GPU-tested; off by default because it is still slower than the norm kernels (8B step on the H200: +4 % at batch 1,
  // +9 % at batch 8, docs/results.md "Eighteenth session"): at batch 1 the o and down GEMMs do not split K, so a
  // kernel still reads the rows back for the sums, and staging fp32 rows costs the GEMM more than BF16 ones.
  bool fused_norm_partials = false;
  // With fused_epilogues, INT4 o and down projections on the W4A16 path: the RMSNorm after each of them (the MLP norm,
  // the next layer's attention norm) runs inside the GEMM's split-K reduce where K is split
  // (cuda::gemm_w4a16_residual_rmsnorm: reduce, residual add and norm in one kernel; after an unsplit GEMM the norm
  // kernel as before). Same bits. Not where a norm prologue takes the norm. Only in passes of at most
  // fused_residual_norm_max_rows rows whose GEMM splits K (elsewhere the GEMM + norm kernel as before): the fused
  // kernel gives each row one CTA, which pays at small batches and not at large ones (thirty-eighth session, H100, 8B
  // step: -1.3 % at batch 4 and 8; +0.4 to +2.9 % at 12..32; 70B level at 8, +1.6 % at 16). bench_decode_step:
  // FT_RESIDUAL_NORM=0|1, FT_RESIDUAL_NORM_MAX_ROWS=n.
  bool fused_residual_norm = true;
  int fused_residual_norm_max_rows = 8;
  // Decode steps on the W4A16 path: after each layer's qkv GEMM, a side branch of the step (its own stream, joined at
  // the end of the layers) prefetches this fraction of the layer's gate|up weight into L2 (cuda::l2_prefetch_stripes,
  // round(16 f) of every 16 lines, evict_last), while the attention's latency-bound kernels leave DRAM mostly idle, so
  // the gate|up GEMM finds that share of its bytes in L2. A hint: the same bits either way. 0 (the default): none.
  // Must be in [0, 1] (Error at construction otherwise). bench_decode_step: FT_L2_PREFETCH_GATE_UP=f. Measured slower
  // from the default grid (thirty-eighth session, H100: +10.3 % at batch 1 for 0.5; the prefetches delay the attention's
  // reads); from 8 CTAs (l2_prefetch_ctas) -1.1 % at batch 1, slower at 8 and 32. docs/kernels.md has the analysis.
  double l2_prefetch_gate_up = 0.0;
  // The same branch also prefetches this fraction of the layer's down weight (after gate|up's share), [0, 1].
  // bench_decode_step: FT_L2_PREFETCH_DOWN=f.
  double l2_prefetch_down = 0.0;
  // The same branch first prefetches this fraction of the layer's o weight (before gate|up's share: the o GEMM runs
  // first), [0, 1]. bench_decode_step: FT_L2_PREFETCH_O=f. Measured slower (+4.2 % at batch 1, +4.4 % at 32, H100).
  double l2_prefetch_o = 0.0;
  // Where the branch forks: false = after the qkv GEMM (the prefetch shares DRAM with the attention, which it slowed
  // by ~6 us a layer at batch 1 on an H100 in the thirty-eighth session), true = after the attention's kernels (it
  // shares DRAM with the o GEMM's compute and the MLP norm). bench_decode_step: FT_L2_PREFETCH_AFTER_ATTENTION=1.
  bool l2_prefetch_after_attention = false;
  // At most this many CTAs per prefetch kernel (cuda::l2_prefetch_stripes' max_blocks; 0 = its default, two per SM)
  // of l2_prefetch_threads threads (a multiple of 32 up to 256; 0 = 256). bench_decode_step: FT_L2_PREFETCH_CTAS=n,
  // FT_L2_PREFETCH_THREADS=n.
  int l2_prefetch_ctas = 0;
  int l2_prefetch_threads = 0;
  // The branch runs only in decode steps of at most this many rows (0: any). bench_decode_step:
  // FT_L2_PREFETCH_MAX_ROWS=n.
  int l2_prefetch_max_rows = 0;
  // FP8 prefill passes: the down projection's input is quantised per token per 128 channels (the recipe
  // act-fp8-block-bf16; twin: make_prefill_decode_reference_engine with ActivationFormat::Fp8BlockOverBf16) instead of
  // per token. With fused_epilogues the gate|up FP8 GEMM then applies SwiGLU and writes those FP8 codes and scales in
  // its epilogue (cuda::gemm_fp8_swiglu; its weight packed for it), so neither the BF16 gate|up tensor nor a SwiGLU
  // kernel exist, and the down GEMM applies the block scales per K block (gemm_fp8_block_a_residual); without it,
  // gate|up GEMM → swiglu_fp8_block → down GEMM, the same bits. Needs an intermediate size that is a multiple of 128
  // (Error at construction otherwise). GPU-tested; off by default because at the 8B shape and 2048 tokens it is a
  // wash (the block-scaled down GEMM is still 12 % slower than the per-token one; the whole MLP is 6-10 % faster at
  // 8192 tokens and on the 70B shapes, docs/results.md).
  bool fp8_block_swiglu = false;
  // INT4 projections in passes of at least this many rows run as dequantise-to-BF16 (one BF16 copy of the weight in a
  // scratch buffer) + the cuBLAS BF16 GEMM instead of the W4A16 GEMM's 64-row launches (docs/design.md "INT4
  // projections at prefill sizes"): every weight rounded to BF16 once (relative error <= 2^-9). -1: the
  // FT_INT4_DEQUANT_MIN_ROWS environment variable if set, else the heuristic (192 rows,
  // src/cuda/engine/int4_dequant_heuristics.h); 0: never (every pass runs the W4A16 GEMM). The scratch (the largest
  // INT4 projection, N·K BF16) is allocated only when an INT4 pass can reach the threshold (max_batch_tokens; with FP8
  // prefill also max_sequences). An INT4 LM head always runs the W4A16 GEMM (its BF16 copy would be ~1 GB).
  int64_t int4_dequant_min_rows = -1;
  // Diagnosis: time every op of every pass with CUDA events (CudaEngine::op_profile). Runs without CUDA graphs and
  // synchronises after each pass, so it slows the engine; the per-op times include each op's launch gap.
  bool profile_ops = false;
};

// Bytes the engine holds on the GPU.
struct CudaEngineMemory {
  int64_t weights = 0;      // projections (packed INT4 + scales, or BF16), embedding, head (BF16 or INT4), norms
  int64_t kv_cache = 0;     // page pool of every layer (+ key anchors)
  int64_t activations = 0;  // per-pass buffers, logits
  int64_t workspace = 0;    // GEMM split-K / attention split / cuBLAS scratch, INT4 dequantisation scratch
  int64_t int4_dequant_scratch = 0;  // part of workspace: the BF16 copy of the largest INT4 projection (0 when unused)
  int64_t total() const { return weights + kv_cache + activations + workspace; }
};

class CudaEngine : public Engine {
 public:
  // Like forward, but the next token of each chunk is chosen on the GPU by greedy argmax (the same choice as
  // sample() at temperature 0) and only the ids come back.
  virtual std::vector<int32_t> forward_greedy(std::span<const SequenceChunk> batch) = 0;
  // Like forward_greedy, but chunk i's next token is sampled on the GPU from the caller's draw uniforms[i] in
  // [0, 1): the token sample_with_uniform(logits of chunk i, params, uniforms[i]) chooses (params.seed unused).
  virtual std::vector<int32_t> forward_sample(std::span<const SequenceChunk> batch, const SamplingParams& params,
                                              std::span<const double> uniforms) = 0;
  virtual CudaEngineMemory memory() const = 0;
  // Decode-step timing for benchmarks: runs forward_greedy(batch) twice (warm-up, then CUDA-graph capture; each
  // advances every sequence by one token), then replays that step's graph `iters` times on the same inputs (the
  // replays rewrite the same cache slots with the same values), each timed with CUDA events. Microseconds.
  struct StepTiming {
    double median_us = 0, p90_us = 0, min_us = 0;
  };
  // Synthetic engines only (Error otherwise): makes sequence seq_id (new or existing) `tokens` positions longer
  // without running the model, its new cache slots holding the pool's fill pattern, so decode latency at a long
  // context can be measured without a prefill.
  virtual void append_synthetic_context(int32_t seq_id, int64_t tokens) = 0;
  virtual StepTiming benchmark_decode_step(std::span<const SequenceChunk> batch, int iters) = 0;
  virtual std::string description() const = 0;  // recipe and kernels, one line
  // With CudaEngineOptions::profile_ops: GPU time per op name summed over every pass since the last clear, each op
  // measured from the end of the op before it (so launch gaps count). Empty without profile_ops.
  struct OpTime {
    std::string op;
    int64_t calls = 0;
    double total_us = 0;
  };
  virtual std::vector<OpTime> op_profile() const = 0;
  // Quality runs (eval/device_quality.h) without downloading logits: runs `chunk` as forward(chunk, true) would and
  // leaves every row's logits on the GPU, [rows, vocab] fp32 rows of stride vocab in a buffer the engine owns (grown
  // as needed), valid until the next call on this engine. The engine's stream is idle when it returns.
  virtual const float* forward_logits_on_device(const SequenceChunk& chunk) = 0;
  virtual void clear_op_profile() = 0;
};

// Uploads `model` with full-precision projections (BF16). Errors (before any GPU work where possible) for:
// no usable Hopper GPU, a model the kernels cannot run, options out of range, too little GPU memory.
std::unique_ptr<CudaEngine> make_cuda_engine(const Model& model, const CudaEngineOptions& options = {});
// Uploads a quantised model: its INT4 projections as W4A16 weights (symmetric INT4 only), the rest as above; with
// head-int4 (int4 holds lm_head.weight) the LM head as a W4A16 weight too — its reference twin is the reference
// engine with the recipe's options (act-bf16: the logits rounded to BF16 as the GEMM writes them). FP8 weights
// belong to the FP8 prefill path (the overload below): an Error here.
std::unique_ptr<CudaEngine> make_cuda_engine(const quant::QuantizedModel& model, const CudaEngineOptions& options = {});
// FP8 prefill (docs/design.md "FP8 prefill"): `decode` is uploaded as above and runs every chunk of one token;
// `prefill` (an fp8-weights recipe of the same checkpoint) adds FP8 copies of the projections, and every chunk of
// more than one token runs its projections as FP8 × FP8 GEMMs with per-token FP8 inputs and BF16 outputs — the
// reference twin is make_prefill_decode_reference_engine with prefill activations act-fp8-bf16 (whatever activation
// format `prefill`'s recipe names, except act-fp8-block-bf16, which turns CudaEngineOptions::fp8_block_swiglu on:
// twin act-fp8-block-bf16). Embedding, norms and LM head come from `decode`. Errors, before any GPU work: a
// prefill recipe without fp8 weights, configs, recipe KV or head formats that differ, or a projection group the
// FP8 GEMM cannot run (K % 128, N % 8; the message names it) — FP8 prefill is all or nothing.
std::unique_ptr<CudaEngine> make_cuda_engine(const quant::QuantizedModel& decode, const quant::QuantizedModel& prefill,
                                             const CudaEngineOptions& options = {});

// A synthetic model made directly in GPU memory (no file, no host copy of the weights): `config`'s shapes with
// random INT4 projections (symmetric, group `int4_group`, F16 scales) or random BF16 projections when
// int4_group == 0; with options.synthetic_fp8_prefill also random FP8 prefill copies (prompt chunks run FP8); with
// options.synthetic_int4_head a random INT4 LM head (else the head is the BF16 embedding). For latency
// measurements only: its outputs mean nothing.
std::unique_ptr<CudaEngine> make_synthetic_cuda_engine(const ModelConfig& config, int64_t int4_group,
                                                       const CudaEngineOptions& options = {}, uint64_t seed = 1);

// The engine options a recipe asks for: its KV format (fp32 → bf16, the narrowest the GPU keeps losslessly enough; fp8
// → Error) and synthetic_int4_head from its head part. Throws Error naming the recipe for parts the CUDA engine does
// not run.
CudaEngineOptions cuda_engine_options(const PrecisionRecipe& recipe, CudaEngineOptions base = {});

}  // namespace futransformer
