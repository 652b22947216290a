// Thread-block cluster primitives (sm_90): the cluster barrier and loads from another CTA's shared memory
// (distributed shared memory). Used by the W4A16 GEMM's split-K reduce inside a cluster (gemm_w4a16_cluster.cuh) and
// the decode attention's cluster combine (attention_decode.cuh).
#pragma once

#include <cstdint>

namespace futransformer::cuda::ptx {

// barrier.cluster.arrive.release + wait.acquire: every thread of every CTA of the cluster arrives, and the shared
// (and global) writes each made before arriving are visible to every thread after its wait. All threads of the CTA
// must execute it (the .aligned forms: the whole warp executes the same instruction).
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// %cluster_ctarank: this CTA's rank in its cluster (x fastest, then y, then z).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// mapa.shared::cluster: the shared::cluster address of the same shared-window offset in the CTA of rank `rank`.
__device__ __forceinline__ uint32_t map_shared_rank(uint32_t smem_addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr), "r"(rank));
  return r;
}

// ld.shared::cluster.v4.f32: four consecutive fp32 values (16-byte aligned) of any CTA of the cluster.
__device__ __forceinline__ float4 ld_shared_cluster_f4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// ld.shared::cluster.f32: one fp32 value of any CTA of the cluster.
__device__ __forceinline__ float ld_shared_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

}  // namespace futransformer::cuda::ptx
