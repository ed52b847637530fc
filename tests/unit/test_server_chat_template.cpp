// kiln serve's chat path through runtime/prompt's ChatPrompt: the model's own chat template (Qwen3's, here), tools
// and tool_choice, replies split into tool_calls / reasoning_content (non-stream and streamed deltas), template
// errors as 400 template_error, --chat-template-file and --chat-template-kwargs, the fallback notice.
//
// The model is the random-weight llama fixture edited so that its reply is known: tokens 993 and 994 spell a whole
// Hermes tool call, and output.weight is zero except row 993 = w and row 994 = -w, so greedy decoding always picks
// one of the two (whichever sign h.w has), and every generated token is a tool call.
#include <gtest/gtest.h>

#include <filesystem>

#include "unit/test_server_models.h"
#include "unit/test_server_util.h"

namespace kiln {
namespace {

using test::HttpResponse;
using test::json;
using test::kCallA;
using test::kCallB;
using test::make_model;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "description": "The weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
  "required": ["city"]}}}])");

class ServeTemplate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string qwen3 = test::slurp(test::data_path("templates/Qwen-Qwen3-0.6B.jinja"));
    proc_ = new test::ServeProcess();
    ASSERT_TRUE(proc_->start({"-m", make_model("tools.gguf", qwen3, true), "-t", "2", "-c", "2048"})) << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
  }
  static HttpResponse post(const json& body) { return test::http(proc_->port, "POST", "/v1/chat/completions", body.dump()); }
  static json chat(int max_tokens, bool stream) {
    return json{{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", stream}};
  }
  static test::ServeProcess* proc_;
};
test::ServeProcess* ServeTemplate::proc_ = nullptr;

TEST_F(ServeTemplate, UsesTheModelsTemplateWithoutANotice) {
  EXPECT_EQ(proc_->log().find("no chat template"), std::string::npos) << proc_->log();
}

TEST_F(ServeTemplate, ToolCallsNonStream) {
  json body = chat(1, false);
  body["tools"] = kTools;
  HttpResponse r = post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = r.j()["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls") << r.body;
  EXPECT_TRUE(c["message"]["content"].is_null()) << r.body;
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r.body;
  const json call = c["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_FALSE(call["id"].get<std::string>().empty());
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json::parse(R"({"city": "Paris"})"));
  // Two tokens: two calls (parallel tool calls).
  body["max_tokens"] = 2;
  r = post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["message"]["tool_calls"].size(), 2u) << r.body;
  // Without tools, or with tool_choice "none", the same text is content.
  json plain = chat(1, false);
  r = post(plain);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["finish_reason"], "length");
  const std::string text = r.j()["choices"][0]["message"]["content"];
  EXPECT_TRUE(text == kCallA || text == kCallB) << text;
  EXPECT_FALSE(r.j()["choices"][0]["message"].contains("tool_calls"));
  body["max_tokens"] = 1;
  body["tool_choice"] = "none";
  r = post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["message"]["content"], text);
  // A named function is accepted (the only one offered); an unknown one is a 400 naming tool_choice.
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  r = post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["finish_reason"], "tool_calls");
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  r = post(body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.j()["error"]["param"], "tool_choice") << r.body;
}

TEST_F(ServeTemplate, ToolCallsStreamed) {
  json body = chat(1, true);
  body["tools"] = kTools;
  HttpResponse r = post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  std::string content, args, name;
  std::string finish;
  int n_call_chunks = 0;
  for (const std::string& e : test::sse_events(r.body)) {
    if (e == "[DONE]") continue;
    const json j = json::parse(e);
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    if (c["finish_reason"].is_string()) finish = c["finish_reason"];
    if (!c.contains("delta")) continue;
    const json& d = c["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {  // OpenAI's shape: index, id, type and name first; then the arguments
      ++n_call_chunks;
      ASSERT_EQ(d["tool_calls"].size(), 1u) << e;
      const json& t = d["tool_calls"][0];
      EXPECT_EQ(t["index"], 0) << e;
      EXPECT_EQ(t.contains("id"), n_call_chunks == 1) << e;
      EXPECT_EQ(t.contains("type"), n_call_chunks == 1) << e;
      EXPECT_EQ(t["function"].contains("name"), n_call_chunks == 1) << e;
      if (t["function"].contains("name")) name += t["function"]["name"].get<std::string>();
      args += t["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(finish, "tool_calls") << r.body;
  EXPECT_EQ(content, "") << r.body;  // the tool-call text never streams as content
  EXPECT_EQ(n_call_chunks, 2) << r.body;
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(json::parse(args), json::parse(R"({"city": "Paris"})"));
}

TEST_F(ServeTemplate, ConversationsWithToolResultsRenderAndBadToolsAre400) {
  // A full tool round trip in the history (assistant tool_calls with string arguments, a tool message).
  json body = chat(1, false);
  body["tools"] = kTools;
  body["messages"] = json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "tomorrow?"}]}])");
  HttpResponse r = post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  // Malformed tools are 400s naming the field.
  json t = chat(1, false);
  t["tools"] = json::parse(R"([{"type": "function", "function": {"description": "no name"}}])");
  r = post(t);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.j()["error"]["param"], "tools[0].function.name") << r.body;
  t["tools"] = json::parse(R"([{"type": "retrieval"}])");
  r = post(t);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.j()["error"]["param"], "tools[0].type") << r.body;
  t = chat(1, false);
  t["messages"][0]["role"] = "assistant";
  t["messages"][0]["tool_calls"] = 5;
  r = post(t);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.j()["error"]["param"], "messages[0].tool_calls") << r.body;
}

// --chat-template-file and --chat-template-kwargs: a template that opens the reasoning block in the generation
// prompt when `think` is set, so the whole reply is reasoning_content (non-stream and streamed alike).
TEST(ServeTemplateFlags, TemplateFileKwargsAndReasoning) {
  const std::string file = test::model_dir() + "/think.jinja";
  std::ofstream(file) << "{% for m in messages %}{% if m.role == 'system' %}\n{{ raise_exception('no system role') }}"
                         "{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
                         "{% if think %}<think>\n{% endif %}";
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::data_path("models/fixture-llama-f16.gguf"), "-t", "2", "--chat-template-file", file,
                       "--chat-template-kwargs", R"({"think": true})"}))
      << p.log();
  EXPECT_EQ(p.log().find("no chat template"), std::string::npos) << p.log();
  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 5}, {"temperature", 0},
               {"ignore_eos", true}};
  HttpResponse r = test::http(p.port, "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json m = r.j()["choices"][0]["message"];
  EXPECT_EQ(m["content"], "") << r.body;
  ASSERT_TRUE(m.contains("reasoning_content")) << r.body;
  const std::string reasoning = m["reasoning_content"];
  EXPECT_FALSE(reasoning.empty());
  body["stream"] = true;
  r = test::http(p.port, "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  std::string streamed, content;
  for (const std::string& e : test::sse_events(r.body)) {
    if (e == "[DONE]") continue;
    const json j = json::parse(e);
    if (j["choices"].empty() || !j["choices"][0].contains("delta")) continue;
    const json& d = j["choices"][0]["delta"];
    if (d.contains("reasoning_content")) streamed += d["reasoning_content"].get<std::string>();
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(content, "");
  // parse_reply trims the reasoning; the deltas are the raw text.
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \n"));
    s.erase(s.find_last_not_of(" \n") + 1);
    return s;
  };
  EXPECT_EQ(trim(streamed), reasoning);
  // A template that raises: 400 template_error with the template position, streamed or not.
  body["messages"] = json::parse(R"([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}])");
  for (bool stream : {false, true}) {
    body["stream"] = stream;
    r = test::http(p.port, "POST", "/v1/chat/completions", body.dump());
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.j()["error"]["code"], "template_error") << r.body;
    EXPECT_EQ(r.j()["error"]["param"], "messages") << r.body;
    EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("think.jinja: line 2, column "), std::string::npos)
        << r.body;
    EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("no system role"), std::string::npos) << r.body;
  }
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
}

TEST(ServeTemplateFlags, FallbackNoticeAndBadTemplates) {
  // No template: the built-in chatml, announced.
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::data_path("models/fixture-llama-f16.gguf"), "-t", "1"})) << p.log();
  EXPECT_NE(p.log().find("kiln serve: the model has no chat template: using the built-in chatml format"),
            std::string::npos) << p.log();
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
  // A template file that does not parse: refused before anything loads, exit 1 with the position.
  const std::string broken = test::model_dir() + "/broken.jinja";
  std::ofstream(broken) << "{% for m in messages %}\n{{ m.content }\n";
  test::CmdResult r = test::run_kiln("serve --port 0 -m '" + test::data_path("models/fixture-llama-f16.gguf") +
                                     "' --chat-template-file '" + broken + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("broken.jinja: line 2, column "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("listening"), std::string::npos) << r.err;
  // The model's own template broken: exit 1 naming it.
  const std::string bad_model = make_model("bad-template.gguf", "{% if %}", false);
  r = test::run_kiln("serve --port 0 -m '" + bad_model + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("tokenizer.chat_template: line 1, column "), std::string::npos) << r.err;
}


// Reasoning budgets (runtime/reasoning.h) with a template that opens <think> in the generation prompt: each field
// that names a budget cuts the reasoning at it (the greedy reply's first N tokens, then the forced "\n</think>\n\n"
// and content), usage counts the block; a budget message is forced before the close; bad values are 400s naming the
// field; --reasoning-budget and --reasoning-budget-message set the defaults.
class ReasoningBudgetServe : public ::testing::Test {
 protected:
  static std::string template_file() {
    const std::string file = test::model_dir() + "/think-budget.jinja";
    std::ofstream(file) << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant><think>\n";
    return file;
  }
  static void SetUpTestSuite() {
    proc_ = new test::ServeProcess;
    ASSERT_TRUE(proc_->start({"-m", test::data_path("models/fixture-llama-f16.gguf"), "-t", "2",
                              "--chat-template-file", template_file()}))
        << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
  }
  static json chat(int max_tokens) {
    return {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", max_tokens}, {"temperature", 0},
            {"ignore_eos", true}};
  }
  static HttpResponse post(const std::string& path, const json& body, int port = 0) {
    return test::http(port ? port : proc_->port, "POST", path, body.dump());
  }
  static int64_t reasoning_tokens(const json& u) {
    return u.contains("completion_tokens_details") ? u["completion_tokens_details"]["reasoning_tokens"].get<int64_t>()
                                                   : -1;
  }
  // The tokens of a text (the forced close's by default).
  static int64_t close_tokens(const std::string& text = "\n</think>\n\n") {
    HttpResponse r = post("/tokenize", {{"content", text}});
    EXPECT_EQ(r.status, 200) << r.body;
    return static_cast<int64_t>(r.j()["tokens"].size());
  }
  // The reasoning of the unbudgeted greedy reply of n tokens (all reasoning: the block is never closed).
  static std::string reasoning_of(int n) {
    HttpResponse r = post("/v1/chat/completions", chat(n));
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(reasoning_tokens(r.j()["usage"]), n) << r.body;
    return r.j()["choices"][0]["message"]["reasoning_content"];
  }
  static test::ServeProcess* proc_;
};
test::ServeProcess* ReasoningBudgetServe::proc_ = nullptr;

TEST_F(ReasoningBudgetServe, BadValuesNameTheField) {
  struct Case {
    const char* name;
    json fields;
    const char* path;
    const char* param;
  };
  const Case cases[] = {
      {"budget not an int", {{"reasoning_budget_tokens", "5"}}, "/v1/chat/completions", "reasoning_budget_tokens"},
      {"budget below -1", {{"reasoning_budget_tokens", -2}}, "/v1/chat/completions", "reasoning_budget_tokens"},
      {"thinking budget float", {{"thinking_budget_tokens", 1.5}}, "/v1/chat/completions", "thinking_budget_tokens"},
      {"budgets differ", {{"reasoning_budget_tokens", 4}, {"thinking_budget_tokens", 5}}, "/v1/chat/completions",
       "thinking_budget_tokens"},
      {"effort unknown", {{"reasoning_effort", "max"}}, "/v1/chat/completions", "reasoning_effort"},
      {"effort not a string", {{"reasoning_effort", 3}}, "/v1/chat/completions", "reasoning_effort"},
      {"completions budget", {{"reasoning_budget_tokens", 3}}, "/v1/completions", "reasoning_budget_tokens"},
      {"responses effort", {{"reasoning", {{"effort", "maximum"}}}}, "/v1/responses", "reasoning.effort"},
      {"messages budget", {{"thinking", {{"type", "enabled"}, {"budget_tokens", 0}}}}, "/v1/messages",
       "thinking.budget_tokens"},
      {"message not a string", {{"reasoning_budget_message", 3}}, "/v1/chat/completions", "reasoning_budget_message"},
      {"completions message", {{"reasoning_budget_message", "x"}}, "/v1/completions", "reasoning_budget_message"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    json body = chat(5);
    if (std::string(c.path) == "/v1/completions") body = {{"prompt", "hi"}, {"max_tokens", 5}};
    if (std::string(c.path) == "/v1/responses") body = {{"input", "hi"}, {"max_output_tokens", 5}};
    for (auto& [k, v] : c.fields.items()) body[k] = v;
    HttpResponse r = post(c.path, body);
    EXPECT_EQ(r.status, 400) << r.body;
    const json e = r.j()["error"];
    if (std::string(c.path) == "/v1/messages") EXPECT_NE(e["message"].get<std::string>().find(c.param), std::string::npos) << r.body;
    else EXPECT_EQ(e["param"], c.param) << r.body;
  }
}

TEST_F(ReasoningBudgetServe, EveryFieldCutsTheReasoning) {
  const int64_t k = close_tokens();
  ASSERT_GE(k, 3);
  const std::string r4 = reasoning_of(4);
  ASSERT_FALSE(r4.empty());
  auto check_chat = [&](json fields, int budget, const std::string& want) {
    SCOPED_TRACE(fields.dump());
    json body = chat(budget + static_cast<int>(k) + 6);
    for (auto& [f, v] : fields.items()) body[f] = v;
    HttpResponse r = post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json m = r.j()["choices"][0]["message"];
    EXPECT_EQ(m.value("reasoning_content", std::string()), want) << r.body;
    EXPECT_FALSE(m["content"].get<std::string>().empty()) << r.body;  // the reply went on after the close
    EXPECT_EQ(reasoning_tokens(r.j()["usage"]), budget + k) << r.body;
    // Streamed: the same cut, usage on the last chunk.
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    r = post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    std::string streamed;
    int64_t usage = -2;
    for (const std::string& e : test::sse_events(r.body)) {
      if (e == "[DONE]") continue;
      const json j = json::parse(e);
      if (j.contains("usage") && j["usage"].is_object()) usage = reasoning_tokens(j["usage"]);
      if (j["choices"].empty() || !j["choices"][0].contains("delta")) continue;
      const json& d = j["choices"][0]["delta"];
      if (d.contains("reasoning_content")) streamed += d["reasoning_content"].get<std::string>();
    }
    EXPECT_NE(streamed.find(want), std::string::npos) << r.body;
    EXPECT_EQ(usage, budget + k);
  };
  check_chat({{"reasoning_budget_tokens", 4}}, 4, r4);
  check_chat({{"thinking_budget_tokens", 4}}, 4, r4);
  check_chat({{"reasoning_budget_tokens", 4}, {"thinking_budget_tokens", 4}}, 4, r4);
  check_chat({{"reasoning_effort", "none"}}, 0, "");
  check_chat({{"reasoning_effort", "minimal"}, {"reasoning_budget_tokens", 4}}, 4, r4);  // the count wins
  // A large budget (and -1) leaves the 6-token reply all reasoning.
  for (json f : {json{{"reasoning_effort", "low"}}, json{{"reasoning_budget_tokens", -1}}}) {
    json body = chat(6);
    for (auto& [n, v] : f.items()) body[n] = v;
    HttpResponse r = post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["choices"][0]["message"]["reasoning_content"], reasoning_of(6)) << r.body;
  }
  // reasoning_budget_message: forced before the close, so the reasoning ends with it; usage counts its tokens.
  {
    const std::string msg = " Time is up, I answer now.";
    const int64_t m = close_tokens(msg);
    json body = chat(static_cast<int>(4 + m + k + 6));
    body["reasoning_budget_tokens"] = 4;
    body["reasoning_budget_message"] = msg;
    HttpResponse r = post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["choices"][0]["message"]["reasoning_content"], r4 + msg) << r.body;
    EXPECT_EQ(reasoning_tokens(r.j()["usage"]), 4 + m + k) << r.body;
  }
  // Anthropic: thinking.budget_tokens cuts the thinking block; disabled closes it at once (no thinking block).
  json msg = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4 + k + 6}, {"temperature", 0},
              {"ignore_eos", true}, {"thinking", {{"type", "enabled"}, {"budget_tokens", 4}}}};
  HttpResponse r = post("/v1/messages", msg);
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_GE(r.j()["content"].size(), 2u) << r.body;
  EXPECT_EQ(r.j()["content"][0]["type"], "thinking");
  EXPECT_EQ(r.j()["content"][0]["thinking"], r4) << r.body;
  EXPECT_EQ(r.j()["content"][1]["type"], "text");
  msg["thinking"] = {{"type", "disabled"}};
  r = post("/v1/messages", msg);
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j()["content"].size(), 1u) << r.body;
  EXPECT_EQ(r.j()["content"][0]["type"], "text");
  // Responses: reasoning.effort none: no reasoning item; the close counted in output_tokens_details.
  json resp = {{"input", "hi"}, {"max_output_tokens", k + 6}, {"temperature", 0}, {"ignore_eos", true},
               {"reasoning", {{"effort", "none"}}}};
  r = post("/v1/responses", resp);
  ASSERT_EQ(r.status, 200) << r.body;
  const json out = r.j();  // the loop's range must outlive it (r.j() returns a new value)
  for (const json& it : out["output"]) EXPECT_NE(it["type"], "reasoning") << r.body;
  EXPECT_EQ(r.j()["usage"]["output_tokens_details"]["reasoning_tokens"], k) << r.body;
}

// kiln serve --reasoning-budget N and --reasoning-budget-message MSG: the defaults of every request (a request's own
// field wins: an empty message is the close alone); bad values refused.
TEST_F(ReasoningBudgetServe, ServerFlagSetsTheDefault) {
  const std::string r3 = reasoning_of(3);
  const int64_t k = close_tokens();
  const std::string msg = " Enough thinking.";
  const int64_t m = close_tokens(msg);
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::data_path("models/fixture-llama-f16.gguf"), "-t", "2", "--chat-template-file",
                       template_file(), "--reasoning-budget", "3", "--reasoning-budget-message", msg}))
      << p.log();
  HttpResponse r = post("/v1/chat/completions", chat(3 + m + k + 4), p.port);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["message"]["reasoning_content"], r3 + msg) << r.body;
  EXPECT_EQ(reasoning_tokens(r.j()["usage"]), 3 + m + k);
  json quiet = chat(3 + k + 4);
  quiet["reasoning_budget_message"] = "";
  r = post("/v1/chat/completions", quiet, p.port);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["message"]["reasoning_content"], r3) << r.body;
  EXPECT_EQ(reasoning_tokens(r.j()["usage"]), 3 + k);
  json body = chat(6);
  body["reasoning_budget_tokens"] = -1;
  r = post("/v1/chat/completions", body, p.port);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["choices"][0]["message"]["reasoning_content"], reasoning_of(6)) << r.body;
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
  const test::CmdResult bad = test::run_kiln("serve --reasoning-budget -2 --port 0");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--reasoning-budget"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace kiln
