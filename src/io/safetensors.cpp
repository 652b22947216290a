#include "futransformer/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "futransformer/error.h"
#include "futransformer/mapped_file.h"

namespace futransformer {
namespace {

using nlohmann::json;

// Names and parser messages come from the file; keep messages readable even when they are megabytes long.
std::string clip(const std::string& s, size_t limit = 200) {
  std::string out = s.size() <= limit ? s : s.substr(0, limit) + "...";
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  }
  return out;
}

bool dtype_from_name(const std::string& s, DType* t) {
  static const std::pair<const char*, DType> kNames[] = {{"F32", DType::F32}, {"F16", DType::F16},
                                                         {"BF16", DType::BF16}, {"I8", DType::I8},
                                                         {"I32", DType::I32}, {"U8", DType::U8}};
  for (const auto& [name, dtype] : kNames) {
    if (s == name) {
      *t = dtype;
      return true;
    }
  }
  return false;
}

// A JSON value that must be a non-negative integer; `what` describes it for the message.
uint64_t as_count(const json& v, const std::string& source, const std::string& tensor, const char* what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) fail(source, ": tensor '", clip(tensor), "': ", what, " is negative");
  fail(source, ": tensor '", clip(tensor), "': ", what, " is a JSON ", v.type_name(), ", expected a non-negative integer");
}

struct Span {
  uint64_t begin, end;
  size_t index;
};

// Bytes of a tensor of `shape` and `dtype`, or fails if the count does not fit in 63 bits. Dimensions of size
// zero make the tensor empty, but the other dimensions must still multiply without overflow because
// Tensor::numel() multiplies them in order.
uint64_t checked_nbytes(const std::vector<int64_t>& shape, DType dtype, const std::string& where) {
  uint64_t product = 1;
  bool empty = false;
  for (int64_t d : shape) {
    check(d >= 0, where, ": negative dimension ", d);
    if (d == 0) {
      empty = true;
      continue;
    }
    check(!__builtin_mul_overflow(product, static_cast<uint64_t>(d), &product) &&
              product <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
          where, ": the element count of the shape overflows 64 bits");
  }
  uint64_t bytes = 0;
  check(!__builtin_mul_overflow(product, static_cast<uint64_t>(dtype_size(dtype)), &bytes) &&
            bytes <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
        where, ": the byte size of the shape overflows 64 bits");
  return empty ? 0 : bytes;
}

}  // namespace

std::vector<Tensor> parse_safetensors(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                                      const std::string& source, std::map<std::string, std::string>* metadata) {
  check(size >= 8 && data != nullptr, source, ": file is ", size,
        " bytes, too short for the 8-byte safetensors header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  check(n <= kSafetensorsMaxHeaderBytes, source, ": safetensors header length ", n, " exceeds the limit of ",
        kSafetensorsMaxHeaderBytes, " bytes (corrupt or not a safetensors file)");
  check(n <= size - 8, source, ": safetensors header length ", n, " runs past the end of the ", size, "-byte file");
  const char* text = reinterpret_cast<const char*>(data + 8);
  json header;
  try {
    header = json::parse(text, text + n);
  } catch (const json::exception& e) {
    fail(source, ": safetensors header is not valid JSON: ", clip(e.what()));
  }
  check(header.is_object(), source, ": safetensors header is a JSON ", header.type_name(), ", expected an object");

  const uint8_t* region = data + 8 + n;
  const uint64_t region_size = size - 8 - n;
  std::vector<Tensor> tensors;
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.get_ref<const json::object_t&>()) {
    if (name == "__metadata__") {
      check(entry.is_object(), source, ": __metadata__ is a JSON ", entry.type_name(), ", expected an object");
      for (const auto& [key, value] : entry.get_ref<const json::object_t&>()) {
        check(value.is_string(), source, ": __metadata__ entry '", clip(key), "' is a JSON ", value.type_name(),
              ", expected a string");
        if (metadata) (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = source + ": tensor '" + clip(name) + "'";
    check(entry.is_object(), where, " is a JSON ", entry.type_name(), ", expected an object");
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    check(dtype_it != entry.end() && shape_it != entry.end() && offsets_it != entry.end(), where,
          ": missing field (expected 'dtype', 'shape' and 'data_offsets')");
    check(dtype_it->is_string(), where, ": 'dtype' is a JSON ", dtype_it->type_name(), ", expected a string");
    Tensor t;
    t.name = name;
    const std::string& dtype_str = dtype_it->get_ref<const std::string&>();
    check(dtype_from_name(dtype_str, &t.dtype), where, ": dtype '", clip(dtype_str),
          "' is not supported (expected F32, F16, BF16, I8, I32 or U8)");
    check(shape_it->is_array(), where, ": 'shape' is a JSON ", shape_it->type_name(), ", expected an array");
    for (const json& d : *shape_it) {
      const uint64_t dim = as_count(d, source, name, "a 'shape' entry");
      check(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where, ": dimension ", dim,
            " is too large");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t nbytes = checked_nbytes(t.shape, t.dtype, where);
    check(offsets_it->is_array() && offsets_it->size() == 2, where,
          ": 'data_offsets' must be an array of 2 integers [begin, end]");
    const uint64_t begin = as_count((*offsets_it)[0], source, name, "data_offsets[0]");
    const uint64_t end = as_count((*offsets_it)[1], source, name, "data_offsets[1]");
    check(begin <= end, where, ": data_offsets end ", end, " is before begin ", begin);
    check(end <= region_size, where, ": data_offsets [", begin, ", ", end, "] run past the end of the ",
          region_size, "-byte data region");
    check(end - begin == nbytes, where, ": data_offsets span ", end - begin, " bytes but shape ", t.shape_str(),
          " of ", dtype_name(t.dtype), " needs ", nbytes);
    const uint8_t* bytes = region + begin;
    if (reinterpret_cast<uintptr_t>(bytes) % dtype_size(t.dtype) != 0) {
      // Legal but rare (hand-made files): copy so consumers may read elements with aligned loads.
      auto copy = std::make_shared<std::vector<uint8_t>>(bytes, bytes + nbytes);
      t.data = copy->data();
      t.owner = copy;
    } else {
      t.data = bytes;
      t.owner = owner;
    }
    spans.push_back({begin, end, tensors.size()});
    tensors.push_back(std::move(t));
  }

  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  const Span* previous = nullptr;  // the non-empty span reaching furthest so far
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;
    if (previous) {
      check(s.begin >= previous->end, source, ": tensors '", clip(tensors[previous->index].name), "' [",
            previous->begin, ", ", previous->end, ") and '", clip(tensors[s.index].name), "' [", s.begin, ", ",
            s.end, ") overlap in the data region");
    }
    if (!previous || s.end > previous->end) previous = &s;
  }
  std::vector<Tensor> ordered;
  ordered.reserve(tensors.size());
  for (const Span& s : spans) ordered.push_back(std::move(tensors[s.index]));
  return ordered;
}

std::vector<Tensor> load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  return parse_safetensors(file, file->data(), file->size(), path, metadata);
}

namespace {

// The padded header text for `entries`; fills `data_bytes` with the size of the data region.
std::string make_header(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                        const std::map<std::string, std::string>& metadata, uint64_t* data_bytes) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    const std::string where = path + ": tensor '" + clip(e.name) + "'";
    check(!e.name.empty() && e.name != "__metadata__", where, ": invalid tensor name");
    check(!header.contains(e.name), where, ": duplicate tensor name");
    const uint64_t nbytes = checked_nbytes(e.shape, e.dtype, where);
    uint64_t end = 0;
    check(!__builtin_add_overflow(offset, nbytes, &end), where, ": data region exceeds 64 bits");
    // dtype_name spells every DType the way safetensors headers do ("F32", "BF16", ...).
    header[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  // Padding the header to a multiple of 8 keeps every tensor 8-byte aligned in the file (and in a mapping).
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  check(text.size() <= kSafetensorsMaxHeaderBytes, path, ": safetensors header of ", text.size(),
        " bytes exceeds the limit of ", kSafetensorsMaxHeaderBytes, " bytes readers accept");
  *data_bytes = offset;
  return text;
}

}  // namespace

uint64_t SafetensorsWriter::planned_size(const std::vector<SafetensorsEntry>& entries,
                                         const std::map<std::string, std::string>& metadata) {
  uint64_t data_bytes = 0;
  const std::string header = make_header("(planned file)", entries, metadata, &data_bytes);
  return 8 + header.size() + data_bytes;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
  uint64_t data_bytes = 0;
  const std::string header = make_header(path, entries, metadata, &data_bytes);
  file_size_ = 8 + header.size() + data_bytes;
  // Regular files are written under a temporary name and renamed by finish(): a reader never sees a partial
  // file, and a Model still mapping the old file keeps its (unlinked) pages instead of faulting on a truncated
  // one. Existing non-regular targets (a pipe, /dev/full) are written directly and never unlinked.
  struct stat st {};
  const bool direct = ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
  write_path_ = direct ? path : path + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(write_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, ": cannot create file: ", std::strerror(errno));
  temporary_ = !direct;
  try {
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
    write_all(length, 8);
    write_all(header.data(), header.size());
    written_ = 8 + header.size();
  } catch (...) {
    abandon();
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() { abandon(); }

void SafetensorsWriter::abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  if (temporary_) ::unlink(write_path_.c_str());
}

void SafetensorsWriter::write_all(const void* bytes, size_t size) {
  const char* p = static_cast<const char*>(bytes);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path_, ": write failed: ", n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void SafetensorsWriter::append(const void* bytes, size_t size) {
  check(fd_ >= 0, path_, ": append after finish");
  check(size <= file_size_ - written_, path_, ": ", size, " more bytes given but only ", file_size_ - written_,
        " remain for the declared tensors");
  write_all(bytes, size);
  written_ += size;
}

void SafetensorsWriter::finish() {
  check(fd_ >= 0, path_, ": finish called twice or after a failure");
  check(written_ == file_size_, path_, ": only ", written_, " of ", file_size_, " bytes were written");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    if (temporary_) ::unlink(write_path_.c_str());
    fail(path_, ": write failed on close: ", std::strerror(err));
  }
  if (temporary_ && ::rename(write_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(write_path_.c_str());
    fail(path_, ": cannot move the finished file into place: ", std::strerror(err));
  }
}

void write_safetensors(const std::string& path, const std::vector<const Tensor*>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const Tensor* t : tensors) {
    check(t != nullptr, path, ": null tensor given to write_safetensors");
    entries.push_back({t->name, t->dtype, t->shape});
  }
  SafetensorsWriter writer(path, entries, metadata);
  for (const Tensor* t : tensors) {
    const size_t nbytes = t->nbytes();
    check(t->data != nullptr || nbytes == 0, path, ": tensor '", clip(t->name), "' has no data");
    writer.append(t->data, nbytes);
  }
  writer.finish();
}

}  // namespace futransformer
