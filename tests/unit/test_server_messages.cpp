// POST /v1/messages (Anthropic's Messages API) through a real HTTP client: the reply equals /v1/chat/completions'
// for the same conversation (one engine path), the streamed events (message_start, content blocks, message_delta,
// message_stop) add up to the non-streamed message, stop_reason and stop_sequence, usage, x-api-key, count_tokens,
// tool_use / tool_result with the model's template (the tool model of test_server_models.h), thinking blocks, and
// hostile bodies (each a 4xx in Anthropic's error shape naming the field).
#include <gtest/gtest.h>

#include <fstream>

#include "unit/test_server_models.h"
#include "unit/test_server_util.h"

namespace kiln {
namespace {

using test::HttpResponse;
using test::json;

const char* kKey = "m-key";

// The events of an Anthropic stream: (event name, data) pairs.
std::vector<std::pair<std::string, json>> events_of(const std::string& body) {
  std::vector<std::pair<std::string, json>> out;
  std::istringstream in(body);
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) == 0) out.emplace_back(name, json::parse(line.substr(6), nullptr, false));
  }
  return out;
}

// The message a stream adds up to: content blocks rebuilt from the deltas, stop_reason, usage.
json assemble(const std::vector<std::pair<std::string, json>>& evs) {
  json msg;
  for (const auto& [name, d] : evs) {
    EXPECT_EQ(name, d.value("type", "")) << d.dump();
    const std::string t = d.value("type", "");
    if (t == "message_start") msg = d["message"];
    if (t == "content_block_start") {
      EXPECT_EQ(d["index"], msg["content"].size()) << d.dump();
      msg["content"].push_back(d["content_block"]);
    }
    if (t == "content_block_delta") {
      json& b = msg["content"][d["index"].get<size_t>()];
      const json& dl = d["delta"];
      if (dl["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + dl["text"].get<std::string>();
      if (dl["type"] == "thinking_delta")
        b["thinking"] = b["thinking"].get<std::string>() + dl["thinking"].get<std::string>();
      if (dl["type"] == "input_json_delta") b["partial"] = b.value("partial", "") + dl["partial_json"].get<std::string>();
    }
    if (t == "message_delta") {
      msg["stop_reason"] = d["delta"]["stop_reason"];
      msg["stop_sequence"] = d["delta"]["stop_sequence"];
      msg["usage"] = d["usage"];
    }
  }
  for (json& b : msg["content"])
    if (b.contains("partial")) b["input"] = json::parse(b["partial"].get<std::string>()), b.erase("partial");
  return msg;
}

class Messages : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    proc_ = new test::ServeProcess();
    ASSERT_TRUE(proc_->start({"-m", test::data_path("models/fixture-llama-q8_0.gguf"), "-t", "2", "--api-key", kKey,
                              "-a", "fixture", "-c", "2048", "--body-limit", "1048576"}))
        << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
  }
  static HttpResponse post(const json& body, const std::string& path = "/v1/messages") {
    return test::http(proc_->port, "POST", path, body.dump(), "", "x-api-key: " + std::string(kKey) + "\r\n");
  }
  static json request(int max_tokens, bool stream = false) {
    return json{{"model", "claude-any-name"},
                {"max_tokens", max_tokens},
                {"system", "You are terse."},
                {"messages", {{{"role", "user"}, {"content", "Say something."}}}},
                {"temperature", 0},
                {"ignore_eos", true},
                {"stream", stream}};
  }
  static test::ServeProcess* proc_;
};
test::ServeProcess* Messages::proc_ = nullptr;

TEST_F(Messages, SameTextAsChatCompletionsAndStreamsTheSame) {
  HttpResponse r = post(request(12));
  ASSERT_EQ(r.status, 200) << r.body;
  const json m = r.j();
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "claude-any-name");  // any name is accepted when one model is served
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  EXPECT_TRUE(m["stop_sequence"].is_null());
  EXPECT_EQ(m["usage"]["output_tokens"], 12);
  ASSERT_EQ(m["content"].size(), 1u) << r.body;
  EXPECT_EQ(m["content"][0]["type"], "text");
  const std::string text = m["content"][0]["text"];
  // The same conversation through /v1/chat/completions: the same tokens.
  json chat = {{"messages", {{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Say something."}}}},
               {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
  HttpResponse c = test::http(proc_->port, "POST", "/v1/chat/completions", chat.dump(), kKey);
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.j()["choices"][0]["message"]["content"], text);
  EXPECT_EQ(c.j()["usage"]["prompt_tokens"].get<int64_t>(),
            m["usage"]["input_tokens"].get<int64_t>() + m["usage"]["cache_read_input_tokens"].get<int64_t>());
  // Streamed: the events in Anthropic's order, adding up to the same message.
  r = post(request(12, true));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.headers.find("text/event-stream"), std::string::npos);
  const auto evs = events_of(r.body);
  ASSERT_GE(evs.size(), 5u) << r.body;
  EXPECT_EQ(evs.front().first, "message_start");
  EXPECT_EQ(evs[evs.size() - 2].first, "message_delta");
  EXPECT_EQ(evs.back().first, "message_stop");
  const json s = assemble(evs);
  EXPECT_EQ(s["content"], m["content"]) << r.body;
  EXPECT_EQ(s["stop_reason"], "max_tokens");
  EXPECT_EQ(s["usage"]["output_tokens"], 12);
}

TEST_F(Messages, StopSequencesAndContentBlocks) {
  HttpResponse r = post(request(16));
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string text = r.j()["content"][0]["text"];
  ASSERT_GE(text.size(), 6u);
  // A stop sequence taken from the middle of the known reply: the text ends before it, and it is named.
  const std::string stop = text.substr(text.size() / 2, 3);
  for (bool stream : {false, true}) {
    json body = request(16, stream);
    body["stop_sequences"] = {"\x01never", stop};
    r = post(body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json m = stream ? assemble(events_of(r.body)) : r.j();
    EXPECT_EQ(m["stop_reason"], "stop_sequence") << r.body;
    EXPECT_EQ(m["stop_sequence"], stop) << r.body;
    EXPECT_EQ(m["content"][0]["text"], text.substr(0, text.find(stop))) << r.body;
  }
  // Content as blocks, system as blocks: the same prompt as the strings.
  json blocks = request(16);
  blocks["system"] = {{{"type", "text"}, {"text", "You are terse."}, {"cache_control", {{"type", "ephemeral"}}}}};
  blocks["messages"][0]["content"] = {{{"type", "text"}, {"text", "Say "}}, {{"type", "text"}, {"text", "something."}}};
  r = post(blocks);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["content"][0]["text"], text);
  // count_tokens: the prompt's tokens.
  json count = blocks;
  for (const char* k : {"max_tokens", "temperature", "ignore_eos", "stream"}) count.erase(k);
  const json usage = r.j()["usage"];
  r = post(count, "/v1/messages/count_tokens");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["input_tokens"].get<int64_t>(),
            usage["input_tokens"].get<int64_t>() + usage["cache_read_input_tokens"].get<int64_t>());
}

TEST_F(Messages, AuthAndHostileBodies) {
  HttpResponse r = test::http(proc_->port, "POST", "/v1/messages", request(2).dump());
  EXPECT_EQ(r.status, 401);
  r = test::http(proc_->port, "POST", "/v1/messages", request(2).dump(), "", "x-api-key: wrong\r\n");
  EXPECT_EQ(r.status, 401);
  const std::string big(300000, 'a');
  struct Case {
    const char* what;
    json patch;  // merged into request(4); a null value removes the key
    int status;
    const char* param;
  } cases[] = {
      {"no max_tokens", {{"max_tokens", nullptr}}, 400, "max_tokens"},
      {"max_tokens a string", {{"max_tokens", "5"}}, 400, "max_tokens"},
      {"max_tokens 0", {{"max_tokens", 0}}, 400, "max_tokens"},
      {"messages missing", {{"messages", nullptr}}, 400, "messages"},
      {"messages empty", {{"messages", json::array()}}, 400, "messages"},
      {"messages an object", {{"messages", json::object()}}, 400, "messages"},
      {"system role in messages", {{"messages", {{{"role", "system"}, {"content", "x"}}}}}, 400, "messages[0].role"},
      {"content a number", {{"messages", {{{"role", "user"}, {"content", 5}}}}}, 400, "messages[0].content"},
      {"block without type", {{"messages", {{{"role", "user"}, {"content", {{{"text", "x"}}}}}}}}, 400,
       "messages[0].content[0].type"},
      {"image block", {{"messages", {{{"role", "user"}, {"content", {{{"type", "image"}, {"source", json::object()}}}}}}}},
       400, "messages[0].content[0].type"},
      {"tool_use in a user turn",
       {{"messages", {{{"role", "user"}, {"content", {{{"type", "tool_use"}, {"id", "t"}, {"name", "f"}, {"input", json::object()}}}}}}}},
       400, "messages[0].content[0].type"},
      {"tool_use input a string",
       {{"messages", {{{"role", "user"}, {"content", "hi"}},
                      {{"role", "assistant"}, {"content", {{{"type", "tool_use"}, {"id", "t"}, {"name", "f"}, {"input", "x"}}}}}}}},
       400, "messages[1].content[0].input"},
      {"unknown field", {{"container", "c"}}, 400, "container"},
      {"unknown field in a message", {{"messages", {{{"role", "user"}, {"content", "x"}, {"name", "bob"}}}}}, 400,
       "messages[0].name"},
      {"system a number", {{"system", 3}}, 400, "system"},
      {"stop_sequences a string", {{"stop_sequences", "x"}}, 400, "stop_sequences"},
      {"stop_sequences empty string", {{"stop_sequences", {""}}}, 400, "stop_sequences[0]"},
      {"temperature too high", {{"temperature", 9}}, 400, "temperature"},
      {"server tool", {{"tools", {{{"type", "web_search_20250305"}, {"name", "web_search"}}}}}, 400, "tools[0].type"},
      {"tool without input_schema", {{"tools", {{{"name", "f"}}}}}, 400, "tools[0].input_schema"},
      {"tool_choice a string", {{"tool_choice", "auto"}}, 400, "tool_choice"},
      {"tool_choice any without tools", {{"tool_choice", {{"type", "any"}}}}, 400, "tool_choice"},
      {"thinking without budget", {{"thinking", {{"type", "enabled"}}}}, 400, "thinking.budget_tokens"},
      {"stream a string", {{"stream", "yes"}}, 400, "stream"},
      {"metadata unknown key", {{"metadata", {{"x", 1}}}}, 400, "metadata.x"},
      {"huge prompt", {{"messages", {{{"role", "user"}, {"content", big}}}}}, 400, "messages"},
  };
  for (const Case& c : cases) {
    json body = request(4);
    for (auto it = c.patch.begin(); it != c.patch.end(); ++it) {
      if (it->is_null()) body.erase(it.key());
      else body[it.key()] = *it;
    }
    r = post(body);
    EXPECT_EQ(r.status, c.status) << c.what << ": " << r.body;
    const json j = r.j();
    EXPECT_EQ(j["type"], "error") << c.what << ": " << r.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << c.what << ": " << r.body;
    EXPECT_EQ(j["error"]["param"], c.param) << c.what << ": " << r.body;
    if (std::string(c.what) != "huge prompt")  // that message names the context and the prompt's size
      EXPECT_NE(j["error"]["message"].get<std::string>().find(c.param), std::string::npos) << c.what << ": " << r.body;
  }
  r = test::http(proc_->port, "POST", "/v1/messages", "{not json", "", "x-api-key: m-key\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.j()["type"], "error") << r.body;
  // The server still answers.
  EXPECT_EQ(post(request(2)).status, 200);
}

const json kTools = json::parse(R"([{"name": "get_weather", "description": "The weather in a city",
  "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}])");

// The tool model with Qwen3's template: every reply token is a whole tool call.
class MessagesTools : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string qwen3 = test::slurp(test::data_path("templates/Qwen-Qwen3-0.6B.jinja"));
    proc_ = new test::ServeProcess();
    ASSERT_TRUE(proc_->start({"-m", test::make_model("msg-tools.gguf", qwen3, true), "-t", "2", "-c", "2048"}))
        << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
  }
  static HttpResponse post(const json& body) { return test::http(proc_->port, "POST", "/v1/messages", body.dump()); }
  static json request(int max_tokens, bool stream) {
    return json{{"max_tokens", max_tokens}, {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                {"tools", kTools}, {"temperature", 0}, {"stream", stream}};
  }
  static test::ServeProcess* proc_;
};
test::ServeProcess* MessagesTools::proc_ = nullptr;

TEST_F(MessagesTools, ToolUseBlocksStreamedOrNot) {
  for (bool stream : {false, true}) {
    HttpResponse r = post(request(2, stream));
    ASSERT_EQ(r.status, 200) << r.body;
    const json m = stream ? assemble(events_of(r.body)) : r.j();
    EXPECT_EQ(m["stop_reason"], "tool_use") << r.body;
    ASSERT_EQ(m["content"].size(), 2u) << r.body;  // two tokens: two parallel calls
    for (const json& b : m["content"]) {
      EXPECT_EQ(b["type"], "tool_use") << r.body;
      EXPECT_EQ(b["name"], "get_weather");
      EXPECT_EQ(b["input"], json::parse(R"({"city": "Paris"})"));
      EXPECT_FALSE(b["id"].get<std::string>().empty());
    }
    json one = request(2, stream);
    one["tool_choice"] = {{"type", "tool"}, {"name", "get_weather"}, {"disable_parallel_tool_use", true}};
    r = post(one);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ((stream ? assemble(events_of(r.body)) : r.j())["content"].size(), 1u) << r.body;
  }
  // tool_choice none: the same text is a text block.
  json none = request(1, false);
  none["tool_choice"] = {{"type", "none"}};
  HttpResponse r = post(none);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["content"][0]["type"], "text") << r.body;
  EXPECT_EQ(r.j()["stop_reason"], "max_tokens");
}

TEST_F(MessagesTools, ToolResultRoundTripRendersThroughTheTemplate) {
  json body = request(1, false);
  body["messages"] = json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use the tool.", "signature": ""},
      {"type": "text", "text": "Let me check."},
      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
      {"type": "text", "text": "And tomorrow?"}]}])");
  HttpResponse r = post(body);
  ASSERT_EQ(r.status, 200) << r.body;
  // The rendered prompt holds the tool call and its result as Qwen3's template writes them.
  json count = body;
  for (const char* k : {"max_tokens", "temperature", "stream"}) count.erase(k);
  HttpResponse c = test::http(proc_->port, "POST", "/v1/messages/count_tokens", count.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  json first = count;
  first["messages"] = {body["messages"][0]};
  HttpResponse c1 = test::http(proc_->port, "POST", "/v1/messages/count_tokens", first.dump());
  ASSERT_EQ(c1.status, 200) << c1.body;
  EXPECT_GT(c.j()["input_tokens"].get<int64_t>(), c1.j()["input_tokens"].get<int64_t>() + 20) << c.body;
  json bad = body;
  bad["messages"][2]["content"][0]["tool_use_id"] = 7;
  r = post(bad);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.j()["error"]["param"], "messages[2].content[0].tool_use_id") << r.body;
}

// A template that opens the reasoning block: the reply is all reasoning, a thinking block (disabled: closed at once).
TEST(MessagesThinking, ReasoningIsAThinkingBlock) {
  const std::string file = test::model_dir() + "/think-msg.jinja";
  std::ofstream(file) << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant><think>\n";
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::data_path("models/fixture-llama-f16.gguf"), "-t", "2", "--chat-template-file", file}))
      << p.log();
  json body = {{"max_tokens", 6}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"temperature", 0},
               {"ignore_eos", true}};
  HttpResponse r = test::http(p.port, "POST", "/v1/messages", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j()["content"].size(), 1u) << r.body;
  EXPECT_EQ(r.j()["content"][0]["type"], "thinking") << r.body;
  const std::string thinking = r.j()["content"][0]["thinking"];
  EXPECT_FALSE(thinking.empty());
  body["stream"] = true;
  r = test::http(p.port, "POST", "/v1/messages", body.dump());
  const json s = assemble(events_of(r.body));
  ASSERT_EQ(s["content"].size(), 1u) << r.body;
  EXPECT_EQ(s["content"][0]["type"], "thinking");
  EXPECT_NE(s["content"][0]["thinking"].get<std::string>().find(thinking), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("signature_delta"), std::string::npos);
  body["stream"] = false;
  // Disabled: budget 0, the block the prompt opened is closed at once; the reply is text, no thinking block.
  body["thinking"] = {{"type", "disabled"}};
  body["max_tokens"] = 12;
  r = test::http(p.port, "POST", "/v1/messages", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j()["content"].size(), 1u) << r.body;
  EXPECT_EQ(r.j()["content"][0]["type"], "text") << r.body;
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
}

}  // namespace
}  // namespace kiln
