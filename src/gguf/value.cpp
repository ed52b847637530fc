// Metadata values: names, classification and human-readable rendering.
#include <cinttypes>
#include <cstdio>

#include "gguf/gguf.h"

namespace kiln::gguf {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "unknown";
}

bool value_type_is_valid(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

bool Value::is_integer() const {
  switch (type()) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16: case ValueType::U32:
    case ValueType::I32: case ValueType::U64: case ValueType::I64:
      return true;
    default:
      return false;
  }
}

std::string quote_string(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += strprintf("\\x%02x", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

std::string Value::to_string(size_t max_items) const {
  switch (type()) {
    case ValueType::U8: return std::to_string(std::get<uint8_t>(v));
    case ValueType::I8: return std::to_string(std::get<int8_t>(v));
    case ValueType::U16: return std::to_string(std::get<uint16_t>(v));
    case ValueType::I16: return std::to_string(std::get<int16_t>(v));
    case ValueType::U32: return std::to_string(std::get<uint32_t>(v));
    case ValueType::I32: return std::to_string(std::get<int32_t>(v));
    case ValueType::U64: return std::to_string(std::get<uint64_t>(v));
    case ValueType::I64: return std::to_string(std::get<int64_t>(v));
    case ValueType::F32: return strprintf("%.9g", static_cast<double>(std::get<float>(v)));
    case ValueType::F64: return strprintf("%.17g", std::get<double>(v));
    case ValueType::BOOL: return std::get<bool>(v) ? "true" : "false";
    case ValueType::STRING: return quote_string(str());
    case ValueType::ARRAY: {
      const Array& a = arr();
      std::string s = "[";
      const size_t n = a.items.size() < max_items ? a.items.size() : max_items;
      for (size_t i = 0; i < n; ++i) {
        if (i) s += ", ";
        s += a.items[i].to_string(max_items);
      }
      if (n < a.items.size()) s += strprintf("%s... (%zu more)", n ? ", " : "", a.items.size() - n);
      s += "]";
      return s;
    }
  }
  return "?";
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (uint32_t i = 0; i < n_dims; ++i) s += strprintf("%s%" PRId64, i ? ", " : "", ne[i]);
  return s + "]";
}

}  // namespace kiln::gguf
