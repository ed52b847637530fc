// Field checks shared by the request parsers of the dialects (anthropic.cpp, responses.cpp, llama_routes.cpp):
// every error is a 400 whose param and message name the field by its path in the request ("messages[2].content").
#pragma once

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
