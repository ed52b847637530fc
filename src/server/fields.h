// Field checks shared by the request parsers of the dialects (anthropic.cpp, responses.cpp, llama_routes.cpp):
// every error is a 400 whose param and message name the field by its path in the request ("messages[2].content").
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai.h"

namespace kiln::server {

using ojson = nlohmann::ordered_json;

// The path of element i of the field at p, as errors name it: "messages[2]".
inline std::string index_path(const std::string& p, size_t i) { return p + "[" + std::to_string(i) + "]"; }

inline ApiError field_error(const std::string& param, const std::string& msg, const std::string& code = "invalid_value") {
  ApiError e;
  e.status = 400;
  e.param = param;
  e.message = msg;
  e.code = code;
  return e;
}

template <class J>
const char* json_type_name(const J& v) {
  if (v.is_null()) return "null";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  return "a value";
}

// "'p' must be WANT, not an object" (invalid_type).
template <class J>
ApiError type_error(const std::string& p, const char* want, const J& v) {
  return field_error(p, "'" + p + "' must be " + want + ", not " + json_type_name(v), "invalid_type");
}

// Body field k is there and not null.
inline bool present(const json& b, const char* k) {
  auto it = b.find(k);
  return it != b.end() && !it->is_null();
}

// An integer, or a number with an integral value (a JSON client may write 2.0), into *out.
inline bool as_int(const json& v, int64_t* out) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) return false;
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

// b[k] when present: a finite number in [lo, hi] (lo excluded when lo_open) into *out.
inline std::optional<ApiError> get_number(const json& b, const char* k, double lo, double hi, bool lo_open,
                                          double* out) {
  if (!present(b, k)) return std::nullopt;
  const json& v = b[k];
  if (!v.is_number()) return type_error(k, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be in %s%g, %g]; got %g", k, lo_open ? "(" : "[", lo, hi, x);
    return field_error(k, buf);
  }
  *out = x;
  return std::nullopt;
}

// b[k] when present: an integer in [lo, hi] into *out.
inline std::optional<ApiError> get_int(const json& b, const char* k, int64_t lo, int64_t hi, int64_t* out) {
  if (!present(b, k)) return std::nullopt;
  const json& v = b[k];
  int64_t x = 0;
  if (!as_int(v, &x)) return type_error(k, "an integer", v);
  if (x < lo || x > hi) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be in [%lld, %lld]; got %lld", k, (long long)lo, (long long)hi,
                  (long long)x);
    return field_error(k, buf);
  }
  *out = x;
  return std::nullopt;
}

inline ApiError missing_field(const std::string& p) {
  return field_error(p, "'" + p + "' is required", "missing_required_parameter");
}

// The first key of object o (at path `where`, "" for the body) that is not in `known`: a 400 naming it. A field
// kiln does not know is refused rather than ignored.
template <class J>
std::optional<ApiError> check_fields(const J& o, std::initializer_list<const char*> known, const std::string& where) {
  for (auto it = o.begin(); it != o.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (ok) continue;
    const std::string p = where.empty() ? it.key() : where + "." + it.key();
    return field_error(p, "unknown or unsupported parameter '" + p + "'", "unsupported_parameter");
  }
  return std::nullopt;
}

// o[k] as a string into *out when present and not null; a type error otherwise.
template <class J>
std::optional<ApiError> opt_string(const J& o, const char* k, const std::string& p, std::string* out) {
  auto it = o.find(k);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return type_error(p, "a string", *it);
  *out = it->template get<std::string>();
  return std::nullopt;
}

}  // namespace kiln::server
