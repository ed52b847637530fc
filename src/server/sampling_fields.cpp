#include "server/sampling_fields.h"

#include <cstdlib>
#include <limits>

#include "runtime/dry.h"
#include "server/fields.h"

namespace kiln::server {

namespace {

constexpr const char* kBias = "logit_bias";

// One bias value: a number in [-100, 100] (OpenAI's range), or false (llama-server: never pick the token).
std::optional<ApiError> bias_value(const json& v, const std::string& where, float* out) {
  if (v.is_boolean() && !v.get<bool>()) {
    *out = -std::numeric_limits<float>::infinity();
    return std::nullopt;
  }
  if (!v.is_number())
    return field_error(kBias, "'" + where + "' must be a number in [-100, 100] or false, not " + json_type_name(v),
                       "invalid_type");
  const double x = v.get<double>();
  if (!(x >= -100.0 && x <= 100.0)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be in [-100, 100]; got %g", where.c_str(), x);
    return field_error(kBias, buf);
  }
  *out = static_cast<float>(x);
  return std::nullopt;
}

// The tokens a key or entry names: a token id (in the vocabulary), or text whose every token is meant.
std::optional<ApiError> bias_tokens(const json& k, const std::string& where, const Tokenizer& tok,
                                    std::vector<int32_t>* out) {
  out->clear();
  int64_t id = 0;
  if (k.is_string()) {
    const std::string& s = k.get_ref<const std::string&>();
    const size_t digits = s.find_first_not_of("0123456789", !s.empty() && s[0] == '-' ? 1 : 0);
    if (s.empty() || s == "-" || digits != std::string::npos) {  // text
      *out = tok.encode(s, false, false);
      if (out->empty()) return field_error(kBias, "'" + where + "': the text '" + s + "' encodes to no tokens");
      return std::nullopt;
    }
    id = std::strtoll(s.c_str(), nullptr, 10);  // saturates: outside the vocabulary either way
  } else if (!as_int(k, &id)) {
    return field_error(kBias, "'" + where + "' must be a token id or a text, not " + json_type_name(k), "invalid_type");
  }
  if (id < 0 || id >= tok.n_vocab())
    return field_error(kBias, "'" + where + "': token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(tok.n_vocab()) + ")");
  out->push_back(static_cast<int32_t>(id));
  return std::nullopt;
}

std::optional<ApiError> parse_logit_bias(const json& v, const Tokenizer& tok, std::vector<LogitBias>* out) {
  out->clear();
  std::vector<int32_t> ids;
  float bias = 0;
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string where = std::string(kBias) + "[\"" + it.key() + "\"]";
      if (auto e = bias_tokens(json(it.key()), where, tok, &ids)) return e;
      if (auto e = bias_value(it.value(), where, &bias)) return e;
      for (int32_t t : ids) out->push_back({t, bias});
    }
    return std::nullopt;
  }
  if (!v.is_array())
    return field_error(kBias, std::string("'logit_bias' must be an object {\"token id\": bias} or an array of "
                                          "[token, bias] pairs, not ") + json_type_name(v), "invalid_type");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = index_path(kBias, i);
    const json& el = v[i];
    if (!el.is_array() || el.size() != 2)
      return field_error(kBias, "'" + where + "' must be a pair [token id or text, bias]", "invalid_type");
    if (auto e = bias_tokens(el[0], where + "[0]", tok, &ids)) return e;
    if (auto e = bias_value(el[1], where + "[1]", &bias)) return e;
    for (int32_t t : ids) out->push_back({t, bias});
  }
  return std::nullopt;
}

std::optional<ApiError> parse_breakers(const json& v, std::vector<std::string>* out) {
  const char* k = "dry_sequence_breakers";
  if (!v.is_array()) return type_error(k, "an array of strings", v);
  if (v.empty()) return field_error(k, "'dry_sequence_breakers' must hold at least one string");
  if (v.size() > DryBreakers::kMaxBreakers)
    return field_error(k, "'dry_sequence_breakers' holds at most " + std::to_string(DryBreakers::kMaxBreakers) +
                              " strings (got " + std::to_string(v.size()) + ")");
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      return field_error(k, "'" + index_path(k, i) + "' must be a string, not " + json_type_name(v[i]), "invalid_type");
    if (v[i].get_ref<const std::string&>().empty())
      return field_error(k, "'" + index_path(k, i) + "' is empty");
    out->push_back(v[i].get<std::string>());
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_sampler_fields(const json& b, const Tokenizer& tok, SamplerParams* sp) {
  struct Num {
    const char* name;
    double lo, hi;
    float* out;
  };
  for (const Num& f : {Num{"typical_p", 0, 1, &sp->typical_p}, Num{"xtc_probability", 0, 1, &sp->xtc_probability},
                       Num{"xtc_threshold", 0, 1, &sp->xtc_threshold}, Num{"dry_multiplier", 0, 1e6, &sp->dry_multiplier},
                       Num{"dry_base", 1, 1e6, &sp->dry_base}, Num{"mirostat_tau", 0, 1e6, &sp->mirostat_tau},
                       Num{"mirostat_eta", 0, 1e6, &sp->mirostat_eta}}) {
    double d = 0;
    if (auto e = get_number(b, f.name, f.lo, f.hi, false, &d)) return e;
    if (present(b, f.name)) *f.out = static_cast<float>(d);
  }
  int64_t i = 0;
  if (auto e = get_int(b, "dry_allowed_length", 0, INT32_MAX, &i)) return e;
  if (present(b, "dry_allowed_length")) sp->dry_allowed_length = static_cast<int32_t>(i);
  if (auto e = get_int(b, "dry_penalty_last_n", -1, INT32_MAX, &i)) return e;
  if (present(b, "dry_penalty_last_n")) sp->dry_penalty_last_n = static_cast<int32_t>(i);
  if (auto e = get_int(b, "mirostat", 0, 2, &i)) return e;
  if (present(b, "mirostat")) sp->mirostat = static_cast<int32_t>(i);
  if (present(b, "dry_sequence_breakers"))
    if (auto e = parse_breakers(b["dry_sequence_breakers"], &sp->dry_sequence_breakers)) return e;
  if (present(b, kBias))
    if (auto e = parse_logit_bias(b[kBias], tok, &sp->logit_bias)) return e;
  // tfs_z (tail-free sampling, which llama.cpp removed): refused unless neutral, never ignored.
  if (present(b, "tfs_z")) {
    if (!b["tfs_z"].is_number()) return type_error("tfs_z", "a number", b["tfs_z"]);
    if (b["tfs_z"].get<double>() != 1.0)
      return field_error("tfs_z", "'tfs_z' is not supported (only its neutral value, 1)", "unsupported_parameter");
  }
  return std::nullopt;
}

std::optional<ApiError> parse_spec_fields(const json& b, const SpecConfig& sv, SpecRequest* out) {
  if (present(b, "speculative"))
    return field_error("speculative", "'speculative' is not supported as an object: use llama-server's keys "
                       "speculative.n_max, speculative.n_min and speculative.p_min", "unsupported_parameter");
  int64_t i = 0;
  double d = 0;
  if (auto e = get_int(b, "speculative.n_max", 0, INT32_MAX, &i)) return e;
  if (present(b, "speculative.n_max")) out->n_max = static_cast<int32_t>(i);
  if (auto e = get_int(b, "speculative.n_min", 0, INT32_MAX, &i)) return e;
  if (present(b, "speculative.n_min")) out->n_min = static_cast<int32_t>(i);
  if (auto e = get_number(b, "speculative.p_min", 0, 1, false, &d)) return e;
  if (present(b, "speculative.p_min")) out->p_min = static_cast<float>(d);
  if (Status st = check_spec_request(*out, sv); !st) {
    const std::string& m = st.message();
    return field_error(m.substr(0, m.find(':')), m);
  }
  const char* type = "speculative.type";
  if (present(b, type)) {
    if (!b[type].is_string()) return type_error(type, "a string", b[type]);
    const std::string want = spec_type_name(sv.type), got = b[type].get<std::string>();
    if (got != want)
      return field_error(type, "'speculative.type' is '" + got + "', but this server runs " + want +
                         " (chosen at startup: --spec-type, -md)", "unsupported_parameter");
  }
  // Prompt lookup's sizes are the server's: a request may repeat them, not change them.
  struct Fixed {
    const char* name;
    int64_t value;
  };
  const bool ngram = sv.type == SpecConfig::Type::kNgram;
  for (const Fixed& f : {Fixed{"speculative.ngram_size_n", sv.ngram_n}, Fixed{"speculative.ngram_size_m", sv.ngram_m},
                         Fixed{"speculative.ngram_min_hits", 1}}) {
    if (!present(b, f.name)) continue;
    if (!as_int(b[f.name], &i)) return type_error(f.name, "an integer", b[f.name]);
    if (!ngram || i != f.value)
      return field_error(f.name, std::string("'") + f.name + "' is set at startup" +
                                     (ngram ? " (" + std::to_string(f.value) + " on this server)"
                                            : std::string(" and this server runs no prompt lookup")),
                         "unsupported_parameter");
  }
  return std::nullopt;
}

}  // namespace kiln::server
