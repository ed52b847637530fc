// GGUF reader: bounds-checked parse of the header, metadata and tensor infos of a mapped file.
//
// Invariants the parser keeps for hostile input: every read checks the bytes left first; a count (kvs, tensors,
// array items) is compared with the bytes left divided by the smallest encoding of one element before anything is
// reserved, so the allocation is bounded by the file size; arrays nest at most kMaxArrayDepth deep (no unbounded
// recursion). Every error names the byte offset of the field at fault.
#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstring>
#include <limits>

#include "gguf/gguf.h"

namespace kiln::gguf {

namespace {

// Smallest number of bytes one value of type t takes in the file (strings: the u64 length; arrays: type + count).
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 12;
  }
  return 1;
}

constexpr uint64_t kMinKvBytes = 8 + 4 + 1;          // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, n_dims, one dim, type, offset

}  // namespace

class Parser {
 public:
  explicit Parser(const MappedFile& m) : p_(m.data()), size_(m.size()), path_(m.path()) {}

  Status parse(File& f);

 private:
  Status fail(uint64_t offset, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    va_list ap;
    va_start(ap, fmt);
    std::string msg = vstrprintf(fmt, ap);
    va_end(ap);
    return Status(ErrorCode::kInvalidFile,
                  strprintf("%s: at offset %" PRIu64 ": %s", path_.c_str(), offset, msg.c_str()));
  }
  uint64_t left() const { return size_ - pos_; }
  Status need(uint64_t n, const char* what) {
    if (n > left())
      return fail(pos_, "file truncated reading %s (needs %" PRIu64 " bytes, %" PRIu64 " left)", what, n, left());
    return Status::ok();
  }
  template <class T>
  Status read(T* out, const char* what) {
    KILN_TRY(need(sizeof(T), what));
    std::memcpy(out, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }
  Status read_string(std::string* out, const char* what) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    KILN_TRY(read(&len, what));
    if (len > left())
      return fail(at, "%s: string length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes left)", what,
                  len, left());
    out->assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return Status::ok();
  }
  Status read_value(ValueType t, int depth, const std::string& key, Value* out);
  Status read_array(int depth, const std::string& key, Value* out);
  template <class T>
  Status read_scalar_array(uint64_t n, std::vector<Value>* items) {
    // The count was checked against the bytes left: n * sizeof(T) <= left().
    items->reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      T x;
      std::memcpy(&x, p_ + pos_, sizeof(T));
      pos_ += sizeof(T);
      items->emplace_back(x);
    }
    return Status::ok();
  }
  Status parse_kvs(File& f, uint64_t n_kv);
  Status parse_tensor_infos(File& f, uint64_t n_tensors);
  Status place_tensors(File& f);

  const uint8_t* p_;
  uint64_t size_;
  const std::string& path_;
  uint64_t pos_ = 0;
};

Status Parser::read_value(ValueType t, int depth, const std::string& key, Value* out) {
  switch (t) {
    case ValueType::U8: { uint8_t x; KILN_TRY(read(&x, "a u8 value")); out->v = x; return Status::ok(); }
    case ValueType::I8: { int8_t x; KILN_TRY(read(&x, "an i8 value")); out->v = x; return Status::ok(); }
    case ValueType::U16: { uint16_t x; KILN_TRY(read(&x, "a u16 value")); out->v = x; return Status::ok(); }
    case ValueType::I16: { int16_t x; KILN_TRY(read(&x, "an i16 value")); out->v = x; return Status::ok(); }
    case ValueType::U32: { uint32_t x; KILN_TRY(read(&x, "a u32 value")); out->v = x; return Status::ok(); }
    case ValueType::I32: { int32_t x; KILN_TRY(read(&x, "an i32 value")); out->v = x; return Status::ok(); }
    case ValueType::F32: { float x; KILN_TRY(read(&x, "an f32 value")); out->v = x; return Status::ok(); }
    case ValueType::U64: { uint64_t x; KILN_TRY(read(&x, "a u64 value")); out->v = x; return Status::ok(); }
    case ValueType::I64: { int64_t x; KILN_TRY(read(&x, "an i64 value")); out->v = x; return Status::ok(); }
    case ValueType::F64: { double x; KILN_TRY(read(&x, "an f64 value")); out->v = x; return Status::ok(); }
    case ValueType::BOOL: {
      const uint64_t at = pos_;
      uint8_t x;
      KILN_TRY(read(&x, "a bool value"));
      if (x > 1) return fail(at, "key '%s': bool value %u is neither 0 nor 1", key.c_str(), x);
      out->v = x == 1;
      return Status::ok();
    }
    case ValueType::STRING: {
      std::string s;
      KILN_TRY(read_string(&s, "a string value"));
      out->v = std::move(s);
      return Status::ok();
    }
    case ValueType::ARRAY: return read_array(depth + 1, key, out);
  }
  return fail(pos_, "key '%s': unknown value type %u", key.c_str(), static_cast<uint32_t>(t));
}

Status Parser::read_array(int depth, const std::string& key, Value* out) {
  const uint64_t at = pos_;
  if (depth > kMaxArrayDepth)
    return fail(at, "key '%s': arrays nested deeper than %d levels", key.c_str(), kMaxArrayDepth);
  uint32_t et = 0;
  uint64_t n = 0;
  KILN_TRY(read(&et, "an array element type"));
  if (!value_type_is_valid(et)) return fail(at, "key '%s': unknown array element type %u", key.c_str(), et);
  KILN_TRY(read(&n, "an array length"));
  const ValueType t = static_cast<ValueType>(et);
  if (n > left() / min_encoded_size(t))
    return fail(at + 4, "key '%s': array of %" PRIu64 " %s items cannot fit in the %" PRIu64 " bytes left",
                key.c_str(), n, value_type_name(t), left());
  Array a;
  a.type = t;
  switch (t) {
    case ValueType::U8: KILN_TRY(read_scalar_array<uint8_t>(n, &a.items)); break;
    case ValueType::I8: KILN_TRY(read_scalar_array<int8_t>(n, &a.items)); break;
    case ValueType::U16: KILN_TRY(read_scalar_array<uint16_t>(n, &a.items)); break;
    case ValueType::I16: KILN_TRY(read_scalar_array<int16_t>(n, &a.items)); break;
    case ValueType::U32: KILN_TRY(read_scalar_array<uint32_t>(n, &a.items)); break;
    case ValueType::I32: KILN_TRY(read_scalar_array<int32_t>(n, &a.items)); break;
    case ValueType::F32: KILN_TRY(read_scalar_array<float>(n, &a.items)); break;
    case ValueType::U64: KILN_TRY(read_scalar_array<uint64_t>(n, &a.items)); break;
    case ValueType::I64: KILN_TRY(read_scalar_array<int64_t>(n, &a.items)); break;
    case ValueType::F64: KILN_TRY(read_scalar_array<double>(n, &a.items)); break;
    default:
      a.items.resize(n);
      for (uint64_t i = 0; i < n; ++i) KILN_TRY(read_value(t, depth, key, &a.items[i]));
  }
  out->v = std::move(a);
  return Status::ok();
}

Status Parser::parse_kvs(File& f, uint64_t n_kv) {
  if (n_kv > left() / kMinKvBytes)
    return fail(16, "metadata count %" PRIu64 " cannot fit in the %" PRIu64 " bytes left", n_kv, left());
  f.kvs_.reserve(n_kv);
  f.kv_index_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    KeyValue kv;
    kv.offset = pos_;
    KILN_TRY(read_string(&kv.key, "a metadata key"));
    if (kv.key.empty()) return fail(kv.offset, "empty metadata key (GGUF keys must be non-empty)");
    const uint64_t type_at = pos_;
    uint32_t t = 0;
    KILN_TRY(read(&t, "a metadata value type"));
    if (!value_type_is_valid(t)) return fail(type_at, "key '%s': unknown value type %u", kv.key.c_str(), t);
    KILN_TRY(read_value(static_cast<ValueType>(t), 0, kv.key, &kv.value));
    auto [it, fresh] = f.kv_index_.emplace(kv.key, f.kvs_.size());
    if (!fresh)
      return fail(kv.offset, "duplicate key '%s' (first at offset %" PRIu64 ")", kv.key.c_str(),
                  f.kvs_[it->second].offset);
    f.kvs_.push_back(std::move(kv));
  }
  return Status::ok();
}

Status Parser::parse_tensor_infos(File& f, uint64_t n_tensors) {
  if (n_tensors > left() / kMinTensorInfoBytes)
    return fail(8, "tensor count %" PRIu64 " cannot fit in the %" PRIu64 " bytes left", n_tensors, left());
  f.tensors_.reserve(n_tensors);
  f.tensor_index_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo ti;
    ti.info_offset = pos_;
    KILN_TRY(read_string(&ti.name, "a tensor name"));
    const char* name = ti.name.c_str();
    const uint64_t dims_at = pos_;
    KILN_TRY(read(&ti.n_dims, "a tensor's dimension count"));
    if (ti.n_dims == 0 || ti.n_dims > static_cast<uint32_t>(kMaxDims))
      return fail(dims_at, "tensor '%s': %u dimensions (must be 1..%d)", name, ti.n_dims, kMaxDims);
    int64_t n_el = 1;
    for (uint32_t d = 0; d < ti.n_dims; ++d) {
      const uint64_t at = pos_;
      uint64_t ne = 0;
      KILN_TRY(read(&ne, "a tensor dimension"));
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return fail(at, "tensor '%s': dimension %u is negative (%" PRId64 ")", name, d, static_cast<int64_t>(ne));
      ti.ne[d] = static_cast<int64_t>(ne);
      if (__builtin_mul_overflow(n_el, ti.ne[d], &n_el))
        return fail(at, "tensor '%s': element count of shape overflows int64 at dimension %u", name, d);
    }
    const uint64_t type_at = pos_;
    uint32_t type_id = 0;
    KILN_TRY(read(&type_id, "a tensor type"));
    const DTypeTraits* tr = dtype_traits(type_id);
    if (!tr) return fail(type_at, "tensor '%s': unknown tensor type id %u", name, type_id);
    ti.type = static_cast<DType>(type_id);
    if (ti.ne[0] % tr->block_size != 0)
      return fail(dims_at + 4, "tensor '%s': ne[0] = %" PRId64 " is not a multiple of %s's block size %" PRId64, name,
                  ti.ne[0], tr->name, tr->block_size);
    // Bytes: (ne[0] / block) * type_size * ne[1] * ne[2] * ne[3], each product overflow-checked.
    uint64_t nbytes = static_cast<uint64_t>(ti.ne[0] / tr->block_size);
    bool over = __builtin_mul_overflow(nbytes, static_cast<uint64_t>(tr->type_size), &nbytes);
    for (int d = 1; d < kMaxDims && !over; ++d) over = __builtin_mul_overflow(nbytes, static_cast<uint64_t>(ti.ne[d]), &nbytes);
    if (over) return fail(dims_at, "tensor '%s': byte size of shape %s overflows 64 bits", name, ti.shape_string().c_str());
    ti.nbytes = nbytes;
    const uint64_t off_at = pos_;
    KILN_TRY(read(&ti.offset, "a tensor data offset"));
    if (ti.offset % f.alignment_ != 0)
      return fail(off_at, "tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, name,
                  ti.offset, f.alignment_);
    auto [it, fresh] = f.tensor_index_.emplace(ti.name, f.tensors_.size());
    if (!fresh)
      return fail(ti.info_offset, "duplicate tensor name '%s' (first at offset %" PRIu64 ")", name,
                  f.tensors_[it->second].info_offset);
    f.tensors_.push_back(std::move(ti));
  }
  return Status::ok();
}

Status Parser::place_tensors(File& f) {
  // data_offset = end of tensor infos rounded up to the alignment (pos_ <= size_, so this cannot overflow).
  f.data_offset_ = (pos_ + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  if (f.tensors_.empty()) return Status::ok();
  if (f.data_offset_ > size_)
    return fail(pos_, "data section at offset %" PRIu64 " starts past the end of the file (%" PRIu64 " bytes)",
                f.data_offset_, size_);
  const uint64_t avail = size_ - f.data_offset_;
  for (TensorInfo& t : f.tensors_) {
    if (t.offset > avail || t.nbytes > avail - t.offset)
      return fail(t.info_offset,
                  "tensor '%s': data [%" PRIu64 ", +%" PRIu64 ") relative to the data section at %" PRIu64
                  " lies outside the file (%" PRIu64 " bytes)",
                  t.name.c_str(), t.offset, t.nbytes, f.data_offset_, size_);
    t.data = p_ + f.data_offset_ + t.offset;
  }
  // Overlap: sorted by offset, each non-empty tensor must end at or before the next one starts.
  std::vector<const TensorInfo*> order;
  order.reserve(f.tensors_.size());
  for (const TensorInfo& t : f.tensors_)
    if (t.nbytes > 0) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& a = *order[i - 1];
    const TensorInfo& b = *order[i];
    if (a.offset + a.nbytes > b.offset)
      return fail(b.info_offset,
                  "tensor '%s': data at relative offset %" PRIu64 " overlaps tensor '%s' ([%" PRIu64 ", %" PRIu64 "))",
                  b.name.c_str(), b.offset, a.name.c_str(), a.offset, a.offset + a.nbytes);
  }
  return Status::ok();
}

Status Parser::parse(File& f) {
  uint32_t magic = 0, version = 0;
  KILN_TRY(read(&magic, "the magic"));
  if (magic != kMagic)
    return fail(0, "bad magic 0x%08x (not a GGUF file: expected \"GGUF\")", magic);
  KILN_TRY(read(&version, "the version"));
  if (version == 1) return fail(4, "unsupported GGUF version 1 (only versions 2 and 3 are read)");
  if (version != 2 && version != 3)
    return fail(4, "unsupported GGUF version %u%s (only versions 2 and 3 are read)", version,
                (version & 0xffff) == 0 ? ", a big-endian file?" : "");
  f.version_ = version;
  uint64_t n_tensors = 0, n_kv = 0;
  KILN_TRY(read(&n_tensors, "the tensor count"));
  KILN_TRY(read(&n_kv, "the metadata count"));
  KILN_TRY(parse_kvs(f, n_kv));

  if (auto it = f.kv_index_.find("general.alignment"); it != f.kv_index_.end()) {
    const KeyValue& kv = f.kvs_[it->second];
    if (kv.value.type() != ValueType::U32)
      return fail(kv.offset, "general.alignment has type %s (must be u32)", value_type_name(kv.value.type()));
    const uint32_t a = std::get<uint32_t>(kv.value.v);
    if (a == 0 || (a & (a - 1)) != 0)
      return fail(kv.offset, "general.alignment %u is not a non-zero power of two", a);
    f.alignment_ = a;
  }
  KILN_TRY(parse_tensor_infos(f, n_tensors));
  return place_tensors(f);
}

Result<File> File::parse(std::shared_ptr<MappedFile> map, File* partial) {
  File f;
  f.map_ = std::move(map);
  Parser p(*f.map_);
  if (Status st = p.parse(f); !st) {
    if (partial) *partial = std::move(f);
    return st;
  }
  return f;
}

Result<File> File::parse(std::shared_ptr<MappedFile> map) { return parse(std::move(map), nullptr); }

Result<File> File::open(const std::string& path, File* partial) {
  KILN_ASSIGN_OR_RETURN(auto map, MappedFile::open(path));
  return parse(std::move(map), partial);
}

Result<File> File::open(const std::string& path) { return open(path, nullptr); }

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace kiln::gguf
