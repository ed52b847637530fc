#include "server/openai.h"

#include <cmath>
#include <cstring>

#include "grammar/grammar.h"
#include "runtime/prompt.h"
#include "runtime/reasoning.h"
#include "runtime/tool_grammar.h"
#include "server/fields.h"
#include "server/sampling_fields.h"

namespace kiln::server {

json error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return json{{"error", err}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace {

ApiError bad(const std::string& param, const std::string& msg, const std::string& code = "invalid_value") {
  return field_error(param, msg, code);
}

template <class J>
const char* type_name(const J& v) {
  switch (v.type()) {
    case J::value_t::null: return "null";
    case J::value_t::object: return "an object";
    case J::value_t::array: return "an array";
    case J::value_t::string: return "a string";
    case J::value_t::boolean: return "a boolean";
    case J::value_t::number_integer:
    case J::value_t::number_unsigned: return "an integer";
    case J::value_t::number_float: return "a number";
    default: return "a value";
  }
}

std::optional<ApiError> get_bool(const json& b, const char* k, bool* out) {
  if (!present(b, k)) return std::nullopt;
  const json& v = b[k];
  if (!v.is_boolean()) return bad(k, std::string("'") + k + "' must be a boolean, not " + type_name(v), "invalid_type");
  *out = v.get<bool>();
  return std::nullopt;
}

// Fields of OpenAI's schemas checked by type here; of those kiln does not act on, the ones whose presence would
// change the answer are refused rather than ignored (response_format is read by parse_constraint).
enum class T { kString, kObject, kArray, kBool, kInt, kStringOrObject };
struct Known {
  const char* name;
  T type;
};
constexpr Known kKnown[] = {
    {"user", T::kString},         {"response_format", T::kObject},
    {"tools", T::kArray},         {"tool_choice", T::kStringOrObject}, {"parallel_tool_calls", T::kBool},
    {"service_tier", T::kString}, {"metadata", T::kObject},        {"store", T::kBool},
    {"suffix", T::kString},       {"echo", T::kBool},              {"best_of", T::kInt},
    {"stream_options", T::kObject}, {"functions", T::kArray},      {"function_call", T::kStringOrObject},
    {"modalities", T::kArray},    {"prediction", T::kObject},      {"audio", T::kObject},
    {"reasoning_effort", T::kString},
};

std::optional<ApiError> check_known(const json& b, bool chat) {
  for (const Known& k : kKnown) {
    if (!present(b, k.name)) continue;
    const json& v = b[k.name];
    bool ok = false;
    const char* want = "";
    switch (k.type) {
      case T::kString: ok = v.is_string(), want = "a string"; break;
      case T::kObject: ok = v.is_object(), want = "an object"; break;
      case T::kArray: ok = v.is_array(), want = "an array"; break;
      case T::kBool: ok = v.is_boolean(), want = "a boolean"; break;
      case T::kInt: ok = v.is_number_integer(), want = "an integer"; break;
      case T::kStringOrObject: ok = v.is_string() || v.is_object(), want = "a string or an object"; break;
    }
    if (!ok)
      return bad(k.name, std::string("'") + k.name + "' must be " + want + ", not " + type_name(v), "invalid_type");
  }
  auto unsupported = [](const char* p, const std::string& m) { return bad(p, m, "unsupported_parameter"); };
  if (!chat && present(b, "tools") && !b["tools"].empty())
    return unsupported("tools", "tools are a chat completions parameter");
  if (present(b, "functions") && !b["functions"].empty())
    return unsupported("functions", "function calls are not supported");
  if (present(b, "echo") && b["echo"].get<bool>()) return unsupported("echo", "'echo' is not supported");
  if (present(b, "best_of") && b["best_of"].get<int64_t>() != 1)
    return unsupported("best_of", "'best_of' other than 1 is not supported");
  if (present(b, "suffix") && !b["suffix"].get<std::string>().empty())
    return unsupported("suffix", "'suffix' is not supported");
  // vLLM's constraint field kiln does not have (llama-server's samplers: sampling_fields.h).
  if (!chat)
    for (const char* k : {"reasoning_effort", "reasoning_budget_tokens", "thinking_budget_tokens",
                          "reasoning_budget_message"})
      if (present(b, k))
        return unsupported(k, std::string("'") + k + "' is a chat completions parameter (a thinking block is the "
                                                      "chat template's)");
  if (present(b, "structured_outputs"))
    return unsupported("structured_outputs", "'structured_outputs' is not supported: use response_format, json_schema, "
                       "grammar or the guided_* fields");
  return std::nullopt;
}

// Fields common to both endpoints: model, sampling, limits, stop, stream.
std::optional<ApiError> parse_common(const json& b, const ParseContext& ctx, ParsedRequest* out) {
  if (auto e = check_known(b, out->chat)) return e;
  if (present(b, "model")) {
    if (!b["model"].is_string()) return bad("model", std::string("'model' must be a string, not ") + type_name(b["model"]), "invalid_type");
    out->model = b["model"].get<std::string>();
    if (ctx.strict_model && !out->model.empty() && out->model != ctx.model_id) {
      ApiError e = bad("model", "The model '" + out->model + "' does not exist; this server serves '" + ctx.model_id +
                                    "' (GET /v1/models)", "model_not_found");
      e.status = 404;
      return e;
    }
  }
  if (out->model.empty()) out->model = ctx.model_id;
  GenRequest& g = out->gen;
  SamplerParams& sp = g.sampling;
  double d = 0;
  int64_t i = 0;
  if (auto e = get_number(b, "temperature", 0, 2, false, &d)) return e;
  if (present(b, "temperature")) sp.temp = static_cast<float>(d);
  if (auto e = get_number(b, "top_p", 0, 1, true, &d)) return e;
  if (present(b, "top_p")) sp.top_p = static_cast<float>(d);
  if (auto e = get_int(b, "top_k", 0, 1 << 20, &i)) return e;
  if (present(b, "top_k")) sp.top_k = static_cast<int32_t>(i);
  if (auto e = get_number(b, "min_p", 0, 1, false, &d)) return e;
  if (present(b, "min_p")) sp.min_p = static_cast<float>(d);
  if (auto e = get_number(b, "presence_penalty", -2, 2, false, &d)) return e;
  if (present(b, "presence_penalty")) sp.presence_penalty = static_cast<float>(d);
  if (auto e = get_number(b, "frequency_penalty", -2, 2, false, &d)) return e;
  if (present(b, "frequency_penalty")) sp.frequency_penalty = static_cast<float>(d);
  if (auto e = get_number(b, "repeat_penalty", 0, 100, true, &d)) return e;
  if (present(b, "repeat_penalty")) sp.repeat_penalty = static_cast<float>(d);
  if (auto e = get_int(b, "repeat_last_n", -1, 1 << 20, &i)) return e;
  if (present(b, "repeat_last_n")) sp.penalty_last_n = static_cast<int32_t>(i);
  if (auto e = parse_sampler_fields(b, *ctx.tok, &sp)) return e;
  if (auto e = parse_spec_fields(b, ctx.spec, &g.spec)) return e;
  if (present(b, "seed")) {
    if (!as_int(b["seed"], &i))
      return bad("seed", std::string("'seed' must be an integer, not ") + type_name(b["seed"]), "invalid_type");
    sp.seed = static_cast<uint64_t>(i);
  }
  // max_completion_tokens (the current name) wins over max_tokens (deprecated), as in OpenAI's API.
  const int64_t max_gen = std::max<int64_t>(1, ctx.max_seq_ctx - 1);
  g.max_new_tokens = ctx.default_max_new_tokens;
  for (const char* k : {"max_tokens", "max_completion_tokens"}) {
    if (auto e = get_int(b, k, 1, max_gen, &i)) {
      if (e->code == "invalid_value")
        e->message += " (a request generates at least 1 token and at most the context, " + std::to_string(max_gen) + ")";
      return e;
    }
    if (present(b, k)) g.max_new_tokens = static_cast<int32_t>(i);
  }
  if (auto e = get_bool(b, "ignore_eos", &g.ignore_eos)) return e;
  if (present(b, "stop")) {
    const json& s = b["stop"];
    std::vector<std::string> stops;
    if (s.is_string()) {
      stops.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 16) return bad("stop", "'stop' holds at most 16 strings (got " + std::to_string(s.size()) + ")");
      for (size_t k = 0; k < s.size(); ++k) {
        if (!s[k].is_string())
          return bad("stop", "'stop[" + std::to_string(k) + "]' must be a string, not " + type_name(s[k]), "invalid_type");
        stops.push_back(s[k].get<std::string>());
      }
    } else {
      return bad("stop", std::string("'stop' must be a string or an array of strings, not ") + type_name(s), "invalid_type");
    }
    for (auto& x : stops) {
      if (x.empty()) return bad("stop", "'stop' strings must not be empty");
      if (x.size() > 1024) return bad("stop", "'stop' strings are limited to 1024 bytes");
    }
    g.stop = std::move(stops);
  }
  if (auto e = get_int(b, "n", 1, 16, &i)) return e;
  if (present(b, "n")) out->n = static_cast<int>(i);
  if (auto e = get_bool(b, "stream", &out->stream)) return e;
  if (present(b, "stream_options")) {
    if (auto e = get_bool(b["stream_options"], "include_usage", &out->include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
  }
  // llama-server's n_probs: top alternatives per token.
  if (auto e = get_int(b, "n_probs", 0, 20, &i)) return e;
  if (present(b, "n_probs") && i > 0) g.logprobs = true, g.top_logprobs = static_cast<int32_t>(i);
  g.timeout_s = ctx.timeout_s;
  return std::nullopt;
}

std::optional<ApiError> check_prompt_len(size_t n, const char* param, const ParseContext& ctx) {
  if (static_cast<int64_t>(n) >= ctx.max_seq_ctx) {
    return bad(param, "This model's maximum context length is " + std::to_string(ctx.max_seq_ctx) +
                          " tokens per sequence; the prompt has " + std::to_string(n) +
                          " tokens (at least one must be left to generate)", "context_length_exceeded");
  }
  return std::nullopt;
}

}  // namespace

namespace {

using ojson = nlohmann::ordered_json;

// OpenAI's tools: [{"type": "function", "function": {"name": ..., "description"?, "parameters"?}}, ...].
std::optional<ApiError> check_tools(const json& tools) {
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const json& t = tools[i];
    if (!t.is_object()) return bad(p, "'" + p + "' must be an object, not " + type_name(t), "invalid_type");
    if (!t.contains("type") || !t["type"].is_string() || t["type"].get<std::string>() != "function")
      return bad(p + ".type", "'" + p + ".type' must be \"function\"");
    if (!t.contains("function") || !t["function"].is_object())
      return bad(p + ".function", "'" + p + ".function' must be an object", "invalid_type");
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      return bad(p + ".function.name", "'" + p + ".function.name' must be a non-empty string", "invalid_type");
    if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
      return bad(p + ".function.parameters", "'" + p + ".function.parameters' must be an object", "invalid_type");
  }
  return std::nullopt;
}

// An assistant message's tool_calls: [{"id"?, "type": "function", "function": {"name", "arguments"}}].
std::optional<ApiError> check_tool_calls(const json& calls, const std::string& p) {
  if (!calls.is_array()) return bad(p, "'" + p + "' must be an array, not " + type_name(calls), "invalid_type");
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string pk = p + "[" + std::to_string(k) + "]";
    const json& c = calls[k];
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      return bad(pk + ".function", "'" + pk + ".function' must be an object", "invalid_type");
    const json& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string())
      return bad(pk + ".function.name", "'" + pk + ".function.name' must be a string", "invalid_type");
    if (f.contains("arguments") && !f["arguments"].is_string() && !f["arguments"].is_object())
      return bad(pk + ".function.arguments", "'" + pk + ".function.arguments' must be a JSON string", "invalid_type");
    if (c.contains("id") && !c["id"].is_null() && !c["id"].is_string())
      return bad(pk + ".id", "'" + pk + ".id' must be a string", "invalid_type");
  }
  return std::nullopt;
}

// ---- output constraints: at most one field, compiled to GBNF (docs/GRAMMAR.md) ----

// The fields that constrain the output, as OpenAI (response_format), llama-server (grammar, json_schema) and vLLM
// (guided_*) clients send them.
constexpr const char* kConstraintFields[] = {"response_format", "grammar",       "json_schema",   "guided_json",
                                             "guided_regex",    "guided_choice", "guided_grammar"};

// Whether field k of the body asks for a constraint: present, and not a no-op (response_format text; llama-server's
// default grammar "").
bool constrains(const json& b, const char* k) {
  if (!present(b, k)) return false;
  const json& v = b[k];
  if (std::strcmp(k, "response_format") == 0)
    return !(v.is_object() && v.contains("type") && v["type"].is_string() && v["type"].get<std::string>() == "text");
  if (std::strcmp(k, "grammar") == 0) return !(v.is_string() && v.get<std::string>().empty());
  return true;
}

// A JSON schema (an object or a boolean; with text_ok also a string holding one, as vLLM's guided_json takes it).
std::optional<ApiError> schema_grammar(const ojson& v, const std::string& param, bool text_ok, OutputGrammar* out) {
  Result<std::string> g = Status(ErrorCode::kInvalidArgument, "");
  if (v.is_object() || v.is_boolean()) {
    g = grammar::json_schema_to_gbnf(v);
  } else if (text_ok && v.is_string()) {
    g = grammar::json_schema_to_gbnf(std::string_view(v.get_ref<const std::string&>()));
  } else {
    return bad(param, "'" + param + "' must be a JSON schema (an object" + (text_ok ? " or a string holding one" : "") +
                          "), not " + type_name(v), "invalid_type");
  }
  if (!g) return grammar_error(param, g.status());
  *out = OutputGrammar{param, std::move(g).value()};
  return std::nullopt;
}

// OpenAI's response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
// "strict", "description"}}; llama-server's {"type": "json_object", "schema": {...}} too. A json_schema without
// "schema" allows any JSON value (as llama-server). strict is accepted either way: the schema is always enforced.
std::optional<ApiError> response_format_grammar(const ojson& rf, std::optional<OutputGrammar>* out) {
  if (!rf.contains("type") || !rf["type"].is_string())
    return bad("response_format.type", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
               rf.contains("type") ? "invalid_type" : "missing_required_parameter");
  const std::string type = rf["type"].get<std::string>();
  OutputGrammar g;
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    if (rf.contains("schema") && !rf["schema"].is_null()) {
      if (auto e = schema_grammar(rf["schema"], "response_format.schema", false, &g)) return e;
    } else {
      g = OutputGrammar{"response_format", grammar::json_object_gbnf()};
    }
  } else if (type == "json_schema") {
    const std::string p = "response_format.json_schema";
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
      return bad(p, "'" + p + "' must be an object {\"name\", \"schema\", \"strict\"}",
                 rf.contains("json_schema") ? "invalid_type" : "missing_required_parameter");
    const ojson& js = rf["json_schema"];
    for (const char* k : {"name", "description"})
      if (js.contains(k) && !js[k].is_string())
        return bad(p + "." + k, "'" + p + "." + k + "' must be a string, not " + type_name(js[k]), "invalid_type");
    if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean())
      return bad(p + ".strict", "'" + p + ".strict' must be a boolean, not " + type_name(js["strict"]), "invalid_type");
    const ojson schema = js.contains("schema") && !js["schema"].is_null() ? js["schema"] : ojson(true);
    if (auto e = schema_grammar(schema, p + ".schema", false, &g)) return e;
  } else {
    return bad("response_format.type", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", "
               "not '" + type + "'");
  }
  *out = std::move(g);
  return std::nullopt;
}

std::optional<ApiError> string_field(const ojson& b, const char* k, std::string* out) {
  if (!b[k].is_string())
    return bad(k, std::string("'") + k + "' must be a string, not " + type_name(b[k]), "invalid_type");
  *out = b[k].get<std::string>();
  return std::nullopt;
}

// The one constraint field of the body, as GBNF; two -> 400 naming both. `ob`: the body with its key order (a
// schema's properties are written in the order the client gave them).
std::optional<ApiError> parse_constraint(const json& b, const ojson& ob, std::optional<OutputGrammar>* out) {
  if (present(b, "guided_whitespace_pattern"))
    return bad("guided_whitespace_pattern", "'guided_whitespace_pattern' is not supported (JSON output allows "
               "llama.cpp's bounded whitespace between tokens)", "unsupported_parameter");
  std::vector<const char*> given;
  for (const char* k : kConstraintFields)
    if (constrains(b, k)) given.push_back(k);
  if (given.empty()) return std::nullopt;
  if (given.size() > 1)
    return bad(given[1], std::string("'") + given[0] + "' and '" + given[1] +
                             "' both constrain the output: send only one of them");
  const std::string k = given[0];
  OutputGrammar g{k, ""};
  if (k == "response_format") return response_format_grammar(ob[k], out);
  if (k == "json_schema" || k == "guided_json") {
    if (auto e = schema_grammar(ob[k], k, k == "guided_json", &g)) return e;
  } else if (k == "grammar" || k == "guided_grammar") {
    if (auto e = string_field(ob, k.c_str(), &g.gbnf)) return e;
  } else if (k == "guided_regex") {
    std::string re;
    if (auto e = string_field(ob, "guided_regex", &re)) return e;
    auto r = grammar::regex_to_gbnf(re);
    if (!r) return grammar_error(k, r.status());
    g.gbnf = std::move(r).value();
  } else {  // guided_choice
    const ojson& c = ob[k];
    if (!c.is_array()) return bad(k, "'guided_choice' must be an array of strings, not " + std::string(type_name(c)), "invalid_type");
    std::vector<std::string> choices;
    for (size_t i = 0; i < c.size(); ++i) {
      if (!c[i].is_string())
        return bad(k, "'guided_choice[" + std::to_string(i) + "]' must be a string, not " + type_name(c[i]), "invalid_type");
      choices.push_back(c[i].get<std::string>());
    }
    auto r = grammar::choice_to_gbnf(choices);
    if (!r) return grammar_error(k, r.status());
    g.gbnf = std::move(r).value();
  }
  *out = std::move(g);
  return std::nullopt;
}

// parse_constraint over the ordered body when the caller has it (else the body re-read: keys sorted).
std::optional<ApiError> constraint_of(const json& b, const ojson* ordered, ParsedRequest* out) {
  bool any = present(b, "guided_whitespace_pattern");
  for (const char* k : kConstraintFields) any = any || present(b, k);
  if (!any) return std::nullopt;
  if (ordered) return parse_constraint(b, *ordered, &out->grammar);
  return parse_constraint(b, ojson::parse(b.dump()), &out->grammar);
}

}  // namespace

namespace {

// A request's tools: `offered` (what the template sees), the functions a forced call may name (tool_choice
// "required": every one; a named function: that one; else none), parallel_tool_calls.
struct ToolRequest {
  ojson all = nullptr;      // tools as the request gave them (their indices name them in errors)
  ojson offered = nullptr;  // null: none (no tools, or tool_choice "none")
  std::vector<std::string> forced;
  std::string what;         // how tool_choice asked: "\"required\"" or "function 'NAME'"
  bool parallel = true;
};

// tools / tool_choice / parallel_tool_calls: "none" hides the tools; "auto" offers them and the reply may call
// them (free until a call opens, then the call's grammar: lazy_tool_grammar); "required" offers them and the reply is
// one or more calls (a grammar, tool_choice_grammar); a named function offers only that one and the reply calls it.
// parallel_tool_calls false: at most one call (enforced by the grammar; where "auto" has none, only the first call
// is returned). A constrained output cannot be a tool
// call: "required" and a named function are refused beside a constraint; with "auto" the model sees the tools and
// answers as constrained.
std::optional<ApiError> parse_tools(const json& b, const ojson* ordered, const ParsedRequest* out, ToolRequest* tr) {
  if (auto e = get_bool(b, "parallel_tool_calls", &tr->parallel)) return e;
  if (present(b, "tools") && !b["tools"].empty()) {
    if (auto e = check_tools(b["tools"])) return e;
    tr->all = ordered && ordered->contains("tools") ? (*ordered)["tools"] : ojson::parse(b["tools"].dump());
    tr->offered = tr->all;
  }
  if (!present(b, "tool_choice")) return std::nullopt;
  const json& tc = b["tool_choice"];
  if (out->grammar && !(tc.is_string() && (tc.get<std::string>() == "none" || tc.get<std::string>() == "auto")))
    return bad("tool_choice", "'tool_choice' asks for a tool call, which '" +
                                  out->grammar->param.substr(0, out->grammar->param.find('.')) +
                                  "' does not allow: send one of them");
  if (tc.is_string()) {
    const std::string v = tc.get<std::string>();
    if (v != "none" && v != "auto" && v != "required")
      return bad("tool_choice",
                 "'tool_choice' must be \"none\", \"auto\", \"required\" or a function, not '" + v + "'");
    if (v == "none") tr->offered = nullptr;
    if (v != "required") return std::nullopt;
    if (tr->offered.is_null()) return bad("tool_choice", "'tool_choice' \"required\" needs 'tools'");
    for (const auto& t : tr->offered) tr->forced.push_back(t["function"]["name"].get<std::string>());
    tr->what = "\"required\"";
    return std::nullopt;
  }
  if (!tc.contains("function") || !tc["function"].is_object() || !tc["function"].contains("name") ||
      !tc["function"]["name"].is_string())
    return bad("tool_choice", "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
               "invalid_type");
  const std::string name = tc["function"]["name"].get<std::string>();
  ojson only = ojson::array();
  if (tr->offered.is_array())
    for (const auto& t : tr->offered)
      if (t["function"]["name"] == name) only.push_back(t);
  if (only.empty())
    return bad("tool_choice", "'tool_choice' names the function '" + name + "', which 'tools' does not define");
  tr->offered = std::move(only);
  tr->forced = {name};
  tr->what = "function '" + name + "'";
  return std::nullopt;
}

// The grammar of a forced call (runtime/tool_grammar.h) in the template's format, as the request's constraint.
std::optional<ApiError> tool_choice_grammar(const ChatPrompt& chat, const ToolRequest& tr, ParsedRequest* out) {
  const tpl::ToolFormat* f = chat.tool_format();
  if (!f)
    return bad("tool_choice", "'tool_choice' " + tr.what + " cannot be enforced: " + chat.describe() +
                                  " writes tool calls in no format kiln knows (README, \"Tool calls\"); use \"auto\"",
               "unsupported_parameter");
  ToolGrammarRequest rq;
  rq.names = tr.forced;
  rq.parallel = tr.parallel;
  // A reasoning block may come first, unless the prompt closed one (Qwen3 with enable_thinking false).
  const std::string& end = chat.reply_options().think_end;
  const size_t last = out->prompt_text.find_last_not_of(" \n\t\r");
  const bool closed = last != std::string::npos && last + 1 >= end.size() &&
                      out->prompt_text.compare(last + 1 - end.size(), end.size(), end) == 0;
  if (chat.has_reasoning() && !closed) {
    rq.think_begin = chat.reply_options().think_begin;
    rq.think_end = end;
    rq.think_after = chat.reply_options().message_start;
  }
  rq.opened_reasoning = out->reply.opened_reasoning;
  rq.opened_tool_call = out->reply.opened_tool_call;
  rq.opener_tail = out->reply.opener_tail;
  auto g = tool_call_gbnf(*f, tr.all, rq);
  if (!g) {
    const std::string& m = g.status().message();
    const size_t colon = m.find(": ");
    const std::string param =
        m.rfind("tools[", 0) == 0 && colon != std::string::npos ? m.substr(0, colon) : std::string("tool_choice");
    return bad(param, "'tool_choice' " + tr.what + " cannot be enforced: " + m, "unsupported_parameter");
  }
  out->grammar = OutputGrammar{"tool_choice", std::move(g).value(), true};
  return std::nullopt;
}

// The reply's reasoning budget (runtime/reasoning.h): reasoning_budget_tokens or thinking_budget_tokens (an int
// >= -1; both only when equal), else reasoning_effort's level, else the server's --reasoning-budget. *message:
// reasoning_budget_message (a string), else --reasoning-budget-message.
std::optional<ApiError> parse_reasoning_budget(const json& b, const ParseContext& ctx, int32_t* out,
                                               std::string* message) {
  *out = ctx.reasoning_budget;
  *message = ctx.reasoning_budget_message;
  if (present(b, "reasoning_budget_message")) {
    const json& m = b["reasoning_budget_message"];
    if (!m.is_string())
      return bad("reasoning_budget_message",
                 std::string("'reasoning_budget_message' must be a string, not ") + type_name(m), "invalid_type");
    *message = m.get<std::string>();
  }
  if (present(b, "reasoning_effort")) {
    const std::string effort = b["reasoning_effort"].get<std::string>();
    const std::optional<int32_t> n = reasoning_effort_budget(effort);
    if (!n)
      return bad("reasoning_effort", "'reasoning_effort' must be \"none\", \"minimal\", \"low\", \"medium\", "
                                     "\"high\" or \"xhigh\", not '" + effort + "'");
    *out = *n;
  }
  std::optional<int64_t> given;
  for (const char* k : {"reasoning_budget_tokens", "thinking_budget_tokens"}) {
    int64_t i = 0;
    if (auto e = get_int(b, k, -1, INT32_MAX, &i)) {
      if (e->code == "invalid_value") e->message += " (-1: unlimited, 0: no thinking)";
      return e;
    }
    if (!present(b, k)) continue;
    if (given && *given != i)
      return bad(k, "'thinking_budget_tokens' and 'reasoning_budget_tokens' differ; send one");
    given = i;
  }
  if (given) *out = static_cast<int32_t>(*given);
  return std::nullopt;
}

// tool_choice "auto" (llama.cpp's lazy grammar): the reply is free until the format's trigger appears, then it is
// calls of the offered functions as "required" would write them; a prompt that opened a call (a prefill ending in
// the format's opener) is that call's continuation from the start. The trigger may begin in the prompt's end (the
// generation prompt and `prefill`; at_start formats: the prefill) and end in the reply, or end at the prompt's end
// (GrammarTriggers::prefix); none when the prompt opened a thinking block (a trigger there is thought about).
// Nothing is refused: a format without a trigger (ToolFormat::trigger: an ambiguous opening) or a schema keyword the
// format cannot enforce leave the reply free.
void lazy_tool_grammar(const ChatPrompt& chat, const ToolRequest& tr, const std::string& prefill,
                       ParsedRequest* out) {
  const tpl::ToolFormat* f = chat.tool_format();
  const bool opened = out->reply.opened_tool_call;
  if (!f || (f->trigger.empty() && !opened) || !tr.offered.is_array()) return;
  ToolGrammarRequest rq;
  for (const auto& t : tr.offered) rq.names.push_back(t["function"]["name"].get<std::string>());
  rq.parallel = tr.parallel;
  rq.opened_tool_call = opened;
  rq.opener_tail = out->reply.opener_tail;
  auto g = tool_call_gbnf(*f, tr.offered, rq);
  if (!g) return;
  out->grammar = OutputGrammar{"tools", std::move(g).value(), true, opened ? nullptr : f, true};
  const std::string& p = out->prompt_text;
  if (!opened && !out->reply.opened_reasoning)
    out->grammar->trigger_prefix = f->at_start ? prefill : p.substr(p.size() - std::min(p.size(), f->trigger.size()));
}

// Assistant prefill (as llama-server): a last assistant message without tool calls, after at least one other message,
// is the start of the reply. It leaves the conversation and its text follows the rendered generation prompt; the
// reply continues it (and holds only the continuation).
std::string take_prefill(ojson& msgs) {
  if (msgs.size() < 2) return "";
  const ojson& last = msgs.back();
  if (last["role"] != "assistant" || (last.contains("tool_calls") && !last["tool_calls"].is_null())) return "";
  std::string text = last["content"].get<std::string>();
  msgs.erase(msgs.size() - 1);
  return text;
}

}  // namespace

std::optional<ApiError> parse_chat(const json& b, const ParseContext& ctx, ParsedRequest* out,
                                   const nlohmann::ordered_json* ordered) {
  out->chat = true;
  out->gen.sampling = ctx.sampling;
  if (!b.contains("messages")) return bad("messages", "'messages' is required", "missing_required_parameter");
  const json& ms = b["messages"];
  if (!ms.is_array()) return bad("messages", std::string("'messages' must be an array, not ") + type_name(ms), "invalid_type");
  if (ms.empty()) return bad("messages", "'messages' must hold at least one message");
  // The messages the template sees: as the client wrote them (key order kept), content parts joined into one
  // string (templates differ in what they accept there), "developer" as "system", tool-call arguments as objects
  // (transformers templates expect a mapping and write it with tojson).
  const ojson oms = ordered && ordered->contains("messages") ? (*ordered)["messages"] : ojson::parse(ms.dump());
  ojson msgs = ojson::array();
  for (size_t i = 0; i < ms.size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const json& m = ms[i];
    if (!m.is_object()) return bad(p, "'" + p + "' must be an object, not " + type_name(m), "invalid_type");
    if (!m.contains("role") || !m["role"].is_string())
      return bad(p + ".role", "'" + p + ".role' must be a string", m.contains("role") ? "invalid_type" : "missing_required_parameter");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return bad(p + ".role", "'" + p + ".role': unknown role '" + m["role"].get<std::string>() +
                                  "' (system, developer, user, assistant, tool)");
    const bool has_calls = role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null();
    std::string content;
    const json* c = m.contains("content") ? &m["content"] : nullptr;
    if (!c || c->is_null()) {
      if (role != "assistant") return bad(p + ".content", "'" + p + ".content' is required", "missing_required_parameter");
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        const std::string pp = p + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
          return bad(pp, "'" + pp + "' must be an object with a 'type'", "invalid_type");
        if (part["type"].get<std::string>() != "text")
          return bad(pp + ".type", "'" + pp + ".type': only text content is supported (got '" +
                                       part["type"].get<std::string>() + "')", "unsupported_parameter");
        if (!part.contains("text") || !part["text"].is_string())
          return bad(pp + ".text", "'" + pp + ".text' must be a string", "invalid_type");
        content += part["text"].get<std::string>();
      }
    } else {
      return bad(p + ".content", "'" + p + ".content' must be a string or an array of content parts, not " +
                                     std::string(type_name(*c)), "invalid_type");
    }
    if (m.contains("name") && !m["name"].is_null() && !m["name"].is_string())
      return bad(p + ".name", "'" + p + ".name' must be a string", "invalid_type");
    if (role == "tool" && m.contains("tool_call_id") && !m["tool_call_id"].is_null() && !m["tool_call_id"].is_string())
      return bad(p + ".tool_call_id", "'" + p + ".tool_call_id' must be a string", "invalid_type");
    if (has_calls)
      if (auto e = check_tool_calls(m["tool_calls"], p + ".tool_calls")) return e;
    ojson om = oms.at(i);
    om["role"] = role;
    // null content (an assistant turn of tool calls) is "": real templates concatenate it (Qwen3's
    // `'\n' + message.content`, `'</think>' in message.content`) and fail on None, as llama-server found too.
    om["content"] = content;
    if (has_calls)
      for (auto& call : om["tool_calls"]) {
        ojson& f = call["function"];
        if (f.contains("arguments") && f["arguments"].is_string()) {
          try {
            ojson a = ojson::parse(f["arguments"].get<std::string>());
            if (a.is_object()) f["arguments"] = std::move(a);
          } catch (const nlohmann::json::exception&) {
          }  // not JSON: the template gets the string
        }
      }
    msgs.push_back(std::move(om));
  }
  if (auto e = parse_common(b, ctx, out)) return e;
  bool lp = false;
  if (auto e = get_bool(b, "logprobs", &lp)) return e;
  int64_t top = 0;
  if (auto e = get_int(b, "top_logprobs", 0, 20, &top)) return e;
  if (present(b, "top_logprobs") && !lp) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (lp) out->gen.logprobs = true, out->gen.top_logprobs = static_cast<int32_t>(top);
  if (auto e = constraint_of(b, ordered, out)) return e;

  ToolRequest tr;
  if (auto e = parse_tools(b, ordered, out, &tr)) return e;
  ojson& tools = tr.offered;
  // chat_template_kwargs (llama-server, vLLM): template variables of this request; reasoning_effort (OpenAI) is the
  // variable of that name (gpt-oss's template reads it) unless chat_template_kwargs sets it.
  ojson kwargs = nullptr;
  if (present(b, "chat_template_kwargs")) {
    const json& k = b["chat_template_kwargs"];
    if (!k.is_object())
      return bad("chat_template_kwargs", std::string("'chat_template_kwargs' must be an object, not ") + type_name(k),
                 "invalid_type");
    kwargs = ordered && ordered->contains("chat_template_kwargs") ? (*ordered)["chat_template_kwargs"]
                                                                   : ojson::parse(k.dump());
    if (Status s = check_template_kwargs(kwargs); !s.is_ok()) return bad("chat_template_kwargs", s.message());
  }
  if (present(b, "reasoning_effort")) {
    if (kwargs.is_null()) kwargs = ojson::object();
    if (!kwargs.contains("reasoning_effort")) kwargs["reasoning_effort"] = b["reasoning_effort"].get<std::string>();
  }
  if (!ctx.chat) return bad("messages", "the server has no chat template ready");
  int32_t budget = -1;
  std::string budget_message;
  if (auto e = parse_reasoning_budget(b, ctx, &budget, &budget_message)) return e;
  reasoning_budget_kwargs(*ctx.chat, budget, &kwargs);
  const std::string prefill = take_prefill(msgs);
  auto text = ctx.chat->render(msgs, tools, true, kwargs);
  if (!text) return bad("messages", "the chat template failed: " + text.status().message(), "template_error");
  *text += prefill;
  std::vector<int32_t> ids = ctx.chat->tokenize(*text);
  if (ids.empty()) return bad("messages", "the conversation renders to no tokens");
  if (auto e = check_prompt_len(ids.size(), "messages", ctx)) return e;
  out->prompts.push_back(std::move(ids));
  out->chat_prompt = ctx.chat;
  out->prompt_text = *text;
  ReplyContext& rc = out->reply;
  rc.want_tools = tools.is_array() && !tools.empty();
  rc.tools = tools;
  rc.parallel = tr.parallel;
  rc.opened_reasoning = ctx.chat->prompt_opens_reasoning(*text);
  rc.opened_tool_call = rc.want_tools && ctx.chat->prompt_opens_tool_call(*text, &rc.opener_tail);
  if (!tr.forced.empty()) {
    if (!prefill.empty())
      return bad("tool_choice", "'tool_choice' " + tr.what + " cannot continue an assistant prefill (the last "
                                "message is the assistant's)");
    if (auto e = tool_choice_grammar(*ctx.chat, tr, out)) return e;
  } else if (rc.want_tools && !out->grammar) {
    lazy_tool_grammar(*ctx.chat, tr, prefill, out);
  }
  const bool tool_grammar = out->grammar && out->grammar->tool_calls;
  if (rc.want_tools && (!out->grammar || tool_grammar)) out->gen.text_tokens = ctx.chat->tool_marker_tokens();
  out->split = (!out->grammar || tool_grammar) && (rc.want_tools || ctx.chat->has_reasoning());
  // An output grammar writes no thinking block (a tool call's grammar allows one before the call).
  if (!out->grammar || tool_grammar)
    out->gen.reasoning = reasoning_budget_for(*ctx.chat, budget, *text, budget_message);
  return std::nullopt;
}

json tool_calls_json(const std::vector<tpl::ToolCall>& calls) {
  json a = json::array();
  for (const tpl::ToolCall& c : calls)
    a.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return a;
}

std::vector<json> tool_call_deltas(const std::vector<tpl::ToolCall>& calls) {
  std::vector<json> out;
  for (size_t k = 0; k < calls.size(); ++k) {
    const int i = static_cast<int>(k);
    out.push_back(json::array({{{"index", i}, {"id", calls[k].id}, {"type", "function"},
                                {"function", {{"name", calls[k].name}, {"arguments", ""}}}}}));
    out.push_back(json::array({{{"index", i}, {"function", {{"arguments", calls[k].arguments}}}}}));
  }
  return out;
}

json chat_message(const ParsedRequest& pr, ChoiceState* c) {
  json m = {{"role", "assistant"}};
  if (!pr.split || !pr.chat_prompt) {
    m["content"] = c->text;
    return m;
  }
  const tpl::ParsedReply r = pr.chat_prompt->parse_reply(c->text, pr.reply);
  c->tool_calls = !r.tool_calls.empty();
  m["content"] = r.content.empty() && c->tool_calls ? json(nullptr) : json(r.content);
  if (!r.reasoning_content.empty()) m["reasoning_content"] = r.reasoning_content;
  if (c->tool_calls) m["tool_calls"] = tool_calls_json(r.tool_calls);
  return m;
}

std::optional<ApiError> parse_completion(const json& b, const ParseContext& ctx, ParsedRequest* out,
                                         const nlohmann::ordered_json* ordered) {
  out->chat = false;
  out->gen.sampling = ctx.sampling;
  if (!b.contains("prompt")) return bad("prompt", "'prompt' is required", "missing_required_parameter");
  const json& p = b["prompt"];
  const int32_t nv = ctx.tok->n_vocab();
  auto token_list = [&](const json& arr, const std::string& param, std::vector<int32_t>* ids) -> std::optional<ApiError> {
    for (size_t k = 0; k < arr.size(); ++k) {
      int64_t v = 0;
      if (!as_int(arr[k], &v))
        return bad(param, "'" + param + "[" + std::to_string(k) + "]' must be a token id (integer), not " +
                              type_name(arr[k]), "invalid_type");
      if (v < 0 || v >= nv)
        return bad(param, "'" + param + "[" + std::to_string(k) + "]': token id " + std::to_string(v) +
                              " is outside the vocabulary [0, " + std::to_string(nv) + ")");
      ids->push_back(static_cast<int32_t>(v));
    }
    if (ids->empty()) return bad(param, "'" + param + "' is an empty token list");
    return std::nullopt;
  };
  if (p.is_string()) {
    out->prompts.push_back(encode_prompt(*ctx.tok, p.get<std::string>()));
  } else if (p.is_array()) {
    if (p.empty()) return bad("prompt", "'prompt' is an empty array");
    if (p[0].is_number()) {
      std::vector<int32_t> ids;
      if (auto e = token_list(p, "prompt", &ids)) return e;
      out->prompts.push_back(std::move(ids));
    } else {
      if (p.size() > 64) return bad("prompt", "'prompt' holds at most 64 prompts");
      for (size_t k = 0; k < p.size(); ++k) {
        const std::string pk = "prompt[" + std::to_string(k) + "]";
        if (p[k].is_string()) {
          out->prompts.push_back(encode_prompt(*ctx.tok, p[k].get<std::string>()));
        } else if (p[k].is_array()) {
          std::vector<int32_t> ids;
          if (auto e = token_list(p[k], pk, &ids)) return e;
          out->prompts.push_back(std::move(ids));
        } else {
          return bad(pk, "'" + pk + "' must be a string or a token list, not " + type_name(p[k]), "invalid_type");
        }
      }
    }
  } else {
    return bad("prompt", std::string("'prompt' must be a string, an array of strings or token ids, not ") +
                             type_name(p), "invalid_type");
  }
  for (auto& ids : out->prompts) {
    if (ids.empty()) return bad("prompt", "the prompt encodes to no tokens");
    if (auto e = check_prompt_len(ids.size(), "prompt", ctx)) return e;
  }
  if (auto e = parse_common(b, ctx, out)) return e;
  if (auto e = constraint_of(b, ordered, out)) return e;
  if (out->prompts.size() * static_cast<size_t>(out->n) > 64)
    return bad("n", "at most 64 choices per request (prompts x n)");
  int64_t lp = 0;
  if (auto e = get_int(b, "logprobs", 0, 20, &lp)) return e;
  if (present(b, "logprobs")) out->gen.logprobs = true, out->gen.top_logprobs = static_cast<int32_t>(lp);
  return std::nullopt;
}

ApiError grammar_error(const std::string& param, const Status& st) {
  const std::string& m = st.message();
  if (m.rfind(param + ": ", 0) == 0) return bad(param, m);  // the grammar layer named it already ("guided_choice: ")
  return bad(param, "'" + param + "': " + m);
}

ApiError submit_error(const Status& st) {
  const std::string& m = st.message();
  std::string param;
  const size_t colon = m.find(':');
  if (colon != std::string::npos && colon < 32 && m.find(' ') > colon) param = m.substr(0, colon);
  if (st.code() == ErrorCode::kUnsupported && m.find("shutting down") != std::string::npos) {
    ApiError e;
    e.status = 503;
    e.type = "unavailable_error";
    e.message = m;
    e.code = "shutting_down";
    return e;
  }
  return bad(param, m, st.code() == ErrorCode::kOutOfRange ? "context_length_exceeded" : "invalid_value");
}

const char* finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    default: return "stop";
  }
}

json usage_json(const std::vector<ChoiceState>& choices, const std::vector<int64_t>& prompt_tokens) {
  int64_t p = 0, c = 0, cached = 0, reasoning = 0;
  for (int64_t n : prompt_tokens) p += n;
  for (auto& ch : choices) c += ch.timings.n_gen, cached += ch.timings.n_cached, reasoning += ch.timings.n_reasoning;
  json u = {{"prompt_tokens", p},
            {"completion_tokens", c},
            {"total_tokens", p + c},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  // OpenAI's shape, where a reply had a thinking block (its tokens, both markers included).
  if (reasoning > 0) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
  return u;
}

json timings_json(const std::vector<ChoiceState>& choices) {
  int64_t cache_n = 0, prompt_n = 0, pred_n = 0, draft_n = 0, draft_ok = 0;
  double prompt_ms = 0, pred_ms = 0;
  for (auto& ch : choices) {
    draft_n += ch.timings.n_draft, draft_ok += ch.timings.n_draft_accepted;
    cache_n += ch.timings.n_cached;
    prompt_n += ch.timings.n_prompt - ch.timings.n_cached;
    pred_n += ch.timings.n_gen;
    prompt_ms = std::max(prompt_ms, ch.timings.prompt_ms);
    pred_ms = std::max(pred_ms, ch.timings.gen_ms);
  }
  auto per_s = [](int64_t n, double ms) { return ms > 0 ? n * 1000.0 / ms : 0.0; };
  auto per_tok = [](int64_t n, double ms) { return n > 0 ? ms / n : 0.0; };
  json t = {{"cache_n", cache_n},
            {"prompt_n", prompt_n},
            {"prompt_ms", prompt_ms},
            {"prompt_per_token_ms", per_tok(prompt_n, prompt_ms)},
            {"prompt_per_second", per_s(prompt_n, prompt_ms)},
            {"predicted_n", pred_n},
            {"predicted_ms", pred_ms},
            {"predicted_per_token_ms", per_tok(pred_n, pred_ms)},
            {"predicted_per_second", per_s(pred_n, pred_ms)}};
  if (draft_n > 0) t["draft_n"] = draft_n, t["draft_n_accepted"] = draft_ok;  // as llama-server: only with drafts
  return t;
}

namespace {
json bytes_of(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}
}  // namespace

json chat_logprob_entry(const Tokenizer& tok, int32_t id, float lp, const std::vector<TokenLogprob>& top) {
  const std::string piece = tok.token_to_piece(id);
  json tops = json::array();
  for (auto& t : top) {
    const std::string tp = tok.token_to_piece(t.id);
    tops.push_back({{"token", tp}, {"logprob", t.logprob}, {"bytes", bytes_of(tp)}});
  }
  return json{{"token", piece}, {"logprob", lp}, {"bytes", bytes_of(piece)}, {"top_logprobs", tops}};
}

json completion_logprobs(const Tokenizer& tok, const ChoiceState& c) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t off = 0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    const std::string piece = tok.token_to_piece(c.ids[i]);
    tokens.push_back(piece);
    lps.push_back(c.lps[i]);
    json t = json::object();
    for (auto& x : c.tops[i]) t[tok.token_to_piece(x.id)] = x.logprob;
    tops.push_back(t);
    offs.push_back(off);
    off += piece.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

}  // namespace kiln::server
