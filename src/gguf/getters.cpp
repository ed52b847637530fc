// Typed metadata access: integer widths convert when the value fits, f32 accepts f64 and integers.
#include <cmath>
#include <limits>

#include "gguf/gguf.h"

namespace kiln::gguf {

namespace {

// An integer value as (negative?, magnitude-ish) pair: signed values in i64, unsigned in u64.
struct IntValue {
  bool is_signed;
  int64_t s;
  uint64_t u;
};

bool as_int(const Value& v, IntValue* out) {
  switch (v.type()) {
    case ValueType::U8: *out = {false, 0, std::get<uint8_t>(v.v)}; return true;
    case ValueType::U16: *out = {false, 0, std::get<uint16_t>(v.v)}; return true;
    case ValueType::U32: *out = {false, 0, std::get<uint32_t>(v.v)}; return true;
    case ValueType::U64: *out = {false, 0, std::get<uint64_t>(v.v)}; return true;
    case ValueType::I8: *out = {true, std::get<int8_t>(v.v), 0}; return true;
    case ValueType::I16: *out = {true, std::get<int16_t>(v.v), 0}; return true;
    case ValueType::I32: *out = {true, std::get<int32_t>(v.v), 0}; return true;
    case ValueType::I64: *out = {true, std::get<int64_t>(v.v), 0}; return true;
    default: return false;
  }
}

// Converts an integer value to T when it fits.
template <class T>
bool int_to(const Value& v, T* out) {
  IntValue iv;
  if (!as_int(v, &iv)) return false;
  using L = std::numeric_limits<T>;
  if (iv.is_signed) {
    if (iv.s < 0) {
      if (!L::is_signed || iv.s < static_cast<int64_t>(L::min())) return false;
    } else if (static_cast<uint64_t>(iv.s) > static_cast<uint64_t>(L::max())) {
      return false;
    }
    *out = static_cast<T>(iv.s);
  } else {
    if (iv.u > static_cast<uint64_t>(L::max())) return false;
    *out = static_cast<T>(iv.u);
  }
  return true;
}

bool to_f32(const Value& v, float* out) {
  if (v.type() == ValueType::F32) { *out = std::get<float>(v.v); return true; }
  if (v.type() == ValueType::F64) { *out = static_cast<float>(std::get<double>(v.v)); return true; }
  IntValue iv;
  if (!as_int(v, &iv)) return false;
  *out = iv.is_signed ? static_cast<float>(iv.s) : static_cast<float>(iv.u);
  return true;
}

Status type_error(std::string_view key, const Value& v, const char* wanted) {
  return make_error(ErrorCode::kInvalidFile, "metadata key '%.*s' holds %s %s, expected %s",
                    static_cast<int>(key.size()), key.data(), value_type_name(v.type()), v.to_string(4).c_str(),
                    wanted);
}

Status missing(std::string_view key) {
  return make_error(ErrorCode::kNotFound, "metadata key '%.*s' is missing", static_cast<int>(key.size()), key.data());
}

template <class T>
Result<T> get_int(const File& f, std::string_view key, const char* wanted) {
  const Value* v = f.find(key);
  if (!v) return missing(key);
  T x{};
  if (!int_to(*v, &x)) return type_error(key, *v, wanted);
  return x;
}

const Array* find_array(const File& f, std::string_view key, Status* err) {
  const Value* v = f.find(key);
  if (!v) {
    *err = missing(key);
    return nullptr;
  }
  if (!v->is_array()) {
    *err = type_error(key, *v, "an array");
    return nullptr;
  }
  return &v->arr();
}

}  // namespace

Result<uint64_t> File::get_u64(std::string_view key) const { return get_int<uint64_t>(*this, key, "an unsigned 64-bit integer"); }
Result<uint32_t> File::get_u32(std::string_view key) const { return get_int<uint32_t>(*this, key, "an unsigned 32-bit integer"); }
Result<int64_t> File::get_i64(std::string_view key) const { return get_int<int64_t>(*this, key, "a 64-bit integer"); }

Result<float> File::get_f32(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  float x;
  if (!to_f32(*v, &x)) return type_error(key, *v, "a number");
  return x;
}

Result<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (v->type() != ValueType::BOOL) return type_error(key, *v, "a bool");
  return std::get<bool>(v->v);
}

Result<std::string> File::get_str(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (!v->is_string()) return type_error(key, *v, "a string");
  return v->str();
}

Result<uint32_t> File::get_u32_or(std::string_view key, uint32_t fallback) const {
  return has(key) ? get_u32(key) : Result<uint32_t>(fallback);
}
Result<float> File::get_f32_or(std::string_view key, float fallback) const {
  return has(key) ? get_f32(key) : Result<float>(fallback);
}
Result<bool> File::get_bool_or(std::string_view key, bool fallback) const {
  return has(key) ? get_bool(key) : Result<bool>(fallback);
}
Result<std::string> File::get_str_or(std::string_view key, std::string fallback) const {
  return has(key) ? get_str(key) : Result<std::string>(std::move(fallback));
}

Result<std::vector<std::string>> File::get_str_array(std::string_view key) const {
  Status err;
  const Array* a = find_array(*this, key, &err);
  if (!a) return err;
  if (a->type != ValueType::STRING)
    return make_error(ErrorCode::kInvalidFile, "metadata key '%.*s' is an array of %s, expected strings",
                      static_cast<int>(key.size()), key.data(), value_type_name(a->type));
  std::vector<std::string> out;
  out.reserve(a->items.size());
  for (const Value& x : a->items) out.push_back(x.str());
  return out;
}

Result<std::vector<float>> File::get_f32_array(std::string_view key) const {
  Status err;
  const Array* a = find_array(*this, key, &err);
  if (!a) return err;
  std::vector<float> out(a->items.size());
  for (size_t i = 0; i < a->items.size(); ++i)
    if (!to_f32(a->items[i], &out[i]))
      return make_error(ErrorCode::kInvalidFile, "metadata key '%.*s' is an array of %s, expected numbers",
                        static_cast<int>(key.size()), key.data(), value_type_name(a->type));
  return out;
}

Result<std::vector<int32_t>> File::get_i32_array(std::string_view key) const {
  Status err;
  const Array* a = find_array(*this, key, &err);
  if (!a) return err;
  std::vector<int32_t> out(a->items.size());
  for (size_t i = 0; i < a->items.size(); ++i)
    if (!int_to(a->items[i], &out[i]))
      return make_error(ErrorCode::kInvalidFile, "metadata key '%.*s': item %zu (%s %s) is not a 32-bit integer",
                        static_cast<int>(key.size()), key.data(), i, value_type_name(a->items[i].type()),
                        a->items[i].to_string(4).c_str());
  return out;
}

}  // namespace kiln::gguf
