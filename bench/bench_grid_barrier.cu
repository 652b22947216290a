// What a phase boundary costs on the device: a device-wide barrier inside one persistent kernel (one CTA per SM,
// cooperative launch, so every CTA is resident) against a kernel boundary between small kernels replayed from a CUDA
// graph, with and without programmatic dependent launch (the decode step's chain). Each decode layer is nine dependent
// kernels; docs/notes/decode-batch1-fixed-cost.md uses these numbers to ask whether one persistent kernel per layer
// would be cheaper (it would not: the boundary under programmatic launch is the cheaper of the two).
//
// Every phase carries a check that the boundary orders memory: thread 0 of CTA b writes a value for phase p, and
// after the boundary reads the one CTA b + 1 wrote; a wrong value counts an error and the bench fails.
//
//   bench_grid_barrier [--json PATH] [--iters N]
#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "cuda/ptx/griddep.cuh"

using namespace futransformer::bench;
namespace ptx = futransformer::cuda::ptx;

namespace {

constexpr int kThreads = 256;
constexpr int kPhases = 512;  // boundaries per timed launch (the persistent kernel) or per graph (the chain)

__device__ __forceinline__ unsigned phase_value(int p, int b) { return static_cast<unsigned>(p) * 4096u + b + 1u; }

// Thread 0 of CTA b: check the value CTA b + 1 wrote in phase p - 1, write this CTA's value of phase p (two buffers,
// so a value is overwritten only two boundaries after it was written).
__device__ __forceinline__ void check_and_write(unsigned* data, unsigned* errors, int p, int b, int grid) {
  if (p > 0) {
    const int nb = (b + 1) % grid;
    if (__ldcg(data + ((p - 1) & 1) * grid + nb) != phase_value(p - 1, nb)) atomicAdd(errors, 1u);
  }
  __stcg(data + (p & 1) * grid + b, phase_value(p, b));
}

// Device-wide barrier on a monotonic arrival counter: the CTA's writes are ordered before thread 0's release add, and
// thread 0's acquire loads order everything after it. Phase p waits for (p + 1) * grid arrivals.
__device__ __forceinline__ void grid_barrier(unsigned* arrivals, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(arrivals) : "memory");
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrivals) : "memory");
    } while (seen < target);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) persistent_kernel(unsigned* data, unsigned* errors, unsigned* arrivals,
                                                              int phases) {
  const int b = static_cast<int>(blockIdx.x), grid = static_cast<int>(gridDim.x);
  for (int p = 0; p < phases; ++p) {
    if (threadIdx.x == 0) check_and_write(data, errors, p, b, grid);
    grid_barrier(arrivals, static_cast<unsigned>(p + 1) * static_cast<unsigned>(grid));
  }
  if (threadIdx.x == 0 && phases > 0) check_and_write(data, errors, phases, b, grid);  // the last phase's values
}

// One phase as its own kernel. With programmatic launch the next kernel's CTAs start early and wait in
// griddepcontrol.wait, as the engine's decode kernels do.
__global__ void __launch_bounds__(kThreads) phase_kernel(unsigned* data, unsigned* errors, int p) {
  ptx::griddepcontrol_launch_dependents();
  ptx::griddepcontrol_wait();
  if (threadIdx.x == 0) check_and_write(data, errors, p, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
}

struct Row {
  std::string mechanism;
  int ctas, phases;
  double us_total, us_per_boundary;
  unsigned errors;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 20, 5);
  const DeviceInfo d = query_device();
  int coop = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, d.dev));
  if (!coop) {
    std::fprintf(stderr, "bench_grid_barrier: the device does not support cooperative launch\n");
    return 1;
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int sms = d.prop.multiProcessorCount;
  unsigned *data = nullptr, *errors = nullptr, *arrivals = nullptr;
  CHECK_CUDA(cudaMalloc(&data, 2 * sizeof(unsigned) * 2 * sms));
  CHECK_CUDA(cudaMalloc(&errors, sizeof(unsigned)));
  CHECK_CUDA(cudaMalloc(&arrivals, sizeof(unsigned)));
  CHECK_CUDA(cudaMemset(errors, 0, sizeof(unsigned)));
  std::vector<Row> rows;

  // Persistent kernel: kPhases barriers against none; the difference over kPhases is one barrier.
  for (int ctas : {sms, 2 * sms}) {
    int per_sm = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kThreads, 0));
    if (per_sm * sms < ctas) continue;
    auto launch = [&](int phases) {
      CHECK_CUDA(cudaMemsetAsync(arrivals, 0, sizeof(unsigned), stream));
      void* kargs[] = {&data, &errors, &arrivals, &phases};
      CHECK_CUDA(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(persistent_kernel), dim3(ctas),
                                             dim3(kThreads), kargs, 0, stream));
    };
    // The memset is inside both timings, so it cancels in the difference.
    const double with = time_median_us(args.iters, stream, [&](int) { launch(kPhases); });
    const double without = time_median_us(args.iters, stream, [&](int) { launch(0); });
    CHECK_CUDA(cudaMemset(errors, 0, sizeof(unsigned)));
    launch(kPhases);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    unsigned err = 0;
    CHECK_CUDA(cudaMemcpy(&err, errors, sizeof(unsigned), cudaMemcpyDeviceToHost));
    rows.push_back({"grid barrier in a persistent kernel", ctas, kPhases, with - without, (with - without) / kPhases,
                    err});
  }

  // Kernel chain in a CUDA graph: kPhases kernels of `sms` CTAs, captured with or without programmatic launch.
  for (bool pdl : {true, false}) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int p = 0; p <= kPhases; ++p) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(static_cast<unsigned>(sms));
      cfg.blockDim = dim3(kThreads);
      cfg.stream = stream;
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr.val.programmaticStreamSerializationAllowed = 1;
      if (pdl && p > 0) {
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
      }
      CHECK_CUDA(cudaLaunchKernelEx(&cfg, phase_kernel, data, errors, p));
    }
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaMemset(errors, 0, sizeof(unsigned)));
    const double us = time_median_us(args.iters, stream, [&](int) { CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
    CHECK_CUDA(cudaStreamSynchronize(stream));
    unsigned err = 0;
    CHECK_CUDA(cudaMemcpy(&err, errors, sizeof(unsigned), cudaMemcpyDeviceToHost));
    rows.push_back({pdl ? "kernel boundary, CUDA graph, programmatic launch" : "kernel boundary, CUDA graph",
                    sms, kPhases, us, us / (kPhases + 1), err});
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }

  print_device_summary(d);
  std::printf("; %d threads per CTA, %d boundaries per run, median of %d runs\n", kThreads, kPhases, args.iters);
  std::printf("| mechanism | CTAs | boundaries | µs total | µs per boundary | ordering errors |\n|---|---|---|---|---|---|\n");
  unsigned total_errors = 0;
  for (const Row& r : rows) {
    std::printf("| %s | %d | %d | %.1f | %.3f | %u |\n", r.mechanism.c_str(), r.ctas, r.phases, r.us_total,
                r.us_per_boundary, r.errors);
    total_errors += r.errors;
  }
  const int mhz = report_sm_clock_after_runs(d.dev);
  if (!args.json_path.empty()) {
    write_json(
        args.json_path, "grid_barrier", d, mhz, std::nullopt,
        [&](FILE* f) { std::fprintf(f, "  \"threads_per_cta\": %d,\n  \"timed_runs\": %d,\n", kThreads, args.iters); },
        rows.size(), [&](FILE* f, size_t i) {
          const Row& r = rows[i];
          std::fprintf(f,
                       "    {\"mechanism\": \"%s\", \"ctas\": %d, \"boundaries\": %d, \"us_total\": %.3f, "
                       "\"us_per_boundary\": %.4f, \"ordering_errors\": %u}",
                       r.mechanism.c_str(), r.ctas, r.phases, r.us_total, r.us_per_boundary, r.errors);
        });
  }
  CHECK_CUDA(cudaFree(data));
  CHECK_CUDA(cudaFree(errors));
  CHECK_CUDA(cudaFree(arrivals));
  CHECK_CUDA(cudaStreamDestroy(stream));
  if (total_errors) {
    std::fprintf(stderr, "bench_grid_barrier: %u ordering errors: a boundary did not order the phases' writes\n",
                 total_errors);
    return 1;
  }
  return 0;
}
