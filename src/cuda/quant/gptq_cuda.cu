// Host side of GPTQ on the GPU (quant/gptq_cuda.h): the device Hessian accumulator (cuBLAS DSYRK), the damped
// factorization (cuSOLVER potrf + trtri in fp64 on the reversed matrix, as quant/dense.h does on the CPU), and the
// block loop (gptq_kernels.cuh's block_kernel, then one SGEMM per block for the lazy update). The rules shared with
// the CPU (validation, dead inputs, column order, damping retries, block size, messages) come from gptq_common.h.
#include "futransformer/quant/gptq_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <numeric>
#include <utility>

#include "cuda/engine/device_memory.h"
#include "futransformer/error.h"
#include "gptq_kernels.cuh"
#include "quant/gptq_common.h"

namespace futransformer::quant {
namespace {

namespace ops = cuda::gptq_ops;

constexpr int kThreads = 256;
// Activations are converted to fp64 in chunks of at most this many bytes, bounding the temporary copy.
constexpr size_t kChunkBytes = size_t{256} << 20;
// quant/dense.cpp's rule: a Cholesky pivot keeping less than this fraction of its diagonal entry is singular.
constexpr double kMinRelativePivot = 1e-10;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("GPTQ on the GPU: ", what, ": ", cudaGetErrorString(e));
  }
}
void cublas_ok(cublasStatus_t s, const char* what) {
  check(s == CUBLAS_STATUS_SUCCESS, "GPTQ on the GPU: ", what, ": cuBLAS status ", static_cast<int>(s));
}
void cusolver_ok(cusolverStatus_t s, const char* what) {
  check(s == CUSOLVER_STATUS_SUCCESS, "GPTQ on the GPU: ", what, ": cuSOLVER status ", static_cast<int>(s));
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// Device arrays: the engine's owning array (moves only, freed on destruction), named by what they hold.
template <typename T>
using Buf = cuda::DeviceArray<T>;

// cuBLAS and cuSOLVER handles of this thread, created on first use and deliberately never destroyed: destroying
// them from a thread_local or static destructor can run after the CUDA runtime has shut down at process exit.
struct Handles {
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
  cusolverDnParams_t params = nullptr;
};
Handles& handles() {
  thread_local Handles* h = [] {
    auto* p = new Handles;
    cublas_ok(cublasCreate(&p->blas), "cublasCreate");
    // FP32 and FP64 GEMMs stay in their own precision (no TF32 tensor-core rounding of the error propagation).
    cublas_ok(cublasSetMathMode(p->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    cusolver_ok(cusolverDnCreate(&p->solver), "cusolverDnCreate");
    cusolver_ok(cusolverDnCreateParams(&p->params), "cusolverDnCreateParams");
    return p;
  }();
  return *h;
}

thread_local GptqCudaTimings g_timings;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  cuda_ok(cudaDeviceSynchronize(), "synchronise");
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// H (upper, row-major) ← beta·H + Σ_t x_t·x_tᵀ over the fp64 rows xd [m, K]. cuBLAS is column-major: xd is then
// [K, m] with leading dimension K, and its lower triangle is the row-major upper one.
void syrk_accumulate(const double* xd, int64_t m, int64_t K, double beta, double* h) {
  const double one = 1.0;
  cublas_ok(cublasDsyrk(handles().blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, static_cast<int>(K),
                        static_cast<int>(m), &one, xd, static_cast<int>(K), &beta, h, static_cast<int>(K)),
            "DSYRK (Hessian)");
}

}  // namespace

struct CudaHessianAccumulator::Impl {
  Buf<double> h;
};

CudaHessianAccumulator::CudaHessianAccumulator(int64_t k, std::string name)
    : k_(k), name_(std::move(name)), impl_(std::make_unique<Impl>()) {
  check(k > 0 && k <= detail::kMaxHessianInputs, detail::hessian_label(name_), ": Hessian input size must be in [1, ",
        detail::kMaxHessianInputs, "], got ", k);
  impl_->h = Buf<double>(static_cast<size_t>(k * k), "the Hessian");
  impl_->h.fill_bytes(0, "clear the Hessian");
}

CudaHessianAccumulator::CudaHessianAccumulator(const HessianAccumulator& host)
    : CudaHessianAccumulator(host.k(), host.name()) {
  impl_->h.copy_from_host(host.upper().data(), impl_->h.size(), "the Hessian");
  n_ = host.n_samples();
}

CudaHessianAccumulator::~CudaHessianAccumulator() = default;
CudaHessianAccumulator::CudaHessianAccumulator(CudaHessianAccumulator&&) noexcept = default;
CudaHessianAccumulator& CudaHessianAccumulator::operator=(CudaHessianAccumulator&&) noexcept = default;

void CudaHessianAccumulator::add(const float* x, int64_t n_tokens) {
  const std::string label = detail::hessian_label(name_);
  if (!detail::check_calibration_batch(x, n_tokens, n_, k_, label)) return;
  // Reject before touching H (and before any transfer), so that a bad batch leaves the accumulator as it was.
  detail::check_activations_finite(x, n_tokens, k_, label);
  const int64_t total = n_ + n_tokens;
  const double scale = std::sqrt(2.0 / static_cast<double>(total));
  double beta = static_cast<double>(n_) / static_cast<double>(total);
  const int64_t chunk = std::min<int64_t>(n_tokens, std::max<int64_t>(1, kChunkBytes / (8 * k_)));
  Buf<float> xf(static_cast<size_t>(chunk * k_), "calibration activations");
  Buf<double> xd(static_cast<size_t>(chunk * k_), "fp64 calibration activations");
  for (int64_t t0 = 0; t0 < n_tokens; t0 += chunk) {
    const int64_t m = std::min(chunk, n_tokens - t0);
    cuda_ok(cudaMemcpy(xf.get(), x + t0 * k_, static_cast<size_t>(m * k_) * sizeof(float), cudaMemcpyHostToDevice),
            "upload calibration activations");
    ops::scale_to_double_kernel<<<blocks_for(m * k_), kThreads>>>(xf.get(), m * k_, scale, xd.get());
    cuda_ok(cudaGetLastError(), "fp64 conversion");
    syrk_accumulate(xd.get(), m, k_, beta, impl_->h.get());
    beta = 1.0;
  }
  cuda_ok(cudaDeviceSynchronize(), "Hessian accumulation");
  n_ = total;
}

void CudaHessianAccumulator::add_device(const float* x, int64_t n_tokens) {
  const std::string label = detail::hessian_label(name_);
  if (!detail::check_calibration_batch(x, n_tokens, n_, k_, label)) return;
  {
    Buf<unsigned long long> first(1, "non-finite search");
    const unsigned long long none = ~0ull;
    first.copy_from_host(&none, first.size(), "non-finite search");
    const int64_t n = n_tokens * k_;
    ops::first_non_finite_kernel<<<static_cast<unsigned>(std::min<int64_t>(blocks_for(n), 4096)), kThreads>>>(
        x, n, first.get());
    cuda_ok(cudaGetLastError(), "non-finite search");
    const unsigned long long at = first.download("non-finite search")[0];
    if (at != none) {
      float v = 0.0f;
      cuda_ok(cudaMemcpy(&v, x + at, sizeof(float), cudaMemcpyDeviceToHost), "read a non-finite activation");
      detail::fail_activation_not_finite(label, static_cast<int64_t>(at) / k_, static_cast<int64_t>(at) % k_, v);
    }
  }
  const int64_t total = n_ + n_tokens;
  const double scale = std::sqrt(2.0 / static_cast<double>(total));
  double beta = static_cast<double>(n_) / static_cast<double>(total);
  const int64_t chunk = std::min<int64_t>(n_tokens, std::max<int64_t>(1, kChunkBytes / (8 * k_)));
  Buf<double> xd(static_cast<size_t>(chunk * k_), "fp64 calibration activations");
  for (int64_t t0 = 0; t0 < n_tokens; t0 += chunk) {
    const int64_t m = std::min(chunk, n_tokens - t0);
    ops::scale_to_double_kernel<<<blocks_for(m * k_), kThreads>>>(x + t0 * k_, m * k_, scale, xd.get());
    cuda_ok(cudaGetLastError(), "fp64 conversion");
    syrk_accumulate(xd.get(), m, k_, beta, impl_->h.get());
    beta = 1.0;
  }
  cuda_ok(cudaDeviceSynchronize(), "Hessian accumulation");
  n_ = total;
}

std::vector<double> CudaHessianAccumulator::upper() const { return impl_->h.download("the Hessian"); }

const double* CudaHessianAccumulator::device_upper() const { return impl_->h.get(); }

namespace {

// U (fp32, [K, K], zeros below the diagonal) for the damped, permuted H, with the CPU's retry rule. Returns the
// damping used and the attempt index; fails (naming the tensor) when every attempt is not positive definite.
struct Factored {
  double damp;
  int attempt;
};
Factored factor(const double* h, const detail::GptqColumnPlan& plan, const Buf<int32_t>& perm, int64_t K,
                const GptqOptions& opt, const std::string& tensor_name, Buf<float>& u) {
  Handles& hd = handles();
  Buf<double> diag(static_cast<size_t>(K), "diag(H)");
  diag.copy_from_host(plan.diag.data(), diag.size(), "diag(H)");
  Buf<double> r(static_cast<size_t>(K * K), "the damped Hessian");
  Buf<double> r_diag(static_cast<size_t>(K), "the damped diagonal");
  Buf<int> info(2, "factorization status");  // [0]: cuSOLVER's info, [1]: the pivot check
  size_t dev_bytes = 0, host_bytes = 0, trtri_dev = 0, trtri_host = 0;
  // Column-major view: the row-major lower triangle of R is the upper one; the factor Uc (R = Ucᵀ·Uc) seen row-major
  // is quant/dense.h's lower L (R = L·Lᵀ), and trtri's Uc⁻¹ seen row-major is L⁻¹.
  cusolver_ok(cusolverDnXpotrf_bufferSize(hd.solver, hd.params, CUBLAS_FILL_MODE_UPPER, K, CUDA_R_64F, r.get(), K,
                                          CUDA_R_64F, &dev_bytes, &host_bytes),
              "potrf workspace query");
  cusolver_ok(cusolverDnXtrtri_bufferSize(hd.solver, CUBLAS_FILL_MODE_UPPER, CUBLAS_DIAG_NON_UNIT, K, CUDA_R_64F,
                                          r.get(), K, &trtri_dev, &trtri_host),
              "trtri workspace query");
  Buf<char> work(std::max<size_t>({dev_bytes, trtri_dev, 1}), "the factorization workspace");
  std::vector<char> host_work(std::max<size_t>({host_bytes, trtri_host, 1}));
  const dim3 grid(blocks_for(K), static_cast<unsigned>(std::min<int64_t>(K, 65535)));
  double damp = opt.damp_percent;
  for (int attempt = 0; attempt <= detail::kMaxDampRetries; ++attempt) {
    damp = detail::gptq_retry_damp(opt.damp_percent, attempt);
    ops::build_reversed_kernel<<<grid, kThreads>>>(h, diag.get(), perm.get(), damp * plan.mean_diag, K, r.get(),
                                                  r_diag.get());
    cuda_ok(cudaGetLastError(), "damped Hessian");
    info.fill_bytes(0, "clear factorization status");
    cusolver_ok(cusolverDnXpotrf(hd.solver, hd.params, CUBLAS_FILL_MODE_UPPER, K, CUDA_R_64F, r.get(), K, CUDA_R_64F,
                                 work.get(), work.size(), host_work.data(), host_work.size(), info.get()),
                "Cholesky factorization (potrf)");
    ops::check_pivots_kernel<<<blocks_for(K), kThreads>>>(r.get(), r_diag.get(), K, kMinRelativePivot,
                                                          info.get() + 1);
    cuda_ok(cudaGetLastError(), "pivot check");
    const std::vector<int> status = info.download("factorization status");
    if (status[0] != 0 || status[1] != 0) continue;
    cusolver_ok(cusolverDnXtrtri(hd.solver, CUBLAS_FILL_MODE_UPPER, CUBLAS_DIAG_NON_UNIT, K, CUDA_R_64F, r.get(), K,
                                 work.get(), work.size(), host_work.data(), host_work.size(), info.get()),
                "triangular inverse (trtri)");
    check(info.download("trtri status")[0] == 0, tensor_name, ": GPTQ on the GPU: the Cholesky factor is singular");
    ops::reversed_inverse_to_u_kernel<<<grid, kThreads>>>(r.get(), K, u.get());
    cuda_ok(cudaGetLastError(), "U conversion");
    return {damp, attempt};
  }
  detail::gptq_fail_not_positive_definite(tensor_name, damp);
}

void check_row_failures(const Buf<int32_t>& row_fail, const std::string& tensor_name) {
  const std::vector<int32_t> codes = row_fail.download("row status");
  const auto first = std::min_element(codes.begin(), codes.end());  // earliest block, then lowest row
  if (first == codes.end() || *first == ops::kNoFailure) return;
  const int64_t row = first - codes.begin();
  if (*first % 4 == ops::kFailScaleOverflow)
    fail(tensor_name, ": row ", row, ": an INT4 group scale overflows the FP16 scale type (weights too large; use ",
         "BF16 scales)");
  detail::gptq_fail_row_non_finite(tensor_name, row);
}

}  // namespace

GptqResult gptq_quantize_detailed_cuda(std::span<const float> w, int64_t rows, int64_t cols,
                                       const CudaHessianAccumulator& h, const GptqOptions& opt,
                                       const std::string& tensor_name, bool record_inputs) {
  detail::gptq_validate(w, rows, cols, h.k(), h.n_samples(), h.name(), opt, tensor_name);
  const int64_t N = rows, K = cols;
  const int64_t G = opt.spec.resolved_group(K, tensor_name);
  const int64_t n_groups = K / G;
  const bool act = opt.act_order;
  check(N <= INT_MAX, tensor_name, ": GPTQ on the GPU takes at most ", INT_MAX, " rows, got ", N);
  GptqResult res;
  g_timings = {};
  auto t0 = Clock::now();

  // diag(H): a strided copy of the diagonal; the plan (dead inputs, order, mean) is the CPU's, computed on the host.
  std::vector<double> h_diag(static_cast<size_t>(K));
  cuda_ok(cudaMemcpy2D(h_diag.data(), sizeof(double), h.device_upper(), (K + 1) * sizeof(double), sizeof(double),
                       static_cast<size_t>(K), cudaMemcpyDeviceToHost),
          "download diag(H)");
  const detail::GptqColumnPlan plan = detail::gptq_plan_columns(h_diag, act);
  res.stats.dead_inputs = static_cast<int64_t>(plan.dead.size());
  std::vector<int32_t> perm_host(plan.perm.begin(), plan.perm.end());
  Buf<int32_t> perm(static_cast<size_t>(K), "the column order");
  perm.copy_from_host(perm_host.data(), perm.size(), "the column order");

  Buf<float> W(static_cast<size_t>(N * K), "the weight");
  W.copy_from_host(w.data(), W.size(), "the weight");
  if (!plan.dead.empty()) {
    std::vector<int32_t> dead(plan.dead.begin(), plan.dead.end());
    Buf<int32_t> dead_dev(dead.size(), "dead inputs");
    dead_dev.copy_from_host(dead.data(), dead_dev.size(), "dead inputs");
    const int64_t n = N * static_cast<int64_t>(dead.size());
    ops::zero_columns_kernel<<<blocks_for(n), kThreads>>>(W.get(), N, K, dead_dev.get(), static_cast<int>(dead.size()));
    cuda_ok(cudaGetLastError(), "zero dead inputs");
    cuda_ok(cudaDeviceSynchronize(), "zero dead inputs");
  }

  const bool bf16 = opt.spec.scale_type == formats::ScaleType::BF16;
  const bool sym = opt.spec.symmetric;
  Buf<uint16_t> scale_bits(static_cast<size_t>(N * n_groups), "INT4 scales");
  Buf<uint8_t> zeros(sym ? 0 : static_cast<size_t>(N * n_groups), "INT4 zero-points");
  Buf<int32_t> row_fail(static_cast<size_t>(N), "row status");
  row_fail.fill_bytes(0x7f, "clear row status");
  // Outputs start as 0xFF bytes (NaN scales, nibbles > 15): a value the kernels fail to write shows in the result.
  scale_bits.fill_bytes(0xff, "poison the scales");
  zeros.fill_bytes(0xff, "poison the zero-points");
  if (act) {
    // Static groups from the original (dead-zeroed) weights, then the columns in quantisation order.
    const int64_t pairs = N * n_groups;
    ops::static_params_kernel<<<static_cast<unsigned>((pairs * 32 + kThreads - 1) / kThreads), kThreads>>>(
        W.get(), N, K, G, static_cast<int>(n_groups), sym, bf16, scale_bits.get(), zeros.get(), row_fail.get());
    cuda_ok(cudaGetLastError(), "static group params");
    check_row_failures(row_fail, tensor_name);
    if (record_inputs) res.group_inputs = W.download("the weight");
    Buf<float> Wp(W.size(), "the permuted weight");
    ops::permute_columns_kernel<<<blocks_for(N * K), kThreads>>>(W.get(), Wp.get(), N, K, perm.get());
    cuda_ok(cudaGetLastError(), "column permutation");
    W = std::move(Wp);
  }
  g_timings.prepare_s = seconds_since(t0);

  t0 = Clock::now();
  Buf<float> U(static_cast<size_t>(K * K), "U");
  const Factored f = factor(h.device_upper(), plan, perm, K, opt, tensor_name, U);
  res.stats.damp_percent = f.damp;
  res.stats.damp_retries = f.attempt;
  g_timings.factor_s = seconds_since(t0);

  t0 = Clock::now();
  const int64_t B = detail::gptq_effective_block(std::min<int64_t>(opt.block_size, ops::kMaxBlock), G, K);
  Buf<float> err(static_cast<size_t>(N * B), "the block errors");
  Buf<uint8_t> nibbles(static_cast<size_t>(N * K), "the nibbles");
  Buf<double> row_loss(static_cast<size_t>(N), "the row losses");
  row_loss.fill_bytes(0, "clear the row losses");
  Buf<float> rounded(record_inputs ? static_cast<size_t>(N * K) : 0, "the rounded inputs");
  Buf<float> group_inputs(record_inputs && !act ? static_cast<size_t>(N * K) : 0, "the group inputs");
  nibbles.fill_bytes(0xff, "poison the nibbles");
  rounded.fill_bytes(0xff, "poison the rounded inputs");
  group_inputs.fill_bytes(0xff, "poison the group inputs");
  const size_t smem = static_cast<size_t>(B * B) * sizeof(float);
  cuda_ok(cudaFuncSetAttribute(ops::block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "block kernel shared memory");
  ops::BlockArgs a{};
  a.w = W.get();
  a.u = U.get();
  a.perm = perm.get();
  a.scale_bits = scale_bits.get();
  a.zeros = zeros.get();
  a.err = err.get();
  a.nibbles = nibbles.get();
  a.row_loss = row_loss.get();
  a.row_fail = row_fail.get();
  a.rounded = rounded.get();
  a.group_inputs = group_inputs.get();
  a.N = N;
  a.K = K;
  a.G = G;
  a.n_groups = static_cast<int>(n_groups);
  a.act = act;
  a.symmetric = sym;
  a.bf16 = bf16;
  const unsigned ctas = static_cast<unsigned>((N + ops::kRowsPerCta - 1) / ops::kRowsPerCta);
  const float minus_one = -1.0f, one = 1.0f;
  for (int64_t i1 = 0, block = 0; i1 < K; i1 += B, ++block) {
    const int64_t i2 = std::min(i1 + B, K);
    a.i1 = i1;
    a.b = static_cast<int>(i2 - i1);
    a.block_index = static_cast<int>(block);
    ops::block_kernel<<<ctas, ops::kRowsPerCta * 32, static_cast<size_t>(a.b * a.b) * sizeof(float)>>>(a);
    cuda_ok(cudaGetLastError(), "GPTQ block kernel");
    if (i2 < K) {
      // W[:, i2:] −= Err[N, b] · U[i1:i2, i2:], row-major; column-major that is W'ᵀ −= U'ᵀ · Errᵀ with every operand
      // read in place (ld K for W and U, b for Err).
      cublas_ok(cublasSgemm(handles().blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(K - i2), static_cast<int>(N),
                            a.b, &minus_one, U.get() + i1 * K + i2, static_cast<int>(K), err.get(), a.b, &one,
                            W.get() + i2, static_cast<int>(K)),
                "lazy update (SGEMM)");
    }
  }
  check_row_failures(row_fail, tensor_name);
  g_timings.quantize_s = seconds_since(t0);

  t0 = Clock::now();
  formats::Int4Weight& q = res.weight;
  q.rows = N;
  q.cols = K;
  q.spec = opt.spec;
  q.group = G;
  {
    Buf<uint8_t> packed(static_cast<size_t>(N * K / 2), "the packed weight");
    ops::pack_kernel<<<blocks_for(N * K / 2), kThreads>>>(nibbles.get(), N * K / 2, packed.get());
    cuda_ok(cudaGetLastError(), "packing");
    q.qweight = packed.download("the packed weight");
  }
  q.scales = scale_bits.download("the scales");
  if (!sym) q.zeros = zeros.download("the zero-points");
  const std::vector<double> losses = row_loss.download("the row losses");
  res.stats.loss = std::accumulate(losses.begin(), losses.end(), 0.0);
  if (record_inputs) {
    res.rounded_inputs = rounded.download("the rounded inputs");
    if (!act) res.group_inputs = group_inputs.download("the group inputs");
  }
  g_timings.finish_s = seconds_since(t0);
  return res;
}

GptqCudaTimings gptq_cuda_last_timings() { return g_timings; }

}  // namespace futransformer::quant
