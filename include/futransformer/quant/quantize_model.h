// Quantising a whole model to a PrecisionRecipe, quantised checkpoints on disk, and reference engines that run a
// recipe.
//
// Weights: every q/k/v/o/gate/up/down projection (is_quantised_projection) in the recipe's format — fp8 (one fp32
// scale per output channel), int4-rtn (round to nearest), int4-gptq (GPTQ, sequential over layers and, inside a
// layer, over the groups q/k/v → o → gate/up → down: each group's Hessian comes from the calibration activations
// produced by the already-quantised layers and groups before it). Embeddings and norms are kept as stored; the LM
// head too, unless the recipe has head-int4: then it is rounded to nearest in head_int4_spec's INT4 format (its
// source the embedding when tied) and stored as lm_head.weight (dequantised) and int4["lm_head.weight"] (packed).
// Activation and KV formats are not weights: they are applied by the engine (reference_options()).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "futransformer/engine.h"
#include "futransformer/formats/fp8.h"
#include "futransformer/formats/int4.h"
#include "futransformer/model.h"
#include "futransformer/quant/gptq.h"
#include "futransformer/recipe.h"
#include "futransformer/reference_engine.h"
#include "futransformer/tokenizer.h"

namespace futransformer::quant {

struct QuantizeOptions {
  PrecisionRecipe recipe;
  std::string calibration_path;  // GPTQ calibration text; "" = default_calibration_path()
  int64_t samples = 32;          // calibration windows
  int64_t sample_tokens = 512;   // tokens per window (BOS included when the tokenizer adds one)
  uint64_t seed = 0;             // picks the windows' offsets
  double damp_percent = 0.01;    // GPTQ damping (fraction of mean diag H)
  int64_t block_size = 128;      // GPTQ lazy-batch block
  // GPTQ descending-diag(H) column order with static groups (packed layout unchanged). On by default: on SmolLM2
  // without it GPTQ came out worse than RTN (docs/results.md), with it clearly better.
  bool act_order = true;
  // Where each projection group's Hessian and GPTQ run. Recorded in the recipe JSON as gptq.device.
  GptqDevice gptq_device = GptqDevice::Cpu;
  // Where the calibration forward runs (the layers producing each group's inputs): unset = on gptq_device. Cuda runs
  // it in fp32 on the GPU (src/quant/calibration_forward.h) and needs gptq_device Cuda (its activations never leave
  // the device); Cpu with gptq_device Cuda is the reference engine's forward feeding GPU GPTQ (for comparisons).
  // Recorded as gptq.calibration_forward.
  std::optional<GptqDevice> calibration_device;
};

// Wall-clock seconds of quantize_model's phases (0 for phases a recipe does not have).
struct QuantizeTimings {
  double calibration_text_s = 0;     // reading and tokenising the calibration text (the tokenizer overload)
  double weight_load_s = 0;          // GPU forward: each layer's weights converted to fp32 and uploaded
  double calibration_forward_s = 0;  // the layers' forward, hooks excluded (RefModel construction on the CPU path)
  double hessian_s = 0;              // Hessian accumulation of every projection group
  double gptq_s = 0;                 // GPTQ / RTN / FP8 of the projections (and the INT4 head), dequantised back
  double total_s = 0;                // the whole quantize_model call
};

// (stage, done, total): e.g. ("calibration", 0, 1), ("gptq", 7, 210), ("rtn", 3, 210).
using QuantizeProgress = std::function<void(const std::string& stage, int64_t done, int64_t total)>;

// GPTQ calibration data: windows of token ids and where they came from (recorded in the recipe JSON).
struct CalibrationSet {
  std::vector<std::vector<int32_t>> windows;  // each non-empty, all ids < the model's vocab
  std::string source;                         // the text's path (or a description, for ids made elsewhere)
  std::string sha256;                         // of the text's bytes; "" when not from a text
};

// $FT_CACHE_DIR/calibration-devils-dictionary.txt, default $HOME/.cache/futransformer/… (scripts/fetch_calibration.sh
// makes it: The Devil's Dictionary, public domain — never evaluation text).
std::string default_calibration_path();
// Reads options.calibration_path (or the default), tokenises it once and cuts options.samples windows of
// options.sample_tokens tokens at offsets drawn from a 64-bit Mersenne Twister seeded with options.seed (offset =
// draw mod (count − window + 1), so the same seed gives the same windows everywhere); BOS first when the tokenizer
// adds one. Errors name the file: missing (with the fetch script to run), empty, or too short for one window.
CalibrationSet load_calibration(const Tokenizer& tokenizer, const QuantizeOptions& options);

struct QuantizedModel {
  // The source model with every projection replaced by its dequantised fp32 values (what the reference engine
  // runs); all other tensors, the tokenizer and the config as in the source.
  Model model;
  // The canonical packed forms, by projection tensor name ("model.layers.0.self_attn.q_proj.weight"): int4 for
  // the int4 recipes, fp8 for fp8; both empty for "full" weights. head-int4 adds int4["lm_head.weight"] (also for
  // tied models, whose `model` then holds a dequantised lm_head.weight beside the embedding).
  std::map<std::string, formats::Int4Weight> int4;
  std::map<std::string, formats::Fp8Matrix> fp8;
  PrecisionRecipe recipe;
  // Everything about how it was made (docs/formats.md "Quantised checkpoint"): recipe, per-tensor formats, GPTQ
  // settings, calibration source + sha256 + samples × tokens, per-layer GPTQ loss.
  nlohmann::json recipe_json;
  // How long it took (not recorded in recipe_json, which stays deterministic).
  QuantizeTimings timings;
};

// Quantises `model`'s projections per options.recipe. GPTQ reads and tokenises the calibration text with
// `tokenizer` (load_calibration); the other recipes need no calibration. Errors (before any work) name the tensor
// whose input size the INT4 group does not divide.
QuantizedModel quantize_model(const Model& model, const Tokenizer& tokenizer, const QuantizeOptions& options,
                              const QuantizeProgress& progress = {});
// The same with calibration windows given directly (ignored unless the recipe is GPTQ).
QuantizedModel quantize_model(const Model& model, const CalibrationSet& calibration, const QuantizeOptions& options,
                              const QuantizeProgress& progress = {});

// The engine options that apply a recipe's activation, KV and head formats.
ReferenceOptions reference_options(const PrecisionRecipe& recipe, int64_t max_sequence_length = 0);
// A reference engine running the quantised model with its recipe's activation and KV formats.
std::unique_ptr<Engine> make_reference_engine(const QuantizedModel& quantized, int64_t max_sequence_length = 0);
// make_prefill_decode_reference_engine with each quantised model's recipe options (reference_options): prompts run
// `prefill` (e.g. fp8+act-fp8), single-token steps `decode` (e.g. int4-gptq-g128), over one cache. The two recipes'
// KV formats must agree.
std::unique_ptr<Engine> make_prefill_decode_reference_engine(const QuantizedModel& prefill,
                                                             const QuantizedModel& decode,
                                                             int64_t max_sequence_length = 0);
// Quantises `model` to `recipe` (calibration.recipe is ignored; its other fields drive GPTQ) and returns a
// reference engine for it. A recipe that quantises no weight (full weights, no head-int4) skips quantisation.
std::unique_ptr<Engine> make_reference_engine_for_recipe(const Model& model, const Tokenizer& tokenizer,
                                                         const PrecisionRecipe& recipe,
                                                         const QuantizeOptions& calibration,
                                                         int64_t max_sequence_length,
                                                         const QuantizeProgress& progress = {});

// Writes a quantised checkpoint directory (created if absent; existing files of the same names are replaced):
// config.json, model.safetensors (non-projection tensors as stored + packed projections), quantization.json, and
// the tokenizer: the model's tokenizer file copied (tokenizer.json / tokenizer.model), else `tokenizer_file`
// copied (as tokenizer.json when it is JSON, else tokenizer.model — the loader recognises its kind by content),
// else the GGUF vocabulary as tokenizer_data.json. Layout in docs/formats.md "Quantised checkpoint".
void write_quantized_checkpoint(const QuantizedModel& quantized, const std::string& dir,
                                const std::string& tokenizer_file = "");
// True when `path` is a directory holding quantization.json.
bool is_quantized_checkpoint(const std::string& path);
// Reads a quantised checkpoint; malformed files produce an Error naming the file and the tensor/field. The model
// has format "quantized" and dequantised projections, so load_model(dir) returns exactly this `.model`.
QuantizedModel load_quantized_checkpoint(const std::string& dir);

}  // namespace futransformer::quant
