// OpenAI's Responses request (stateless) -> a chat completions body:
//   instructions                               -> a system message first
//   input: a string                            -> one user message
//   input items: message (user / system / developer / assistant; input_text, output_text, refusal parts)
//                function_call                 -> tool_calls of the assistant message before it (or a new one)
//                function_call_output          -> a tool message
//                reasoning (content or summary text) -> reasoning_content of the next assistant message
//   tools [{type: function, name, parameters}] -> chat tools; tool_choice the same values
//   max_output_tokens -> max_tokens; temperature, top_p and kiln's sampling extras under their names
// Stored state (store: true, previous_response_id, item_reference), images, files, built-in tools and structured
// text formats are refused with a 400 naming the field.
#include <string>

#include "runtime/reasoning.h"
#include "server/dialects.h"

namespace kiln::server {

namespace {

// The text of a message's content: a string, or parts of the given text types joined.
std::optional<ApiError> content_text(const ojson& c, const std::string& p, bool assistant, std::string* out) {
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return type_error(p, "a string or an array of content parts", c);
  for (size_t k = 0; k < c.size(); ++k) {
    const std::string pk = index_path(p, k);
    const ojson& part = c[k];
    if (!part.is_object()) return type_error(pk, "an object", part);
    if (!part.contains("type") || !part["type"].is_string()) return missing_field(pk + ".type");
    const std::string t = part["type"].get<std::string>();
    const char* key = t == "input_text" || t == "output_text" ? "text" : t == "refusal" && assistant ? "refusal" : nullptr;
    if (!key)
      return field_error(pk + ".type", "'" + pk + ".type': '" + t + "' parts are not supported (input_text, output_text" +
                                           (assistant ? ", refusal" : "") + " are)", "unsupported_parameter");
    if (auto e = check_fields(part, {"type", "text", "refusal", "annotations", "logprobs"}, pk)) return e;
    if (!part.contains(key) || !part[key].is_string()) return type_error(pk + "." + key, "a string", part.value(key, ojson()));
    *out += part[key].get<std::string>();
  }
  return std::nullopt;
}

// Builds the chat messages from the input items.
struct Conversation {
  ojson msgs = ojson::array();
  std::string reasoning;  // a reasoning item waiting for its assistant message
  bool has_reasoning = false;

  ojson& assistant() {  // the assistant message the next function call joins (the previous message, or a new one)
    if (msgs.empty() || msgs.back()["role"] != "assistant") push_assistant("");
    return msgs.back();
  }
  void push_assistant(const std::string& text) {
    ojson m = {{"role", "assistant"}, {"content", text}};
    if (has_reasoning) m["reasoning_content"] = reasoning, reasoning.clear(), has_reasoning = false;
    msgs.push_back(std::move(m));
  }
};

std::optional<ApiError> add_message(const ojson& it, const std::string& p, Conversation* cv) {
  if (auto e = check_fields(it, {"type", "role", "content", "id", "status"}, p)) return e;
  if (!it.contains("role") || !it["role"].is_string()) return missing_field(p + ".role");
  const std::string role = it["role"].get<std::string>();
  if (role != "user" && role != "system" && role != "developer" && role != "assistant")
    return field_error(p + ".role", "'" + p + ".role' must be user, system, developer or assistant, not '" + role + "'");
  if (!it.contains("content")) return missing_field(p + ".content");
  std::string text;
  if (auto e = content_text(it["content"], p + ".content", role == "assistant", &text)) return e;
  if (role == "assistant") cv->push_assistant(text);
  else cv->msgs.push_back(ojson{{"role", role == "developer" ? "system" : role}, {"content", text}});
  return std::nullopt;
}

std::optional<ApiError> add_function_call(const ojson& it, const std::string& p, Conversation* cv) {
  if (auto e = check_fields(it, {"type", "call_id", "name", "arguments", "id", "status"}, p)) return e;
  for (const char* k : {"call_id", "name", "arguments"})
    if (!it.contains(k) || !it[k].is_string())
      return it.contains(k) ? type_error(p + "." + k, "a string", it[k]) : missing_field(p + "." + k);
  ojson args = it["arguments"];
  try {
    ojson a = ojson::parse(it["arguments"].get<std::string>());
    if (a.is_object()) args = std::move(a);
  } catch (const nlohmann::json::exception&) {
  }  // not JSON: the template gets the string
  ojson& m = cv->assistant();
  if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
  m["tool_calls"].push_back(
      ojson{{"id", it["call_id"]}, {"type", "function"}, {"function", {{"name", it["name"]}, {"arguments", args}}}});
  return std::nullopt;
}

std::optional<ApiError> add_function_output(const ojson& it, const std::string& p, Conversation* cv) {
  if (auto e = check_fields(it, {"type", "call_id", "output", "id", "status"}, p)) return e;
  if (!it.contains("call_id") || !it["call_id"].is_string()) return missing_field(p + ".call_id");
  if (!it.contains("output")) return missing_field(p + ".output");
  std::string text;
  if (auto e = content_text(it["output"], p + ".output", false, &text)) return e;
  cv->msgs.push_back(ojson{{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", text}});
  return std::nullopt;
}

std::optional<ApiError> add_reasoning(const ojson& it, const std::string& p, Conversation* cv) {
  if (auto e = check_fields(it, {"type", "id", "summary", "content", "encrypted_content", "status"}, p)) return e;
  if (it.contains("encrypted_content") && it["encrypted_content"].is_string() &&
      !it["encrypted_content"].get<std::string>().empty())
    return field_error(p + ".encrypted_content", "'" + p + ".encrypted_content': this server keeps no encrypted "
                                                         "reasoning; send the reasoning as content", "unsupported_parameter");
  // The reasoning text: its content parts (reasoning_text), else its summary (summary_text).
  std::string text;
  for (const char* k : {"content", "summary"}) {
    if (!it.contains(k) || it[k].is_null()) continue;
    const ojson& a = it[k];
    if (!a.is_array()) return type_error(p + "." + k, "an array", a);
    std::string t;
    for (size_t j = 0; j < a.size(); ++j) {
      const std::string pj = index_path(p + "." + k, j);
      if (!a[j].is_object() || !a[j].contains("text") || !a[j]["text"].is_string())
        return field_error(pj, "'" + pj + "' must be an object with a string 'text'", "invalid_type");
      t += a[j]["text"].get<std::string>();
    }
    if (text.empty()) text = t;
  }
  cv->reasoning += text;
  cv->has_reasoning = true;
  return std::nullopt;
}

std::optional<ApiError> convert_input(const ojson& in, Conversation* cv) {
  if (in.is_string()) {
    cv->msgs.push_back(ojson{{"role", "user"}, {"content", in}});
    return std::nullopt;
  }
  if (!in.is_array()) return type_error("input", "a string or an array of items", in);
  if (in.empty()) return field_error("input", "'input' must hold at least one item");
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string p = index_path("input", i);
    const ojson& it = in[i];
    if (!it.is_object()) return type_error(p, "an object", it);
    std::string type = "message";
    if (auto e = opt_string(it, "type", p + ".type", &type)) return e;
    std::optional<ApiError> e;
    if (type == "message") e = add_message(it, p, cv);
    else if (type == "function_call") e = add_function_call(it, p, cv);
    else if (type == "function_call_output") e = add_function_output(it, p, cv);
    else if (type == "reasoning") e = add_reasoning(it, p, cv);
    else if (type == "item_reference")
      e = field_error(p + ".type", "'" + p + "': item references need stored responses; this server is stateless",
                      "unsupported_parameter");
    else
      e = field_error(p + ".type", "'" + p + ".type': unknown item type '" + type + "'");
    if (e) return e;
  }
  if (cv->has_reasoning) cv->push_assistant("");  // reasoning last: the turn it belongs to
  return std::nullopt;
}

std::optional<ApiError> convert_tools(const ojson& ts, ojson* out) {
  if (!ts.is_array()) return type_error("tools", "an array", ts);
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string p = index_path("tools", i);
    const ojson& t = ts[i];
    if (!t.is_object()) return type_error(p, "an object", t);
    if (!t.contains("type") || t["type"] != "function")
      return field_error(p + ".type", "'" + p + ".type': only function tools are supported", "unsupported_parameter");
    if (auto e = check_fields(t, {"type", "name", "description", "parameters", "strict"}, p)) return e;
    if (!t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
      return field_error(p + ".name", "'" + p + ".name' must be a non-empty string", "invalid_type");
    ojson f = {{"name", t["name"]}};
    std::string desc;
    if (auto e = opt_string(t, "description", p + ".description", &desc)) return e;
    if (!desc.empty()) f["description"] = desc;
    if (t.contains("parameters") && !t["parameters"].is_null()) {
      if (!t["parameters"].is_object()) return type_error(p + ".parameters", "an object", t["parameters"]);
      f["parameters"] = t["parameters"];
    }
    if (t.contains("strict") && !t["strict"].is_null() && !t["strict"].is_boolean())
      return type_error(p + ".strict", "a boolean", t["strict"]);
    out->push_back(ojson{{"type", "function"}, {"function", std::move(f)}});
  }
  return std::nullopt;
}

std::optional<ApiError> convert_tool_choice(const ojson& tc, ojson* chat) {
  if (tc.is_string()) {
    (*chat)["tool_choice"] = tc;  // parse_chat checks the value
    return std::nullopt;
  }
  if (!tc.is_object()) return type_error("tool_choice", "a string or an object", tc);
  if (auto e = check_fields(tc, {"type", "name"}, "tool_choice")) return e;
  if (!tc.contains("type") || tc["type"] != "function" || !tc.contains("name") || !tc["name"].is_string())
    return field_error("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                      "{\"type\": \"function\", \"name\": ...}", "invalid_type");
  (*chat)["tool_choice"] = ojson{{"type", "function"}, {"function", {{"name", tc["name"]}}}};
  return std::nullopt;
}

// Fields that describe the request without changing the reply: checked, echoed in the response.
std::optional<ApiError> check_settings(const ojson& b, ResponsesOptions* o) {
  if (b.contains("store") && !b["store"].is_null()) {
    if (!b["store"].is_boolean()) return type_error("store", "a boolean", b["store"]);
    if (b["store"].get<bool>())
      return field_error("store", "'store': true is not supported: this server keeps no responses (send false)",
                         "unsupported_parameter");
  }
  if (b.contains("previous_response_id") && !b["previous_response_id"].is_null())
    return field_error("previous_response_id", "'previous_response_id' is not supported: this server is stateless; "
                                               "send the whole conversation as 'input'", "unsupported_parameter");
  if (b.contains("truncation") && !b["truncation"].is_null() && b["truncation"] != "disabled")
    return field_error("truncation", "only 'truncation': \"disabled\" is supported", "unsupported_parameter");
  if (b.contains("include") && !b["include"].is_null()) {
    const ojson& inc = b["include"];
    if (!inc.is_array()) return type_error("include", "an array", inc);
    for (size_t k = 0; k < inc.size(); ++k)  // reasoning is always in clear: its encrypted form is ""
      if (inc[k] != "reasoning.encrypted_content")
        return field_error(index_path("include", k),
                           "'" + index_path("include", k) + "': only \"reasoning.encrypted_content\" is supported",
                           "unsupported_parameter");
  }
  if (b.contains("text") && !b["text"].is_null()) {
    const ojson& t = b["text"];
    if (!t.is_object()) return type_error("text", "an object", t);
    if (auto e = check_fields(t, {"format"}, "text")) return e;
    if (t.contains("format") && !(t["format"].is_object() && t["format"].value("type", "") == "text"))
      return field_error("text.format", "only 'text.format' {\"type\": \"text\"} is supported", "unsupported_parameter");
  }
  if (b.contains("reasoning") && !b["reasoning"].is_null()) {  // effort: the reasoning budget; summary: as it does
    const ojson& r = b["reasoning"];
    if (!r.is_object()) return type_error("reasoning", "an object", r);
    if (auto e = check_fields(r, {"effort", "summary", "generate_summary"}, "reasoning")) return e;
    std::string s;
    for (const char* k : {"summary", "generate_summary"})
      if (auto e = opt_string(r, k, std::string("reasoning.") + k, &s)) return e;
    if (auto e = opt_string(r, "effort", "reasoning.effort", &o->effort)) return e;
    if (!o->effort.empty() && !reasoning_effort_budget(o->effort))
      return field_error("reasoning.effort", "'reasoning.effort' must be \"none\", \"minimal\", \"low\", \"medium\", "
                                             "\"high\" or \"xhigh\", not '" + o->effort + "'");
  }
  if (b.contains("metadata") && !b["metadata"].is_null() && !b["metadata"].is_object())
    return type_error("metadata", "an object", b["metadata"]);
  std::string s;
  for (const char* k : {"user", "prompt_cache_key", "safety_identifier", "service_tier"})
    if (auto e = opt_string(b, k, k, &s)) return e;
  if (b.contains("parallel_tool_calls") && !b["parallel_tool_calls"].is_null()) {
    if (!b["parallel_tool_calls"].is_boolean())
      return type_error("parallel_tool_calls", "a boolean", b["parallel_tool_calls"]);
    o->parallel_tool_calls = b["parallel_tool_calls"].get<bool>();
  }
  if (b.contains("stream") && !b["stream"].is_null()) {
    if (!b["stream"].is_boolean()) return type_error("stream", "a boolean", b["stream"]);
    o->stream = b["stream"].get<bool>();
  }
  for (const char* k : {"instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens",
                        "metadata", "text", "reasoning", "user"})
    if (b.contains(k)) o->echo[k] = b[k];
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> responses_to_chat(const ojson& b, ojson* chat, ResponsesOptions* o) {
  static constexpr const char* kSame[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos",
                                          "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty"};
  if (auto e = check_fields(b, {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
                                "stream", "max_output_tokens", "temperature", "top_p", "reasoning", "text",
                                "metadata", "user", "store", "truncation", "include", "previous_response_id",
                                "prompt_cache_key", "safety_identifier", "service_tier", "top_k", "min_p", "seed",
                                "ignore_eos", "repeat_penalty", "repeat_last_n", "presence_penalty",
                                "frequency_penalty"},
                            ""))
    return e;
  if (auto e = check_settings(b, o)) return e;
  Conversation cv;
  if (b.contains("instructions") && !b["instructions"].is_null()) {
    if (!b["instructions"].is_string()) return type_error("instructions", "a string", b["instructions"]);
    cv.msgs.push_back(ojson{{"role", "system"}, {"content", b["instructions"]}});
  }
  if (!b.contains("input") || b["input"].is_null()) return missing_field("input");
  if (auto e = convert_input(b["input"], &cv)) return e;
  *chat = ojson{{"messages", std::move(cv.msgs)}};
  for (const char* k : kSame)
    if (b.contains(k)) (*chat)[k] = b[k];
  if (b.contains("max_output_tokens") && !b["max_output_tokens"].is_null()) {
    const ojson& m = b["max_output_tokens"];
    if (!m.is_number_integer()) return type_error("max_output_tokens", "an integer", m);
    if (m.get<int64_t>() < 1) return field_error("max_output_tokens", "'max_output_tokens' must be >= 1");
    (*chat)["max_tokens"] = m;
  }
  if (b.contains("tools") && !b["tools"].is_null()) {
    ojson tools = ojson::array();
    if (auto e = convert_tools(b["tools"], &tools)) return e;
    if (!tools.empty()) (*chat)["tools"] = std::move(tools);
  }
  if (b.contains("tool_choice") && !b["tool_choice"].is_null())
    if (auto e = convert_tool_choice(b["tool_choice"], chat)) return e;
  if (!o->parallel_tool_calls) (*chat)["parallel_tool_calls"] = false;  // a forced call's grammar writes one
  if (!o->effort.empty()) (*chat)["reasoning_effort"] = o->effort;  // the budget of its level (runtime/reasoning.h)
  return std::nullopt;
}

}  // namespace kiln::server
