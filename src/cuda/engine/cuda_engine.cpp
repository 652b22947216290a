// The CUDA engine (include/futransformer/cuda_engine.h). Host code: weight upload, the paged cache's page and
// slot bookkeeping, per-pass metadata, the layer loop of kernel launches, and the decode-step CUDA graphs.
#include "futransformer/cuda_engine.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <map>
#include <set>
#include <sstream>

#include "cuda/engine/device_linear.h"
#include "cuda/engine/device_memory.h"
#include "cuda/engine/engine_kernels.h"
#include "cuda/engine/int4_dequant_heuristics.h"
#include "cuda/launch_status.h"
#include "futransformer/cuda/attention_decode.h"
#include "futransformer/cuda/attention_prefill.h"
#include "futransformer/cuda/attention_generic.h"
#include "futransformer/cuda/decoder_ops.h"
#include "futransformer/cuda/fp8_producers.h"
#include "futransformer/cuda/fused_ops.h"
#include "futransformer/cuda/gemm_fp8.h"
#include "futransformer/cuda/gemm_fp8_qkv.h"
#include "futransformer/cuda/gemm_fp8_swiglu.h"
#include "futransformer/cuda/gemm_w4a16.h"
#include "futransformer/cuda/kv_append.h"
#include "futransformer/cuda/l2_prefetch.h"
#include "futransformer/cuda/sampling.h"
#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "futransformer/formats/hadamard.h"
#include "futransformer/quant/quantize_model.h"
#include "ref/ops.h"

namespace futransformer {
namespace {

using cuda::cuda_check;
using cuda::DeviceArray;
using cuda::DeviceLinear;

constexpr int64_t kPageTokens = formats::kKvPageTokens;
constexpr int64_t kDefaultMaxSequence = 4096;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// CudaEngineOptions::l2_prefetch_{o, gate_up, down}'s stripes: round(16 f) of every 16 lines (2 KB, four 512-byte
// W4A16 blocks).
constexpr int kL2PrefetchPeriod = 16;

struct DeviceLayer {
  DeviceArray<float> attn_norm, mlp_norm;
  DeviceLinear qkv, o, gate_up, down;
  DeviceLinear qkv8, o8, gate_up8, down8;  // FP8 prefill copies (empty without FP8 prefill)
};

// Where the weights come from: a host model (+ its INT4 projections), or nothing (synthetic); FP8 prefill copies
// from a second (fp8-recipe) quantisation, or random ones for a synthetic engine.
struct WeightSource {
  const Model* model = nullptr;
  const std::map<std::string, formats::Int4Weight>* int4 = nullptr;
  const std::map<std::string, formats::Fp8Matrix>* fp8 = nullptr;
  bool synthetic_fp8 = false;
  int64_t synthetic_group = -1;  // >= 0: synthetic (0 = BF16 projections)
  uint64_t seed = 1;
  std::string recipe_name = "full";
  std::string prefill_recipe_name;  // non-empty: FP8 prefill
};

// FP8 prefill runs every projection group through gemm_fp8; a group it cannot run makes the whole engine an Error
// before any GPU work (a per-group mix of FP8 and decode-path GEMMs would have no reference twin).
void check_fp8_prefill_shapes(const ModelConfig& c) {
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const int64_t qw = c.num_attention_heads * c.head_dim, kvw = c.num_key_value_heads * c.head_dim;
  struct Group {
    const char* name;
    int64_t n, k;
  };
  for (const Group& g : {Group{"self_attn.q_proj|k_proj|v_proj (fused q|k|v)", qw + 2 * kvw, h},
                         Group{"self_attn.o_proj", h, qw}, Group{"mlp.gate_proj|up_proj (fused gate|up)", 2 * inter, h},
                         Group{"mlp.down_proj", h, inter}}) {
    const std::string why = DeviceLinear::fp8_shape_problem(g.n, g.k);
    check(why.empty(), "CUDA engine: FP8 prefill needs every projection group to fit the FP8 GEMM (K a multiple of ",
          cuda::kFp8GemmKMultiple, ", N of ", cuda::kFp8GemmNMultiple, "); model.layers.*.", g.name, " is ", g.n,
          " x ", g.k, " (N x K): ", why, ". Run this model without a prefill model (the decode path serves prompts)");
  }
}

std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

// Offsets (in int32 elements) of the per-pass metadata block; they depend only on the pass's row count, so a
// graph captured for a row count reads the same addresses every replay.
struct MetaLayout {
  int64_t tokens, positions, row_page, row_slot, row_anchor, seq_lens, new_first, new_count, new_anchor,
      block_table, chunk_first, chunk_start, chunk_table, total;
  MetaLayout(int64_t rows, int64_t max_seqs, int64_t pages_per_seq) {
    tokens = 0;
    positions = rows;
    row_page = 2 * rows;
    row_slot = 3 * rows;
    row_anchor = 4 * rows;
    seq_lens = 5 * rows;
    new_first = 6 * rows;
    new_count = new_first + max_seqs;
    new_anchor = new_count + max_seqs;
    block_table = (new_anchor + max_seqs + 3) / 4 * 4;  // 16-byte aligned
    // attention_prefill's per-chunk view of a pass (a batch holds at most max_seqs chunks).
    chunk_first = block_table + rows * pages_per_seq;
    chunk_start = chunk_first + max_seqs + 1;
    chunk_table = chunk_start + max_seqs;
    total = chunk_table + max_seqs * pages_per_seq;
  }
};

// A pass attends with attention_prefill when one of its chunks has at least this many rows; shorter passes keep the
// decode kernels, which split long contexts across CTAs. Chosen for the mma.sync kernel's 64-vector tiles (mostly
// full at 16 rows for G >= 4); the default wgmma kernel's tiles hold 128 vectors — not re-measured since.
constexpr int kPrefillAttentionMinChunkRows = 16;

struct SeqState {
  int32_t slot = 0;
  int64_t length = 0;
  std::vector<int32_t> pages;
};

// One pass: up to max_batch_tokens rows, each a (chunk, token) pair.
struct PassRow {
  size_t chunk;
  int64_t index;  // token index inside the chunk
};

class CudaEngineImpl final : public CudaEngine {
 public:
  CudaEngineImpl(const ModelConfig& config, const WeightSource& src, const CudaEngineOptions& options);
  ~CudaEngineImpl() override;

  const ModelConfig& config() const override { return config_; }
  std::vector<std::vector<float>> forward(std::span<const SequenceChunk> batch, bool all_logits) override {
    return run(batch, all_logits, nullptr);
  }
  std::vector<int32_t> forward_greedy(std::span<const SequenceChunk> batch) override {
    std::vector<int32_t> ids;
    run(batch, false, &ids);
    return ids;
  }
  std::vector<int32_t> forward_sample(std::span<const SequenceChunk> batch, const SamplingParams& params,
                                      std::span<const double> uniforms) override {
    check(uniforms.size() == batch.size(), "forward_sample: ", uniforms.size(), " uniforms for ", batch.size(),
          " chunks");
    std::string why;
    check(cuda::sample_rows_f32_can_implement(static_cast<int>(logit_rows_), static_cast<int>(config_.vocab_size),
                                              params.temperature, params.top_k, params.top_p, &why) == cudaSuccess,
          "forward_sample: ", why);
    for (double u : uniforms) check(u >= 0.0 && u < 1.0, "forward_sample: uniform ", u, " outside [0, 1)");
    if (params.temperature == 0.0f) return forward_greedy(batch);
    if (!sample_ws_.get()) {  // lazily: greedy-only users never pay for it
      sample_ws_.allocate(cuda::sample_rows_f32_workspace_bytes(static_cast<int>(logit_rows_),
                                                                static_cast<int>(config_.vocab_size)),
                          "sampling workspace");
      uniforms_.allocate(static_cast<size_t>(logit_rows_), "sampling draws");
      update_workspace_bytes();
    }
    sample_params_ = &params;
    sample_u_ = uniforms;
    std::vector<int32_t> ids;
    try {
      run(batch, false, &ids);
    } catch (...) {
      sample_params_ = nullptr;
      throw;
    }
    sample_params_ = nullptr;
    for (size_t i = 0; i < ids.size(); ++i)
      check(ids[i] >= 0, "forward_sample: chunk ", i, " has NaN or non-finite logits");
    return ids;
  }
  int64_t sequence_length(int32_t seq_id) const override {
    auto it = seqs_.find(seq_id);
    return it == seqs_.end() ? 0 : it->second.length;
  }
  void reset(int32_t seq_id) override;
  int64_t max_sequence_length() const override { return max_len_; }
  CudaEngineMemory memory() const override { return memory_; }
  StepTiming benchmark_decode_step(std::span<const SequenceChunk> batch, int iters) override;
  void append_synthetic_context(int32_t seq_id, int64_t tokens) override;
  std::string description() const override { return description_; }
  std::vector<OpTime> op_profile() const override;
  const float* forward_logits_on_device(const SequenceChunk& chunk) override;
  void clear_op_profile() override;

 private:
  void upload_weights(const WeightSource& src);
  void allocate_buffers();
  void validate(std::span<const SequenceChunk> batch) const;
  std::vector<std::vector<float>> run(std::span<const SequenceChunk> batch, bool all_logits, std::vector<int32_t>* ids);
  // Enqueues the layers over `rows` rows whose metadata is uploaded; n_new sequences start in this pass.
  // fp8: the FP8 prefill pass (every row belongs to a prompt chunk; docs/design.md "FP8 prefill").
  void enqueue_layers(int64_t rows, int64_t n_new, int64_t max_len, bool fp8 = false);
  // Final norm + LM head (+ argmax) of `rows` rows of `x_rows` (fp32 [rows, hidden]) into logits_ / ids_.
  void enqueue_head(const float* x_rows, int64_t rows);
  void ensure_attention_workspace(int64_t rows, int64_t max_len);
  void update_workspace_bytes();
  // The GEMM context of this engine's projections; dequant: INT4 layer projections may take the dequantise + cuBLAS
  // path (not the LM head, which has no scratch of its size).
  cuda::GemmContext gemm_context(bool dequant);
  bool fast_attention(int64_t rows, int64_t max_len) const;
  void clear_graphs();
  void check_op(cudaError_t e, const char* op, const char* (*last_error)());
  // profile_ops: an event after each op (mark), one at the start of each pass (mark_pass_start); the events are
  // turned into per-op times when the next pass starts or the profile is read.
  void mark(const char* op);
  void mark_pass_start();
  void collect_profile() const;

  ModelConfig config_;
  CudaEngineOptions opt_;
  mutable std::vector<cudaEvent_t> events_;                 // profile_ops: reused event pool
  mutable std::vector<std::pair<const char*, size_t>> marks_;  // (op or nullptr = pass start, event index)
  mutable std::map<std::string, OpTime> profile_;
  DeviceArray<float> device_logits_;       // forward_logits_on_device's output
  float* device_logits_dst_ = nullptr;     // set during forward_logits_on_device: logits stay on the GPU
  int64_t max_len_ = 0, pages_per_seq_ = 0, n_pages_ = 0, logit_rows_ = 0;
  int64_t q_width_ = 0, kv_width_ = 0, qkv_width_ = 0;
  int64_t head_cols_ = 0;  // INT4 head: the W4A16 GEMM's N, the vocabulary rounded up to its tile (row stride)
  int64_t head_group_ = 0;  // INT4 head: its group size
  int hadamard_block_ = 0;
  bool synthetic_ = false;
  bool fused_qkv_ = false;  // qkv_rope_kv_append takes this head shape
  bool attention_prologue_ok_ = false;  // attention_decode_int4_with_prologue takes this model (fast attention)
  bool prefill_attention_ok_ = false;  // attention_prefill takes this model and cache format
  // The pass being enqueued, as attention_prefill sees it: its chunks (0: attend row by row) and longest chunk.
  int pass_chunks_ = 0, pass_max_chunk_rows_ = 0;
  bool pass_decode_only_ = false;  // every row of the pass is its sequence's one new token (then pass_chunks_ is 0)
  bool fp8_prefill_ = false;  // prompt passes run the FP8 GEMMs
  // INT4 layer projections of passes with at least this many rows dequantise into dequant_ws_ and run cuBLAS; 0: never
  // (the option says so, no projection is INT4, or no pass can be that large).
  int64_t dequant_min_rows_ = 0;
  formats::KvPageLayout layout_;
  std::string description_;
  CudaEngineMemory memory_;

  cudaStream_t stream_ = nullptr;
  // CudaEngineOptions::l2_prefetch_*: the side stream of the prefetch branch, its fork and join events, and the
  // stripes (keep of every kL2PrefetchPeriod lines; all 0: no branch).
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t fork_event_ = nullptr, join_event_ = nullptr;
  int l2_prefetch_keep_ = 0, l2_prefetch_down_keep_ = 0, l2_prefetch_o_keep_ = 0;
  cublasHandle_t cublas_ = nullptr;
  DeviceArray<uint8_t> cublas_ws_;

  DeviceArray<uint16_t> embedding_;  // BF16 [vocab, hidden]
  std::vector<DeviceLayer> layers_;
  DeviceArray<float> final_norm_;
  DeviceLinear lm_head_;
  DeviceArray<float> inv_freq_;

  DeviceArray<uint8_t> kv_pool_;      // [layers][n_pages][n_kv_heads][page_bytes]
  DeviceArray<uint16_t> anchors_;     // [layers][max_sequences][n_kv_heads][head_dim] fp16 (int4-hadamard)
  DeviceArray<float> x_, x_gather_, logits_;
  DeviceArray<uint16_t> logits_bf16_;  // INT4 head: the W4A16 GEMM's BF16 logits [logit_rows_, head_cols_]
  DeviceArray<uint16_t> xn_, qkv_, q_, att_, delta_, gate_up_, act_;
  DeviceArray<uint8_t> fp8_codes_;  // FP8 prefill: per-token E4M3 GEMM input [rows, max K]
  DeviceArray<float> fp8_scales_;   // and its scales [rows]
  DeviceArray<float> fp8_block_scales_;  // fp8_block_swiglu: the down GEMM input's scales [rows, inter / 128]
  DeviceArray<float> rope_table_;        // fused FP8 qkv epilogue: the pass's RoPE (cos, sin) [rows, head_dim / 2, 2]
  // fused_norm_partials: the residual stream's RMSNorm partials [kW4A16NormMaxM, gemm_w4a16_norm_partials_per_row]
  // from the last residual GEMM, for the norm-prologue GEMM after it.
  DeviceArray<float> norm_partials_;
  DeviceArray<uint32_t> qkv_tail_counters_;  // one per qkv head item, zero between launches (fused_qkv_tail)
  bool fp8_qkv_epilogue_ = false;        // FP8 passes run gemm_fp8_qkv (fused_fp8_qkv and the model / cache fit it)
  bool fp8_rope_ = false;                // FP8 passes with a separate RoPE run it in the qkv GEMM (fused_fp8_rope)
  DeviceArray<int32_t> meta_, ids_;
  int32_t* meta_host_ = nullptr;      // pinned mirror of meta_
  DeviceArray<uint8_t> gemm_ws_, attn_ws_;
  DeviceArray<uint8_t> dequant_ws_;  // BF16 copy of the largest INT4 projection (dequant_min_rows_ > 0)
  DeviceArray<double> uniforms_;       // forward_sample: one draw per head row
  DeviceArray<uint8_t> sample_ws_;     // forward_sample: sort workspace (allocated on first use)
  const SamplingParams* sample_params_ = nullptr;  // set only during forward_sample
  std::span<const double> sample_u_;

  std::map<int32_t, SeqState> seqs_;
  std::vector<int32_t> free_pages_, free_slots_;

  // Decode-step graphs by (rows, context bucket); a key is captured the second time it is seen, so the first
  // run warms up the launchers' per-shape caches outside a capture.
  std::map<std::pair<int64_t, int64_t>, cudaGraphExec_t> graphs_;
  std::set<std::pair<int64_t, int64_t>> seen_;
  cudaGraphExec_t last_graph_ = nullptr;  // the graph the last decode pass replayed
};

__nv_bfloat16* bf(DeviceArray<uint16_t>& a) { return reinterpret_cast<__nv_bfloat16*>(a.get()); }
const __nv_bfloat16* bf(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

CudaEngineImpl::CudaEngineImpl(const ModelConfig& config, const WeightSource& src, const CudaEngineOptions& options)
    : config_(config), opt_(options) {
  const ModelConfig& c = config_;
  if (opt_.profile_ops) opt_.cuda_graphs = false;  // per-op events need plain launches
  check(opt_.max_sequence_length >= 0, "CUDA engine: max_sequence_length must be >= 0, got ",
        opt_.max_sequence_length);
  max_len_ = opt_.max_sequence_length > 0 ? opt_.max_sequence_length
                                          : std::min<int64_t>(c.max_position_embeddings, kDefaultMaxSequence);
  check(max_len_ <= c.max_position_embeddings, "CUDA engine: max_sequence_length ", max_len_,
        " exceeds the model's max_position_embeddings ", c.max_position_embeddings);
  check(opt_.max_sequences >= 1 && opt_.max_sequences <= 4096, "CUDA engine: max_sequences must be in [1, 4096], got ",
        opt_.max_sequences);
  check(opt_.max_batch_tokens >= 1 && opt_.max_batch_tokens <= 16384,
        "CUDA engine: max_batch_tokens must be in [1, 16384], got ", opt_.max_batch_tokens);
  check(opt_.kv != formats::KvFormat::FP8, "CUDA engine: the GPU attention kernels do not read an fp8 KV cache; ",
        "use kv-bf16, kv-int4 or kv-int4-hadamard");
  check(opt_.int4_dequant_min_rows >= -1, "CUDA engine: int4_dequant_min_rows must be -1 (default), 0 (never) or a ",
        "row count, got ", opt_.int4_dequant_min_rows);
  dequant_min_rows_ = cuda::int4_dequant_min_rows_from_env(opt_.int4_dequant_min_rows, cuda::print_heuristics());
  pages_per_seq_ = (max_len_ + kPageTokens - 1) / kPageTokens;
  // By default every sequence can reach max_sequence_length at once: whole pages per sequence (a pool of
  // max_sequences · max_len tokens would be short when max_len is not a multiple of the page).
  const int64_t cache_tokens =
      opt_.kv_cache_tokens > 0 ? opt_.kv_cache_tokens : opt_.max_sequences * pages_per_seq_ * kPageTokens;
  n_pages_ = std::max<int64_t>((cache_tokens + kPageTokens - 1) / kPageTokens, 1);
  check(n_pages_ < (int64_t{1} << 31) / std::max<int64_t>(c.num_key_value_heads, 1),
        "CUDA engine: kv_cache_tokens ", cache_tokens, " is too large");
  logit_rows_ = std::max<int64_t>(opt_.max_sequences, 16);
  q_width_ = c.num_attention_heads * c.head_dim;
  kv_width_ = c.num_key_value_heads * c.head_dim;
  qkv_width_ = q_width_ + 2 * kv_width_;
  try {
    layout_ = formats::kv_page_layout(opt_.kv, c.head_dim);
  } catch (const Error& e) {
    fail("CUDA engine: KV-cache format ", formats::kv_format_name(opt_.kv), " cannot hold this model's heads: ",
         e.what());
  }
  hadamard_block_ = static_cast<int>(formats::kv_hadamard_block(opt_.kv, c.head_dim));
  fused_qkv_ = cuda::qkv_rope_kv_append_can_implement(opt_.kv, static_cast<int>(opt_.max_batch_tokens),
                                                      static_cast<int>(c.num_attention_heads),
                                                      static_cast<int>(c.num_key_value_heads),
                                                      static_cast<int>(c.head_dim), hadamard_block_,
                                                      nullptr) == cudaSuccess;

  // Attention must run for every pass shape: the fast kernel, or the generic one, must accept the model.
  std::string why_fast, why_generic;
  const bool fast_ok = !opt_.generic_attention && cuda::attention_decode_can_implement(opt_.kv, 1, static_cast<int>(c.num_attention_heads),
                                                            static_cast<int>(c.num_key_value_heads),
                                                            static_cast<int>(c.head_dim),
                                                            static_cast<int>(pages_per_seq_),
                                                            static_cast<int>(max_len_), &why_fast) == cudaSuccess;
  const bool generic_ok = cuda::attention_generic_can_implement(
                              opt_.kv, static_cast<int>(std::max(opt_.max_batch_tokens, opt_.max_sequences)),
                              static_cast<int>(c.num_attention_heads), static_cast<int>(c.num_key_value_heads),
                              static_cast<int>(c.head_dim), static_cast<int>(pages_per_seq_), &why_generic) ==
                          cudaSuccess;
  check(fast_ok || generic_ok, "CUDA engine: no attention kernel runs this model: ", why_fast, "; ", why_generic);
  // The decode attention's own prologue: INT4 caches at head_dim 128 (the quad path's shape).
  attention_prologue_ok_ = fast_ok && fused_qkv_ &&
                           (opt_.kv == formats::KvFormat::INT4 || opt_.kv == formats::KvFormat::INT4_HADAMARD) &&
                           c.head_dim == 128;
  prefill_attention_ok_ =
      opt_.prefill_attention && !opt_.generic_attention &&
      cuda::attention_prefill_can_implement(opt_.kv, static_cast<int>(opt_.max_batch_tokens),
                                            static_cast<int>(opt_.max_sequences),
                                            static_cast<int>(c.num_attention_heads),
                                            static_cast<int>(c.num_key_value_heads), static_cast<int>(c.head_dim),
                                            static_cast<int>(pages_per_seq_), static_cast<int>(opt_.max_batch_tokens),
                                            nullptr) == cudaSuccess;

  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "create stream");
  check(opt_.l2_prefetch_gate_up >= 0.0 && opt_.l2_prefetch_gate_up <= 1.0,
        "CUDA engine: l2_prefetch_gate_up must be a fraction in [0, 1], got " + std::to_string(opt_.l2_prefetch_gate_up));
  check(opt_.l2_prefetch_down >= 0.0 && opt_.l2_prefetch_down <= 1.0,
        "CUDA engine: l2_prefetch_down must be a fraction in [0, 1], got " + std::to_string(opt_.l2_prefetch_down));
  check(opt_.l2_prefetch_ctas >= 0 && opt_.l2_prefetch_ctas <= cuda::kL2PrefetchMaxBlocks,
        "CUDA engine: l2_prefetch_ctas must be in [0, ", cuda::kL2PrefetchMaxBlocks, "], got ", opt_.l2_prefetch_ctas);
  check(opt_.l2_prefetch_threads >= 0 && opt_.l2_prefetch_threads <= cuda::kL2PrefetchMaxThreads &&
            opt_.l2_prefetch_threads % 32 == 0,
        "CUDA engine: l2_prefetch_threads must be 0 or a multiple of 32 up to ", cuda::kL2PrefetchMaxThreads, ", got ",
        opt_.l2_prefetch_threads);
  check(opt_.l2_prefetch_max_rows >= 0, "CUDA engine: l2_prefetch_max_rows must be >= 0, got ",
        opt_.l2_prefetch_max_rows);
  check(opt_.fused_residual_norm_max_rows >= 0,
        "CUDA engine: fused_residual_norm_max_rows must be >= 0, got ", opt_.fused_residual_norm_max_rows);
  check(opt_.fused_qkv_tail_min_rows >= 1 && opt_.fused_qkv_tail_min_rows <= opt_.fused_qkv_tail_max_rows,
        "CUDA engine: fused_qkv_tail_min_rows..fused_qkv_tail_max_rows must be a range of rows >= 1, got ",
        opt_.fused_qkv_tail_min_rows, "..", opt_.fused_qkv_tail_max_rows);
  check(opt_.l2_prefetch_o >= 0.0 && opt_.l2_prefetch_o <= 1.0,
        "CUDA engine: l2_prefetch_o must be a fraction in [0, 1], got " + std::to_string(opt_.l2_prefetch_o));
  l2_prefetch_keep_ = static_cast<int>(std::lround(opt_.l2_prefetch_gate_up * kL2PrefetchPeriod));
  l2_prefetch_down_keep_ = static_cast<int>(std::lround(opt_.l2_prefetch_down * kL2PrefetchPeriod));
  l2_prefetch_o_keep_ = static_cast<int>(std::lround(opt_.l2_prefetch_o * kL2PrefetchPeriod));
  if (l2_prefetch_keep_ > 0 || l2_prefetch_down_keep_ > 0 || l2_prefetch_o_keep_ > 0) {
    cuda_check(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking), "create side stream");
    cuda_check(cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming), "fork event");
    cuda_check(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming), "join event");
  }
  check(cublasCreate(&cublas_) == CUBLAS_STATUS_SUCCESS, "CUDA engine: cublasCreate failed");
  cublas_ws_.allocate(kCublasWorkspaceBytes, "cuBLAS workspace");
  check(cublasSetStream(cublas_, stream_) == CUBLAS_STATUS_SUCCESS &&
            cublasSetWorkspace(cublas_, cublas_ws_.get(), cublas_ws_.bytes()) == CUBLAS_STATUS_SUCCESS,
        "CUDA engine: cuBLAS setup failed");

  synthetic_ = src.model == nullptr;
  fp8_prefill_ = src.fp8 != nullptr || src.synthetic_fp8;
  if (fp8_prefill_) check_fp8_prefill_shapes(c);
  check(!fp8_prefill_ || !opt_.fp8_block_swiglu || c.intermediate_size % cuda::kFp8SwigluChannelMultiple == 0,
        "CUDA engine: fp8_block_swiglu quantises the SwiGLU output per 128 channels, so the intermediate size must be a ",
        "multiple of ", cuda::kFp8SwigluChannelMultiple, "; this model's is ", c.intermediate_size);
  // The qkv GEMM's epilogue takes the attention prologue for INT4 caches at head_dim 128 (a tile per head).
  fp8_qkv_epilogue_ =
      fp8_prefill_ && opt_.fused_fp8_qkv &&
      cuda::gemm_fp8_qkv_can_implement(opt_.kv, 1, static_cast<int>(c.num_attention_heads),
                                       static_cast<int>(c.num_key_value_heads), static_cast<int>(c.head_dim),
                                       static_cast<int>(c.hidden_size), hadamard_block_, nullptr) == cudaSuccess;
  // RoPE in the FP8 qkv GEMM's epilogue (gemm_fp8_rope): one head per 128-column tile.
  fp8_rope_ = fp8_prefill_ && opt_.fused_fp8_rope && !fp8_qkv_epilogue_ && c.head_dim == 128;
  upload_weights(src);
  allocate_buffers();
  // A synthetic model's cache is never read before it is written except through append_synthetic_context: fill it
  // with small finite values (0x11 bytes: int4 codes 1, fp16/bf16 scales and values near 1e-3 / 1e-28).
  if (synthetic_) cuda_check(cudaMemsetAsync(kv_pool_.get(), 0x11, kv_pool_.bytes(), stream_), "cache fill");
  for (int64_t p = n_pages_ - 1; p >= 0; --p) free_pages_.push_back(static_cast<int32_t>(p));
  for (int64_t s = opt_.max_sequences - 1; s >= 0; --s) free_slots_.push_back(static_cast<int32_t>(s));

  std::ostringstream d;
  d << src.recipe_name << " | projections "
    << (layers_.empty() ? "-" : (layers_[0].qkv.kind() == DeviceLinear::Kind::Int4 ? "W4A16 INT4" : "BF16 cuBLAS"))
    << " | KV " << formats::kv_format_name(opt_.kv) << " (" << (fast_ok ? "fast" : "generic") << " attention"
    << (fast_ok && hadamard_block_ > 1 && opt_.fused_epilogues && opt_.fused_attention_unrotation
            ? ", output un-rotated by the attention"
            : "")
    << ") | CUDA graphs " << (opt_.cuda_graphs ? "on" : "off");
  if (!layers_.empty() && layers_[0].o.kind() == DeviceLinear::Kind::Int4) {
    d << " | GEMM epilogues "
      << (opt_.fused_epilogues
              ? (opt_.fused_attention_prologue && attention_prologue_ok_
                     ? (opt_.attention_prologue_unsplit ? "fused (residual, SwiGLU, decode steps' qkv prologue in decode attention)"
                                                        : "fused (residual, SwiGLU, decode steps' qkv prologue in decode attention when K is split)")
                     : "fused (residual, SwiGLU, qkv prologue when K is split)")
              : "separate kernels");
    const bool int4_cache = opt_.kv == formats::KvFormat::INT4 || opt_.kv == formats::KvFormat::INT4_HADAMARD;
    if (opt_.fused_epilogues && opt_.fused_qkv_prologue && opt_.fused_qkv_tail && int4_cache && c.head_dim == 128)
      d << " | qkv prologue in the GEMM's tail at " << opt_.fused_qkv_tail_min_rows << ".."
        << opt_.fused_qkv_tail_max_rows << " rows when K is not split";
    if (opt_.fused_epilogues && (opt_.fused_norm_prologue || opt_.fused_norm_partials))
      d << " | RMSNorm in the qkv / gate|up GEMMs at <= 8 rows"
        << (opt_.fused_norm_partials ? " (row sums from the residual GEMMs)" : "");
    if (dequant_min_rows_ > 0)
      d << " | INT4 passes of >= " << dequant_min_rows_ << " rows: dequantise to BF16 + cuBLAS";
    else
      d << " | INT4 W4A16 GEMM at every pass size";
  }
  if (fp8_prefill_) {
    d << " | FP8 prefill (" << src.prefill_recipe_name << ", FP8 E4M3 GEMMs for prompt chunks"
      << (opt_.fp8_block_swiglu ? (opt_.fused_epilogues ? "; SwiGLU to FP8 per 128 channels in the gate|up GEMM"
                                                        : "; SwiGLU to FP8 per 128 channels")
                                : "")
      << (fp8_qkv_epilogue_ ? "; RoPE, q rotation and INT4 cache placement in the qkv GEMM's epilogue" : "")
      << (fp8_rope_ ? "; RoPE in the qkv GEMM's epilogue where it runs alone" : "") << ")";
  }
  if (lm_head_.kind() == DeviceLinear::Kind::Int4) d << " | LM head W4A16 INT4 g" << head_group_;
  description_ = d.str();
}

CudaEngineImpl::~CudaEngineImpl() {
  if (stream_) cudaStreamSynchronize(stream_);
  clear_graphs();
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (meta_host_) cudaFreeHost(meta_host_);
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
  if (side_stream_) cudaStreamDestroy(side_stream_);
  if (fork_event_) cudaEventDestroy(fork_event_);
  if (join_event_) cudaEventDestroy(join_event_);
}

void CudaEngineImpl::clear_graphs() {
  for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
  seen_.clear();
  last_graph_ = nullptr;
}

void CudaEngineImpl::upload_weights(const WeightSource& src) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, inter = c.intermediate_size, vocab = c.vocab_size;
  int64_t bytes = 0;
  auto norm = [&](const std::string& name) {
    DeviceArray<float> a;
    if (src.model) {
      a.upload(src.model->get(name).to_f32(), name);
    } else {
      a.allocate(static_cast<size_t>(h), name);
      cuda_check(cuda::fill_f32(a.get(), a.size(), 1.0f, stream_), name);
    }
    bytes += static_cast<int64_t>(a.bytes());
    return a;
  };
  auto bf16_weight = [&](const std::string& name) { return to_bf16_bits(src.model->get(name).to_f32()); };
  // Fused projections: rows of the parts one after another (q|k|v, gate|up), one GEMM per group.
  // n x k: the fused group's shape from the config (what synthetic weights get; loaded ones are checked against it).
  // rows: the packing of INT4 weights (gate|up is interleaved for the fused SwiGLU epilogue).
  auto fused = [&](int64_t li, std::initializer_list<const char*> parts, const std::string& label, int64_t n,
                   int64_t k, formats::Int4MmaRows rows = formats::Int4MmaRows::canonical) {
    const std::string p = "model.layers." + std::to_string(li) + ".";
    std::vector<std::string> names;
    for (const char* s : parts) names.push_back(p + s);
    if (!src.model) {
      const uint64_t seed = src.seed * 1000003 + static_cast<uint64_t>(li) * 16 + label.size();
      return src.synthetic_group > 0 ? DeviceLinear::synthetic_int4(n, k, src.synthetic_group, seed, p + label,
                                                                    formats::ScaleType::F16, rows)
                                     : DeviceLinear::synthetic_bf16(n, k, seed, p + label);
    }
    if (src.int4 && src.int4->count(names[0])) {
      std::vector<const formats::Int4Weight*> ws;
      for (const std::string& nm : names) {
        auto it = src.int4->find(nm);
        check(it != src.int4->end(), nm, ": missing from the quantised model's INT4 weights");
        ws.push_back(&it->second);
      }
      return DeviceLinear::from_int4(ws, p + label, rows);
    }
    std::vector<uint16_t> w;
    for (const std::string& nm : names) {
      const Tensor& t = src.model->get(nm);
      check(t.shape.size() == 2 && t.shape[1] == k, nm, ": expected a 2-D weight of ", k, " columns, got ",
            t.shape_str());
      const std::vector<uint16_t> part = bf16_weight(nm);
      w.insert(w.end(), part.begin(), part.end());
    }
    return DeviceLinear::from_bf16(w, n, k, p + label);
  };

  if (src.model) {
    embedding_.upload(bf16_weight("model.embed_tokens.weight"), "model.embed_tokens.weight");
  } else {
    embedding_.allocate(static_cast<size_t>(vocab * h), "embedding");
    cuda_check(cuda::fill_random_half_bits(embedding_.get(), embedding_.size(), -1.0f, 1.0f, true, src.seed, stream_),
               "synthetic embedding");
  }
  bytes += static_cast<int64_t>(embedding_.bytes());
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const std::string p = "model.layers." + std::to_string(li) + ".";
    DeviceLayer l;
    l.attn_norm = norm(p + "input_layernorm.weight");
    l.mlp_norm = norm(p + "post_attention_layernorm.weight");
    l.qkv = fused(li, {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}, "qkv",
                  qkv_width_, h);
    l.o = fused(li, {"self_attn.o_proj.weight"}, "o_proj", h, q_width_);
    l.gate_up = fused(li, {"mlp.gate_proj.weight", "mlp.up_proj.weight"}, "gate_up", 2 * inter, h,
                      opt_.fused_epilogues ? formats::Int4MmaRows::swiglu_interleaved : formats::Int4MmaRows::canonical);
    l.down = fused(li, {"mlp.down_proj.weight"}, "down_proj", h, inter);
    check(l.qkv.out_features() == qkv_width_ && l.qkv.in_features() == h && l.o.out_features() == h &&
              l.o.in_features() == q_width_ && l.gate_up.out_features() == 2 * inter &&
              l.gate_up.in_features() == h && l.down.out_features() == h && l.down.in_features() == inter,
          "CUDA engine: layer ", li, ": projection shapes do not match the config");
    bytes += l.qkv.device_bytes() + l.o.device_bytes() + l.gate_up.device_bytes() + l.down.device_bytes();
    if (fp8_prefill_) {
      // Same fusion as the decode copy: one FP8 GEMM per group.
      auto fused8 = [&](std::initializer_list<const char*> parts, const std::string& label, int64_t n, int64_t k,
                        bool swiglu_pack = false) {
        if (!src.fp8) {
          const uint64_t seed = src.seed * 2000003 + static_cast<uint64_t>(li) * 16 + label.size();
          return DeviceLinear::synthetic_fp8(n, k, seed, p + label + " (FP8)", swiglu_pack);
        }
        std::vector<const formats::Fp8Matrix*> ws;
        for (const char* part : parts) {
          auto it = src.fp8->find(p + part);
          check(it != src.fp8->end(), p + part, ": missing from the prefill model's FP8 weights");
          ws.push_back(&it->second);
        }
        return DeviceLinear::from_fp8(ws, p + label + " (FP8)", swiglu_pack);
      };
      l.qkv8 = fused8({"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}, "qkv",
                      qkv_width_, h);
      l.o8 = fused8({"self_attn.o_proj.weight"}, "o_proj", h, q_width_);
      // The SwiGLU → FP8-blocks epilogue reads its weight packed (gemm_fp8_swiglu.h).
      l.gate_up8 = fused8({"mlp.gate_proj.weight", "mlp.up_proj.weight"}, "gate_up", 2 * inter, h,
                          opt_.fp8_block_swiglu && opt_.fused_epilogues);
      l.down8 = fused8({"mlp.down_proj.weight"}, "down_proj", h, inter);
      check(l.qkv8.out_features() == qkv_width_ && l.qkv8.in_features() == h && l.o8.out_features() == h &&
                l.o8.in_features() == q_width_ && l.gate_up8.out_features() == 2 * inter &&
                l.gate_up8.in_features() == h && l.down8.out_features() == h && l.down8.in_features() == inter,
            "CUDA engine: layer ", li, ": FP8 prefill projection shapes do not match the config");
      bytes += l.qkv8.device_bytes() + l.o8.device_bytes() + l.gate_up8.device_bytes() + l.down8.device_bytes();
    }
    layers_.push_back(std::move(l));
  }
  final_norm_ = norm("model.norm.weight");
  // head-int4 (docs/design.md "INT4 LM head"): the head's own INT4 copy runs the W4A16 GEMM, its rows padded with
  // zeros to the GEMM's N tile (vocabularies like 32001); enqueue_head widens the BF16 logits it writes to fp32.
  const bool int4_head = src.model ? src.int4 && src.int4->count(kLmHeadTensor) : opt_.synthetic_int4_head;
  if (int4_head) {
    head_cols_ = (vocab + cuda::kW4A16TileN - 1) / cuda::kW4A16TileN * cuda::kW4A16TileN;
    if (src.model) {
      const formats::Int4Weight& w = src.int4->at(kLmHeadTensor);
      check(w.rows == vocab && w.cols == h, "CUDA engine: the INT4 LM head is ", w.rows, " x ", w.cols,
            ", expected vocab x hidden = ", vocab, " x ", h);
      head_group_ = w.group;
      formats::Int4Weight padded;  // only when the vocabulary is not a whole number of tiles (no 0.5 GB copy)
      const formats::Int4Weight* parts[] = {&w};
      if (w.rows != head_cols_) {
        padded = formats::int4_pad_rows(w, head_cols_);
        parts[0] = &padded;
      }
      lm_head_ = DeviceLinear::from_int4(parts, "lm_head (INT4)");
    } else {
      head_group_ = head_int4_spec(h, "synthetic LM head").group_size;
      lm_head_ = DeviceLinear::synthetic_int4(head_cols_, h, head_group_, src.seed * 3000017, "lm_head (INT4)",
                                              formats::ScaleType::BF16);
    }
    bytes += lm_head_.device_bytes();
  } else if (c.tie_word_embeddings || !src.model) {
    lm_head_ = DeviceLinear::borrow_bf16(embedding_.get(), vocab, h, "lm_head (tied)");
  } else {
    lm_head_ = DeviceLinear::from_bf16(bf16_weight("lm_head.weight"), vocab, h, "lm_head.weight");
    bytes += lm_head_.device_bytes();
  }
  inv_freq_.upload(ref::rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling), "RoPE frequencies");
  memory_.weights = bytes;
  cuda_check(cudaStreamSynchronize(stream_), "weight upload");
}

void CudaEngineImpl::allocate_buffers() {
  const ModelConfig& c = config_;
  const int64_t R = opt_.max_batch_tokens, S = opt_.max_sequences, L = c.num_hidden_layers;
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const size_t pool_bytes = static_cast<size_t>(L * n_pages_ * c.num_key_value_heads * layout_.page_bytes);
  kv_pool_.allocate(pool_bytes, "KV-cache page pool");
  if (opt_.kv == formats::KvFormat::INT4_HADAMARD)
    anchors_.allocate(static_cast<size_t>(L * S * kv_width_), "KV key anchors");
  if (anchors_.get()) cuda_check(cudaMemset(anchors_.get(), 0, anchors_.bytes()), "KV key anchors");
  memory_.kv_cache = static_cast<int64_t>(kv_pool_.bytes() + anchors_.bytes());

  x_.allocate(static_cast<size_t>(R * h), "residual stream");
  x_gather_.allocate(static_cast<size_t>(logit_rows_ * h), "LM-head rows");
  logits_.allocate(static_cast<size_t>(logit_rows_ * c.vocab_size), "logits");
  xn_.allocate(static_cast<size_t>(std::max(R, logit_rows_) * h), "normalised rows");
  qkv_.allocate(static_cast<size_t>(R * qkv_width_), "q|k|v");
  q_.allocate(static_cast<size_t>(R * q_width_), "queries");
  att_.allocate(static_cast<size_t>(R * q_width_), "attention output");
  delta_.allocate(static_cast<size_t>(R * h), "projection output");
  gate_up_.allocate(static_cast<size_t>(R * 2 * inter), "gate|up");
  act_.allocate(static_cast<size_t>(R * inter), "SwiGLU output");
  ids_.allocate(static_cast<size_t>(logit_rows_), "greedy ids");
  if (lm_head_.kind() == DeviceLinear::Kind::Int4)
    logits_bf16_.allocate(static_cast<size_t>(logit_rows_ * head_cols_), "INT4 LM head's BF16 logits");
  if (fp8_prefill_) {
    fp8_codes_.allocate(static_cast<size_t>(R * std::max({h, q_width_, inter})), "FP8 GEMM input codes");
    fp8_scales_.allocate(static_cast<size_t>(R), "FP8 GEMM input scales");
    if (fp8_qkv_epilogue_ || fp8_rope_) rope_table_.allocate(static_cast<size_t>(R * c.head_dim), "RoPE table of a pass");
    if (opt_.fp8_block_swiglu) {
      fp8_block_scales_.allocate(static_cast<size_t>(R * inter / cuda::kFp8SwigluChannelMultiple),
                                 "FP8 down GEMM input block scales");
    }
  }
  if (opt_.fused_norm_partials)
    norm_partials_.allocate(static_cast<size_t>(std::min<int64_t>(R, cuda::kW4A16NormMaxM) *
                                                cuda::gemm_w4a16_norm_partials_per_row(static_cast<int>(h))),
                            "RMSNorm partials");
  if (opt_.fused_qkv_tail) {
    const size_t items = static_cast<size_t>(c.num_attention_heads + 2 * c.num_key_value_heads);
    qkv_tail_counters_.allocate(items, "qkv prologue head counters");
    cuda_check(cudaMemset(qkv_tail_counters_.get(), 0, qkv_tail_counters_.bytes()), "qkv prologue head counters");
  }
  const MetaLayout ml(R, S, pages_per_seq_);
  meta_.allocate(static_cast<size_t>(ml.total), "pass metadata");
  cuda_check(cudaMallocHost(reinterpret_cast<void**>(&meta_host_), static_cast<size_t>(ml.total) * sizeof(int32_t)),
             "pinned metadata");
  memory_.activations = static_cast<int64_t>(x_.bytes() + x_gather_.bytes() + logits_.bytes() + xn_.bytes() +
                                             qkv_.bytes() + q_.bytes() + att_.bytes() + delta_.bytes() +
                                             gate_up_.bytes() + act_.bytes() + ids_.bytes() + meta_.bytes() +
                                             fp8_codes_.bytes() + fp8_scales_.bytes() + fp8_block_scales_.bytes() + rope_table_.bytes() +
                                             logits_bf16_.bytes() + norm_partials_.bytes());

  size_t gemm_ws = 0;
  for (const DeviceLayer& l : layers_) {
    for (const DeviceLinear* lin : {&l.qkv, &l.o, &l.gate_up, &l.down}) gemm_ws = std::max(gemm_ws, lin->workspace_bytes(R));
  }
  gemm_ws = std::max(gemm_ws, lm_head_.workspace_bytes(logit_rows_));  // 0 unless the head is INT4
  gemm_ws_.allocate(gemm_ws, "W4A16 split-K workspace");
  // Passes of at least dequant_min_rows_ rows dequantise each INT4 projection in turn into one BF16 buffer, sized for
  // the largest (8B: gate|up, 28672 x 4096, 235 MB; 70B: 940 MB). Only when an INT4 pass can be that large: with FP8
  // prefill those are decode steps, one row per sequence.
  const int64_t int4_pass_rows = fp8_prefill_ ? std::min(R, S) : R;
  size_t dequant = 0;
  if (dequant_min_rows_ > 0 && int4_pass_rows >= dequant_min_rows_)
    for (const DeviceLayer& l : layers_)
      for (const DeviceLinear* lin : {&l.qkv, &l.o, &l.gate_up, &l.down})
        dequant = std::max(dequant, lin->dequant_scratch_bytes());
  if (dequant > 0)
    dequant_ws_.allocate(dequant, "INT4 -> BF16 dequantisation scratch");
  else
    dequant_min_rows_ = 0;
  memory_.int4_dequant_scratch = static_cast<int64_t>(dequant_ws_.bytes());
  update_workspace_bytes();
  ensure_attention_workspace(std::max(R, S), max_len_);
  ensure_attention_workspace(S, max_len_);
}

bool CudaEngineImpl::fast_attention(int64_t rows, int64_t max_len) const {
  const ModelConfig& c = config_;
  return !opt_.generic_attention &&
         cuda::attention_decode_can_implement(opt_.kv, static_cast<int>(rows), static_cast<int>(c.num_attention_heads),
                                              static_cast<int>(c.num_key_value_heads), static_cast<int>(c.head_dim),
                                              static_cast<int>(pages_per_seq_), static_cast<int>(max_len),
                                              nullptr) == cudaSuccess;
}

void CudaEngineImpl::ensure_attention_workspace(int64_t rows, int64_t max_len) {
  if (!fast_attention(rows, max_len)) return;
  const ModelConfig& c = config_;
  const size_t need = cuda::attention_decode_workspace_bytes(
      opt_.kv, static_cast<int>(rows), static_cast<int>(c.num_attention_heads), static_cast<int>(c.num_key_value_heads),
      static_cast<int>(c.head_dim), static_cast<int>(pages_per_seq_), static_cast<int>(max_len));
  if (need <= attn_ws_.bytes()) return;
  // Graphs captured so far point at the old buffer.
  cuda_check(cudaStreamSynchronize(stream_), "attention workspace");
  clear_graphs();
  attn_ws_.allocate(need, "attention split workspace");
  update_workspace_bytes();
}

void CudaEngineImpl::update_workspace_bytes() {
  memory_.workspace = static_cast<int64_t>(gemm_ws_.bytes() + attn_ws_.bytes() + cublas_ws_.bytes() +
                                           dequant_ws_.bytes() + sample_ws_.bytes() + uniforms_.bytes());
}

cuda::GemmContext CudaEngineImpl::gemm_context(bool dequant) {
  cuda::GemmContext g;
  g.cublas = cublas_;
  g.workspace = gemm_ws_.get();
  g.workspace_bytes = gemm_ws_.bytes();
  g.stream = stream_;
  if (dequant && dequant_min_rows_ > 0) {
    g.int4_dequant_min_rows = dequant_min_rows_;
    g.dequant_scratch = dequant_ws_.get();
    g.dequant_scratch_bytes = dequant_ws_.bytes();
  }
  return g;
}

void CudaEngineImpl::check_op(cudaError_t e, const char* op, const char* (*last_error)()) {
  if (e == cudaSuccess) {
    mark(op);
    return;
  }
  fail("CUDA engine: ", op, ": ", e == cudaErrorInvalidValue && last_error ? last_error() : cudaGetErrorString(e));
}

void CudaEngineImpl::mark(const char* op) {
  if (!opt_.profile_ops || marks_.empty()) return;  // only inside a pass that mark_pass_start opened
  const size_t i = marks_.size();
  if (i == events_.size()) {
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreate(&e), "profile event");
    events_.push_back(e);
  }
  cuda_check(cudaEventRecord(events_[i], stream_), "profile event");
  marks_.emplace_back(op, i);
}

void CudaEngineImpl::mark_pass_start() {
  if (!opt_.profile_ops) return;
  collect_profile();
  if (events_.empty()) {
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreate(&e), "profile event");
    events_.push_back(e);
  }
  cuda_check(cudaEventRecord(events_[0], stream_), "profile event");
  marks_.emplace_back(nullptr, 0);
}

void CudaEngineImpl::collect_profile() const {
  if (marks_.empty()) return;
  cuda_check(cudaStreamSynchronize(stream_), "profile");
  for (size_t k = 1; k < marks_.size(); ++k) {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, events_[marks_[k - 1].second], events_[marks_[k].second]), "profile");
    OpTime& t = profile_[marks_[k].first];
    t.op = marks_[k].first;
    ++t.calls;
    t.total_us += 1000.0 * ms;
  }
  marks_.clear();
}

const float* CudaEngineImpl::forward_logits_on_device(const SequenceChunk& chunk) {
  const size_t need = chunk.tokens.size() * static_cast<size_t>(config_.vocab_size);
  if (device_logits_.size() < need) device_logits_.allocate(need, "logits kept on the GPU");
  device_logits_dst_ = device_logits_.get();
  try {
    run(std::span(&chunk, 1), true, nullptr);
  } catch (...) {
    device_logits_dst_ = nullptr;
    throw;
  }
  device_logits_dst_ = nullptr;
  return device_logits_.get();
}

std::vector<CudaEngine::OpTime> CudaEngineImpl::op_profile() const {
  collect_profile();
  std::vector<OpTime> out;
  for (const auto& [name, t] : profile_) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.total_us > b.total_us; });
  return out;
}

void CudaEngineImpl::clear_op_profile() {
  collect_profile();
  profile_.clear();
}

void CudaEngineImpl::reset(int32_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  for (int32_t p : it->second.pages) free_pages_.push_back(p);
  free_slots_.push_back(it->second.slot);
  seqs_.erase(it);
}

void CudaEngineImpl::validate(std::span<const SequenceChunk> batch) const {
  check_batch(*this, batch, "CUDA engine");
  // Then room for the batch: free sequence slots and pages.
  int64_t new_seqs = 0, new_pages = 0;
  for (const SequenceChunk& c : batch) {
    const int64_t cached = sequence_length(c.seq_id);
    const int64_t added = static_cast<int64_t>(c.tokens.size());
    auto it = seqs_.find(c.seq_id);
    const int64_t have = it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.pages.size());
    if (it == seqs_.end()) ++new_seqs;
    new_pages += (cached + added + kPageTokens - 1) / kPageTokens - have;
  }
  check(new_seqs <= static_cast<int64_t>(free_slots_.size()), "CUDA engine: ", new_seqs, " new sequences but only ",
        free_slots_.size(), " of max_sequences ", opt_.max_sequences, " are free; reset finished sequences");
  check(new_pages <= static_cast<int64_t>(free_pages_.size()), "CUDA engine: KV cache full: the batch needs ",
        new_pages, " more pages of ", kPageTokens, " tokens, ", free_pages_.size(),
        " are free; raise kv_cache_tokens or reset finished sequences");
}

void CudaEngineImpl::enqueue_layers(int64_t rows, int64_t n_new, int64_t max_len, bool fp8) {
  const ModelConfig& c = config_;
  const MetaLayout ml(rows, opt_.max_sequences, pages_per_seq_);
  const int32_t* m = meta_.get();
  const int nh = static_cast<int>(c.num_attention_heads), nkv = static_cast<int>(c.num_key_value_heads);
  const int hd = static_cast<int>(c.head_dim), hh = static_cast<int>(c.hidden_size);
  bool side_pending = false;  // a prefetch branch was forked and is not joined yet
  const int inter = static_cast<int>(c.intermediate_size), r = static_cast<int>(rows);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const cuda::GemmContext g = gemm_context(true);
  const bool fast = fast_attention(rows, max_len);
  const size_t layer_pool = static_cast<size_t>(n_pages_ * nkv * layout_.page_bytes);
  using cuda::decoder_ops_last_error;
  mark_pass_start();

  check_op(cuda::embed_rows_bf16(bf(embedding_.get()), m + ml.tokens, x_.get(), r, hh, static_cast<int>(c.vocab_size),
                                 stream_),
           "embedding", decoder_ops_last_error);
  check(!fp8 || fp8_prefill_, "CUDA engine: an FP8 pass needs the FP8 prefill weights");
  if (fp8 && (fp8_qkv_epilogue_ || fp8_rope_))  // once per pass: every layer's qkv epilogue reads the same cos / sin
    check_op(cuda::rope_cos_sin_table(m + ml.positions, inv_freq_.get(), r, hd, rope_table_.get(), stream_),
             "RoPE table", decoder_ops_last_error);
  // FP8 passes (docs/design.md "FP8 prefill"): each projection reads per-token FP8 codes written by the op before
  // it (rmsnorm_fp8 / quantize_rows_fp8 / swiglu_fp8) and writes BF16, so everything between the GEMMs — RoPE, the
  // cache append, attention, SwiGLU's inputs, the residual adds — is the decode path's code on the same BF16 values.
  uint8_t* const codes = fp8_codes_.get();
  float* const scales = fp8_scales_.get();
  auto rmsnorm_to_fp8 = [&](const float* w, const char* what) {
    check_op(cuda::rmsnorm_fp8(x_.get(), w, codes, scales, r, hh, eps, stream_), what, cuda::fp8_producers_last_error);
  };
  // RMSNorm prologues (CudaEngineOptions::fused_norm_prologue; BF16-activation passes of at most kW4A16NormMaxM rows
  // with fused epilogues): the norm runs inside the next GEMM's activation staging, from x_, instead of writing xn_.
  // Layer li > 0's attention norm goes into its qkv GEMM when the layer before ended with a fused down GEMM (which
  // then skips its norm kernel); the MLP norm into the gate|up GEMM after a fused o GEMM. Same bits either way.
  // With fused_norm_partials the residual GEMM before each such GEMM also writes the rows' norm partials
  // (gemm_w4a16_residual_norm_partials) and the GEMM adds those instead of summing its rows' squares: same bits.
  const bool norm_prologue = !fp8 && opt_.fused_epilogues &&
                             (opt_.fused_norm_prologue || opt_.fused_norm_partials) && rows <= cuda::kW4A16NormMaxM;
  float* const norm_partials = norm_prologue && opt_.fused_norm_partials ? norm_partials_.get() : nullptr;
  auto fused_down_of = [&](const DeviceLayer& l) {
    return opt_.fused_epilogues && l.down.kind() == DeviceLinear::Kind::Int4 && !l.down.dequant_path(rows, g);
  };
  auto attn_norm_in_qkv = [&](size_t li) {
    return norm_prologue && li > 0 && li < layers_.size() && fused_down_of(layers_[li - 1]) &&
           layers_[li].qkv.norm_prologue(rows, g);
  };
  // Each layer's attention RMSNorm is fused into the previous layer's last residual add (BF16 passes); the first
  // one runs here.
  if (!layers_.empty()) {
    if (fp8)
      rmsnorm_to_fp8(layers_[0].attn_norm.get(), "attention RMSNorm (FP8)");
    else
      check_op(cuda::rmsnorm_bf16(x_.get(), layers_[0].attn_norm.get(), bf(xn_), r, hh, eps, stream_),
               "attention RMSNorm", decoder_ops_last_error);
  }
  for (size_t li = 0; li < layers_.size(); ++li) {
    const DeviceLayer& l = layers_[li];
    uint8_t* pool = kv_pool_.get() + li * layer_pool;
    uint16_t* anchors = anchors_.get() ? anchors_.get() + li * static_cast<size_t>(opt_.max_sequences * kv_width_)
                                       : nullptr;
    const int32_t* row_anchor = anchors ? m + ml.row_anchor : nullptr;
    // The attention prologue (RoPE, cache append, q rotation) in one kernel: decode steps and passes without new
    // int4-hadamard sequences. With fused epilogues it runs inside the qkv GEMM's split-K reduce when every W4A16
    // launch of the pass splits K (same bits: gemm_w4a16_qkv_rope_append); unsplit launches keep the two kernels.
    const bool prologue_one_kernel = fused_qkv_ && !(anchors && n_new > 0);
    // Decode steps on INT4 caches at head_dim 128: the decode attention runs the prologue where the qkv GEMM splits K
    // (instead of the GEMM's reduce: measured faster at batch 32), and where it does not only with
    // attention_prologue_unsplit (there the separate kernel, whose launch the attention's early copies overlap, is
    // faster at batch 1). CudaEngineOptions has the measurements.
    const bool qkv_splits_k = !fp8 && l.qkv.qkv_prologue_in_reduce(rows, g);
    const bool prologue_in_attention =
        !fp8 && prologue_one_kernel && pass_decode_only_ && fast && opt_.fused_epilogues &&
        opt_.fused_attention_prologue && attention_prologue_ok_ && (qkv_splits_k || opt_.attention_prologue_unsplit);
    const bool norm_in_qkv = attn_norm_in_qkv(li);
    // Unsplit decode passes of fused_qkv_tail_min_rows..max_rows rows (<= 8): the prologue in the GEMM's own tail.
    const bool qkv_in_tail = !fp8 && !qkv_splits_k && !norm_in_qkv && opt_.fused_epilogues && opt_.fused_qkv_prologue &&
                             opt_.fused_qkv_tail && rows >= opt_.fused_qkv_tail_min_rows &&
                             rows <= opt_.fused_qkv_tail_max_rows && prologue_one_kernel && !prologue_in_attention &&
                             l.qkv.qkv_prologue_in_tail(rows, g, opt_.kv, nh, nkv, hd);
    const bool prologue_in_gemm = !fp8 && opt_.fused_epilogues && opt_.fused_qkv_prologue && prologue_one_kernel &&
                                  (qkv_splits_k || qkv_in_tail) && !prologue_in_attention;
    // The key anchors of the sequences this pass starts (int4-hadamard): a mean over their RoPE'd BF16 keys in qkv_,
    // computed before any of those keys is stored.
    auto compute_new_anchors = [&] {
      check_op(cuda::kv_key_anchor_compute(bf(qkv_), static_cast<int>(qkv_width_), static_cast<int>(q_width_), nkv, hd,
                                           static_cast<int>(n_new), m + ml.new_first, m + ml.new_count,
                                           m + ml.new_anchor, anchors, stream_),
               "KV key anchors", cuda::kv_append_last_error);
    };
    // FP8 passes with the qkv epilogue: RoPE, the q rotation and the cache placement happen in the GEMM. Keys of a
    // pass that starts int4-hadamard sequences come out as RoPE'd BF16 in qkv_ (their anchors are a mean over the
    // chunk's keys), then the anchors and the keys-only append.
    const bool qkv_epilogue = fp8 && fp8_qkv_epilogue_;
    // RoPE as its own kernel (below) moves into the FP8 qkv GEMM's epilogue with fused_fp8_rope.
    const bool rope_in_fp8_gemm = fp8 && fp8_rope_ && !qkv_epilogue && !prologue_one_kernel;
    if (qkv_epilogue) {
      const bool keys_later = anchors && n_new > 0;
      cuda::GemmFp8QkvArgs qa;
      qa.format = opt_.kv;
      qa.n_heads = nh;
      qa.n_kv_heads = nkv;
      qa.head_dim = hd;
      qa.rope_cos_sin = rope_table_.get();
      qa.row_page = m + ml.row_page;
      qa.row_slot = m + ml.row_slot;
      qa.key_anchors = anchors;
      qa.row_anchor = row_anchor;
      qa.kv_pool = pool;
      qa.hadamard_block = hadamard_block_;
      qa.q_out = bf(q_);
      qa.qkv_keys = keys_later ? bf(qkv_) : nullptr;
      l.qkv8.forward_fp8_qkv(codes, scales, rows, qa, g);
      if (keys_later) {
        mark("qkv GEMM (FP8) + RoPE + V append + q rotation");
        compute_new_anchors();
        check_op(cuda::kv_append_keys(opt_.kv, bf(qkv_), r, nh, nkv, hd, m + ml.row_page, m + ml.row_slot, anchors,
                                      row_anchor, pool, stream_),
                 "K append", cuda::fused_ops_last_error);
      } else {
        mark("qkv GEMM (FP8) + RoPE + KV append + q rotation");
      }
    } else if (rope_in_fp8_gemm) {
      l.qkv8.forward_fp8_rope(codes, scales, rows, bf(qkv_), rope_table_.get(), static_cast<int>(nh + nkv), g);
      mark("qkv GEMM (FP8) + RoPE");
    } else if (fp8) {
      l.qkv8.forward_fp8(codes, scales, rows, bf(qkv_), g);
      mark("qkv GEMM (FP8)");
    } else if (prologue_in_gemm) {
      cuda::QkvRopeAppend p;
      p.format = opt_.kv;
      p.n_heads = nh;
      p.n_kv_heads = nkv;
      p.head_dim = hd;
      p.positions = m + ml.positions;
      p.inv_freq = inv_freq_.get();
      p.row_page = m + ml.row_page;
      p.row_slot = m + ml.row_slot;
      p.key_anchors = anchors;
      p.row_anchor = row_anchor;
      p.kv_pool = pool;
      p.hadamard_block = hadamard_block_;
      p.q_out = bf(q_);
      p.head_counters = qkv_in_tail ? qkv_tail_counters_.get() : nullptr;
      if (norm_in_qkv) {
        l.qkv.forward_qkv_rope_append_rmsnorm(x_.get(), l.attn_norm.get(), eps, rows, bf(qkv_), p, g, norm_partials);
        mark("RMSNorm + qkv GEMM + RoPE + KV append + q rotation");
      } else {
        l.qkv.forward_qkv_rope_append(bf(xn_), rows, bf(qkv_), p, g);
        mark("qkv GEMM + RoPE + KV append + q rotation");
      }
    } else if (norm_in_qkv) {
      l.qkv.forward_rmsnorm(x_.get(), l.attn_norm.get(), eps, rows, bf(qkv_), g, norm_partials);
      mark("RMSNorm + qkv GEMM");
    } else {
      l.qkv.forward(bf(xn_), rows, qkv_.get(), false, g);
      mark(l.qkv.dequant_path(rows, g) ? "qkv GEMM (dequant + cuBLAS)" : "qkv GEMM");
    }
    // The weights' L2 prefetch branch (CudaEngineOptions::l2_prefetch_*): forked after the qkv GEMM, whose weight bytes
    // are then read, or after the attention (l2_prefetch_after_attention). Joined once, after the last layer.
    const bool prefetch_weights = (l2_prefetch_keep_ > 0 || l2_prefetch_down_keep_ > 0 || l2_prefetch_o_keep_ > 0) &&
                              pass_decode_only_ && !fp8 &&
                              (opt_.l2_prefetch_max_rows == 0 || rows <= opt_.l2_prefetch_max_rows) &&
                              l.gate_up.int4_packed() != nullptr &&
                              !l.gate_up.dequant_path(rows, g) && l.down.int4_packed() != nullptr &&
                              !l.down.dequant_path(rows, g) && l.o.int4_packed() != nullptr &&
                              !l.o.dequant_path(rows, g);
    const auto launch_prefetch = [&] {
      cuda_check(cudaEventRecord(fork_event_, stream_), "prefetch fork");
      cuda_check(cudaStreamWaitEvent(side_stream_, fork_event_, 0), "prefetch fork");
      const int ctas = opt_.l2_prefetch_ctas, threads = opt_.l2_prefetch_threads;
      check_op(cuda::l2_prefetch_stripes(l.o.int4_packed(), l.o.int4_packed_bytes(), l2_prefetch_o_keep_,
                                         kL2PrefetchPeriod, side_stream_, nullptr, ctas, threads),
               "o L2 prefetch", cuda::l2_prefetch_last_error);
      check_op(cuda::l2_prefetch_stripes(l.gate_up.int4_packed(), l.gate_up.int4_packed_bytes(), l2_prefetch_keep_,
                                         kL2PrefetchPeriod, side_stream_, nullptr, ctas, threads),
               "gate|up L2 prefetch", cuda::l2_prefetch_last_error);
      check_op(cuda::l2_prefetch_stripes(l.down.int4_packed(), l.down.int4_packed_bytes(), l2_prefetch_down_keep_,
                                         kL2PrefetchPeriod, side_stream_, nullptr, ctas, threads),
               "down L2 prefetch", cuda::l2_prefetch_last_error);
      side_pending = true;
    };
    if (prefetch_weights && !opt_.l2_prefetch_after_attention) launch_prefetch();
    if (prologue_in_gemm || qkv_epilogue || prologue_in_attention) {
      // Nothing here: the qkv GEMM's split-K reduce or FP8 epilogue ran the prologue, or the attention will.
    } else if (prologue_one_kernel) {
      // Decode steps and passes without new int4-hadamard sequences: RoPE, cache append and the query gather in one.
      check_op(cuda::qkv_rope_kv_append(opt_.kv, bf(qkv_), r, nh, nkv, hd, m + ml.positions, inv_freq_.get(),
                                        m + ml.row_page, m + ml.row_slot, anchors, row_anchor, pool, hadamard_block_,
                                        bf(q_), stream_),
               "RoPE + KV append + q rotation", cuda::fused_ops_last_error);
    } else {
      if (!rope_in_fp8_gemm)
        check_op(cuda::rope_qk_bf16(bf(qkv_), m + ml.positions, inv_freq_.get(), r, nh, nkv, hd, stream_), "RoPE",
                 decoder_ops_last_error);
      if (anchors && n_new > 0) compute_new_anchors();
      if (fused_qkv_) {
        check_op(cuda::kv_append_rotate_q(opt_.kv, bf(qkv_), r, nh, nkv, hd, m + ml.row_page, m + ml.row_slot, anchors,
                                          row_anchor, pool, hadamard_block_, bf(q_), stream_),
                 "KV append + q rotation", cuda::fused_ops_last_error);
      } else {
        check_op(cuda::kv_append(opt_.kv, bf(qkv_), static_cast<int>(qkv_width_), static_cast<int>(q_width_),
                                 static_cast<int>(q_width_ + kv_width_), r, nkv, hd, m + ml.row_page, m + ml.row_slot,
                                 anchors, row_anchor, pool, stream_),
                 "KV append", cuda::kv_append_last_error);
        cuda_check(cuda::rotate_heads_bf16(bf(qkv_), static_cast<int>(qkv_width_), bf(q_), r, nh, hd, hadamard_block_,
                                           stream_),
                   "query rotation");
        mark("query rotation");
      }
    }
    bool attention_unrotated = false;  // the attention kernel un-rotated its int4-hadamard output itself
    // Decode steps: the only cache entries the kernels before the attention write are the new tokens.
    const bool early_copies = pass_decode_only_ && opt_.decode_attention_early_copies;
    if (pass_chunks_ > 0 && hadamard_block_ > 1 && opt_.fused_epilogues && opt_.fused_prefill_unrotation) {
      // The prefill kernel un-rotates its int4-hadamard output in its store when its shape has the instance (same
      // bits as the separate kernel below); the answer is known on the host, so a captured graph holds what ran.
      const cudaError_t e = cuda::attention_prefill_int4_unrotated(
          bf(q_), pool, m + ml.chunk_table, m + ml.chunk_first, m + ml.chunk_start, bf(att_), r, pass_chunks_, nh,
          nkv, hd, static_cast<int>(pages_per_seq_), pass_max_chunk_rows_, hadamard_block_, stream_,
          &attention_unrotated);
      check_op(e, attention_unrotated ? "prefill attention + un-rotation" : "prefill attention",
               cuda::attention_prefill_last_error);
    } else if (pass_chunks_ > 0) {
      check_op(cuda::attention_prefill(opt_.kv, bf(q_), pool, m + ml.chunk_table, m + ml.chunk_first,
                                       m + ml.chunk_start, bf(att_), r, pass_chunks_, nh, nkv, hd,
                                       static_cast<int>(pages_per_seq_), pass_max_chunk_rows_, stream_),
               "prefill attention", cuda::attention_prefill_last_error);
    } else if (prologue_in_attention) {
      cuda::AttentionDecodePrologue ap;
      ap.format = opt_.kv;
      ap.qkv = bf(qkv_);
      ap.positions = m + ml.positions;
      ap.inv_freq = inv_freq_.get();
      ap.row_page = m + ml.row_page;
      ap.row_slot = m + ml.row_slot;
      ap.key_anchors = anchors;
      ap.row_anchor = row_anchor;
      ap.hadamard_block = hadamard_block_;
      // The output is un-rotated by the attention (its combine, or the decode kernel when unsplit) when
      // fused_attention_unrotation allows.
      const int unrotate = hadamard_block_ > 1 && opt_.fused_attention_unrotation ? hadamard_block_ : 0;
      const cudaError_t e = cuda::attention_decode_int4_with_prologue(
          ap, pool, m + ml.block_table, m + ml.seq_lens, bf(att_), r, nh, nkv, hd, static_cast<int>(pages_per_seq_),
          static_cast<int>(max_len), unrotate, attn_ws_.get(), attn_ws_.bytes(), stream_, &attention_unrotated);
      check_op(e,
               attention_unrotated ? "RoPE + KV append + q rotation + decode attention + un-rotation"
                                   : "RoPE + KV append + q rotation + decode attention",
               cuda::attention_decode_last_error);
    } else if (fast && hadamard_block_ > 1 && opt_.fused_epilogues && opt_.fused_attention_unrotation) {
      // An int4-hadamard output is un-rotated by the kernel that finishes each head: the combine when the launch
      // splits the sequences, the decode kernel itself when it does not (same bits as the separate kernel below, one
      // launch fewer). The answer is known on the host, so a captured graph holds whichever ran.
      const cudaError_t e = cuda::attention_decode_int4_unrotated(
          bf(q_), pool, m + ml.block_table, m + ml.seq_lens, bf(att_), r, nh, nkv, hd,
          static_cast<int>(pages_per_seq_), static_cast<int>(max_len), hadamard_block_, attn_ws_.get(),
          attn_ws_.bytes(), stream_, &attention_unrotated, early_copies);
      check_op(e, attention_unrotated ? "decode attention + un-rotation" : "decode attention",
               cuda::attention_decode_last_error);
    } else if (fast) {
      const auto fn = layout_.format == formats::KvFormat::BF16 ? cuda::attention_decode_bf16
                                                                : cuda::attention_decode_int4;
      check_op(fn(bf(q_), pool, m + ml.block_table, m + ml.seq_lens, bf(att_), r, nh, nkv, hd,
                  static_cast<int>(pages_per_seq_), static_cast<int>(max_len), attn_ws_.get(), attn_ws_.bytes(),
                  stream_, early_copies),
               "decode attention", cuda::attention_decode_last_error);
    } else {
      check_op(cuda::attention_decode_generic(opt_.kv, bf(q_), pool, m + ml.block_table, m + ml.seq_lens, bf(att_), r,
                                              nh, nkv, hd, static_cast<int>(pages_per_seq_), stream_),
               "attention (generic)", cuda::attention_generic_last_error);
    }
    if (prefetch_weights && opt_.l2_prefetch_after_attention) launch_prefetch();
    // FP8 passes may un-rotate while quantising the o GEMM's input (fused_unrotate_fp8): the shape is known here.
    const bool unrotate_into_fp8 =
        fp8 && hadamard_block_ > 1 && !attention_unrotated && opt_.fused_unrotate_fp8 &&
        cuda::unrotate_rows_fp8_can_implement(r, nh, hd, hadamard_block_, static_cast<int>(q_width_), nullptr) ==
            cudaSuccess;
    if (hadamard_block_ > 1 && !attention_unrotated && !unrotate_into_fp8) {
      cuda_check(cuda::rotate_heads_bf16(bf(att_), static_cast<int>(q_width_), bf(att_), r, nh, hd, hadamard_block_,
                                         stream_),
                 "attention output un-rotation");
      mark("attention output un-rotation");
    }
    if (fp8) {
      // The o GEMM's input is the FP8 of the BF16 attention output (act-fp8-bf16's o_proj rule). With fused
      // epilogues the o and down GEMMs add into the residual stream themselves (gemm_fp8_residual, bit-identical to
      // a BF16 output + add_residual_bf16); the RMSNorms after them stay separate: the FP8 GEMMs want the fp32 norm
      // quantised per token.
      // The labels are string literals: the profiler keeps the pointers.
      auto fp8_into_residual = [&](const DeviceLinear& lin, const char* fused_label, const char* plain_label) {
        if (opt_.fused_epilogues) {
          lin.forward_fp8_residual(codes, scales, rows, x_.get(), g);
          mark(fused_label);
        } else {
          lin.forward_fp8(codes, scales, rows, bf(delta_), g);
          mark(plain_label);
          check_op(cuda::add_residual_bf16(x_.get(), bf(delta_), r, hh, stream_), "residual", decoder_ops_last_error);
        }
      };
      if (unrotate_into_fp8) {
        check_op(cuda::unrotate_rows_fp8(bf(att_), static_cast<int>(q_width_), codes, scales, r, nh, hd,
                                         hadamard_block_, stream_),
                 "attention output un-rotation + FP8", cuda::fp8_producers_last_error);
      } else {
        check_op(cuda::quantize_rows_fp8(bf(att_), static_cast<int>(q_width_), codes, scales, r,
                                         static_cast<int>(q_width_), stream_),
                 "attention output to FP8", cuda::fp8_producers_last_error);
      }
      fp8_into_residual(l.o8, "o GEMM (FP8) + residual", "o GEMM (FP8)");
      rmsnorm_to_fp8(l.mlp_norm.get(), "MLP RMSNorm (FP8)");
      if (opt_.fp8_block_swiglu) {
        // The down GEMM's input per token per 128 channels (act-fp8-block-bf16): from the gate|up GEMM's epilogue
        // into the unused SwiGLU-output buffer (its input codes are still being read), or from swiglu_fp8_block.
        float* blk = fp8_block_scales_.get();
        uint8_t* y_codes = codes;
        if (l.gate_up8.fp8_swiglu_packed()) {
          y_codes = reinterpret_cast<uint8_t*>(act_.get());
          l.gate_up8.forward_fp8_swiglu(codes, scales, rows, y_codes, blk, g);
          mark("gate|up GEMM (FP8) + SwiGLU to FP8 blocks");
        } else {
          l.gate_up8.forward_fp8(codes, scales, rows, bf(gate_up_), g);
          mark("gate|up GEMM (FP8)");
          check_op(cuda::swiglu_fp8_block(bf(gate_up_), codes, blk, r, inter, stream_), "SwiGLU (FP8 blocks)",
                   cuda::fp8_producers_last_error);
        }
        if (opt_.fused_epilogues) {
          l.down8.forward_fp8_block_a_residual(y_codes, blk, rows, x_.get(), g);
          mark("down GEMM (FP8, block-scaled input) + residual");
        } else {
          l.down8.forward_fp8_block_a(y_codes, blk, rows, bf(delta_), g);
          mark("down GEMM (FP8, block-scaled input)");
          check_op(cuda::add_residual_bf16(x_.get(), bf(delta_), r, hh, stream_), "residual", decoder_ops_last_error);
        }
      } else {
        l.gate_up8.forward_fp8(codes, scales, rows, bf(gate_up_), g);
        mark("gate|up GEMM (FP8)");
        check_op(cuda::swiglu_fp8(bf(gate_up_), codes, scales, r, inter, stream_), "SwiGLU (FP8)",
                 cuda::fp8_producers_last_error);
        fp8_into_residual(l.down8, "down GEMM (FP8) + residual", "down GEMM (FP8)");
      }
      if (li + 1 < layers_.size()) rmsnorm_to_fp8(layers_[li + 1].attn_norm.get(), "attention RMSNorm (FP8)");
      continue;
    }
    // INT4 o and down GEMMs with fused epilogues add straight into the residual stream, leaving the RMSNorm that
    // follows on its own; otherwise the GEMM writes BF16 and the residual add is fused with that RMSNorm instead.
    // Same values either way (the fused epilogue rounds like the BF16 store; add_residual_rmsnorm_bf16 is
    // add_residual_bf16 + rmsnorm_bf16 bit for bit). Passes on the dequantise + cuBLAS path have no fused epilogue:
    // they take the second order, which is one pass over the residual stream fewer than forward_residual's there.
    const bool fused_o = opt_.fused_epilogues && l.o.kind() == DeviceLinear::Kind::Int4 && !l.o.dequant_path(rows, g);
    // fused_residual_norm: the norm after a residual GEMM runs in its split-K reduce (small passes whose GEMM splits).
    const auto residual_norm_in_reduce = [&](const DeviceLinear& lin) {
      return opt_.fused_residual_norm && rows <= opt_.fused_residual_norm_max_rows && lin.residual_norm_in_reduce(rows, g);
    };
    const bool fused_down = fused_down_of(l);
    const bool norm_in_gate_up =
        norm_prologue && fused_o && l.gate_up.swiglu_packed() && l.gate_up.norm_prologue(rows, g);
    if (fused_o && !norm_in_gate_up && residual_norm_in_reduce(l.o)) {
      l.o.forward_residual_rmsnorm(bf(att_), rows, x_.get(), l.mlp_norm.get(), eps, bf(xn_), g);
      mark("o GEMM + residual + MLP RMSNorm");
    } else if (fused_o) {
      l.o.forward_residual(bf(att_), rows, x_.get(), bf(delta_), g, norm_in_gate_up ? norm_partials : nullptr);
      mark("o GEMM + residual");
      if (!norm_in_gate_up)
        check_op(cuda::rmsnorm_bf16(x_.get(), l.mlp_norm.get(), bf(xn_), r, hh, eps, stream_), "MLP RMSNorm",
                 decoder_ops_last_error);
    } else {
      l.o.forward(bf(att_), rows, delta_.get(), false, g);
      mark(l.o.dequant_path(rows, g) ? "o GEMM (dequant + cuBLAS)" : "o GEMM");
      check_op(cuda::add_residual_rmsnorm_bf16(x_.get(), bf(delta_), l.mlp_norm.get(), bf(xn_), r, hh, eps, stream_),
               "residual + MLP RMSNorm", cuda::fused_ops_last_error);
    }
    if (norm_in_gate_up) {
      l.gate_up.forward_swiglu_rmsnorm(x_.get(), l.mlp_norm.get(), eps, rows, bf(act_), g, norm_partials);
      mark("RMSNorm + gate|up GEMM + SwiGLU");
    } else if (l.gate_up.swiglu_packed()) {
      // On the dequantise + cuBLAS path: the GEMM into gate_up_ (canonical [gate | up] columns), then swiglu_bf16.
      l.gate_up.forward_swiglu(bf(xn_), rows, bf(act_), bf(gate_up_), g);
      mark(l.gate_up.dequant_path(rows, g) ? "gate|up GEMM (dequant + cuBLAS) + SwiGLU" : "gate|up GEMM + SwiGLU");
    } else {
      l.gate_up.forward(bf(xn_), rows, gate_up_.get(), false, g);
      mark(l.gate_up.dequant_path(rows, g) ? "gate|up GEMM (dequant + cuBLAS)" : "gate|up GEMM");
      check_op(cuda::swiglu_bf16(bf(gate_up_), bf(act_), r, inter, stream_), "SwiGLU", decoder_ops_last_error);
    }
    const bool last = li + 1 == layers_.size();
    if (fused_down && !last && !attn_norm_in_qkv(li + 1) && residual_norm_in_reduce(l.down)) {
      l.down.forward_residual_rmsnorm(bf(act_), rows, x_.get(), layers_[li + 1].attn_norm.get(), eps, bf(xn_), g);
      mark("down GEMM + residual + attention RMSNorm");
      continue;
    }
    if (fused_down) {
      l.down.forward_residual(bf(act_), rows, x_.get(), bf(delta_), g,
                              !last && attn_norm_in_qkv(li + 1) ? norm_partials : nullptr);
      mark("down GEMM + residual");
      if (!last && !attn_norm_in_qkv(li + 1))
        check_op(cuda::rmsnorm_bf16(x_.get(), layers_[li + 1].attn_norm.get(), bf(xn_), r, hh, eps, stream_),
                 "attention RMSNorm", decoder_ops_last_error);
      continue;
    }
    l.down.forward(bf(act_), rows, delta_.get(), false, g);
    mark(l.down.dequant_path(rows, g) ? "down GEMM (dequant + cuBLAS)" : "down GEMM");
    // The last layer keeps a plain add: the head normalises only the rows it needs (possibly gathered).
    if (!last)
      check_op(cuda::add_residual_rmsnorm_bf16(x_.get(), bf(delta_), layers_[li + 1].attn_norm.get(), bf(xn_), r, hh,
                                               eps, stream_),
               "residual + attention RMSNorm", cuda::fused_ops_last_error);
    else
      check_op(cuda::add_residual_bf16(x_.get(), bf(delta_), r, hh, stream_), "residual", decoder_ops_last_error);
  }
  if (side_pending) {  // the prefetch branches rejoin the step (a captured graph must end on its origin stream)
    cuda_check(cudaEventRecord(join_event_, side_stream_), "prefetch join");
    cuda_check(cudaStreamWaitEvent(stream_, join_event_, 0), "prefetch join");
  }
}

namespace {
// FT_HEAD_WIDEN_ARGMAX=0: the INT4 head's BF16 logits widened by one kernel and their argmax taken by another (the
// path before widen_argmax_rows_bf16; for A/B runs). Read once per process.
bool fused_widen_argmax() {
  static const bool on = [] {
    const char* v = std::getenv("FT_HEAD_WIDEN_ARGMAX");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}
}  // namespace

void CudaEngineImpl::enqueue_head(const float* x_rows, int64_t rows) {
  const ModelConfig& c = config_;
  const cuda::GemmContext g = gemm_context(false);
  check_op(cuda::rmsnorm_bf16(x_rows, final_norm_.get(), bf(xn_), static_cast<int>(rows),
                              static_cast<int>(c.hidden_size), static_cast<float>(c.rms_norm_eps), stream_),
           "final RMSNorm", cuda::decoder_ops_last_error);
  if (lm_head_.kind() == DeviceLinear::Kind::Int4) {
    lm_head_.forward(bf(xn_), rows, logits_bf16_.get(), false, g);
    mark("LM head GEMM");
    if (fused_widen_argmax()) {  // the fp32 logits and the greedy ids in one kernel
      check_op(cuda::widen_argmax_rows_bf16(bf(logits_bf16_), static_cast<int>(head_cols_), logits_.get(), ids_.get(),
                                            static_cast<int>(rows), static_cast<int>(c.vocab_size), stream_),
               "INT4 LM head: BF16 logits to fp32 + greedy argmax", cuda::decoder_ops_last_error);
      return;
    }
    cuda_check(cuda::widen_rows_bf16_to_f32(bf(logits_bf16_), static_cast<int>(head_cols_), logits_.get(),
                                            static_cast<int>(rows), static_cast<int>(c.vocab_size), stream_),
               "INT4 LM head: BF16 logits to fp32");
    mark("INT4 LM head: BF16 logits to fp32");
  } else {
    lm_head_.forward(bf(xn_), rows, logits_.get(), true, g);
    mark("LM head GEMM");
  }
  check_op(cuda::argmax_rows_f32(logits_.get(), ids_.get(), static_cast<int>(rows), static_cast<int>(c.vocab_size),
                                 stream_),
           "greedy argmax", cuda::decoder_ops_last_error);
}

std::vector<std::vector<float>> CudaEngineImpl::run(std::span<const SequenceChunk> batch, bool all_logits,
                                                    std::vector<int32_t>* ids) {
  validate(batch);
  const int64_t vocab = config_.vocab_size, h = config_.hidden_size;
  // Reserve slots and pages for the whole batch up front (validate checked there are enough).
  std::vector<SeqState*> st(batch.size());
  std::vector<int64_t> start(batch.size());
  std::vector<bool> is_new(batch.size());
  for (size_t ci = 0; ci < batch.size(); ++ci) {
    auto [it, inserted] = seqs_.try_emplace(batch[ci].seq_id);
    if (inserted) {
      it->second.slot = free_slots_.back();
      free_slots_.pop_back();
    }
    st[ci] = &it->second;
    start[ci] = it->second.length;
    is_new[ci] = inserted;
    const int64_t end = start[ci] + static_cast<int64_t>(batch[ci].tokens.size());
    while (static_cast<int64_t>(st[ci]->pages.size()) * kPageTokens < end) {
      st[ci]->pages.push_back(free_pages_.back());
      free_pages_.pop_back();
    }
  }

  std::vector<std::vector<float>> out(batch.size());
  if (ids) ids->assign(batch.size(), 0);
  const bool decode_only = std::all_of(batch.begin(), batch.end(), [](const SequenceChunk& c) {
    return c.tokens.size() == 1;
  }) && std::none_of(is_new.begin(), is_new.end(), [](bool b) { return b; }) &&
                           static_cast<int64_t>(batch.size()) <= logit_rows_;
  try {
    // Rows in chunk order, cut into passes of at most max_batch_tokens.
    std::vector<PassRow> all;
    for (size_t ci = 0; ci < batch.size(); ++ci)
      for (int64_t i = 0; i < static_cast<int64_t>(batch[ci].tokens.size()); ++i) all.push_back({ci, i});
    // With FP8 prefill a pass is also cut where the rows change kind, so that every row of a prompt chunk (more
    // than one token) runs the FP8 GEMMs and every other row the decode path — the per-chunk routing of
    // make_prefill_decode_reference_engine. A chunk is one kind, so only max_batch_tokens ever splits one.
    auto fp8_row = [&](const PassRow& pr) { return fp8_prefill_ && batch[pr.chunk].tokens.size() > 1; };
    std::vector<std::pair<size_t, int64_t>> passes;  // (first row, rows)
    for (size_t p0 = 0; p0 < all.size();) {
      size_t end = p0 + 1;
      while (end < all.size() && static_cast<int64_t>(end - p0) < opt_.max_batch_tokens &&
             fp8_row(all[end]) == fp8_row(all[p0]))
        ++end;
      passes.emplace_back(p0, static_cast<int64_t>(end - p0));
      p0 = end;
    }
    std::vector<bool> anchored(batch.size(), false);
    for (const auto& [p0, rows] : passes) {
      const bool fp8_pass = fp8_row(all[p0]);
      const MetaLayout ml(rows, opt_.max_sequences, pages_per_seq_);
      cuda_check(cudaStreamSynchronize(stream_), "previous pass");  // the pinned mirror is about to be rewritten
      int32_t* mh = meta_host_;
      std::fill(mh, mh + ml.total, 0);
      int64_t max_len = 1, n_new = 0;
      std::vector<int64_t> anchor_entry(batch.size(), -1);
      for (int64_t r = 0; r < rows; ++r) {
        const PassRow pr = all[p0 + static_cast<size_t>(r)];
        const SeqState& s = *st[pr.chunk];
        const int64_t pos = start[pr.chunk] + pr.index;
        mh[ml.tokens + r] = batch[pr.chunk].tokens[static_cast<size_t>(pr.index)];
        mh[ml.positions + r] = static_cast<int32_t>(pos);
        mh[ml.row_page + r] = s.pages[static_cast<size_t>(pos / kPageTokens)];
        mh[ml.row_slot + r] = static_cast<int32_t>(pos % kPageTokens);
        mh[ml.row_anchor + r] = s.slot;
        mh[ml.seq_lens + r] = static_cast<int32_t>(pos + 1);
        max_len = std::max(max_len, pos + 1);
        std::copy(s.pages.begin(), s.pages.end(), mh + ml.block_table + r * pages_per_seq_);
        // A new sequence's key anchor comes from its rows in the first pass that holds it (consecutive rows).
        if (is_new[pr.chunk] && !anchored[pr.chunk]) {
          anchored[pr.chunk] = true;
          anchor_entry[pr.chunk] = n_new;
          mh[ml.new_first + n_new] = static_cast<int32_t>(r);
          mh[ml.new_anchor + n_new] = s.slot;
          ++n_new;
        }
        if (anchor_entry[pr.chunk] >= 0) ++mh[ml.new_count + anchor_entry[pr.chunk]];
      }
      // Decode steps replay graphs keyed by a power-of-two context bucket, so the split plan baked into the graph
      // covers every length up to the bucket.
      int64_t bucket = max_len;
      if (decode_only && opt_.cuda_graphs) {
        bucket = 256;
        while (bucket < max_len) bucket *= 2;
        bucket = std::min(bucket, max_len_);
      }
      // Chunks of this pass (consecutive rows of one chunk) for attention_prefill; passes whose longest chunk is
      // short attend row by row (the decode kernels split long contexts across CTAs, the prefill kernel does not).
      pass_chunks_ = 0;
      pass_max_chunk_rows_ = 0;
      pass_decode_only_ = decode_only;
      if (prefill_attention_ok_ && !decode_only) {
        int n_chunks = 0, longest = 0;
        for (int64_t r = 0; r < rows;) {
          const PassRow pr = all[p0 + static_cast<size_t>(r)];
          int64_t n = 1;
          while (r + n < rows && all[p0 + static_cast<size_t>(r + n)].chunk == pr.chunk) ++n;
          const SeqState& s = *st[pr.chunk];
          mh[ml.chunk_first + n_chunks] = static_cast<int32_t>(r);
          mh[ml.chunk_start + n_chunks] = static_cast<int32_t>(start[pr.chunk] + pr.index);
          std::copy(s.pages.begin(), s.pages.end(), mh + ml.chunk_table + n_chunks * pages_per_seq_);
          longest = std::max(longest, static_cast<int>(n));
          ++n_chunks;
          r += n;
        }
        mh[ml.chunk_first + n_chunks] = static_cast<int32_t>(rows);
        if (longest >= kPrefillAttentionMinChunkRows) {
          pass_chunks_ = n_chunks;
          pass_max_chunk_rows_ = longest;
        }
      }
      ensure_attention_workspace(rows, bucket);
      cuda_check(cudaMemcpyAsync(meta_.get(), mh, static_cast<size_t>(ml.total) * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_),
                 "metadata upload");

      // Which rows produce logits: each chunk's last token, or all of them.
      std::vector<int64_t> head_rows;
      for (int64_t r = 0; r < rows; ++r) {
        const PassRow pr = all[p0 + static_cast<size_t>(r)];
        if (all_logits || pr.index + 1 == static_cast<int64_t>(batch[pr.chunk].tokens.size())) head_rows.push_back(r);
      }
      const bool head_is_all_rows = static_cast<int64_t>(head_rows.size()) == rows && rows <= logit_rows_;

      if (decode_only && opt_.cuda_graphs) {
        const std::pair<int64_t, int64_t> key{rows, bucket};
        auto git = graphs_.find(key);
        if (git == graphs_.end() && seen_.count(key)) {
          cudaGraph_t graph = nullptr;
          cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "graph capture");
          try {
            enqueue_layers(rows, 0, bucket);
            enqueue_head(x_.get(), rows);
          } catch (...) {
            cudaStreamEndCapture(stream_, &graph);
            if (graph) cudaGraphDestroy(graph);
            throw;
          }
          cuda_check(cudaStreamEndCapture(stream_, &graph), "graph capture");
          cudaGraphExec_t exec = nullptr;
          const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
          cudaGraphDestroy(graph);
          cuda_check(e, "graph instantiate");
          git = graphs_.emplace(key, exec).first;
        }
        if (git != graphs_.end()) {
          cuda_check(cudaGraphLaunch(git->second, stream_), "graph launch");
          last_graph_ = git->second;
        } else {
          seen_.insert(key);
          enqueue_layers(rows, 0, bucket);
          enqueue_head(x_.get(), rows);
        }
      } else {
        enqueue_layers(rows, n_new, bucket, fp8_pass);
      }

      // Logits (and greedy ids) of head_rows, logit_rows_ at a time.
      const bool head_done = decode_only && opt_.cuda_graphs;
      for (size_t h0 = 0; h0 < head_rows.size(); h0 += static_cast<size_t>(logit_rows_)) {
        const int64_t n = std::min<int64_t>(logit_rows_, static_cast<int64_t>(head_rows.size() - h0));
        if (!head_done) {
          const float* src = x_.get();
          if (!head_is_all_rows) {
            for (int64_t i = 0; i < n; ++i)
              cuda_check(cudaMemcpyAsync(x_gather_.get() + i * h, x_.get() + head_rows[h0 + static_cast<size_t>(i)] * h,
                                         static_cast<size_t>(h) * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                         "gather LM-head rows");
            src = x_gather_.get();
          }
          enqueue_head(src, n);
        }
        // forward_sample: the sampler overwrites the greedy ids (after a graph replay too; graphs stay greedy).
        if (ids && sample_params_) {
          std::vector<double> u(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i)
            u[static_cast<size_t>(i)] =
                sample_u_[all[p0 + static_cast<size_t>(head_rows[h0 + static_cast<size_t>(i)])].chunk];
          cuda_check(cudaMemcpyAsync(uniforms_.get(), u.data(), u.size() * sizeof(double), cudaMemcpyHostToDevice,
                                     stream_),
                     "upload draws");  // pageable source: staged before the call returns
          const SamplingParams& sp = *sample_params_;
          check_op(cuda::sample_rows_f32(logits_.get(), uniforms_.get(), ids_.get(), static_cast<int>(n),
                                         static_cast<int>(vocab), sp.temperature, sp.top_k, sp.top_p,
                                         sample_ws_.get(), sample_ws_.bytes(), stream_),
                   "sampling", cuda::sampling_last_error);
        }
        if (device_logits_dst_) {
          // forward_logits_on_device: one chunk, every row a head row in order, so this group is rows
          // index(first) … index(first) + n − 1 of the chunk.
          const int64_t first = all[p0 + static_cast<size_t>(head_rows[h0])].index;
          cuda_check(cudaMemcpyAsync(device_logits_dst_ + first * vocab, logits_.get(),
                                     static_cast<size_t>(n * vocab) * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                     "keep logits on the GPU");
          continue;
        }
        std::vector<int32_t> id_host(static_cast<size_t>(n));
        std::vector<float> lg;
        if (ids) {
          cuda_check(cudaMemcpyAsync(id_host.data(), ids_.get(), static_cast<size_t>(n) * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, stream_),
                     "download ids");
        } else {
          lg.resize(static_cast<size_t>(n * vocab));
          cuda_check(cudaMemcpyAsync(lg.data(), logits_.get(), lg.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream_),
                     "download logits");
        }
        cuda_check(cudaStreamSynchronize(stream_), "forward pass");
        for (int64_t i = 0; i < n; ++i) {
          const size_t chunk = all[p0 + static_cast<size_t>(head_rows[h0 + static_cast<size_t>(i)])].chunk;
          if (ids) {
            (*ids)[chunk] = id_host[static_cast<size_t>(i)];
          } else {
            out[chunk].insert(out[chunk].end(), lg.begin() + i * vocab, lg.begin() + (i + 1) * vocab);
          }
        }
      }
    }
    cuda_check(cudaStreamSynchronize(stream_), "forward");
  } catch (...) {
    // Some layers' caches may already hold the chunk: the batch's sequences cannot continue and are freed.
    cudaStreamSynchronize(stream_);
    for (const SequenceChunk& c : batch) reset(c.seq_id);
    throw;
  }
  for (size_t ci = 0; ci < batch.size(); ++ci) st[ci]->length += static_cast<int64_t>(batch[ci].tokens.size());
  return out;
}

void CudaEngineImpl::append_synthetic_context(int32_t seq_id, int64_t tokens) {
  check(synthetic_, "append_synthetic_context: only synthetic engines may skip running the model");
  check(tokens >= 0 && tokens <= max_len_ - sequence_length(seq_id), "append_synthetic_context: sequence ", seq_id,
        " cannot grow by ", tokens, " tokens (maximum length ", max_len_, ")");
  auto [it, inserted] = seqs_.try_emplace(seq_id);
  if (inserted) {
    check(!free_slots_.empty(), "append_synthetic_context: all max_sequences slots are in use");
    it->second.slot = free_slots_.back();
    free_slots_.pop_back();
  }
  SeqState& s = it->second;
  const int64_t end = s.length + tokens;
  while (static_cast<int64_t>(s.pages.size()) * kPageTokens < end) {
    check(!free_pages_.empty(), "append_synthetic_context: KV cache full");
    s.pages.push_back(free_pages_.back());
    free_pages_.pop_back();
  }
  s.length = end;
}

CudaEngine::StepTiming CudaEngineImpl::benchmark_decode_step(std::span<const SequenceChunk> batch, int iters) {
  check(opt_.cuda_graphs, "benchmark_decode_step: needs cuda_graphs on");
  check(iters >= 1, "benchmark_decode_step: iters must be positive");
  for (const SequenceChunk& c : batch)
    check(c.tokens.size() == 1 && sequence_length(c.seq_id) > 0, "benchmark_decode_step: sequence ", c.seq_id,
          " is not a decode step of an existing sequence");
  last_graph_ = nullptr;
  forward_greedy(batch);
  forward_greedy(batch);
  check(last_graph_ != nullptr, "benchmark_decode_step: the step did not run as a CUDA graph");
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cuda_check(cudaEventCreate(&e0), "event");
  cuda_check(cudaEventCreate(&e1), "event");
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    cuda_check(cudaEventRecord(e0, stream_), "event");
    cuda_check(cudaGraphLaunch(last_graph_, stream_), "graph launch");
    cuda_check(cudaEventRecord(e1, stream_), "event");
    cuda_check(cudaEventSynchronize(e1), "graph replay");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, e0, e1), "event");
    us.push_back(ms * 1e3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(us.begin(), us.end());
  StepTiming t;
  t.min_us = us.front();
  t.median_us = us.size() % 2 ? us[us.size() / 2] : 0.5 * (us[us.size() / 2 - 1] + us[us.size() / 2]);
  t.p90_us = us[std::min(us.size() - 1, static_cast<size_t>(0.9 * static_cast<double>(us.size())))];
  return t;
}

void check_hopper() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    fail("CUDA engine: no CUDA device is available");
  }
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "device properties");
  check(prop.major == 9 && prop.minor == 0, "CUDA engine: the kernels need a Hopper GPU (sm_90: H100/H200); device 0 "
        "is ", prop.name, " (sm_", prop.major, prop.minor, ")");
}

}  // namespace

std::unique_ptr<CudaEngine> make_cuda_engine(const Model& model, const CudaEngineOptions& options) {
  check_hopper();
  model.validate();
  WeightSource src;
  src.model = &model;
  return std::make_unique<CudaEngineImpl>(model.config, src, options);
}

std::unique_ptr<CudaEngine> make_cuda_engine(const quant::QuantizedModel& q, const CudaEngineOptions& options) {
  check(q.recipe.weights != WeightFormat::Fp8, q.model.source, ": FP8 weights run only in the FP8 prefill path: ",
        "make_cuda_engine(decode model, FP8 prefill model)");
  check_hopper();
  q.model.validate();
  WeightSource src;
  src.model = &q.model;
  src.int4 = &q.int4;
  src.recipe_name = q.recipe.name();
  return std::make_unique<CudaEngineImpl>(q.model.config, src, options);
}

std::unique_ptr<CudaEngine> make_cuda_engine(const quant::QuantizedModel& decode, const quant::QuantizedModel& prefill,
                                             const CudaEngineOptions& options) {
  check(prefill.recipe.weights == WeightFormat::Fp8, prefill.model.source, ": the prefill model's recipe ",
        prefill.recipe.name(), " has no FP8 weights; FP8 prefill needs an fp8 recipe (e.g. fp8+act-fp8)");
  check(decode.recipe.weights != WeightFormat::Fp8, decode.model.source, ": the decode model's recipe ",
        decode.recipe.name(), " has FP8 weights, which only the prefill path runs; decode with full or int4 weights");
  const ModelConfig& a = decode.model.config;
  const ModelConfig& b = prefill.model.config;
  check(a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
            a.num_hidden_layers == b.num_hidden_layers && a.num_attention_heads == b.num_attention_heads &&
            a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
            a.vocab_size == b.vocab_size && a.rope_theta == b.rope_theta && a.rms_norm_eps == b.rms_norm_eps,
        "CUDA engine: the decode model (", decode.model.source, ") and the prefill model (", prefill.model.source,
        ") have different configs; both must be quantisations of one model");
  check(decode.recipe.kv == prefill.recipe.kv, "CUDA engine: the decode recipe ", decode.recipe.name(),
        " and the prefill recipe ", prefill.recipe.name(), " name different KV-cache formats; both share one cache");
  check(decode.recipe.head == prefill.recipe.head, "CUDA engine: the decode recipe ", decode.recipe.name(),
        " and the prefill recipe ", prefill.recipe.name(), " name different LM-head formats; every chunk runs the ",
        "decode model's head, so both must have head-int4 or neither (the reference twin runs each model's own)");
  check(!prefill.fp8.empty(), prefill.model.source, ": the prefill model holds no packed FP8 weights");
  check_fp8_prefill_shapes(a);
  check_hopper();
  decode.model.validate();
  WeightSource src;
  src.model = &decode.model;
  src.int4 = &decode.int4;
  src.fp8 = &prefill.fp8;
  src.recipe_name = decode.recipe.name();
  src.prefill_recipe_name = prefill.recipe.name();
  // A prefill recipe naming act-fp8-block-bf16 asks for the down input per 128 channels.
  CudaEngineOptions o = options;
  if (prefill.recipe.activations == ActivationFormat::Fp8BlockOverBf16) o.fp8_block_swiglu = true;
  return std::make_unique<CudaEngineImpl>(a, src, o);
}

std::unique_ptr<CudaEngine> make_synthetic_cuda_engine(const ModelConfig& config, int64_t int4_group,
                                                       const CudaEngineOptions& options, uint64_t seed) {
  check(int4_group >= 0, "synthetic CUDA engine: int4_group must be 0 (BF16) or a group size, got ", int4_group);
  if (options.synthetic_fp8_prefill) check_fp8_prefill_shapes(config);
  check_hopper();
  WeightSource src;
  src.synthetic_group = int4_group;
  src.seed = seed;
  src.synthetic_fp8 = options.synthetic_fp8_prefill;
  src.prefill_recipe_name = "synthetic fp8";
  src.recipe_name = int4_group > 0 ? "synthetic int4-g" + std::to_string(int4_group) : "synthetic bf16";
  return std::make_unique<CudaEngineImpl>(config, src, options);
}

}  // namespace futransformer
