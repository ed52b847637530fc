// GGUF reader (versions 2 and 3) and writer.
//
// File layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv key/value pairs
// (string key, u32 value type, value), then n_tensors tensor infos (string name, u32 n_dims, u64 ne[n_dims],
// u32 type, u64 offset), padding to `general.alignment` (default 32), then the data section; a tensor's data
// starts at data_offset + offset. Strings are u64 length + bytes (no terminator).
//
// The reader treats every file as hostile: every read is bounds-checked against the file size, counts are checked
// against the bytes left before anything is allocated, and each error names the problem and its byte offset.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "quant/dtype.h"
#include "util/mmap_file.h"
#include "util/status.h"

namespace kiln::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
inline constexpr int kMaxArrayDepth = 8;  // arrays nested deeper than this are rejected by the reader
const char* value_type_name(ValueType t);
bool value_type_is_valid(uint32_t t);
// `s` in double quotes with \", \\, \n, \r, \t and \xNN escapes (for display).
std::string quote_string(std::string_view s);

struct Value;
struct Array {
  ValueType type = ValueType::U8;  // element type (ARRAY for nested arrays)
  std::vector<Value> items;
};

// The variant's index equals the ValueType number.
struct Value {
  std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string, Array, uint64_t,
               int64_t, double>
      v;

  Value() = default;
  template <class T>
  Value(T x) : v(std::move(x)) {}  // NOLINT: implicit on purpose
  Value(const char* s) : v(std::string(s)) {}

  ValueType type() const { return static_cast<ValueType>(v.index()); }
  bool is_integer() const;
  bool is_string() const { return type() == ValueType::STRING; }
  bool is_array() const { return type() == ValueType::ARRAY; }
  const std::string& str() const { return std::get<std::string>(v); }
  const Array& arr() const { return std::get<Array>(v); }
  // Human-readable rendering; arrays longer than `max_items` are summarized.
  std::string to_string(size_t max_items = 8) const;
};

struct KeyValue {
  std::string key;
  Value value;
  uint64_t offset = 0;  // byte offset of the key in the file
};

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  uint32_t n_dims = 0;
  int64_t ne[kMaxDims] = {1, 1, 1, 1};  // ne[0] is the contiguous (innermost) dimension, as in ggml
  uint64_t offset = 0;                  // relative to the data section
  uint64_t nbytes = 0;
  uint64_t info_offset = 0;             // byte offset of this tensor's info record in the file
  const uint8_t* data = nullptr;        // into the mapping (valid while the File lives)

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // "[4096, 32000]"
};

class File {
 public:
  // Maps and parses `path`.
  static Result<File> open(const std::string& path);
  // Parses bytes held by `map` (for embedded models and fuzzing).
  static Result<File> parse(std::shared_ptr<MappedFile> map);
  // The same for tools that show what they can of a damaged file (kiln info): on a parse error, `*partial` (when
  // not null) receives what was read before the error: the header, every metadata pair and tensor info read
  // intact, the data offset when the infos were all read; tensors whose data was not placed have data == nullptr.
  // The error is returned as from open() / parse(); `*partial` is untouched when the file could not be mapped.
  static Result<File> open(const std::string& path, File* partial);
  static Result<File> parse(std::shared_ptr<MappedFile> map, File* partial);

  const std::string& path() const { return map_->path(); }
  uint64_t file_size() const { return map_->size(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::shared_ptr<MappedFile>& mapping() const { return map_; }

  const std::vector<KeyValue>& kvs() const { return kvs_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed access. get_*: the key must exist and hold that type (integers convert between widths when the value
  // fits; f32 accepts f64 and integers). get_*_or: a missing key gives `fallback`, a wrong type is still an error.
  // Errors name the key and what was found.
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<int64_t> get_i64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string> get_str(std::string_view key) const;
  Result<uint32_t> get_u32_or(std::string_view key, uint32_t fallback) const;
  Result<float> get_f32_or(std::string_view key, float fallback) const;
  Result<bool> get_bool_or(std::string_view key, bool fallback) const;
  Result<std::string> get_str_or(std::string_view key, std::string fallback) const;
  // Arrays: element type must match (integer arrays convert when values fit).
  Result<std::vector<std::string>> get_str_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;
  Result<std::vector<int32_t>> get_i32_array(std::string_view key) const;

 private:
  std::shared_ptr<MappedFile> map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kvs_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> kv_index_, tensor_index_;  // name -> position in kvs_ / tensors_
  friend class Parser;
};

// Writes GGUF v3. Metadata keeps insertion order (set() on an existing key replaces in place); tensors are
// written in add order, each aligned to `alignment`.
class Writer {
 public:
  // Produces the tensor's bytes: fill(dst, begin, n) writes bytes [begin, begin+n) of the tensor's data into dst.
  // Chunks cover the tensor exactly once; begin and n are multiples of the type's block bytes (type_size), so a
  // fill works on whole blocks; chunks are at most kWriteChunkBytes (unless one block is larger) and may be
  // produced concurrently from several threads, in any order.
  static constexpr uint64_t kWriteChunkBytes = 8ull << 20;
  using FillFn = std::function<void(uint8_t* dst, uint64_t begin, uint64_t n)>;

  void set(std::string key, Value value);
  void set_alignment(uint64_t alignment);  // also writes general.alignment when != 32
  // `data` is borrowed: it must stay valid until write() returns. ne has 1..4 dims, ne[0] innermost.
  Status add_tensor(std::string name, DType type, std::vector<int64_t> ne, const void* data);
  Status add_tensor(std::string name, DType type, std::vector<int64_t> ne, FillFn fill);
  // Writes the file; `n_threads` > 1 lets chunks be produced and written in parallel (<= 0: all cores). Data is
  // produced in chunks of up to kWriteChunkBytes and written with pwrite at its final offset into a temporary file
  // with a unique name (`path`.tmp.XXXXXX, created exclusively: an existing file is never clobbered) in the
  // target's folder, renamed over the target on success (removed on failure). A symlink at `path` is followed: its
  // target is replaced and the link kept. A target that exists and is not a regular file (a device node, a FIFO,
  // a directory, a socket) is refused before anything is written.
  // Errors also for empty metadata keys (the GGUF spec requires non-empty keys).
  Status write(const std::string& path, int n_threads = 1) const;

  size_t n_tensors() const { return tensors_.size(); }
  const std::vector<KeyValue>& kvs() const { return kvs_; }
  const Value* find(std::string_view key) const;
  bool remove(std::string_view key);  // true when the key was there
  uint64_t alignment() const { return alignment_; }
  // Bytes the file will have (header, padding, tensor data); an error if the header cannot be serialized.
  Result<uint64_t> file_size() const;

 private:
  struct PendingTensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    uint64_t nbytes;
    const void* data;
    FillFn fill;
  };
  // Serializes header + tensor infos (not padded); sets each tensor's offset in `offsets`.
  Status build_header(std::string* out, std::vector<uint64_t>* offsets) const;

  std::vector<KeyValue> kvs_;
  std::vector<PendingTensor> tensors_;
  uint64_t alignment_ = kDefaultAlignment;
};

}  // namespace kiln::gguf
