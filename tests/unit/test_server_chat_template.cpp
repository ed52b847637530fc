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

}  // namespace
}  // namespace kiln
