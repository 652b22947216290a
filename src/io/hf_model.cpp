// load_hf_model: a Hugging Face Llama directory (config.json + model.safetensors or sharded safetensors with
// model.safetensors.index.json) into a Model whose tensors point into the memory-mapped files.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "futransformer/error.h"
#include "futransformer/io/hf.h"
#include "futransformer/io/safetensors.h"
#include "futransformer/mapped_file.h"
#include "futransformer/model.h"

namespace futransformer {
namespace {

using nlohmann::json;

// Config and index files are small; a multi-megabyte one is a wrong file, not a config.
constexpr size_t kMaxJsonFileBytes = 64u << 20;

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::shared_ptr<MappedFile> open_json_file(const std::string& path) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  check(file->size() <= kMaxJsonFileBytes, path, ": ", file->size(), " bytes is too large for a JSON file (limit ",
        kMaxJsonFileBytes, ")");
  return file;
}

// Shard names come from the index; they must name a file inside the model directory.
void check_shard_name(const std::string& shard, const std::string& index_path, const std::string& tensor) {
  check(!shard.empty() && shard != "." && shard != ".." && shard.find('/') == std::string::npos &&
            shard.find('\\') == std::string::npos && shard.find('\0') == std::string::npos,
        index_path, ": weight_map entry for tensor '", tensor, "' names shard '", shard,
        "', expected a file name inside the model directory");
}

class TensorCollector {
 public:
  explicit TensorCollector(Model& model) : model_(model) {}

  void add(Tensor t, const std::string& file) {
    // Some exporters save the RoPE frequency buffer; it is derived from the config, not a weight.
    if (ends_with(t.name, ".rotary_emb.inv_freq")) return;
    check(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16, file, ": tensor '", t.name,
          "' has dtype ", dtype_name(t.dtype), ", expected F32, F16 or BF16 weights");
    const std::string name = t.name;
    const bool inserted = model_.tensors.emplace(name, std::move(t)).second;
    check(inserted, file, ": tensor '", name, "' appears more than once in the checkpoint");
  }

 private:
  Model& model_;
};

void load_sharded(const std::string& dir, const std::string& index_path, TensorCollector& out) {
  const std::shared_ptr<MappedFile> file = open_json_file(index_path);
  json index;
  try {
    index = json::parse(file->data(), file->data() + file->size());
  } catch (const json::exception& e) {
    fail(index_path, ": not valid JSON: ", std::string(e.what()).substr(0, 300));
  }
  check(index.is_object(), index_path, ": is a JSON ", index.type_name(), ", expected an object");
  const auto map_it = index.find("weight_map");
  check(map_it != index.end() && map_it->is_object(), index_path, ": field 'weight_map' is missing or not an object");
  // Group tensors by shard so each shard is mapped and parsed once.
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [tensor, shard] : map_it->get_ref<const json::object_t&>()) {
    check(shard.is_string(), index_path, ": weight_map entry for tensor '", tensor, "' is a JSON ", shard.type_name(),
          ", expected a file name");
    const std::string& name = shard.get_ref<const std::string&>();
    check_shard_name(name, index_path, tensor);
    by_shard[name].push_back(tensor);
  }
  check(!by_shard.empty(), index_path, ": weight_map is empty");
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = dir + "/" + shard;
    check(is_file(shard_path), index_path, ": shard '", shard, "' (holding tensor '", names.front(),
          "') does not exist at ", shard_path);
    std::map<std::string, Tensor> in_shard;
    for (Tensor& t : load_safetensors(shard_path)) in_shard.emplace(t.name, std::move(t));
    for (const std::string& name : names) {
      auto it = in_shard.find(name);
      check(it != in_shard.end(), shard_path, ": tensor '", name, "' is listed in ", index_path,
            " but absent from this shard");
      out.add(std::move(it->second), shard_path);
    }
  }
}

// For a directory without config.json: "; it holds A.gguf, B.bin: pass the model file itself as --model ..." naming the
// .gguf / .bin files in it (sorted, at most three), or "" when it holds none.
std::string single_file_model_hint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string ext = it->path().extension().string();
    if ((ext == ".gguf" || ext == ".bin") && it->is_regular_file(ec)) found.push_back(it->path().filename().string());
  }
  if (found.empty()) return {};
  std::sort(found.begin(), found.end());
  std::string names;
  for (size_t i = 0; i < found.size() && i < 3; ++i) names += (i ? ", " : "") + found[i];
  if (found.size() > 3) names += " and " + std::to_string(found.size() - 3) + " more";
  return "; it holds " + names + ": pass the model file itself as --model (a llama2.c .bin with its tokenizer .bin as " +
         "--tokenizer)";
}

}  // namespace

Model load_hf_model(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  check(is_file(config_path), dir, ": not a Hugging Face model directory (", config_path, " not found)",
        single_file_model_hint(dir));
  Model model;
  model.source = dir;
  model.format = "hf";
  {
    const std::shared_ptr<MappedFile> file = open_json_file(config_path);
    model.config = parse_hf_config_text(
        std::string_view(reinterpret_cast<const char*>(file->data()), file->size()), config_path);
  }

  // Like transformers: a single model.safetensors takes precedence over an index.
  const std::string single_path = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  TensorCollector collector(model);
  if (is_file(single_path)) {
    for (Tensor& t : load_safetensors(single_path)) collector.add(std::move(t), single_path);
  } else if (is_file(index_path)) {
    load_sharded(dir, index_path, collector);
  } else {
    fail(dir, ": no weights (expected model.safetensors or model.safetensors.index.json)");
  }

  if (!model.config.tie_word_embeddings) {
    check(model.has("lm_head.weight"), dir, ": tie_word_embeddings is false in config.json but tensor ",
          "'lm_head.weight' is missing");
  }
  if (is_file(dir + "/tokenizer.json")) {
    model.tokenizer_path = dir + "/tokenizer.json";
  } else if (is_file(dir + "/tokenizer.model")) {
    model.tokenizer_path = dir + "/tokenizer.model";
  }
  model.validate();
  return model;
}

}  // namespace futransformer
