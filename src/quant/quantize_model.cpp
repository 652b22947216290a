// quantize_model: the recipe's weight format applied to every projection (RTN, FP8, or sequential GPTQ over the
// model's layers, whose calibration forward runs on the reference engine or on the GPU), and the recipe JSON that
// records how.
#include "futransformer/quant/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "core/sha256.h"
#include "futransformer/error.h"
#include "futransformer/mapped_file.h"
#include "futransformer/device.h"
#include "futransformer/quant/gptq.h"
#include "quant/calibration_forward.h"
#include "quant/gptq_backend.h"
#include "ref/kv_cache.h"
#include "ref/ref_model.h"

namespace futransformer::quant {
namespace {

using nlohmann::json;
using ref::Projection;
using ref::ProjectionInput;

constexpr ProjectionInput kInputs[] = {ProjectionInput::Qkv, ProjectionInput::O, ProjectionInput::GateUp,
                                       ProjectionInput::Down};
// Calibration texts are books, not corpora: a larger file is a wrong path.
constexpr size_t kMaxCalibrationBytes = size_t{1} << 30;

const char* scale_type_name(formats::ScaleType t) { return t == formats::ScaleType::F16 ? "f16" : "bf16"; }

const char* weight_format_name(WeightFormat w) {
  switch (w) {
    case WeightFormat::Full: return "full";
    case WeightFormat::Fp8: return "fp8";
    case WeightFormat::Int4Rtn: return "int4-rtn";
    case WeightFormat::Int4Gptq: return "int4-gptq";
  }
  return "?";
}

bool is_int4(WeightFormat w) { return w == WeightFormat::Int4Rtn || w == WeightFormat::Int4Gptq; }

std::vector<int64_t> shape_of(int64_t rows, int64_t cols) { return {rows, cols}; }

// The head-int4 head's source: lm_head.weight, or the embedding when tied (whose lookup stays full precision).
const char* head_source_tensor(const Model& model) {
  return model.config.tie_word_embeddings ? "model.embed_tokens.weight" : kLmHeadTensor;
}

// Fails before any work when an INT4 group does not divide a projection's input size (naming the tensor), or no
// head-int4 group divides the hidden size.
void check_projection_shapes(const Model& model, const PrecisionRecipe& r) {
  if (r.head == HeadFormat::Int4)
    head_int4_spec(model.config.hidden_size, model.source + ": LM head (" + head_source_tensor(model) + ")");
  if (!is_int4(r.weights)) return;
  for (int64_t i = 0; i < model.config.num_hidden_layers; ++i) {
    for (int j = 0; j < ref::kNumProjections; ++j) {
      const std::string name = ref::projection_tensor_name(i, static_cast<Projection>(j));
      const Tensor& t = model.get(name);
      r.int4.resolved_group(t.shape.at(1), model.source + ": tensor '" + name + "'");
    }
  }
}

json base_recipe_json(const Model& model, const QuantizeOptions& o) {
  const PrecisionRecipe& r = o.recipe;
  json w = {{"format", weight_format_name(r.weights)}};
  if (is_int4(r.weights)) {
    w["group_size"] = r.int4.group_size == 0 ? json("per-channel") : json(r.int4.group_size);
    w["symmetric"] = r.int4.symmetric;
    w["scale_type"] = scale_type_name(r.int4.scale_type);
  } else if (r.weights == WeightFormat::Fp8) {
    w["encoding"] = "e4m3fn";
    w["scales"] = "fp32 per output channel (amax / 448)";
  }
  return json{
      {"format", "futransformer-quantized"},
      {"version", 1},
      {"recipe", r.name()},
      {"weights", w},
      {"activations", r.activations == ActivationFormat::Fp8PerToken ? "fp8-e4m3-per-token"
                     : r.activations == ActivationFormat::Bf16      ? "bf16"
                     : r.activations == ActivationFormat::Fp8OverBf16 ? "fp8-e4m3-per-token-over-bf16"
                     : r.activations == ActivationFormat::Fp8BlockOverBf16
                         ? "fp8-e4m3-per-token-over-bf16-down-per-128"
                                                                    : "fp32"},
      {"kv_cache", r.kv ? formats::kv_format_name(*r.kv) : "fp32"},
      {"lm_head", r.head == HeadFormat::Int4 ? json{{"format", "int4-rtn"},
                                                    {"group_size", head_int4_spec(model.config.hidden_size,
                                                                                  model.source).group_size},
                                                    {"symmetric", true},
                                                    {"scale_type", "bf16"},
                                                    {"source", head_source_tensor(model)}}
                                             : json("as stored")},
      {"source", {{"path", model.source}, {"format", model.format}}},
      {"quantised_tensors", "every model.layers.{i}.self_attn.{q,k,v,o}_proj.weight and mlp.{gate,up,down}_proj.weight"},
  };
}

json int4_tensor_json(const formats::Int4Weight& q, const char* method) {
  return {{"format", "int4"},     {"method", method},
          {"shape", shape_of(q.rows, q.cols)},
          {"group_size", q.group}, {"symmetric", q.spec.symmetric},
          {"scale_type", scale_type_name(q.spec.scale_type)}};
}

// Tensor names of the model in a stable order: the projections' formats plus every other tensor's dtype.
void record_other_tensors(const Model& model, json& tensors) {
  for (const auto& [name, t] : model.tensors) {
    if (is_quantised_projection(name)) continue;
    tensors[name] = {{"format", dtype_name(t.dtype)}, {"shape", t.shape}};
  }
}

void replace_with_dequantised(Model& m, const std::string& name, int64_t rows, int64_t cols, std::vector<float> v) {
  m.tensors[name] = Tensor::from_f32(name, shape_of(rows, cols), std::move(v));
}

// head-int4: the head (lm_head.weight, or the embedding of a tied model) rounded to nearest in head_int4_spec's
// format; its dequantised values become lm_head.weight, which a tied model did not have (its embedding stays).
void quantise_head(const Model& source, QuantizedModel& out, const QuantizeProgress& progress) {
  const ModelConfig& c = source.config;
  const std::string from = head_source_tensor(source);
  const std::string what = source.source + ": LM head (" + from + ")";
  const formats::Int4Spec spec = head_int4_spec(c.hidden_size, what);
  if (progress) progress("rtn lm_head", 0, 1);
  const Tensor& t = source.get(from, {c.vocab_size, c.hidden_size});
  formats::Int4Weight q = formats::int4_quantize_rtn(t.to_f32(), c.vocab_size, c.hidden_size, spec, what);
  replace_with_dequantised(out.model, kLmHeadTensor, q.rows, q.cols, formats::int4_dequantize(q));
  json record = int4_tensor_json(q, "rtn");
  record["source"] = from;
  out.recipe_json["tensors"][kLmHeadTensor] = std::move(record);
  out.int4.insert_or_assign(kLmHeadTensor, std::move(q));
  if (progress) progress("rtn lm_head", 1, 1);
}

void quantise_independently(const Model& source, QuantizedModel& out, const QuantizeProgress& progress) {
  const PrecisionRecipe& r = out.recipe;
  const int64_t layers = source.config.num_hidden_layers, total = layers * ref::kNumProjections;
  const char* stage = r.weights == WeightFormat::Fp8 ? "fp8" : "rtn";
  json& tensors = out.recipe_json["tensors"];
  int64_t done = 0;
  for (int64_t i = 0; i < layers; ++i) {
    for (int j = 0; j < ref::kNumProjections; ++j) {
      const std::string name = ref::projection_tensor_name(i, static_cast<Projection>(j));
      const Tensor& t = source.get(name);
      const int64_t rows = t.shape[0], cols = t.shape[1];
      const std::vector<float> w = t.to_f32();
      if (r.weights == WeightFormat::Fp8) {
        formats::Fp8Matrix q = formats::fp8_quantize_weight(w, rows, cols, source.source + ": tensor '" + name + "'");
        replace_with_dequantised(out.model, name, rows, cols, formats::fp8_dequantize(q));
        tensors[name] = {{"format", "fp8"}, {"shape", shape_of(rows, cols)}, {"scale", "fp32 per row"}};
        out.fp8.emplace(name, std::move(q));
      } else {
        formats::Int4Weight q =
            formats::int4_quantize_rtn(w, rows, cols, r.int4, source.source + ": tensor '" + name + "'");
        replace_with_dequantised(out.model, name, rows, cols, formats::int4_dequantize(q));
        tensors[name] = int4_tensor_json(q, "rtn");
        out.int4.emplace(name, std::move(q));
      }
      if (progress) progress(stage, ++done, total);
    }
  }
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One GPTQ pass's bookkeeping shared by both calibration forwards: each group's Hessian from its inputs, each
// projection quantised from it, its dequantised weights recorded in `out`, its stats in the recipe JSON and the
// layer's record, progress and timings.
struct GptqPass {
  GptqPass(const Model& s, QuantizedModel& o, GptqBackend& b, const GptqOptions& g, const QuantizeProgress& p)
      : source(s), out(o), backend(b), gopt(g), progress(p),
        total(s.config.num_hidden_layers * ref::kNumProjections) {}

  const Model& source;
  QuantizedModel& out;
  GptqBackend& backend;
  GptqOptions gopt;
  const QuantizeProgress& progress;
  int64_t done = 0, total = 0;
  json layer;
  double layer_loss = 0.0;

  void start_layer(int64_t i) {
    layer = {{"layer", i}, {"tensors", json::object()}};
    layer_loss = 0.0;
  }
  void set_inputs(int64_t li, ProjectionInput g, const float* x, int64_t n, int64_t k, bool on_device) {
    const auto t0 = Clock::now();
    const std::string name = "layer " + std::to_string(li) + " " + ref::projection_input_name(g) + " inputs";
    if (on_device) {
      backend.set_inputs_device(x, n, k, name);
    } else {
      backend.set_inputs(x, n, k, name);
    }
    out.timings.hessian_s += seconds_since(t0);
  }
  // GPTQ of projection p of layer li from weights w [rows, cols]; returns the dequantised weights.
  std::vector<float> quantize(int64_t li, Projection p, std::span<const float> w, int64_t rows, int64_t cols) {
    const auto t0 = Clock::now();
    const std::string name = ref::projection_tensor_name(li, p);
    GptqResult res = backend.quantize(w, rows, cols, gopt, source.source + ": tensor '" + name + "'");
    std::vector<float> deq = formats::int4_dequantize(res.weight);
    replace_with_dequantised(out.model, name, res.weight.rows, res.weight.cols, deq);
    json t = int4_tensor_json(res.weight, "gptq");
    t["gptq_loss"] = res.stats.loss;
    out.recipe_json["tensors"][name] = t;
    layer["tensors"][name] = {{"loss", res.stats.loss},
                              {"damp_percent", res.stats.damp_percent},
                              {"damp_retries", res.stats.damp_retries},
                              {"dead_inputs", res.stats.dead_inputs}};
    layer_loss += res.stats.loss;
    out.int4.emplace(name, std::move(res.weight));
    out.timings.gptq_s += seconds_since(t0);
    if (progress) progress("gptq", ++done, total);
    return deq;
  }
  json finish_layer() {
    layer["loss"] = layer_loss;
    return std::move(layer);
  }
};

// The CPU forward: the reference model (fp32 activations and cache: calibration measures the weights alone) over
// all windows, layer by layer.
void gptq_cpu_forward(const Model& source, const CalibrationSet& calib, int64_t rows, GptqPass& pass,
                      json& layer_stats) {
  const ModelConfig& c = source.config;
  const auto t0 = Clock::now();
  double hooks_s = 0.0;
  ref::RefModel model(source, {});
  std::vector<float> x(static_cast<size_t>(rows * c.hidden_size));
  std::vector<ref::SequenceRows> seqs;
  for (int64_t r0 = 0; const auto& w : calib.windows) {
    model.embed(w, &x[static_cast<size_t>(r0 * c.hidden_size)]);
    seqs.push_back({r0, static_cast<int64_t>(w.size()), 0, nullptr});
    r0 += static_cast<int64_t>(w.size());
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    pass.start_layer(i);
    auto hook = [&](int64_t li, ProjectionInput g, const float* in, int64_t n, int64_t k) {
      const auto h0 = Clock::now();
      pass.set_inputs(li, g, in, n, k, /*on_device=*/false);
      for (Projection p : ref::projections_of(g)) {
        const ref::RefLinear& lin = model.projection(li, p);
        model.set_projection_weights(li, p, pass.quantize(li, p, lin.weight(), lin.out_features(), lin.in_features()));
      }
      hooks_s += seconds_since(h0);
    };
    std::vector<std::unique_ptr<ref::KvStore>> caches;
    for (ref::SequenceRows& s : seqs) {
      caches.push_back(model.make_kv_store());
      s.kv = caches.back().get();
    }
    model.run_layer(i, x.data(), rows, seqs, hook);
    layer_stats.push_back(pass.finish_layer());
  }
  pass.out.timings.calibration_forward_s += seconds_since(t0) - hooks_s;
}

// The GPU forward (calibration_forward.h): activations stay on the device, each group's Hessian is accumulated from
// them in place, and only the layer being run has weights on the device.
void gptq_cuda_forward(const Model& source, const CalibrationSet& calib, GptqPass& pass, json& layer_stats) {
  std::vector<int64_t> lengths;
  for (const auto& w : calib.windows) lengths.push_back(static_cast<int64_t>(w.size()));
  CudaCalibrationForward fwd(source, std::move(lengths));
  const auto t0 = Clock::now();
  fwd.embed(calib.windows);
  const double embed_s = seconds_since(t0);
  for (int64_t i = 0; i < source.config.num_hidden_layers; ++i) {
    pass.start_layer(i);
    auto hook = [&](int64_t li, ProjectionInput g, const float* in, int64_t n, int64_t k) {
      pass.set_inputs(li, g, in, n, k, /*on_device=*/true);
      for (Projection p : ref::projections_of(g)) {
        const Tensor& t = source.get(ref::projection_tensor_name(li, p));
        fwd.set_projection_weights(li, p, pass.quantize(li, p, fwd.projection(li, p), t.shape[0], t.shape[1]));
      }
    };
    fwd.run_layer(i, hook);
    layer_stats.push_back(pass.finish_layer());
  }
  pass.out.timings.calibration_forward_s += embed_s + fwd.forward_seconds();
  pass.out.timings.weight_load_s += fwd.upload_seconds();
}

// Sequential GPTQ: the calibration windows go through the model layer by layer; inside layer i the hook quantises
// each projection group from the inputs it is about to see (produced by the quantised groups and layers before it)
// and swaps the dequantised weights in, so the layer's output — the next layer's input — is the quantised layer's.
void quantise_gptq(const Model& source, const CalibrationSet& calib, const QuantizeOptions& o, QuantizedModel& out,
                   const QuantizeProgress& progress) {
  const ModelConfig& c = source.config;
  check(!calib.windows.empty(), source.source, ": GPTQ needs calibration windows, got none");
  int64_t rows = 0;
  for (const auto& w : calib.windows) {
    check(!w.empty(), calib.source, ": an empty calibration window");
    check(static_cast<int64_t>(w.size()) <= c.max_position_embeddings, calib.source, ": calibration window of ",
          w.size(), " tokens is longer than the model's context (", c.max_position_embeddings,
          "); use fewer sample tokens");
    for (int32_t id : w)
      check(id >= 0 && id < c.vocab_size, calib.source, ": calibration token id ", id,
            " is outside the model's vocabulary [0, ", c.vocab_size, ")");
    rows += static_cast<int64_t>(w.size());
  }
  const GptqDevice forward_device = o.calibration_device.value_or(o.gptq_device);
  check(forward_device == GptqDevice::Cpu || o.gptq_device == GptqDevice::Cuda,
        "GPTQ: the calibration forward on the GPU needs GPTQ on the GPU too (its activations stay on the device); ",
        "got GPTQ on the CPU");

  GptqOptions gopt;
  gopt.spec = o.recipe.int4;
  gopt.damp_percent = o.damp_percent;
  gopt.block_size = o.block_size;
  gopt.act_order = o.act_order;
  const std::unique_ptr<GptqBackend> backend = make_gptq_backend(o.gptq_device);
  GptqPass pass(source, out, *backend, gopt, progress);
  json layer_stats = json::array();
  if (forward_device == GptqDevice::Cuda) {
    gptq_cuda_forward(source, calib, pass, layer_stats);
  } else {
    gptq_cpu_forward(source, calib, rows, pass, layer_stats);
  }
  int64_t sample_tokens = 0;
  for (const auto& w : calib.windows) sample_tokens = std::max<int64_t>(sample_tokens, static_cast<int64_t>(w.size()));
  out.recipe_json["gptq"] = {
      {"device", gptq_device_name(o.gptq_device)},
      {"calibration_forward", gptq_device_name(forward_device)},
      {"damp_percent", o.damp_percent},
      {"block_size", o.block_size},
      {"act_order", o.act_order},
      {"order", "sequential: layer by layer; inside a layer q/k/v (one Hessian), o, gate/up (one Hessian), down"},
      {"calibration",
       {{"source", calib.source},
        {"sha256", calib.sha256},
        {"samples", calib.windows.size()},
        {"sample_tokens", sample_tokens},
        {"tokens", rows},
        {"seed", o.seed}}},
      {"layers", std::move(layer_stats)},
  };
  if (o.gptq_device == GptqDevice::Cuda) out.recipe_json["gptq"]["device_name"] = query_device().name;
}

}  // namespace

std::string default_calibration_path() {
  const char* cache = std::getenv("FT_CACHE_DIR");
  if (cache && *cache) return std::string(cache) + "/calibration-devils-dictionary.txt";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/futransformer/calibration-devils-dictionary.txt";
}

CalibrationSet load_calibration(const Tokenizer& tokenizer, const QuantizeOptions& o) {
  const std::string path = o.calibration_path.empty() ? default_calibration_path() : o.calibration_path;
  check(o.samples > 0 && o.samples <= (int64_t{1} << 20), path, ": calibration samples ", o.samples,
        " must be in [1, 2^20]");
  check(o.sample_tokens > 1 && o.sample_tokens <= (int64_t{1} << 20), path, ": calibration sample tokens ",
        o.sample_tokens, " must be in [2, 2^20]");
  std::shared_ptr<MappedFile> file;
  try {
    file = MappedFile::open(path);
  } catch (const Error& e) {
    fail(path, ": cannot read the calibration text (", e.what(), ")",
         o.calibration_path.empty() ? "; run scripts/fetch_calibration.sh to create the default one" : "");
  }
  check(file->size() > 0, path, ": the calibration text is empty");
  check(file->size() <= kMaxCalibrationBytes, path, ": ", file->size(), " bytes is too large for a calibration text");
  const std::string_view text(reinterpret_cast<const char*>(file->data()), file->size());
  CalibrationSet set;
  set.source = path;
  set.sha256 = sha256_hex(file->data(), file->size());
  const std::vector<int32_t> ids = tokenizer.encode(text, /*parse_special=*/false);
  const bool bos = tokenizer.add_bos() && tokenizer.bos_id() >= 0;
  const int64_t body = o.sample_tokens - (bos ? 1 : 0);
  const int64_t n = static_cast<int64_t>(ids.size());
  check(n >= body, path, ": the calibration text has ", n, " tokens, fewer than one window of ", body,
        " (use fewer sample tokens or a longer text)");
  std::mt19937_64 rng(o.seed);
  const uint64_t choices = static_cast<uint64_t>(n - body + 1);
  for (int64_t s = 0; s < o.samples; ++s) {
    const int64_t off = static_cast<int64_t>(rng() % choices);
    std::vector<int32_t> w;
    w.reserve(static_cast<size_t>(o.sample_tokens));
    if (bos) w.push_back(tokenizer.bos_id());
    w.insert(w.end(), ids.begin() + off, ids.begin() + off + body);
    set.windows.push_back(std::move(w));
  }
  return set;
}

QuantizedModel quantize_model(const Model& model, const Tokenizer& tokenizer, const QuantizeOptions& options,
                              const QuantizeProgress& progress) {
  const auto t0 = Clock::now();
  CalibrationSet calib;
  if (options.recipe.weights == WeightFormat::Int4Gptq) {
    model.validate();
    check_projection_shapes(model, options.recipe);
    if (progress) progress("calibration", 0, 1);
    calib = load_calibration(tokenizer, options);
    if (progress) progress("calibration", 1, 1);
  }
  const double text_s = seconds_since(t0);
  QuantizedModel out = quantize_model(model, calib, options, progress);
  out.timings.calibration_text_s = text_s;
  out.timings.total_s = seconds_since(t0);
  return out;
}

QuantizedModel quantize_model(const Model& model, const CalibrationSet& calibration, const QuantizeOptions& options,
                              const QuantizeProgress& progress) {
  const auto t0 = Clock::now();
  model.validate();
  check_projection_shapes(model, options.recipe);
  QuantizedModel out;
  out.model = model;
  out.recipe = options.recipe;
  out.recipe_json = base_recipe_json(model, options);
  out.recipe_json["tensors"] = json::object();
  switch (options.recipe.weights) {
    case WeightFormat::Full: break;
    case WeightFormat::Fp8:
    case WeightFormat::Int4Rtn: {
      const auto q0 = Clock::now();
      quantise_independently(model, out, progress);
      out.timings.gptq_s += seconds_since(q0);
      break;
    }
    case WeightFormat::Int4Gptq: quantise_gptq(model, calibration, options, out, progress); break;
  }
  record_other_tensors(model, out.recipe_json["tensors"]);
  if (options.recipe.weights == WeightFormat::Full) {
    for (const auto& [name, t] : model.tensors)
      if (is_quantised_projection(name)) out.recipe_json["tensors"][name] = {{"format", dtype_name(t.dtype)},
                                                                             {"shape", t.shape}};
  }
  if (options.recipe.head == HeadFormat::Int4) {
    const auto q0 = Clock::now();
    quantise_head(model, out, progress);
    out.timings.gptq_s += seconds_since(q0);
  }
  out.timings.total_s = seconds_since(t0);
  return out;
}

ReferenceOptions reference_options(const PrecisionRecipe& recipe, int64_t max_sequence_length) {
  ReferenceOptions o;
  o.max_sequence_length = max_sequence_length;
  o.activations = recipe.activations;
  o.kv = recipe.kv;
  o.head = recipe.head;
  return o;
}

std::unique_ptr<Engine> make_reference_engine(const QuantizedModel& q, int64_t max_sequence_length) {
  return make_reference_engine(q.model, reference_options(q.recipe, max_sequence_length));
}

std::unique_ptr<Engine> make_prefill_decode_reference_engine(const QuantizedModel& prefill,
                                                             const QuantizedModel& decode,
                                                             int64_t max_sequence_length) {
  return futransformer::make_prefill_decode_reference_engine(
      prefill.model, reference_options(prefill.recipe, max_sequence_length), decode.model,
      reference_options(decode.recipe, max_sequence_length));
}

std::unique_ptr<Engine> make_reference_engine_for_recipe(const Model& model, const Tokenizer& tokenizer,
                                                         const PrecisionRecipe& recipe,
                                                         const QuantizeOptions& calibration,
                                                         int64_t max_sequence_length,
                                                         const QuantizeProgress& progress) {
  if (!recipe.quantises_weights())
    return make_reference_engine(model, reference_options(recipe, max_sequence_length));
  QuantizeOptions o = calibration;
  o.recipe = recipe;
  const QuantizedModel q = quantize_model(model, tokenizer, o, progress);
  return make_reference_engine(q, max_sequence_length);
}

}  // namespace futransformer::quant
