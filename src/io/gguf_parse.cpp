// GGUF parsing: every count, length and offset is checked against the bytes that remain before anything is
// allocated, so a hostile file costs at most a small multiple of its own size in memory.
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>
#include <unordered_set>

#include "futransformer/error.h"
#include "futransformer/io/gguf.h"

namespace futransformer {

namespace {

constexpr uint32_t kMaxDims = 4;
// Arrays of arrays recurse; a file of nested empty arrays must not exhaust the stack.
constexpr int kMaxArrayDepth = 16;
// Smallest encodings, used to reject counts that cannot fit in the remaining bytes.
constexpr size_t kMinKvBytes = 8 + 4 + 1;            // empty key, type, one-byte value
constexpr size_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, n_dims, one dim, type, offset

class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& source) : data_(data), size_(size), source_(source) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  // `what` is a callable returning the context for messages, built only on failure.
  template <typename What>
  void need(size_t n, const What& what) const {
    if (n > remaining())
      fail(source_, ": truncated GGUF file: ", what(), " needs ", n, " bytes at offset ", pos_, " but only ",
           remaining(), " remain");
  }

  template <typename T, typename What>
  T read(const What& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  template <typename What>
  std::string read_string(const What& what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      fail(source_, ": ", what(), ": string length ", len, " exceeds the ", remaining(), " bytes left in the file");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& source_;
};

size_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
    case GgufType::STRING: return 8;
    case GgufType::ARRAY: return 4 + 8;
  }
  return 1;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::FLOAT64); }

class Parser {
 public:
  Parser(const uint8_t* data, size_t size, const std::string& source) : r_(data, size, source), source_(source) {}

  GgufValue read_value(GgufType type, const std::string& key, int depth) {
    auto what = [&] { return "GGUF key '" + key + "'"; };
    GgufValue v;
    switch (type) {
      case GgufType::UINT8: v.value = r_.read<uint8_t>(what); break;
      case GgufType::INT8: v.value = r_.read<int8_t>(what); break;
      case GgufType::UINT16: v.value = r_.read<uint16_t>(what); break;
      case GgufType::INT16: v.value = r_.read<int16_t>(what); break;
      case GgufType::UINT32: v.value = r_.read<uint32_t>(what); break;
      case GgufType::INT32: v.value = r_.read<int32_t>(what); break;
      case GgufType::FLOAT32: v.value = r_.read<float>(what); break;
      case GgufType::UINT64: v.value = r_.read<uint64_t>(what); break;
      case GgufType::INT64: v.value = r_.read<int64_t>(what); break;
      case GgufType::FLOAT64: v.value = r_.read<double>(what); break;
      case GgufType::BOOL: {
        const uint8_t b = r_.read<uint8_t>(what);
        check(b <= 1, source_, ": GGUF key '", key, "': bool value ", int{b}, " is neither 0 nor 1");
        v.value = b != 0;
        break;
      }
      case GgufType::STRING: v.value = r_.read_string(what); break;
      case GgufType::ARRAY: v.value = read_array(key, depth); break;
    }
    return v;
  }

  GgufArray read_array(const std::string& key, int depth) {
    auto what = [&] { return "GGUF key '" + key + "' (array header)"; };
    check(depth < kMaxArrayDepth, source_, ": GGUF key '", key, "': arrays nested deeper than ", kMaxArrayDepth);
    const uint32_t elem = r_.read<uint32_t>(what);
    check(valid_value_type(elem), source_, ": GGUF key '", key, "': unknown array element type ", elem);
    const uint64_t count = r_.read<uint64_t>(what);
    GgufArray arr;
    arr.type = static_cast<GgufType>(elem);
    const size_t min_bytes = min_value_bytes(arr.type);
    if (count > r_.remaining() / min_bytes)
      fail(source_, ": GGUF key '", key, "': array of ", count, " ", gguf_type_name(arr.type),
           " elements cannot fit in the ", r_.remaining(), " bytes left in the file");
    arr.items.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) arr.items.push_back(read_value(arr.type, key, depth + 1));
    return arr;
  }

  void read_header(GgufFile& f) {
    auto hdr = [] { return std::string("GGUF header"); };
    r_.need(4, hdr);
    char magic[4];
    for (char& c : magic) c = static_cast<char>(r_.read<uint8_t>(hdr));
    check(std::memcmp(magic, "GGUF", 4) == 0, source_, ": not a GGUF file (magic bytes are not 'GGUF')");
    f.version = r_.read<uint32_t>(hdr);
    if (f.version != 2 && f.version != 3) {
      // A big-endian file shows its version byte-swapped.
      const bool swapped = f.version == 0x02000000u || f.version == 0x03000000u;
      fail(source_, ": unsupported GGUF version ", f.version, swapped ? " (big-endian files are not supported)" : "",
           "; expected 2 or 3");
    }
  }

  GgufFile parse(std::shared_ptr<const void> owner, const uint8_t* data, size_t size) {
    GgufFile f;
    f.source = source_;
    f.owner = std::move(owner);
    read_header(f);
    auto hdr = [] { return std::string("GGUF header"); };
    const uint64_t tensor_count = r_.read<uint64_t>(hdr);
    const uint64_t kv_count = r_.read<uint64_t>(hdr);
    if (kv_count > r_.remaining() / kMinKvBytes)
      fail(source_, ": GGUF header: kv_count ", kv_count, " cannot fit in the ", r_.remaining(),
           " bytes left in the file");
    if (tensor_count > r_.remaining() / kMinTensorInfoBytes)
      fail(source_, ": GGUF header: tensor_count ", tensor_count, " cannot fit in the ", r_.remaining(),
           " bytes left in the file");

    for (uint64_t i = 0; i < kv_count; ++i) {
      const std::string idx = std::to_string(i);
      std::string key = r_.read_string([&] { return "GGUF key #" + idx + " (name)"; });
      const uint32_t type = r_.read<uint32_t>([&] { return "GGUF key '" + key + "' (type)"; });
      check(valid_value_type(type), source_, ": GGUF key '", key, "': unknown value type ", type);
      GgufValue v = read_value(static_cast<GgufType>(type), key, 0);
      check(!f.metadata.count(key), source_, ": GGUF key '", key, "' appears twice");
      f.metadata.emplace(std::move(key), std::move(v));
    }
    read_alignment(f);

    std::unordered_set<std::string> names;
    f.tensors.reserve(static_cast<size_t>(tensor_count));
    for (uint64_t i = 0; i < tensor_count; ++i) {
      f.tensors.push_back(read_tensor_info(i));
      check(names.insert(f.tensors.back().name).second, source_, ": tensor '", f.tensors.back().name,
            "' appears twice");
    }

    // The data section starts at the next multiple of the alignment (possibly the end of the file when empty).
    const size_t pos = r_.pos();
    const size_t pad = static_cast<size_t>((f.alignment - pos % f.alignment) % f.alignment);
    check(pad <= size - pos || tensor_count == 0, source_, ": truncated GGUF file: the data section would start at ",
          "offset ", pos + static_cast<uint64_t>(pad), " past the end of the file (", size, " bytes)");
    f.data_offset = pad <= size - pos ? pos + pad : size;
    for (GgufTensorInfo& t : f.tensors) locate(f, t, data, size);
    return f;
  }

 private:
  void read_alignment(GgufFile& f) {
    const GgufValue* a = f.find("general.alignment");
    if (a == nullptr) return;
    const std::optional<int64_t> v = a->as_int();
    check(v.has_value(), source_, ": GGUF key 'general.alignment' has type ", gguf_type_name(a->type()),
          ", expected an integer");
    check(*v > 0 && *v <= (int64_t{1} << 30) && (*v & (*v - 1)) == 0, source_, ": GGUF key 'general.alignment' = ",
          *v, " is not a power of two in [1, 2^30]");
    f.alignment = static_cast<uint64_t>(*v);
  }

  GgufTensorInfo read_tensor_info(uint64_t index) {
    GgufTensorInfo t;
    const std::string idx = std::to_string(index);
    t.name = r_.read_string([&] { return "tensor info #" + idx + " (name)"; });
    auto what = [&] { return "tensor '" + t.name + "' (info)"; };
    const uint32_t n_dims = r_.read<uint32_t>(what);
    check(n_dims >= 1 && n_dims <= kMaxDims, source_, ": tensor '", t.name, "' has ", n_dims,
          " dims, expected 1 to ", kMaxDims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = r_.read<uint64_t>(what);
      check(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                !__builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel),
            source_, ": tensor '", t.name, "': dimension ", d, " = ", dim, " makes the element count overflow");
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    const uint32_t type = r_.read<uint32_t>(what);
    switch (type) {
      case 0: case 1: case 2: case 3: case 8: case 30: break;
      default:
        fail(source_, ": tensor '", t.name, "' has ggml type ", type, " (", ggml_type_name(type),
             "), which is not supported (F32, F16, BF16, Q4_0, Q4_1, Q8_0 are)");
    }
    t.type = static_cast<GgmlType>(type);
    t.offset = r_.read<uint64_t>(what);
    return t;
  }

  // Checks that the tensor's bytes lie inside the file and sets data/nbytes.
  void locate(const GgufFile& f, GgufTensorInfo& t, const uint8_t* data, size_t size) {
    int64_t block = 1, block_bytes = 4;
    switch (t.type) {
      case GgmlType::F32: block_bytes = 4; break;
      case GgmlType::F16: case GgmlType::BF16: block_bytes = 2; break;
      case GgmlType::Q4_0: block = 32; block_bytes = 18; break;
      case GgmlType::Q4_1: block = 32; block_bytes = 20; break;
      case GgmlType::Q8_0: block = 32; block_bytes = 34; break;
    }
    check(t.dims[0] % block == 0, source_, ": tensor '", t.name, "' of type ", ggml_type_name(uint32_t(t.type)),
          " has ne0 = ", t.dims[0], ", not a multiple of its block size ", block);
    int64_t nbytes = 0;
    check(!__builtin_mul_overflow(t.numel() / block, block_bytes, &nbytes), source_, ": tensor '", t.name,
          "': byte size overflows");
    check(t.offset % f.alignment == 0, source_, ": tensor '", t.name, "': data offset ", t.offset,
          " is not a multiple of the alignment ", f.alignment);
    const size_t avail = size - f.data_offset;
    check(t.offset <= avail && static_cast<uint64_t>(nbytes) <= avail - t.offset, source_, ": tensor '", t.name,
          "': data [", t.offset, ", +", nbytes, ") lies outside the data section (", avail, " bytes at file offset ",
          f.data_offset, ")");
    t.data = data + f.data_offset + t.offset;
    t.nbytes = static_cast<size_t>(nbytes);
  }

  Reader r_;
  const std::string& source_;
};

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* const names[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                      "bool",  "string", "array",  "uint64", "int64",  "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "unknown";
}

const char* ggml_type_name(uint32_t type) {
  // Indexed by ggml's type number; retired numbers keep their slot.
  static const char* const names[] = {
      "F32",     "F16",    "Q4_0",    "Q4_1",   "Q4_2 (retired)", "Q4_3 (retired)", "Q5_0",  "Q5_1",   "Q8_0",
      "Q8_1",    "Q2_K",   "Q3_K",    "Q4_K",   "Q5_K",           "Q6_K",           "Q8_K",  "IQ2_XXS", "IQ2_XS",
      "IQ3_XXS", "IQ1_S",  "IQ4_NL",  "IQ3_S",  "IQ2_S",          "IQ4_XS",         "I8",    "I16",    "I32",
      "I64",     "F64",    "IQ1_M",   "BF16",   "Q4_0_4_4 (retired)", "Q4_0_4_8 (retired)", "Q4_0_8_8 (retired)",
      "TQ1_0",   "TQ2_0",  "IQ4_NL_4_4 (retired)", "IQ4_NL_4_8 (retired)", "IQ4_NL_8_8 (retired)", "MXFP4"};
  return type < std::size(names) ? names[type] : "unknown";
}

std::optional<int64_t> GgufValue::as_int() const {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool> || !std::is_integral_v<T>) {
          return std::nullopt;
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return static_cast<int64_t>(v);
        } else {
          return static_cast<int64_t>(v);
        }
      },
      value);
}

std::optional<double> GgufValue::as_number() const {
  if (const float* f = std::get_if<float>(&value)) return *f;
  if (const double* d = std::get_if<double>(&value)) return *d;
  if (const std::optional<int64_t> i = as_int()) return static_cast<double>(*i);
  return std::nullopt;
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata.find(key);
  return it == metadata.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  for (const GgufTensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

GgufFile parse_gguf(std::shared_ptr<const void> owner, const uint8_t* data, size_t size, const std::string& source) {
  check(data != nullptr || size == 0, source, ": no bytes to parse");
  return Parser(data, size, source).parse(std::move(owner), data, size);
}

}  // namespace futransformer
