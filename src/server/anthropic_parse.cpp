// Anthropic's Messages request -> a chat completions body. The conversation maps block by block:
//   system (string or text blocks)            -> one system message (blocks joined by "\n")
//   user: text blocks                         -> a user message (content parts)
//   user: tool_result blocks                  -> tool messages (tool_call_id; is_error prefixes "Error: ")
//   assistant: text / thinking / tool_use     -> content / reasoning_content / tool_calls (arguments = input)
//   tools [{name, description, input_schema}] -> [{"type": "function", "function": {name, description, parameters}}]
//   tool_choice auto / any / tool / none      -> "auto" / "required" / {"type": "function", ...} / "none"
//   tool_choice.disable_parallel_tool_use     -> parallel_tool_calls: false
//   max_tokens, stop_sequences, temperature, top_p, top_k, kiln's sampling extras -> the same chat fields
// Images, documents, server tools and unknown fields are refused with a 400 naming them.
#include <cstdint>
#include <string>

#include "server/dialects.h"

namespace kiln::server {

namespace {

// Text of a tool_result's content: a string or text blocks.
std::optional<ApiError> tool_result_text(const ojson& c, const std::string& p, std::string* out) {
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return type_error(p, "a string or an array of text blocks", c);
  for (size_t k = 0; k < c.size(); ++k) {
    const std::string pk = index_path(p, k);
    const ojson& b = c[k];
    if (!b.is_object()) return type_error(pk, "an object", b);
    if (!b.contains("type") || b["type"] != "text")
      return field_error(pk + ".type", "'" + pk + ".type': only text blocks are supported in a tool result",
                         "unsupported_parameter");
    if (auto e = check_fields(b, {"type", "text", "cache_control", "citations"}, pk)) return e;
    if (!b.contains("text") || !b["text"].is_string()) return type_error(pk + ".text", "a string", b.value("text", ojson()));
    *out += b["text"].get<std::string>();
  }
  return std::nullopt;
}

// One content block of messages[i] (role user or assistant) into *msg (the chat message being built) or *tools
// (the tool messages a user turn's tool_result blocks become).
std::optional<ApiError> add_block(const ojson& b, const std::string& p, bool user, ojson* msg, ojson* tools) {
  if (!b.is_object()) return type_error(p, "an object", b);
  if (!b.contains("type") || !b["type"].is_string())
    return b.contains("type") ? type_error(p + ".type", "a string", b["type"]) : missing_field(p + ".type");
  const std::string type = b["type"].get<std::string>();
  auto role_error = [&] {
    return field_error(p + ".type", "'" + p + ".type': a '" + type + "' block belongs in " +
                                        (user ? "an assistant" : "a user") + " message");
  };
  if (type == "text") {
    if (auto e = check_fields(b, {"type", "text", "cache_control", "citations"}, p)) return e;
    if (!b.contains("text")) return missing_field(p + ".text");
    if (!b["text"].is_string()) return type_error(p + ".text", "a string", b["text"]);
    (*msg)["content"].push_back(ojson{{"type", "text"}, {"text", b["text"]}});
  } else if (type == "thinking") {
    if (user) return role_error();
    if (auto e = check_fields(b, {"type", "thinking", "signature"}, p)) return e;
    std::string t;
    if (auto e = opt_string(b, "thinking", p + ".thinking", &t)) return e;
    (*msg)["reasoning_content"] = (*msg).value("reasoning_content", std::string()) + t;
  } else if (type == "tool_use") {
    if (user) return role_error();
    if (auto e = check_fields(b, {"type", "id", "name", "input", "cache_control"}, p)) return e;
    if (!b.contains("id") || !b["id"].is_string()) return b.contains("id") ? type_error(p + ".id", "a string", b["id"]) : missing_field(p + ".id");
    if (!b.contains("name") || !b["name"].is_string() || b["name"].get<std::string>().empty())
      return field_error(p + ".name", "'" + p + ".name' must be a non-empty string", "invalid_type");
    const ojson input = b.contains("input") ? b["input"] : ojson::object();
    if (!input.is_object()) return type_error(p + ".input", "an object", input);
    if (!msg->contains("tool_calls")) (*msg)["tool_calls"] = ojson::array();
    (*msg)["tool_calls"].push_back(
        ojson{{"id", b["id"]}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", input}}}});
  } else if (type == "tool_result") {
    if (!user) return role_error();
    if (auto e = check_fields(b, {"type", "tool_use_id", "content", "is_error", "cache_control"}, p)) return e;
    if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
      return b.contains("tool_use_id") ? type_error(p + ".tool_use_id", "a string", b["tool_use_id"])
                                       : missing_field(p + ".tool_use_id");
    std::string text;
    if (b.contains("content"))
      if (auto e = tool_result_text(b["content"], p + ".content", &text)) return e;
    if (b.contains("is_error") && !b["is_error"].is_null()) {
      if (!b["is_error"].is_boolean()) return type_error(p + ".is_error", "a boolean", b["is_error"]);
      if (b["is_error"].get<bool>()) text = "Error: " + text;
    }
    tools->push_back(ojson{{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", text}});
  } else {
    return field_error(p + ".type", "'" + p + ".type': '" + type + "' blocks are not supported (text, tool_use, "
                                        "tool_result and thinking are)", "unsupported_parameter");
  }
  return std::nullopt;
}

std::optional<ApiError> convert_messages(const ojson& ms, ojson* out) {
  if (!ms.is_array()) return type_error("messages", "an array", ms);
  if (ms.empty()) return field_error("messages", "'messages' must hold at least one message");
  for (size_t i = 0; i < ms.size(); ++i) {
    const std::string p = index_path("messages", i);
    const ojson& m = ms[i];
    if (!m.is_object()) return type_error(p, "an object", m);
    if (auto e = check_fields(m, {"role", "content"}, p)) return e;
    if (!m.contains("role")) return missing_field(p + ".role");
    if (!m["role"].is_string()) return type_error(p + ".role", "a string", m["role"]);
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant")
      return field_error(p + ".role", "'" + p + ".role' must be \"user\" or \"assistant\" (the system prompt is "
                                              "the top-level 'system'), not '" + role + "'");
    if (!m.contains("content")) return missing_field(p + ".content");
    const ojson& c = m["content"];
    ojson msg = {{"role", role}, {"content", ojson::array()}};
    ojson tools = ojson::array();
    if (c.is_string()) {
      msg["content"] = c;
    } else if (c.is_array()) {
      for (size_t k = 0; k < c.size(); ++k)
        if (auto e = add_block(c[k], index_path(p + ".content", k), role == "user", &msg, &tools)) return e;
    } else {
      return type_error(p + ".content", "a string or an array of content blocks", c);
    }
    for (auto& t : tools) out->push_back(std::move(t));
    // A user turn of tool results alone is the tool messages; anything else is a message of its own.
    const bool empty = msg["content"].is_array() && msg["content"].empty();
    if (!(empty && !tools.empty() && !msg.contains("tool_calls"))) out->push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<ApiError> convert_system(const ojson& s, ojson* out) {
  std::string text;
  if (s.is_string()) {
    text = s.get<std::string>();
  } else if (s.is_array()) {
    for (size_t k = 0; k < s.size(); ++k) {
      const std::string p = index_path("system", k);
      const ojson& b = s[k];
      if (!b.is_object()) return type_error(p, "an object", b);
      if (auto e = check_fields(b, {"type", "text", "cache_control", "citations"}, p)) return e;
      if (!b.contains("type") || b["type"] != "text")
        return field_error(p + ".type", "'" + p + ".type' must be \"text\"");
      if (!b.contains("text") || !b["text"].is_string()) return type_error(p + ".text", "a string", b.value("text", ojson()));
      if (k > 0) text += "\n";
      text += b["text"].get<std::string>();
    }
  } else {
    return type_error("system", "a string or an array of text blocks", s);
  }
  out->push_back(ojson{{"role", "system"}, {"content", text}});
  return std::nullopt;
}

std::optional<ApiError> convert_tools(const ojson& ts, ojson* out) {
  if (!ts.is_array()) return type_error("tools", "an array", ts);
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string p = index_path("tools", i);
    const ojson& t = ts[i];
    if (!t.is_object()) return type_error(p, "an object", t);
    if (t.contains("type") && !t["type"].is_null() && t["type"] != "custom")
      return field_error(p + ".type", "'" + p + ".type': server tools ('" + t["type"].dump() +
                                          "') are not supported; give client tools (name, input_schema)",
                         "unsupported_parameter");
    if (auto e = check_fields(t, {"type", "name", "description", "input_schema", "cache_control"}, p)) return e;
    if (!t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
      return field_error(p + ".name", "'" + p + ".name' must be a non-empty string", "invalid_type");
    if (!t.contains("input_schema")) return missing_field(p + ".input_schema");
    if (!t["input_schema"].is_object()) return type_error(p + ".input_schema", "an object", t["input_schema"]);
    ojson f = {{"name", t["name"]}};
    std::string desc;
    if (auto e = opt_string(t, "description", p + ".description", &desc)) return e;
    if (t.contains("description") && !t["description"].is_null()) f["description"] = desc;
    f["parameters"] = t["input_schema"];
    out->push_back(ojson{{"type", "function"}, {"function", std::move(f)}});
  }
  return std::nullopt;
}

std::optional<ApiError> convert_tool_choice(const ojson& tc, ojson* chat, MessagesOptions* o) {
  if (!tc.is_object()) return type_error("tool_choice", "an object", tc);
  if (auto e = check_fields(tc, {"type", "name", "disable_parallel_tool_use"}, "tool_choice")) return e;
  if (!tc.contains("type") || !tc["type"].is_string()) return missing_field("tool_choice.type");
  const std::string type = tc["type"].get<std::string>();
  if (tc.contains("disable_parallel_tool_use") && !tc["disable_parallel_tool_use"].is_null()) {
    if (!tc["disable_parallel_tool_use"].is_boolean())
      return type_error("tool_choice.disable_parallel_tool_use", "a boolean", tc["disable_parallel_tool_use"]);
    o->single_tool_call = tc["disable_parallel_tool_use"].get<bool>();
    if (o->single_tool_call) (*chat)["parallel_tool_calls"] = false;  // a forced call's grammar writes one
  }
  if (type == "auto") {
    (*chat)["tool_choice"] = "auto";
  } else if (type == "any") {
    (*chat)["tool_choice"] = "required";
  } else if (type == "none") {
    (*chat)["tool_choice"] = "none";
  } else if (type == "tool") {
    if (!tc.contains("name") || !tc["name"].is_string()) return missing_field("tool_choice.name");
    (*chat)["tool_choice"] = ojson{{"type", "function"}, {"function", {{"name", tc["name"]}}}};
  } else {
    return field_error("tool_choice.type", "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\", not '" +
                                               type + "'");
  }
  if (type != "auto" && type != "none" && !chat->contains("tools"))
    return field_error("tool_choice", "'tool_choice' of type '" + type + "' needs 'tools'");
  return std::nullopt;
}

// thinking: {type: enabled, budget_tokens: N} is the reply's reasoning budget N; {type: disabled} is budget 0 (the
// block closed at once, or not rendered open: runtime/reasoning.h) and no thinking blocks.
std::optional<ApiError> convert_thinking(const ojson& t, const ojson& body, ojson* chat, MessagesOptions* o) {
  if (!t.is_object()) return type_error("thinking", "an object", t);
  if (auto e = check_fields(t, {"type", "budget_tokens"}, "thinking")) return e;
  if (!t.contains("type") || !t["type"].is_string()) return missing_field("thinking.type");
  const std::string type = t["type"].get<std::string>();
  if (type == "disabled") {
    o->show_thinking = false;
    (*chat)["reasoning_budget_tokens"] = 0;
    return std::nullopt;
  }
  if (type != "enabled") return field_error("thinking.type", "'thinking.type' must be \"enabled\" or \"disabled\"");
  // The budget is checked as Anthropic checks it (at least 1, below max_tokens).
  if (!t.contains("budget_tokens")) return missing_field("thinking.budget_tokens");
  const ojson& b = t["budget_tokens"];
  if (!b.is_number_integer()) return type_error("thinking.budget_tokens", "an integer", b);
  if (b.get<int64_t>() < 1) return field_error("thinking.budget_tokens", "'thinking.budget_tokens' must be >= 1");
  if (body.contains("max_tokens") && body["max_tokens"].is_number_integer() &&
      b.get<int64_t>() >= body["max_tokens"].get<int64_t>())
    return field_error("thinking.budget_tokens", "'thinking.budget_tokens' must be less than 'max_tokens'");
  if (b.get<int64_t>() > INT32_MAX)
    return field_error("thinking.budget_tokens", "'thinking.budget_tokens' must be at most 2147483647");
  (*chat)["reasoning_budget_tokens"] = b;
  return std::nullopt;
}

std::optional<ApiError> convert_stop(const ojson& s, ojson* chat) {
  if (!s.is_array()) return type_error("stop_sequences", "an array of strings", s);
  if (s.size() > 16) return field_error("stop_sequences", "'stop_sequences' holds at most 16 strings");
  for (size_t k = 0; k < s.size(); ++k) {
    const std::string p = index_path("stop_sequences", k);
    if (!s[k].is_string()) return type_error(p, "a string", s[k]);
    const size_t n = s[k].get<std::string>().size();
    if (n == 0 || n > 1024) return field_error(p, "'" + p + "' must be 1 to 1024 bytes long");
  }
  if (!s.empty()) (*chat)["stop"] = s;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> messages_to_chat(const ojson& b, bool counting, ojson* chat, MessagesOptions* o) {
  // Fields passed to the chat body under the same name (kiln's sampling extras included).
  static constexpr const char* kSame[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos",
                                          "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty"};
  if (counting) {
    if (auto e = check_fields(b, {"model", "messages", "system", "tools", "tool_choice", "thinking"}, "")) return e;
  } else {
    if (auto e = check_fields(b, {"model", "messages", "system", "max_tokens", "stop_sequences", "stream",
                                  "temperature", "top_p", "top_k", "tools", "tool_choice", "metadata", "thinking",
                                  "min_p", "seed", "ignore_eos", "repeat_penalty", "repeat_last_n",
                                  "presence_penalty", "frequency_penalty"},
                              ""))
      return e;
  }
  *chat = ojson::object();
  ojson msgs = ojson::array();
  if (b.contains("system") && !b["system"].is_null())
    if (auto e = convert_system(b["system"], &msgs)) return e;
  if (!b.contains("messages")) return missing_field("messages");
  if (auto e = convert_messages(b["messages"], &msgs)) return e;
  (*chat)["messages"] = std::move(msgs);
  for (const char* k : kSame)
    if (b.contains(k)) (*chat)[k] = b[k];
  if (!counting) {
    if (!b.contains("max_tokens") || b["max_tokens"].is_null()) return missing_field("max_tokens");
    (*chat)["max_tokens"] = b["max_tokens"];
    if (b.contains("stop_sequences") && !b["stop_sequences"].is_null())
      if (auto e = convert_stop(b["stop_sequences"], chat)) return e;
    if (b.contains("stream") && !b["stream"].is_null()) {
      if (!b["stream"].is_boolean()) return type_error("stream", "a boolean", b["stream"]);
      o->stream = b["stream"].get<bool>();
    }
    if (b.contains("metadata") && !b["metadata"].is_null()) {  // for the caller's records; no effect on the reply
      if (!b["metadata"].is_object()) return type_error("metadata", "an object", b["metadata"]);
      if (auto e = check_fields(b["metadata"], {"user_id"}, "metadata")) return e;
    }
  }
  if (b.contains("tools") && !b["tools"].is_null()) {
    ojson tools = ojson::array();
    if (auto e = convert_tools(b["tools"], &tools)) return e;
    if (!tools.empty()) (*chat)["tools"] = std::move(tools);
  }
  if (b.contains("tool_choice") && !b["tool_choice"].is_null())
    if (auto e = convert_tool_choice(b["tool_choice"], chat, o)) return e;
  if (b.contains("thinking") && !b["thinking"].is_null())
    if (auto e = convert_thinking(b["thinking"], b, chat, o)) return e;
  return std::nullopt;
}

}  // namespace kiln::server
