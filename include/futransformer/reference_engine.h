// The CPU reference engine: the standard Llama forward pass in plain fp32 math, the oracle the GPU engine is
// checked against. Weights are converted to fp32 once at construction.
#pragma once

#include <cstdint>
#include <memory>

#include "futransformer/engine.h"
#include "futransformer/model.h"

namespace futransformer {

struct ReferenceOptions {
  int64_t max_sequence_length = 0;  // 0: config.max_position_embeddings
};

// Validates the model (Model::validate) and copies its weights as fp32; the engine does not keep `model`.
// Throws Error on an invalid model or a negative max_sequence_length.
std::unique_ptr<Engine> make_reference_engine(const Model& model, const ReferenceOptions& options = {});

}  // namespace futransformer
