// Owning device allocations and CUDA status checks for host code (the engine, GPU GPTQ): every failure becomes one
// futransformer::Error naming what was being done.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "futransformer/error.h"

namespace futransformer::cuda {

inline void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) fail("CUDA engine: ", what, ": ", cudaGetErrorString(e));
}

// A CUDA call's failure as an Error naming what was being done (the owner's name is in `what`).
inline void cuda_status(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) fail(what, ": ", cudaGetErrorString(e));
}

// A typed device array (the engine's buffers, GPTQ's and the calibration forward's). Moves, never copies; freed
// on destruction.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n, const std::string& what) { allocate(n, what); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceArray() { release(); }

  void allocate(size_t n, const std::string& what) {
    release();
    if (n == 0) return;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, n * sizeof(T));
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail("cannot allocate ", static_cast<double>(n * sizeof(T)) / (1 << 20), " MiB of GPU memory for ", what, ": ",
           cudaGetErrorString(e));
    }
    p_ = static_cast<T*>(p);
    n_ = n;
  }
  void upload(const T* host, size_t n, const std::string& what) {
    allocate(n, what);
    if (n) cuda_status(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice), "upload " + what);
  }
  void upload(const std::vector<T>& host, const std::string& what) { upload(host.data(), host.size(), what); }
  // Into the existing allocation: n must equal size() (an Error naming `what` otherwise).
  void copy_from_host(const T* host, size_t n, const std::string& what) {
    check(n == n_, what, ": ", n, " values for a device array of ", n_);
    if (n) cuda_status(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice), "upload " + what);
  }
  // Every byte set to `byte` (nothing for an empty array).
  void fill_bytes(int byte, const std::string& what) {
    if (n_) cuda_status(cudaMemset(p_, byte, bytes()), what);
  }
  std::vector<T> download(const std::string& what) const {
    std::vector<T> h(n_);
    if (n_) cuda_status(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost), "download " + what);
    return h;
  }

  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  void release() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace futransformer::cuda
