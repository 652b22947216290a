// One projection (or several fused along N) held on the GPU in the layout its GEMM reads: INT4 repacked for the
// W4A16 kernel, or BF16 row-major [N, K] for cuBLAS. y[M, N] = x[M, K] · Wᵀ with BF16 x.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cuda/engine/device_memory.h"
#include "futransformer/formats/int4.h"

struct __nv_bfloat16;

namespace futransformer::cuda {

struct GemmContext {
  cublasHandle_t cublas = nullptr;  // bound to `stream`, with its own workspace set
  void* workspace = nullptr;        // W4A16 split-K scratch
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

class DeviceLinear {
 public:
  enum class Kind { Int4, Bf16 };

  DeviceLinear() = default;
  // The parts' rows concatenated in order (same K, group and scale type; symmetric). Throws Error naming `name`
  // when the W4A16 kernel cannot run the fused shape.
  static DeviceLinear from_int4(std::span<const formats::Int4Weight* const> parts, const std::string& name);
  // BF16 bit patterns, row-major [N, K].
  static DeviceLinear from_bf16(const std::vector<uint16_t>& w, int64_t N, int64_t K, const std::string& name);
  // Another linear's BF16 storage (the tied LM head reads the embedding); `source` must outlive this.
  static DeviceLinear borrow_bf16(const uint16_t* device_w, int64_t N, int64_t K, const std::string& name);
  // Random weights generated on the device.
  static DeviceLinear synthetic_int4(int64_t N, int64_t K, int64_t group, uint64_t seed, const std::string& name);
  static DeviceLinear synthetic_bf16(int64_t N, int64_t K, uint64_t seed, const std::string& name);

  Kind kind() const { return kind_; }
  int64_t out_features() const { return N_; }
  int64_t in_features() const { return K_; }
  int64_t device_bytes() const { return static_cast<int64_t>(packed_.bytes() + scales_.bytes() + bf16_.bytes()); }
  // Split-K scratch the forward needs for any M up to max_rows.
  size_t workspace_bytes(int64_t max_rows) const;
  // y: BF16 [M, N], or fp32 when y_f32 (BF16 weights only). M >= 1; any M (INT4 runs 64 rows per launch).
  void forward(const __nv_bfloat16* x, int64_t M, void* y, bool y_f32, const GemmContext& ctx) const;

 private:
  Kind kind_ = Kind::Bf16;
  std::string name_;
  int64_t N_ = 0, K_ = 0, group_ = 0;
  formats::ScaleType scale_type_ = formats::ScaleType::F16;
  DeviceArray<uint32_t> packed_;
  DeviceArray<uint16_t> scales_;
  DeviceArray<uint16_t> bf16_;
  const uint16_t* bf16_ptr_ = nullptr;  // bf16_ or a borrowed buffer
};

}  // namespace futransformer::cuda
