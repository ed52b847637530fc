// tool_choice enforced by the grammar engine (runtime/tool_grammar.h) in kiln serve, on the random-weight llama
// fixture with a tool template (Hermes 2 Pro's): "required" and a named function make the reply a call in the
// template's format whose arguments validate against the tool's schema (finish_reason "tool_calls"), streamed as
// OpenAI streams calls (index, id and name first, then the arguments); parallel_tool_calls false makes it one call;
// Anthropic's tool_choice any / tool and the Responses API's "required" go the same way; "auto" finishes a call
// that opens under the same grammar. A template without a
// tool-call format, and a schema keyword the format cannot enforce, are 400s naming the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "grammar/grammar.h"
#include "unit/grammar_test_util.h"
#include "unit/test_server_util.h"

namespace kiln {
namespace {

using test::HttpResponse;
using test::json;

// Bounded schemas: random weights never choose to end a free string.
const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
      "city": {"enum": ["Paris", "Lima", "Oslo"]},
      "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city", "days"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"], "additionalProperties": false}}}])");

std::string work_dir() {
  static const std::string d = [] {
    std::string p = test::temp_dir() + "kiln_toolchoice_" + std::to_string(::getpid());
    std::filesystem::create_directories(p);
    return p;
  }();
  return d;
}

// Whether `args` (a JSON text) validates against function `name`'s schema: the schema's own grammar accepts it.
bool validates(const std::string& name, const std::string& args) {
  for (const json& t : kTools)
    if (t["function"]["name"] == name) {
      auto g = grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(t["function"]["parameters"].dump()));
      return g && grammar::test::matches(*g, args);
    }
  return false;
}

class ServeToolChoice : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Hermes 2 Pro's template, whose generation prompt also writes chat_template_kwargs' `open_call` when a request
    // sets it (a template that opens the call itself).
    const std::string tmpl = work_dir() + "/hermes-open-call.jinja";
    std::ofstream(tmpl) << test::slurp(test::data_path("templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"))
                        << "{%- if add_generation_prompt and open_call is defined %}{{- open_call }}{%- endif %}";
    proc_ = new test::ServeProcess();
    ASSERT_TRUE(proc_->start({"-m", test::data_path("models/fixture-llama-q8_0.gguf"), "-t", "2", "-c", "4096",
                              "--parallel", "2", "--chat-template-file", tmpl}))
        << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
  }
  static HttpResponse post(const std::string& path, const json& body) {
    return test::http(proc_->port, "POST", path, body.dump());
  }
  static json chat(const json& extra) {
    json b = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}, {"tools", kTools},
              {"max_tokens", 400}, {"temperature", 1.0}, {"seed", 11}};
    b.update(extra);
    return b;
  }
  // The calls of a non-streamed chat response that must have ended in calls. cut: max_tokens may have cut a last
  // call, whose text is then the content.
  static json calls_of(const HttpResponse& r, bool cut = false) {
    EXPECT_EQ(r.status, 200) << r.body;
    if (r.status != 200) return json::array();
    const json c = r.j()["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls") << r.body;
    const json& content = c["message"]["content"];
    EXPECT_TRUE(content.is_null() || (cut && content.get<std::string>().rfind("<tool_call>", 0) == 0)) << r.body;
    EXPECT_TRUE(c["message"].contains("tool_calls")) << r.body;
    return c["message"].value("tool_calls", json::array());
  }
  static test::ServeProcess* proc_;
};
test::ServeProcess* ServeToolChoice::proc_ = nullptr;

TEST_F(ServeToolChoice, RequiredIsOneValidCall) {
  std::set<std::string> ids;
  for (int seed = 1; seed <= 3; ++seed) {
    const json calls = calls_of(post("/v1/chat/completions",
                                     chat({{"tool_choice", "required"}, {"parallel_tool_calls", false}, {"seed", seed}})));
    ASSERT_EQ(calls.size(), 1u) << calls.dump();
    const json& c = calls[0];
    EXPECT_EQ(c["type"], "function");
    const std::string name = c["function"]["name"], args = c["function"]["arguments"];
    EXPECT_TRUE(name == "get_weather" || name == "get_time") << name;
    EXPECT_TRUE(validates(name, args)) << name << " " << args;
    EXPECT_EQ(c["id"].get<std::string>().rfind("call_", 0), 0u) << c.dump();
    EXPECT_TRUE(ids.insert(c["id"].get<std::string>()).second) << "ids repeat: " << c["id"];
  }
}

TEST_F(ServeToolChoice, ParallelCallsAndANamedFunction) {
  // parallel calls allowed: one or more, each valid (a call cut off by max_tokens stays out of tool_calls)
  const json calls = calls_of(
      post("/v1/chat/completions", chat({{"tool_choice", "required"}, {"seed", 5}, {"max_tokens", 160}})), true);
  ASSERT_GE(calls.size(), 1u);
  for (const json& c : calls) EXPECT_TRUE(validates(c["function"]["name"], c["function"]["arguments"])) << c.dump();
  // a named function: only that one
  for (int seed = 1; seed <= 3; ++seed) {
    const json named = calls_of(post("/v1/chat/completions",
                                     chat({{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}},
                                           {"parallel_tool_calls", false}, {"seed", seed}})));
    ASSERT_EQ(named.size(), 1u);
    EXPECT_EQ(named[0]["function"]["name"], "get_time");
    EXPECT_TRUE(validates("get_time", named[0]["function"]["arguments"])) << named.dump();
  }
}

// tool_choice "auto" (the default with tools): the reply is free until a call opens, then the call's grammar finishes
// it. Random weights do not open one by themselves, so a prefill does: ending in the opener ("<tool_call>\n"), the
// reply is that call's continuation, a valid call (finish_reason "tool_calls"). Without one the reply stays free.
TEST_F(ServeToolChoice, AutoFinishesACallOnceItOpens) {
  for (int seed = 1; seed <= 3; ++seed) {
    json b = chat({{"seed", seed}, {"parallel_tool_calls", false}});
    b["messages"].push_back({{"role", "assistant"}, {"content", "<tool_call>\n"}});
    const HttpResponse r = post("/v1/chat/completions", b);
    const json calls = calls_of(r);
    ASSERT_EQ(calls.size(), 1u) << r.body;
    const std::string name = calls[0]["function"]["name"], args = calls[0]["function"]["arguments"];
    EXPECT_TRUE(validates(name, args)) << name << " " << args;
    EXPECT_EQ(r.j()["choices"][0]["finish_reason"], "tool_calls") << r.body;
  }
  // A prefill ending in the opener without its newline ("<tool_call>"): the same, the reply (which may write the
  // newline) is the call's continuation.
  for (int seed = 1; seed <= 2; ++seed) {
    json b = chat({{"seed", seed}, {"parallel_tool_calls", false}});
    b["messages"].push_back({{"role", "assistant"}, {"content", "Let me check. <tool_call>"}});
    const HttpResponse r = post("/v1/chat/completions", b);
    const json calls = calls_of(r);
    ASSERT_EQ(calls.size(), 1u) << r.body;
    EXPECT_TRUE(validates(calls[0]["function"]["name"], calls[0]["function"]["arguments"])) << r.body;
  }
  // A prefill holding a complete call does not engage the grammar again: the reply is free.
  {
    json b = chat({{"seed", 2}, {"max_tokens", 80}});
    b["messages"].push_back({{"role", "assistant"},
                             {"content", "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n"
                                         "</tool_call>\n"}});
    const HttpResponse r = post("/v1/chat/completions", b);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.j()["choices"][0]["finish_reason"], "tool_calls") << r.body;
  }
  const HttpResponse free = post("/v1/chat/completions", chat({{"max_tokens", 24}, {"seed", 3}}));
  ASSERT_EQ(free.status, 200) << free.body;
  EXPECT_NE(free.j()["choices"][0]["finish_reason"], "tool_calls") << free.body;
  EXPECT_FALSE(free.j()["choices"][0]["message"].contains("tool_calls")) << free.body;
}

// The call a prompt opened, with or without the opener's newline: by an assistant prefill (tool_choice "auto"; a
// forced choice refuses a prefill) or by the template's generation prompt (auto and "required"), streamed or not,
// comes back as tool_calls.
TEST_F(ServeToolChoice, ACallThePromptOpenedIsAToolCall) {
  struct Case {
    const char* opener;
    bool prefill;
    const char* choice;
  };
  const Case cases[] = {{"<tool_call>", true, "auto"},      {"<tool_call>\n", false, "auto"},
                        {"<tool_call>", false, "auto"},     {"<tool_call>", false, "required"},
                        {"<tool_call>\n", false, "required"}};
  for (const Case& k : cases) {
    for (const bool stream : {false, true}) {
      json b = chat({{"seed", 4}, {"parallel_tool_calls", false}, {"tool_choice", k.choice}, {"stream", stream}});
      if (k.prefill) b["messages"].push_back({{"role", "assistant"}, {"content", k.opener}});
      else b["chat_template_kwargs"] = {{"open_call", k.opener}};
      const std::string what = std::string(k.opener) + (k.prefill ? " prefill, " : " generation prompt, ") + k.choice +
                               (stream ? ", streamed" : "");
      const HttpResponse r = post("/v1/chat/completions", b);
      ASSERT_EQ(r.status, 200) << what << ": " << r.body;
      std::string finish, content, name, args;
      int n_calls = 0;
      if (!stream) {
        const json calls = calls_of(r);
        ASSERT_EQ(calls.size(), 1u) << what << ": " << r.body;
        n_calls = 1;
        finish = r.j()["choices"][0]["finish_reason"];
        name = calls[0]["function"]["name"], args = calls[0]["function"]["arguments"];
      } else {
        for (const std::string& e : test::sse_events(r.body)) {
          if (e == "[DONE]") continue;
          const json j = json::parse(e);
          if (j["choices"].empty()) continue;
          const json& c = j["choices"][0];
          if (c["finish_reason"].is_string()) finish = c["finish_reason"];
          const json& d = c.value("delta", json::object());
          if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
          for (const json& t : d.value("tool_calls", json::array())) {
            if (t.contains("id")) ++n_calls;
            name += t["function"].value("name", "");
            args += t["function"].value("arguments", "");
          }
        }
      }
      EXPECT_EQ(finish, "tool_calls") << what << ": " << r.body;
      EXPECT_EQ(content, "") << what << ": " << r.body;
      EXPECT_EQ(n_calls, 1) << what << ": " << r.body;
      EXPECT_TRUE(validates(name, args)) << what << ": " << name << " " << args;
    }
  }
}

TEST_F(ServeToolChoice, StreamedCallsNameFirstThenArguments) {
  HttpResponse r = post("/v1/chat/completions", chat({{"tool_choice", "required"}, {"parallel_tool_calls", false},
                                                      {"stream", true}, {"seed", 3}}));
  ASSERT_EQ(r.status, 200) << r.body;
  std::string finish, content, name, args, id;
  int n_name = 0, n_args = 0;
  for (const std::string& e : test::sse_events(r.body)) {
    if (e == "[DONE]") continue;
    const json j = json::parse(e);
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    if (c["finish_reason"].is_string()) finish = c["finish_reason"];
    if (!c.contains("delta")) continue;
    const json& d = c["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (!d.contains("tool_calls")) continue;
    ASSERT_EQ(d["tool_calls"].size(), 1u) << e;
    const json& t = d["tool_calls"][0];
    EXPECT_EQ(t["index"], 0) << e;
    const json& f = t["function"];
    if (t.contains("id")) {  // the first chunk of a call: id, type, name, no arguments yet
      EXPECT_EQ(n_args, 0) << "the name comes first: " << e;
      EXPECT_EQ(t["type"], "function") << e;
      id = t["id"], name += f["name"].get<std::string>();
      EXPECT_EQ(f["arguments"], "") << e;
      ++n_name;
    } else {  // then the arguments, without a name
      EXPECT_FALSE(f.contains("name")) << e;
      args += f["arguments"].get<std::string>();
      ++n_args;
    }
  }
  EXPECT_EQ(finish, "tool_calls") << r.body;
  EXPECT_EQ(content, "") << r.body;
  EXPECT_EQ(n_name, 1) << r.body;
  EXPECT_GE(n_args, 1) << r.body;
  EXPECT_FALSE(id.empty());
  EXPECT_TRUE(validates(name, args)) << name << " " << args;
}

TEST_F(ServeToolChoice, AnthropicAndResponsesDialects) {
  // Anthropic: tool_choice any, one call (disable_parallel_tool_use): a tool_use block with a valid input
  json m = {{"model", "x"}, {"max_tokens", 400}, {"temperature", 1.0},
            {"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
            {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}}};
  m["tools"] = json::array();
  for (const json& t : kTools)
    m["tools"].push_back({{"name", t["function"]["name"]}, {"description", t["function"]["description"]},
                          {"input_schema", t["function"]["parameters"]}});
  HttpResponse r = post("/v1/messages", m);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["stop_reason"], "tool_use") << r.body;
  int uses = 0;
  const json msg = r.j();
  for (const json& b : msg["content"])
    if (b["type"] == "tool_use") {
      ++uses;
      EXPECT_TRUE(validates(b["name"], b["input"].dump())) << b.dump();
    }
  EXPECT_EQ(uses, 1) << r.body;
  // Responses: tool_choice "required", parallel_tool_calls false: one function_call item
  json q = {{"model", "x"}, {"input", "Weather?"}, {"max_output_tokens", 400}, {"tool_choice", "required"},
            {"parallel_tool_calls", false}, {"temperature", 1.0}};
  q["tools"] = json::array();
  for (const json& t : kTools)
    q["tools"].push_back({{"type", "function"}, {"name", t["function"]["name"]},
                          {"description", t["function"]["description"]}, {"parameters", t["function"]["parameters"]}});
  r = post("/v1/responses", q);
  ASSERT_EQ(r.status, 200) << r.body;
  int fcalls = 0;
  const json out = r.j();
  for (const json& item : out["output"])
    if (item["type"] == "function_call") {
      ++fcalls;
      EXPECT_TRUE(validates(item["name"], item["arguments"])) << item.dump();
    }
  EXPECT_EQ(fcalls, 1) << r.body;
}

TEST_F(ServeToolChoice, RefusalsNameTheField) {
  // a constraint beside a forced call; a prefill that the call would have to continue
  HttpResponse r = post("/v1/chat/completions", chat({{"tool_choice", "required"},
                                                      {"response_format", {{"type", "json_object"}}}}));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.j()["error"]["param"], "tool_choice") << r.body;
  json pre = chat({{"tool_choice", "required"}});
  pre["messages"].push_back({{"role", "assistant"}, {"content", "<tool_call>"}});
  r = post("/v1/chat/completions", pre);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.j()["error"]["param"], "tool_choice") << r.body;
  r = post("/v1/chat/completions", chat({{"tool_choice", "required"}, {"parallel_tool_calls", "no"}}));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.j()["error"]["param"], "parallel_tool_calls") << r.body;
}

// A template that writes no tool calls kiln knows (Phi 3.5's), and one whose format writes string parameters as
// raw text (a Qwen3-Coder-like template): what cannot be enforced is a 400 naming the field.
TEST(ServeToolChoiceFormats, UnenforceableRequestsAre400) {
  const std::string model = test::data_path("models/fixture-llama-q8_0.gguf");
  test::ServeProcess phi;
  ASSERT_TRUE(phi.start({"-m", model, "-t", "1", "--chat-template-file",
                         test::data_path("templates/microsoft-Phi-3.5-mini-instruct.jinja")}))
      << phi.log();
  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", kTools}, {"max_tokens", 4},
               {"tool_choice", "required"}};
  HttpResponse r = test::http(phi.port, "POST", "/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.j()["error"]["param"], "tool_choice") << r.body;
  EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("no format kiln knows"), std::string::npos) << r.body;
  body["tool_choice"] = "auto";  // "auto" needs no format: the reply is free
  r = test::http(phi.port, "POST", "/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(phi.stop(SIGTERM), 0) << phi.log();

  const std::string coder = work_dir() + "/coder.jinja";
  std::ofstream(coder) << "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                          "{# calls: <tool_call>\n<function=NAME>\n<parameter=P>\nV\n</parameter>\n</function> #}"
                          "<|im_start|>assistant\n";
  test::ServeProcess q;
  ASSERT_TRUE(q.start({"-m", model, "-t", "1", "--chat-template-file", coder})) << q.log();
  body["tool_choice"] = "required";
  body["tools"] = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
    "properties": {"s": {"type": "string", "maxLength": 8}}}}}])");
  r = test::http(q.port, "POST", "/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.j()["error"]["param"], "tools[0].function.parameters") << r.body;
  EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("maxLength"), std::string::npos) << r.body;
  EXPECT_EQ(q.stop(SIGTERM), 0) << q.log();
}

// gpt-oss's template (harmony) on the gpt-oss fixture (random weights): a forced call is accepted and answered as
// a valid call, non-streamed and streamed; "auto" answers with the shape of a chat reply.
TEST(ServeToolChoiceFormats, HarmonyOnTheGptOssFixture) {
  test::ServeProcess s;
  ASSERT_TRUE(s.start({"-m", test::data_path("models-gptoss/fixture-gptoss-f16.gguf"), "-t", "2", "-c", "2048",
                       "--chat-template-file", test::data_path("templates/openai-gpt-oss-120b.jinja")}))
      << s.log();
  json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}, {"tools", kTools},
               {"max_tokens", 200}, {"temperature", 1.0}, {"seed", 3}, {"tool_choice", "required"},
               {"reasoning_budget_tokens", 0}};
  HttpResponse r = test::http(s.port, "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json c = r.j()["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls") << r.body;
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.body;
  const json& call = c["message"]["tool_calls"][0];
  EXPECT_TRUE(validates(call["function"]["name"], call["function"]["arguments"])) << r.body;
  body["stream"] = true;
  r = test::http(s.port, "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  std::string finish, name, args;
  for (const std::string& e : test::sse_events(r.body)) {
    if (e == "[DONE]") continue;
    const json j = json::parse(e);
    if (j["choices"].empty()) continue;
    const json& ch = j["choices"][0];
    if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
    if (!ch.contains("delta") || !ch["delta"].contains("tool_calls")) continue;
    const json& f = ch["delta"]["tool_calls"][0]["function"];
    if (f.contains("name")) name += f["name"].get<std::string>();
    args += f.value("arguments", "");
  }
  EXPECT_EQ(finish, "tool_calls") << r.body;
  EXPECT_TRUE(validates(name, args)) << r.body;
  body.erase("stream");
  body.erase("tool_choice");
  body["max_tokens"] = 8;
  r = test::http(s.port, "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  c = r.j()["choices"][0];
  EXPECT_TRUE(c["message"]["content"].is_string() || c["message"]["content"].is_null()) << r.body;
  EXPECT_TRUE(c["finish_reason"].is_string()) << r.body;
  EXPECT_EQ(s.stop(SIGTERM), 0) << s.log();
}

}  // namespace
}  // namespace kiln
