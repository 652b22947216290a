// Test helpers for the decode attention's plan: PlanKnobs restores the knobs (forced split count, model, forced warps
// per CTA, cluster combine) to the environment's values when a test ends, also when an ASSERT leaves it early;
// this_device_limits() gives the limits attention_decode.cu plans with on the current device.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "cuda/attention_decode_heuristics.h"

namespace futransformer::test {

struct PlanKnobs {
  PlanKnobs() { cuda::attn::reset_plan_knobs(); }
  ~PlanKnobs() { cuda::attn::reset_plan_knobs(); }
  PlanKnobs(const PlanKnobs&) = delete;
  PlanKnobs& operator=(const PlanKnobs&) = delete;
};

inline cuda::attn::DeviceLimits this_device_limits() {
  int dev = 0, sms = 0, per_sm = 0, per_block = 0;
  EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), cudaSuccess);
  cuda::attn::DeviceLimits d;
  d.sm_count = sms;
  d.smem_per_sm = per_sm;
  d.smem_per_block = per_block;
  return d;
}

}  // namespace futransformer::test
