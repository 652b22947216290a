// Host-side harness shared by the CUDA benchmarks (bench/*.cu): error checks, event timing, device and clock
// queries, argument parsing and the common part of the JSON report. Header-only because CMake builds every
// bench/*.cu as its own executable.
//
// A bench that wants the launcher's last error message next to a failed CUDA call defines, before including:
//   #define FT_BENCH_LAST_ERROR() futransformer::cuda::gemm_w4a16_last_error()
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#ifndef FT_BENCH_LAST_ERROR
#define FT_BENCH_LAST_ERROR() ""
#endif

#define CHECK_CUDA(call)                                                                              \
  do {                                                                                                \
    const cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_), \
                   FT_BENCH_LAST_ERROR());                                                            \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)
// Expands only where cublasLt.h is included (the macro names its types, the header does not need them).
#define CHECK_CUBLAS(call)                                                                                    \
  do {                                                                                                        \
    const cublasStatus_t s_ = (call);                                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #call, static_cast<int>(s_)); \
      std::exit(1);                                                                                           \
    }                                                                                                         \
  } while (0)

namespace futransformer::bench {

inline double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Times `launch(i)` for i = 0..iters-1, one event pair per launch (no synchronisation between launches, so the
// device queue stays full); returns the median in microseconds.
template <typename F>
double time_median_us(int iters, cudaStream_t stream, F launch) {
  for (int i = 0; i < 5; ++i) launch(i);
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(iters));
  for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(ev[2 * i], stream));
    launch(i);
    CHECK_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) CHECK_CUDA(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) CHECK_CUDA(cudaEventDestroy(e));
  return median(ms) * 1000.0;
}

// A buffer twice the L2: a memset over it before a timed launch leaves none of the launch's inputs in the L2.
class L2Flush {
 public:
  explicit L2Flush(int l2_bytes) : bytes_(2 * static_cast<size_t>(l2_bytes)) { CHECK_CUDA(cudaMalloc(&buf_, bytes_)); }
  ~L2Flush() { cudaFree(buf_); }
  L2Flush(const L2Flush&) = delete;
  L2Flush& operator=(const L2Flush&) = delete;
  // A different fill value each time so the memset cannot be skipped as a no-op.
  void flush(cudaStream_t stream, int i) const { CHECK_CUDA(cudaMemsetAsync(buf_, i & 0xFF, bytes_, stream)); }

 private:
  size_t bytes_;
  void* buf_ = nullptr;
};

// Times `launch()` `iters` times after warm-up, flushing the L2 before each (outside the timed interval) and
// waiting for each launch; returns the median in microseconds.
template <typename F>
double time_median_flushed_us(int iters, cudaStream_t stream, const L2Flush& l2, F launch) {
  for (int i = 0; i < 3; ++i) launch();
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    l2.flush(stream, i);
    CHECK_CUDA(cudaEventRecord(e0, stream));
    launch();
    CHECK_CUDA(cudaEventRecord(e1, stream));
    CHECK_CUDA(cudaEventSynchronize(e1));
    CHECK_CUDA(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], e0, e1));
  }
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  return median(ms) * 1000.0;
}

// A well-mixed 32-bit hash of an index and a salt (bench inputs without a host round trip).
__device__ __forceinline__ uint32_t hash_index(size_t i, uint32_t salt) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ salt;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return h;
}

// Fills n floats with a spread of values (a hash of the index and salt, scaled to about ±8), so exp sees realistic
// exponents and a row's largest entry sits anywhere in it.
__global__ inline void fill_spread_f32_kernel(float* x, size_t n, uint32_t salt) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] = (static_cast<float>(hash_index(i, salt) & 0xFFFF) / 65535.0f - 0.5f) * 16.0f;
}

// Roofline: device-to-device copy of 1 GiB (bytes read + written over time), in TB/s.
inline double device_copy_tbps(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  CHECK_CUDA(cudaMemsetAsync(src, 1, bytes, stream));
  const double us = time_median_us(
      20, stream, [&](int) { CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)); });
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  return 2.0 * bytes / (us * 1e-6) / 1e12;
}

struct DeviceInfo {
  int dev = 0;
  cudaDeviceProp prop{};
  int clock_khz = 0;  // maximum SM clock
  int l2_bytes = 0;
};

inline DeviceInfo query_device() {
  DeviceInfo d;
  CHECK_CUDA(cudaGetDevice(&d.dev));
  CHECK_CUDA(cudaGetDeviceProperties(&d.prop, d.dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&d.clock_khz, cudaDevAttrClockRate, d.dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, d.dev));
  return d;
}

// Prints "NAME, N SMs, L2 N MB, max SM clock N MHz" without a newline: each bench completes the line.
inline void print_device_summary(const DeviceInfo& d) {
  std::printf("%s, %d SMs, L2 %d MB, max SM clock %d MHz", d.prop.name, d.prop.multiProcessorCount, d.l2_bytes >> 20,
              d.clock_khz / 1000);
}

// Current SM clock through NVML when the driver library is present (dlopen: no link-time dependency); -1 if not.
inline int nvml_sm_clock_mhz(int device) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) return -1;
  using InitFn = int (*)();
  using HandleFn = int (*)(const char*, void**);
  using ClockFn = int (*)(void*, int, unsigned*);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
  auto handle = reinterpret_cast<HandleFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto clock = reinterpret_cast<ClockFn>(dlsym(lib, "nvmlDeviceGetClockInfo"));
  char bus[32] = {};
  void* h = nullptr;
  unsigned mhz = 0;
  int result = -1;
  if (init && handle && clock && init() == 0 && cudaDeviceGetPCIBusId(bus, sizeof(bus), device) == cudaSuccess &&
      handle(bus, &h) == 0 && clock(h, /*NVML_CLOCK_SM*/ 1, &mhz) == 0)
    result = static_cast<int>(mhz);
  dlclose(lib);
  return result;
}

// The SM clock after the runs shows whether the device throttled; printed when NVML answers.
inline int report_sm_clock_after_runs(int device) {
  const int mhz = nvml_sm_clock_mhz(device);
  if (mhz > 0) std::printf("SM clock after the runs (NVML): %d MHz\n", mhz);
  return mhz;
}

struct Args {
  std::string json_path;
  int iters = 0;
  bool flag = false;  // the bench's optional extra flag (e.g. --probe)
};

// [--json PATH] [--iters N] [extra_flag]; iters is raised to min_iters. Exits with status 2 and the usage on
// anything else.
inline Args parse_args(int argc, char** argv, int default_iters, int min_iters, const char* extra_flag = nullptr) {
  Args args;
  args.iters = default_iters;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      args.json_path = argv[++i];
    } else if (extra_flag && a == extra_flag) {
      args.flag = true;
    } else if (a == "--iters" && i + 1 < argc) {
      args.iters = std::max(min_iters, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--iters N (>= %d)]%s%s%s\n", argv[0], min_iters,
                   extra_flag ? " [" : "", extra_flag ? extra_flag : "", extra_flag ? "]" : "");
      std::exit(2);
    }
  }
  return args;
}

// "1,8,32" -> {"1", "8", "32"} (command-line lists).
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) out.push_back(t);
  return out;
}

inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o;
}

// -DFT_GIT_COMMIT=... at build time, else the FT_GIT_COMMIT environment variable, else "unknown".
inline std::string git_commit() {
#ifdef FT_GIT_COMMIT
  return FT_GIT_COMMIT;
#else
  const char* env_commit = std::getenv("FT_GIT_COMMIT");
  return env_commit ? env_commit : "unknown";
#endif
}

inline std::string utc_date() {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return date;
}

// Writes {"benchmark", "gpu", "sm_count", "sm_clock_max_mhz", "sm_clock_nvml_mhz", ["copy_bandwidth_tbps",]
// "git_commit", "date", <extra(f): the bench's own fields, each line "  \"key\": value,\n">, "rows": [row(f, i)...]}
// to `path` and says so on stdout; false (after a message) when the file cannot be written.
template <typename Extra, typename RowFn>
bool write_json(const std::string& path, const char* benchmark, const DeviceInfo& d, int sm_mhz_now,
                std::optional<double> copy_tbps, Extra extra, size_t n_rows, RowFn row) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  std::fprintf(f,
               "{\n  \"benchmark\": \"%s\",\n  \"gpu\": \"%s\",\n  \"sm_count\": %d,\n"
               "  \"sm_clock_max_mhz\": %d,\n  \"sm_clock_nvml_mhz\": %d,\n",
               benchmark, json_escape(d.prop.name).c_str(), d.prop.multiProcessorCount, d.clock_khz / 1000,
               sm_mhz_now);
  if (copy_tbps) std::fprintf(f, "  \"copy_bandwidth_tbps\": %.4f,\n", *copy_tbps);
  std::fprintf(f, "  \"git_commit\": \"%s\",\n  \"date\": \"%s\",\n", json_escape(git_commit()).c_str(),
               utc_date().c_str());
  extra(f);
  std::fprintf(f, "  \"rows\": [\n");
  for (size_t i = 0; i < n_rows; ++i) {
    row(f, i);
    std::fprintf(f, "%s\n", i + 1 < n_rows ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
  std::printf("wrote %s\n", path.c_str());
  return true;
}

}  // namespace futransformer::bench
