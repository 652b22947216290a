// Test helper: restores the decode attention's plan knobs (forced split count, model, forced warps per CTA) to the
// environment's values when a test ends, also when an ASSERT leaves it early.
#pragma once

#include "cuda/attention_decode_heuristics.h"

namespace futransformer::test {

struct PlanKnobs {
  PlanKnobs() { cuda::attn::reset_plan_knobs(); }
  ~PlanKnobs() { cuda::attn::reset_plan_knobs(); }
  PlanKnobs(const PlanKnobs&) = delete;
  PlanKnobs& operator=(const PlanKnobs&) = delete;
};

}  // namespace futransformer::test
