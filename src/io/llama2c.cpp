// Legacy llama2.c checkpoint: a header of 7 int32 followed by fp32 arrays in run.c's memory_map_weights order.
#include "futransformer/io/llama2c.h"

#include <cstring>
#include <filesystem>
#include <system_error>

#include "futransformer/error.h"
#include "futransformer/mapped_file.h"

namespace futransformer {
namespace {

constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
// export.py's versioned formats (version >= 1) start with this magic ("ak42" little-endian) instead of dim.
constexpr int32_t kVersionedMagic = 0x616b3432;
// Bounds the header fields so that a corrupt header is reported as such rather than as a size mismatch; real
// models are far below it (Llama-2-70B: dim 8192, hidden 28672, vocab 32000).
constexpr int64_t kMaxField = int64_t{1} << 20;

struct Header {
  int64_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
  bool shared_classifier;
};

Header read_header(const uint8_t* data, size_t size, const std::string& source) {
  check(size >= kHeaderBytes, source, ": truncated: expected at least ", kHeaderBytes,
        " bytes (the llama2.c header of 7 int32), file has ", size);
  int32_t raw[7];
  std::memcpy(raw, data, kHeaderBytes);
  check(raw[0] != kVersionedMagic, source, ": llama2.c versioned export (magic 'ak42', version ", raw[1],
        ") is not supported; only the legacy format (export.py --version 0) is");
  const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  int64_t v[7];
  for (int i = 0; i < 7; ++i) {
    v[i] = raw[i];
    // A negative vocab_size is llama2.c's flag for an unshared classifier; its magnitude is the vocabulary.
    if (i == 5 && v[i] < 0) v[i] = -v[i];
    check(v[i] > 0 && v[i] <= kMaxField, source, ": llama2.c header field '", names[i], "' = ", raw[i],
          ", expected ", i == 5 ? "a non-zero value with magnitude" : "a positive value", " <= ", kMaxField);
  }
  Header h{v[0], v[1], v[2], v[3], v[4], v[5], v[6], raw[5] > 0};
  check(h.dim % h.heads == 0, source, ": llama2.c header: dim ", h.dim, " is not divisible by n_heads ", h.heads);
  check(h.heads % h.kv_heads == 0, source, ": llama2.c header: n_heads ", h.heads,
        " is not a multiple of n_kv_heads ", h.kv_heads);
  check((h.dim / h.heads) % 2 == 0, source, ": llama2.c header: head size dim/n_heads = ", h.dim / h.heads,
        " is odd; RoPE rotates pairs");
  return h;
}

// Float offsets of the arrays in file order, accumulated with overflow checks.
class Layout {
 public:
  explicit Layout(const std::string& source) : source_(source) {}

  // Reserves an array of the product of `dims` floats and returns its offset (in floats, after the header).
  uint64_t take(const char* what, std::initializer_list<uint64_t> dims) {
    uint64_t n = 1;
    for (uint64_t d : dims) check(!__builtin_mul_overflow(n, d, &n), source_, ": size of '", what, "' overflows");
    const uint64_t at = floats_;
    check(!__builtin_add_overflow(floats_, n, &floats_), source_, ": file size overflows at '", what, "'");
    return at;
  }

  uint64_t total_bytes() const {
    uint64_t bytes = 0;
    check(!__builtin_mul_overflow(floats_, uint64_t{sizeof(float)}, &bytes) &&
              !__builtin_add_overflow(bytes, uint64_t{kHeaderBytes}, &bytes),
          source_, ": expected file size overflows 64 bits");
    return bytes;
  }

 private:
  const std::string& source_;
  uint64_t floats_ = 0;
};

// llama2.c rotates adjacent pairs (x[2i], x[2i+1]) by frequency i; HF's rotate-half pairs (x[i], x[i + hs/2]).
// Reordering the rows of each head turns one convention into the other: HF row p*hs/2 + i = llama2.c row 2i + p.
// `src` is byte-addressed because callers may hand in buffers without float alignment (the fuzzer does).
Tensor permute_rope_rows(std::string name, const uint8_t* src, int64_t n_heads, int64_t head_size, int64_t cols) {
  const size_t row_bytes = static_cast<size_t>(cols) * sizeof(float);
  std::vector<uint8_t> bytes(static_cast<size_t>(n_heads * head_size) * row_bytes);
  const int64_t half = head_size / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t p = 0; p < 2; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t dst_row = h * head_size + p * half + i;
        const int64_t src_row = h * head_size + 2 * i + p;
        std::memcpy(bytes.data() + static_cast<size_t>(dst_row) * row_bytes,
                    src + static_cast<size_t>(src_row) * row_bytes, row_bytes);
      }
    }
  }
  return Tensor::from_bytes(std::move(name), DType::F32, {n_heads * head_size, cols}, std::move(bytes));
}

}  // namespace

Model parse_llama2c(std::shared_ptr<const void> owner, const uint8_t* data, size_t size, const std::string& source) {
  const Header h = read_header(data, size, source);
  const uint64_t D = h.dim, F = h.hidden, L = h.layers, V = h.vocab, S = h.seq_len;
  const int64_t head_size = h.dim / h.heads;
  const uint64_t KV = static_cast<uint64_t>(h.kv_heads * head_size);

  Layout layout(source);
  const uint64_t embed = layout.take("token_embedding_table", {V, D});
  const uint64_t rms_att = layout.take("rms_att_weight", {L, D});
  const uint64_t wq = layout.take("wq", {L, D, D});
  const uint64_t wk = layout.take("wk", {L, KV, D});
  const uint64_t wv = layout.take("wv", {L, KV, D});
  const uint64_t wo = layout.take("wo", {L, D, D});
  const uint64_t rms_ffn = layout.take("rms_ffn_weight", {L, D});
  const uint64_t w1 = layout.take("w1", {L, F, D});
  const uint64_t w2 = layout.take("w2", {L, D, F});
  const uint64_t w3 = layout.take("w3", {L, F, D});
  const uint64_t rms_final = layout.take("rms_final_weight", {D});
  // RoPE tables written by the legacy exporter; run.c (and this project) recompute them from theta 10000.
  layout.take("freq_cis_real", {S, static_cast<uint64_t>(head_size / 2)});
  layout.take("freq_cis_imag", {S, static_cast<uint64_t>(head_size / 2)});
  const uint64_t wcls = h.shared_classifier ? 0 : layout.take("wcls", {V, D});
  const uint64_t expected = layout.total_bytes();
  check(size >= expected, source, ": truncated: expected ", expected, " bytes for this llama2.c header (dim ", h.dim,
        ", hidden_dim ", h.hidden, ", n_layers ", h.layers, ", n_heads ", h.heads, ", n_kv_heads ", h.kv_heads,
        ", vocab_size ", h.vocab, h.shared_classifier ? " shared" : " unshared", ", seq_len ", h.seq_len,
        "), file has ", size);
  check(size == expected, source, ": expected ", expected, " bytes for this llama2.c header, file has ", size,
        " (", size - expected, " unexpected trailing bytes; wrong header or not a legacy llama2.c checkpoint?)");

  const uint8_t* base = data + kHeaderBytes;
  auto at = [&](uint64_t float_offset) { return base + float_offset * sizeof(float); };
  Model m;
  m.source = source;
  m.format = "llama2c";
  auto view = [&](std::string name, std::vector<int64_t> shape, uint64_t offset) {
    Tensor t;
    t.name = name;
    t.dtype = DType::F32;
    t.shape = std::move(shape);
    t.data = at(offset);
    t.owner = owner;
    m.tensors.emplace(std::move(name), std::move(t));
  };
  const int64_t dim = h.dim, hidden = h.hidden, kv_dim = static_cast<int64_t>(KV);
  view("model.embed_tokens.weight", {h.vocab, dim}, embed);
  view("model.norm.weight", {dim}, rms_final);
  if (!h.shared_classifier) view("lm_head.weight", {h.vocab, dim}, wcls);
  for (uint64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    view(p + "input_layernorm.weight", {dim}, rms_att + l * D);
    view(p + "post_attention_layernorm.weight", {dim}, rms_ffn + l * D);
    std::string q_name = p + "self_attn.q_proj.weight", k_name = p + "self_attn.k_proj.weight";
    m.tensors.emplace(q_name, permute_rope_rows(q_name, at(wq + l * D * D), h.heads, head_size, dim));
    m.tensors.emplace(k_name, permute_rope_rows(k_name, at(wk + l * KV * D), h.kv_heads, head_size, dim));
    view(p + "self_attn.v_proj.weight", {kv_dim, dim}, wv + l * KV * D);
    view(p + "self_attn.o_proj.weight", {dim, dim}, wo + l * D * D);
    view(p + "mlp.gate_proj.weight", {hidden, dim}, w1 + l * F * D);
    view(p + "mlp.down_proj.weight", {dim, hidden}, w2 + l * D * F);
    view(p + "mlp.up_proj.weight", {hidden, dim}, w3 + l * F * D);
  }

  ModelConfig& c = m.config;
  c.hidden_size = dim;
  c.intermediate_size = hidden;
  c.num_hidden_layers = h.layers;
  c.num_attention_heads = h.heads;
  c.num_key_value_heads = h.kv_heads;
  c.head_dim = head_size;
  c.vocab_size = h.vocab;
  c.max_position_embeddings = h.seq_len;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = h.shared_classifier;
  // llama2.c's Llama-2 SentencePiece convention: <unk> 0, <s> 1, </s> 2. Tiny vocabularies may lack them.
  c.bos_token_id = h.vocab > 1 ? 1 : -1;
  c.eos_token_id = h.vocab > 2 ? 2 : -1;
  m.validate();
  return m;
}

Model load_llama2c_model(const std::string& path) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  Model m = parse_llama2c(file, file->data(), file->size(), path);
  // run.c's default is tokenizer.bin; llama2.c's train_vocab.sh names custom vocabularies tok<vocab_size>.bin.
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  const std::string names[] = {"tokenizer.bin", "tok" + std::to_string(m.config.vocab_size) + ".bin"};
  for (const std::string& name : names) {
    std::error_code ec;
    const std::filesystem::path candidate = dir / name;
    if (std::filesystem::is_regular_file(candidate, ec)) {
      m.tokenizer_path = candidate.string();
      break;
    }
  }
  return m;
}

}  // namespace futransformer
