// PrecisionRecipe text form. Parsing is strict: every part must be known, each kind of part may appear once, and
// combinations no engine can run are refused with the reason (see recipe.h for the list).
#include "futransformer/recipe.h"

#include <array>
#include <cstring>
#include <vector>

#include "futransformer/error.h"

namespace futransformer {
namespace {

constexpr const char* kWeightChoices = "full, fp8, int4-rtn-g<G>, int4-gptq-g<G>";
constexpr const char* kGroupChoices = "g32, g64, g128 or gch (per-channel)";
constexpr const char* kPartChoices =
    "weights: full | fp8 | int4-rtn-g<G>[-asym][-bf16] | int4-gptq-g<G>[-asym][-bf16] (G: 32, 64, 128, ch); "
    "activations: act-fp8 | act-bf16 | act-fp8-bf16 | act-fp8-block-bf16; "
    "KV cache: kv-bf16 | kv-fp8 | kv-int4 | kv-int4-hadamard; LM head: head-int4";

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::vector<std::string_view> split_parts(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t plus = text.find('+', start);
    parts.push_back(text.substr(start, plus == std::string_view::npos ? std::string_view::npos : plus - start));
    if (plus == std::string_view::npos) break;
    start = plus + 1;
  }
  return parts;
}

// "g32" / "g64" / "g128" / "gch" followed by optional "-asym" and "-bf16" (in this order).
formats::Int4Spec parse_int4_suffix(std::string_view recipe, std::string_view part, std::string_view rest) {
  formats::Int4Spec spec;
  const size_t dash = rest.find('-');
  const std::string_view group = rest.substr(0, dash);
  if (group == "g32") {
    spec.group_size = 32;
  } else if (group == "g64") {
    spec.group_size = 64;
  } else if (group == "g128") {
    spec.group_size = 128;
  } else if (group == "gch") {
    spec.group_size = 0;
  } else {
    fail("recipe '", recipe, "': part '", part, "' has group size '", group, "'; valid group sizes: ", kGroupChoices);
  }
  std::string_view options = dash == std::string_view::npos ? std::string_view() : rest.substr(dash);
  if (starts_with(options, "-asym")) {
    spec.symmetric = false;
    options.remove_prefix(5);
  }
  if (starts_with(options, "-bf16")) {
    spec.scale_type = formats::ScaleType::BF16;
    options.remove_prefix(5);
  }
  check(options.empty(), "recipe '", recipe, "': part '", part, "' has unknown options '", options,
        "' (after the group size: optional -asym, then optional -bf16)");
  return spec;
}

const char* weight_part_name(WeightFormat w) {
  switch (w) {
    case WeightFormat::Full: return "full";
    case WeightFormat::Fp8: return "fp8";
    case WeightFormat::Int4Rtn: return "int4-rtn";
    case WeightFormat::Int4Gptq: return "int4-gptq";
  }
  return "?";
}

}  // namespace

std::string PrecisionRecipe::name() const {
  std::string s = weight_part_name(weights);
  if (weights == WeightFormat::Int4Rtn || weights == WeightFormat::Int4Gptq) {
    s += int4.group_size == 0 ? std::string("-gch") : "-g" + std::to_string(int4.group_size);
    if (!int4.symmetric) s += "-asym";
    if (int4.scale_type == formats::ScaleType::BF16) s += "-bf16";
  }
  if (head == HeadFormat::Int4) s += "+head-int4";
  if (activations == ActivationFormat::Fp8PerToken) s += "+act-fp8";
  if (activations == ActivationFormat::Bf16) s += "+act-bf16";
  if (activations == ActivationFormat::Fp8OverBf16) s += "+act-fp8-bf16";
  if (activations == ActivationFormat::Fp8BlockOverBf16) s += "+act-fp8-block-bf16";
  if (kv) s += std::string("+kv-") + formats::kv_format_name(*kv);
  return s;
}

PrecisionRecipe PrecisionRecipe::parse(std::string_view text) {
  check(!text.empty(), "empty precision recipe (parts joined by '+': ", kPartChoices, ")");
  PrecisionRecipe r;
  std::string_view weights_part, act_part, kv_part, head_part;  // the part that set each kind, for duplicates
  for (const std::string_view part : split_parts(text)) {
    check(!part.empty(), "recipe '", text, "': empty part (parts are joined by a single '+')");
    auto once = [&](std::string_view& slot, const char* kind) {
      check(slot.empty(), "recipe '", text, "': two ", kind, " formats ('", slot, "' and '", part,
            "'); a recipe gives at most one");
      slot = part;
    };
    if (part == "full") {
      once(weights_part, "weight");
      r.weights = WeightFormat::Full;
    } else if (part == "fp8") {
      once(weights_part, "weight");
      r.weights = WeightFormat::Fp8;
    } else if (starts_with(part, "fp8-")) {
      fail("recipe '", text, "': part '", part, "': fp8 weights take no group size or options (one fp32 scale per ",
           "output channel); write 'fp8'");
    } else if (starts_with(part, "int4-rtn-") || starts_with(part, "int4-gptq-")) {
      once(weights_part, "weight");
      const bool gptq = starts_with(part, "int4-gptq-");
      r.weights = gptq ? WeightFormat::Int4Gptq : WeightFormat::Int4Rtn;
      r.int4 = parse_int4_suffix(text, part, part.substr(gptq ? 10 : 9));
    } else if (part == "int4" || part == "int4-rtn" || part == "int4-gptq") {
      fail("recipe '", text, "': part '", part, "' needs a quantiser and a group size, e.g. int4-gptq-g128 ",
           "(weights: ", kWeightChoices, "; G: ", kGroupChoices, ")");
    } else if (part == "act-fp8") {
      once(act_part, "activation");
      r.activations = ActivationFormat::Fp8PerToken;
    } else if (part == "act-bf16") {
      once(act_part, "activation");
      r.activations = ActivationFormat::Bf16;
    } else if (part == "act-fp8-bf16") {
      once(act_part, "activation");
      r.activations = ActivationFormat::Fp8OverBf16;
    } else if (part == "act-fp8-block-bf16") {
      once(act_part, "activation");
      r.activations = ActivationFormat::Fp8BlockOverBf16;
    } else if (part == "head-int4") {
      once(head_part, "LM-head");
      r.head = HeadFormat::Int4;
    } else if (starts_with(part, "head-")) {
      fail("recipe '", text, "': part '", part, "': the LM head's only low-precision format is head-int4 (INT4 RTN, ",
           "symmetric, BF16 scales, group 128 or the largest of 64, 32 dividing the hidden size); leave the part out ",
           "for a full-precision head");
    } else if (starts_with(part, "kv-")) {
      once(kv_part, "KV-cache");
      try {
        r.kv = formats::parse_kv_format(part.substr(3));
      } catch (const Error& e) {
        fail("recipe '", text, "': part '", part, "': ", e.what());
      }
    } else {
      fail("recipe '", text, "': unknown part '", part, "' (", kPartChoices, ")");
    }
  }
  return r;
}

formats::Int4Spec head_int4_spec(int64_t hidden_size, const std::string& what) {
  formats::Int4Spec spec;
  spec.symmetric = true;
  spec.scale_type = formats::ScaleType::BF16;
  for (const int64_t g : {128, 64, 32}) {
    if (hidden_size > 0 && hidden_size % g == 0) {
      spec.group_size = g;
      return spec;
    }
  }
  fail(what, ": head-int4 needs a group of 128, 64 or 32 columns dividing the hidden size, which is ", hidden_size,
       "; run this model without head-int4");
}

bool is_quantised_projection(const std::string& name) {
  static constexpr std::string_view kPrefix = "model.layers.";
  if (!starts_with(name, kPrefix)) return false;
  size_t i = kPrefix.size();
  const size_t digits_begin = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  if (i == digits_begin || i >= name.size() || name[i] != '.') return false;
  static constexpr std::array<std::string_view, 7> kSuffixes = {
      "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
      "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
  const std::string_view rest = std::string_view(name).substr(i + 1);
  for (std::string_view s : kSuffixes)
    if (rest == s) return true;
  return false;
}

}  // namespace futransformer
