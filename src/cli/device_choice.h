// --device handling shared by the subcommands.
#pragma once

#include <memory>
#include <string>

#include "futransformer/engine.h"
#include "futransformer/reference_engine.h"

namespace futransformer::cli {

enum class Backend { Cpu, Cuda };

// "cpu" | "cuda" | "auto". cuda fails with a clear message when no usable Hopper GPU or CUDA engine exists.
Backend choose_backend(const std::string& device);
const char* backend_name(Backend b);
// options: the recipe's activation/KV formats (the reference engine applies them).
std::unique_ptr<Engine> make_engine(Backend b, const Model& model, const ReferenceOptions& options = {});

}  // namespace futransformer::cli
