// Host side of GPTQ's calibration forward on the GPU (quant/calibration_forward.h): ref::RefModel::run_layer's
// steps as cuBLAS fp32 GEMMs and calibration_kernels.cuh's row kernels, on the default stream.
#include "quant/calibration_forward.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "calibration_kernels.cuh"
#include "cuda/engine/device_memory.h"
#include "futransformer/dtype.h"
#include "futransformer/error.h"
#include "ref/ops.h"

namespace futransformer::quant {
namespace {

namespace ops = cuda::calib_ops;
using ref::Projection;
using ref::ProjectionInput;

constexpr const char* kWhat = "GPTQ calibration forward on the GPU";
constexpr int kThreads = 256;
// Grid-stride kernels need no more blocks than this to fill an H200 (132 SMs × 2048 threads / 256).
constexpr int64_t kMaxBlocks = 132 * 8;

void cuda_ok(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(kWhat, ": ", what, ": ", cudaGetErrorString(e));
  }
}
void cublas_ok(cublasStatus_t s, const std::string& what) {
  check(s == CUBLAS_STATUS_SUCCESS, kWhat, ": ", what, ": cuBLAS status ", static_cast<int>(s));
}

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

int as_int(int64_t v, const char* what) {
  check(v >= 0 && v <= INT_MAX, kWhat, ": ", what, " = ", v, " is above cuBLAS's 32-bit sizes");
  return static_cast<int>(v);
}

// fp32 device arrays (the engine's owning array, moves only).
using Buf = cuda::DeviceArray<float>;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Embedding rows converted as Tensor::to_f32 converts them, one row at a time so that only the calibration tokens'
// rows are widened (an 8B model's table is 2 GiB in fp32).
void embedding_row(const Tensor& t, int64_t row, int64_t cols, float* out) {
  const uint8_t* p = t.data + static_cast<size_t>(row * cols) * dtype_size(t.dtype);
  uint16_t h;
  for (int64_t c = 0; c < cols; ++c) {
    switch (t.dtype) {
      case DType::F32: std::memcpy(&out[c], p + 4 * c, 4); break;
      case DType::F16: std::memcpy(&h, p + 2 * c, 2); out[c] = f16_to_f32(h); break;
      case DType::BF16: std::memcpy(&h, p + 2 * c, 2); out[c] = bf16_to_f32(h); break;
      default: fail(kWhat, ": embedding tensor '", t.name, "' has dtype ", dtype_name(t.dtype),
                    "; expected F32, F16 or BF16");
    }
  }
}

}  // namespace

struct CudaCalibrationForward::Impl {
  const Model* model = nullptr;
  ModelConfig c;
  CalibrationForwardOptions options;
  std::vector<int64_t> lengths, starts;
  int64_t rows = 0, max_len = 0;
  cublasHandle_t blas = nullptr;

  Buf x, xn, q, k, v, att, delta, gate, up, scores, inv_freq;
  int32_t* pos = nullptr;  // [rows]: each row's position in its window

  // The running layer (-1 when none): host fp32 weights (what projection() returns), device copies, norms, and
  // which groups have already multiplied (their weights can no longer change this run).
  int64_t layer = -1;
  std::array<std::vector<float>, ref::kNumProjections> host_w;
  std::array<Buf, ref::kNumProjections> dev_w;
  Buf attn_norm, mlp_norm;
  std::array<bool, ref::kNumProjections> used{};

  double forward_s = 0.0, upload_s = 0.0;

  ~Impl() {
    if (pos) cudaFree(pos);
    if (blas) cublasDestroy(blas);
  }

  int64_t out_features(Projection p) const {
    const int64_t qw = c.num_attention_heads * c.head_dim, kvw = c.num_key_value_heads * c.head_dim;
    switch (p) {
      case Projection::Q: return qw;
      case Projection::K:
      case Projection::V: return kvw;
      case Projection::O:
      case Projection::Down: return c.hidden_size;
      case Projection::Gate:
      case Projection::Up: return c.intermediate_size;
    }
    return 0;
  }
  int64_t in_features(Projection p) const {
    switch (p) {
      case Projection::O: return c.num_attention_heads * c.head_dim;
      case Projection::Down: return c.intermediate_size;
      default: return c.hidden_size;
    }
  }

  // y[rows, out] = in[rows, in] · Wᵀ. cuBLAS is column-major: W [out, in] row-major is Wᵀ there with leading
  // dimension `in`, and y comes out as the column-major [out, rows] that is row-major [rows, out].
  void linear(Projection p, const float* in, float* y) {
    used[static_cast<size_t>(p)] = true;
    const int64_t n_out = out_features(p), n_in = in_features(p);
    const float one = 1.0f, zero = 0.0f;
    cublas_ok(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, as_int(n_out, "projection outputs"),
                           as_int(rows, "calibration rows"), as_int(n_in, "projection inputs"), &one,
                           dev_w[static_cast<size_t>(p)].get(), CUDA_R_32F, static_cast<int>(n_in), in, CUDA_R_32F,
                           static_cast<int>(n_in), &zero, y, CUDA_R_32F, static_cast<int>(n_out), CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
              ref::projection_tensor_name(layer, p) + " GEMM");
  }

  // Query rows per attention block for a window of n tokens: all heads' scores for the block fit the budget.
  int64_t block_rows(int64_t n) const {
    const int64_t per_row = c.num_attention_heads * n * static_cast<int64_t>(sizeof(float));
    return std::clamp<int64_t>(static_cast<int64_t>(options.attention_scores_bytes) / per_row, 1, n);
  }

  // Causal GQA attention of every window (ref::attention): for each block of queries, S = Q·Kᵀ/√d for the keys the
  // block's last query sees (one strided-batched GEMM per KV head over its query heads, the K operand shared with
  // stride 0), the causal softmax, then O = P·V the same way.
  void attention() {
    const int64_t hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads, grp = nh / nkv;
    const int qw = static_cast<int>(nh * hd), kvw = static_cast<int>(nkv * hd);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))), one = 1.0f, zero = 0.0f;
    for (size_t w = 0; w < lengths.size(); ++w) {
      const int64_t r0 = starts[w], n = lengths[w], bq = block_rows(n);
      for (int64_t i0 = 0; i0 < n; i0 += bq) {
        const int64_t m = std::min(bq, n - i0), len = i0 + m;
        const long long s_stride = m * len;
        for (int64_t g = 0; g < nkv; ++g) {
          cublas_ok(cublasGemmStridedBatchedEx(
                        blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(len), static_cast<int>(m),
                        static_cast<int>(hd), &scale, k.get() + r0 * kvw + g * hd, CUDA_R_32F, kvw, 0,
                        q.get() + (r0 + i0) * qw + g * grp * hd, CUDA_R_32F, qw, hd, &zero,
                        scores.get() + g * grp * s_stride, CUDA_R_32F, static_cast<int>(len), s_stride,
                        static_cast<int>(grp), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "attention scores");
        }
        ops::causal_softmax_kernel<<<static_cast<unsigned>(nh * m), ops::kRowThreads>>>(scores.get(), m, len,
                                                                                         i0 + 1);
        cuda_ok(cudaGetLastError(), "attention softmax");
        for (int64_t g = 0; g < nkv; ++g) {
          cublas_ok(cublasGemmStridedBatchedEx(
                        blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(hd), static_cast<int>(m),
                        static_cast<int>(len), &one, v.get() + r0 * kvw + g * hd, CUDA_R_32F, kvw, 0,
                        scores.get() + g * grp * s_stride, CUDA_R_32F, static_cast<int>(len), s_stride, &zero,
                        att.get() + (r0 + i0) * qw + g * grp * hd, CUDA_R_32F, qw, hd, static_cast<int>(grp),
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "attention output");
        }
      }
    }
  }

  void rmsnorm(const Buf& w, const float* in, float* out) {
    ops::rmsnorm_kernel<<<static_cast<unsigned>(rows), ops::kRowThreads>>>(in, w.get(), out, c.hidden_size,
                                                                            static_cast<float>(c.rms_norm_eps));
    cuda_ok(cudaGetLastError(), "RMSNorm");
  }
  void rope(float* t, int64_t n_heads) {
    ops::rope_kernel<<<grid_for(rows * n_heads * c.head_dim / 2), kThreads>>>(
        t, rows, static_cast<int>(n_heads), static_cast<int>(c.head_dim), pos, inv_freq.get());
    cuda_ok(cudaGetLastError(), "RoPE");
  }
  void add_residual() {
    const int64_t n = rows * c.hidden_size;
    ops::add_kernel<<<grid_for(n), kThreads>>>(x.get(), delta.get(), n);
    cuda_ok(cudaGetLastError(), "residual add");
  }

  // Layer i's weights as fp32 on the host (Tensor::to_f32, as RefModel's copy) and on the device.
  void load_layer(int64_t i) {
    const auto t0 = Clock::now();
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::vector<float> an = model->get(p + "input_layernorm.weight", {c.hidden_size}).to_f32();
    const std::vector<float> mn = model->get(p + "post_attention_layernorm.weight", {c.hidden_size}).to_f32();
    attn_norm = Buf(an.size(), "attention norm");
    attn_norm.copy_from_host(an.data(), an.size(), "attention norm");
    mlp_norm = Buf(mn.size(), "MLP norm");
    mlp_norm.copy_from_host(mn.data(), mn.size(), "MLP norm");
    for (int j = 0; j < ref::kNumProjections; ++j) {
      const auto pj = static_cast<Projection>(j);
      const std::string name = ref::projection_tensor_name(i, pj);
      host_w[j] = model->get(name, {out_features(pj), in_features(pj)}).to_f32();
      dev_w[j] = Buf(host_w[j].size(), name);
      dev_w[j].copy_from_host(host_w[j].data(), host_w[j].size(), name);
    }
    used.fill(false);
    layer = i;
    upload_s += seconds_since(t0);
  }

  void unload_layer() {
    layer = -1;
    for (int j = 0; j < ref::kNumProjections; ++j) {
      host_w[j] = {};
      dev_w[j] = Buf();
    }
    attn_norm = Buf();
    mlp_norm = Buf();
  }
};

CudaCalibrationForward::CudaCalibrationForward(const Model& model, std::vector<int64_t> window_lengths,
                                               const CalibrationForwardOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  model.validate();
  m.model = &model;
  m.c = model.config;
  m.options = options;
  const ModelConfig& c = m.c;
  check(!window_lengths.empty(), kWhat, ": no calibration windows");
  check(options.attention_scores_bytes > 0, kWhat, ": attention_scores_bytes must be positive");
  for (size_t w = 0; w < window_lengths.size(); ++w) {
    const int64_t n = window_lengths[w];
    check(n > 0 && n <= c.max_position_embeddings, kWhat, ": calibration window ", w, " has ", n,
          " tokens; expected 1 … ", c.max_position_embeddings, " (the model's context)");
    m.starts.push_back(m.rows);
    m.rows += n;
    m.max_len = std::max(m.max_len, n);
  }
  m.lengths = std::move(window_lengths);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    fail(kWhat, ": no CUDA device is available");
  }
  cublas_ok(cublasCreate(&m.blas), "cublasCreate");
  // fp32 GEMMs stay fp32 (no TF32 tensor-core rounding): calibration measures the weights alone, as on the CPU.
  cublas_ok(cublasSetMathMode(m.blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");

  const int64_t h = c.hidden_size, qw = c.num_attention_heads * c.head_dim;
  const int64_t kvw = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  const auto sz = [&](int64_t cols) { return static_cast<size_t>(m.rows * cols); };
  m.x = Buf(sz(h), "activations");
  m.xn = Buf(sz(h), "normed activations");
  m.q = Buf(sz(qw), "queries");
  m.k = Buf(sz(kvw), "keys");
  m.v = Buf(sz(kvw), "values");
  m.att = Buf(sz(qw), "attention output");
  m.delta = Buf(sz(h), "projection output");
  m.gate = Buf(sz(inter), "gate");
  m.up = Buf(sz(inter), "up");
  int64_t score_floats = 0;
  for (int64_t n : m.lengths) score_floats = std::max(score_floats, c.num_attention_heads * m.block_rows(n) * n);
  m.scores = Buf(static_cast<size_t>(score_floats), "attention scores");

  const std::vector<float> inv_freq = ref::rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling);
  m.inv_freq = Buf(inv_freq.size(), "RoPE frequencies");
  m.inv_freq.copy_from_host(inv_freq.data(), inv_freq.size(), "RoPE frequencies");
  std::vector<int32_t> pos;
  pos.reserve(static_cast<size_t>(m.rows));
  for (int64_t n : m.lengths)
    for (int64_t i = 0; i < n; ++i) pos.push_back(static_cast<int32_t>(i));
  cuda_ok(cudaMalloc(reinterpret_cast<void**>(&m.pos), pos.size() * sizeof(int32_t)), "allocate positions");
  cuda_ok(cudaMemcpy(m.pos, pos.data(), pos.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "upload positions");
}

CudaCalibrationForward::~CudaCalibrationForward() = default;

int64_t CudaCalibrationForward::rows() const { return impl_->rows; }
int64_t CudaCalibrationForward::num_layers() const { return impl_->c.num_hidden_layers; }
double CudaCalibrationForward::forward_seconds() const { return impl_->forward_s; }
double CudaCalibrationForward::upload_seconds() const { return impl_->upload_s; }

void CudaCalibrationForward::embed(std::span<const std::vector<int32_t>> windows) {
  Impl& m = *impl_;
  check(windows.size() == m.lengths.size(), kWhat, ": embed got ", windows.size(), " windows, expected ",
        m.lengths.size());
  const int64_t h = m.c.hidden_size;
  const Tensor& emb = m.model->get("model.embed_tokens.weight", {m.c.vocab_size, h});
  std::vector<float> x(static_cast<size_t>(m.rows * h));
  for (size_t w = 0; w < windows.size(); ++w) {
    check(static_cast<int64_t>(windows[w].size()) == m.lengths[w], kWhat, ": window ", w, " has ",
          windows[w].size(), " tokens, expected ", m.lengths[w]);
    for (int64_t i = 0; i < m.lengths[w]; ++i) {
      const int32_t id = windows[w][static_cast<size_t>(i)];
      check(id >= 0 && id < m.c.vocab_size, kWhat, ": token id ", id, " (window ", w, ") is outside [0, ",
            m.c.vocab_size, ")");
      embedding_row(emb, id, h, &x[static_cast<size_t>((m.starts[w] + i) * h)]);
    }
  }
  m.x.copy_from_host(x.data(), x.size(), "embeddings");
}

void CudaCalibrationForward::set_activations(std::span<const float> x) {
  impl_->x.copy_from_host(x.data(), x.size(), std::string(kWhat) + ": activations");
}

std::vector<float> CudaCalibrationForward::activations() const {
  return impl_->x.download(std::string(kWhat) + ": activations");
}

std::span<const float> CudaCalibrationForward::projection(int64_t layer, Projection p) const {
  check(layer == impl_->layer, kWhat, ": projection weights of layer ", layer,
        " are only available while that layer runs (running: ", impl_->layer, ")");
  return impl_->host_w[static_cast<size_t>(p)];
}

void CudaCalibrationForward::set_projection_weights(int64_t layer, Projection p, std::vector<float> weights) {
  Impl& m = *impl_;
  const std::string name = ref::projection_tensor_name(layer, p);
  check(layer == m.layer, kWhat, ": ", name, ": weights can only be replaced while layer ", layer,
        " runs (running: ", m.layer, ")");
  check(!m.used[static_cast<size_t>(p)], kWhat, ": ", name, ": replaced after its GEMM already ran");
  const size_t want = static_cast<size_t>(m.out_features(p) * m.in_features(p));
  check(weights.size() == want, kWhat, ": ", name, ": ", weights.size(), " replacement weights, expected ", want,
        " [", m.out_features(p), ", ", m.in_features(p), "]");
  m.dev_w[static_cast<size_t>(p)].copy_from_host(weights.data(), weights.size(), name);
  m.host_w[static_cast<size_t>(p)] = std::move(weights);
}

void CudaCalibrationForward::run_layer(int64_t index, const DeviceLayerHook& hook) {
  Impl& m = *impl_;
  check(index >= 0 && index < num_layers(), kWhat, ": layer ", index, " outside [0, ", num_layers(), ")");
  const auto t0 = Clock::now();
  const double upload0 = m.upload_s;
  double hook_s = 0.0;
  m.load_layer(index);
  struct Unload {
    Impl& m;
    ~Unload() { m.unload_layer(); }
  } unload{m};
  // The GPU work so far is charged to the forward, not to the hook (which synchronises its own work).
  auto observe = [&](ProjectionInput g, const float* in, int64_t cols) {
    if (!hook) return;
    cuda_ok(cudaDeviceSynchronize(), std::string("layer ") + std::to_string(index) + " before the " +
                                         ref::projection_input_name(g) + " hook");
    const auto h0 = Clock::now();
    hook(index, g, in, m.rows, cols);
    hook_s += seconds_since(h0);
  };
  const ModelConfig& c = m.c;
  const int64_t qw = c.num_attention_heads * c.head_dim, inter = c.intermediate_size;

  m.rmsnorm(m.attn_norm, m.x.get(), m.xn.get());
  observe(ProjectionInput::Qkv, m.xn.get(), c.hidden_size);
  m.linear(Projection::Q, m.xn.get(), m.q.get());
  m.linear(Projection::K, m.xn.get(), m.k.get());
  m.linear(Projection::V, m.xn.get(), m.v.get());
  m.rope(m.q.get(), c.num_attention_heads);
  m.rope(m.k.get(), c.num_key_value_heads);
  m.attention();

  observe(ProjectionInput::O, m.att.get(), qw);
  m.linear(Projection::O, m.att.get(), m.delta.get());
  m.add_residual();

  m.rmsnorm(m.mlp_norm, m.x.get(), m.xn.get());
  observe(ProjectionInput::GateUp, m.xn.get(), c.hidden_size);
  m.linear(Projection::Gate, m.xn.get(), m.gate.get());
  m.linear(Projection::Up, m.xn.get(), m.up.get());
  const int64_t n_inter = m.rows * inter;
  ops::swiglu_kernel<<<grid_for(n_inter), kThreads>>>(m.gate.get(), m.up.get(), m.gate.get(), n_inter);
  cuda_ok(cudaGetLastError(), "SwiGLU");
  observe(ProjectionInput::Down, m.gate.get(), inter);
  m.linear(Projection::Down, m.gate.get(), m.delta.get());
  m.add_residual();
  cuda_ok(cudaDeviceSynchronize(), "layer " + std::to_string(index));
  m.forward_s += seconds_since(t0) - hook_s - (m.upload_s - upload0);
}

}  // namespace futransformer::quant
