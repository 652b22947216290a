// Programmatic dependent launch (sm_90+): lets a dependent kernel, launched with the programmatic stream
// serialization attribute, be scheduled before this one ends, hiding its launch latency.
#pragma once

namespace futransformer::cuda::ptx {

// griddepcontrol.launch_dependents: this CTA no longer holds back the dependent grid's launch.
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// griddepcontrol.wait: blocks until the prerequisite grids have completed and their writes are visible; a
// no-op for a kernel launched without the attribute.
__device__ __forceinline__ void griddepcontrol_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

}  // namespace futransformer::cuda::ptx
