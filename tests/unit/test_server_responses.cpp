// POST /v1/responses (OpenAI's Responses API, stateless) through a real HTTP client: the output text equals
// /v1/chat/completions' for the same conversation, the streamed events (numbered, in the Responses order) add up
// to the non-streamed output, incomplete on max_output_tokens, input items (messages, function calls and their
// outputs, reasoning), function_call items from the tool model, reasoning items, and hostile bodies (each a 4xx
// naming the field).
#include <gtest/gtest.h>

#include <fstream>

#include "unit/test_server_models.h"
#include "unit/test_server_util.h"

namespace kiln {
namespace {

using test::HttpResponse;
using test::json;

// The data of every event, checked: the event name equals its type, sequence numbers count up from 0.
std::vector<json> events_of(const std::string& body) {
  std::vector<json> out;
  std::istringstream in(body);
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) != 0) continue;
    json d = json::parse(line.substr(6), nullptr, false);
    EXPECT_EQ(d.value("type", ""), name) << line;
    EXPECT_EQ(d.value("sequence_number", -1), static_cast<int>(out.size())) << line;
    out.push_back(std::move(d));
  }
  return out;
}

// The output items a stream adds up to (rebuilt from the deltas), checked against the .done events, and the final
// response object.
std::pair<json, json> assemble(const std::vector<json>& evs) {
  json items = json::array(), final;
  for (const json& e : evs) {
    const std::string t = e["type"];
    if (t == "response.output_item.added") {
      EXPECT_EQ(e["output_index"], items.size()) << e.dump();
      items.push_back(e["item"]);
    } else if (t == "response.content_part.added") {
      items[e["output_index"].get<size_t>()]["content"].push_back(e["part"]);
    } else if (t == "response.output_text.delta" || t == "response.reasoning_text.delta") {
      json& part = items[e["output_index"].get<size_t>()]["content"][e["content_index"].get<size_t>()];
      part["text"] = part["text"].get<std::string>() + e["delta"].get<std::string>();
    } else if (t == "response.function_call_arguments.delta") {
      json& it = items[e["output_index"].get<size_t>()];
      it["arguments"] = it["arguments"].get<std::string>() + e["delta"].get<std::string>();
    } else if (t == "response.output_item.done") {
      json& it = items[e["output_index"].get<size_t>()];
      it["status"] = "completed";
      EXPECT_EQ(it, e["item"]) << e.dump();
    } else if (t == "response.completed" || t == "response.incomplete") {
      final = e["response"];
    }
  }
  return {items, final};
}

class Responses : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    proc_ = new test::ServeProcess();
    ASSERT_TRUE(proc_->start({"-m", test::data_path("models/fixture-llama-q8_0.gguf"), "-t", "2", "-a", "fixture",
                              "-c", "2048", "--body-limit", "1048576"}))
        << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
  }
  static HttpResponse post(const json& body) { return test::http(proc_->port, "POST", "/v1/responses", body.dump()); }
  static json request(int max_tokens, bool stream = false) {
    return json{{"model", "gpt-any"}, {"instructions", "You are terse."}, {"input", "Say something."},
                {"max_output_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}, {"stream", stream}};
  }
  static test::ServeProcess* proc_;
};
test::ServeProcess* Responses::proc_ = nullptr;

TEST_F(Responses, SameTextAsChatCompletionsAndStreamsTheSame) {
  HttpResponse r = post(request(12));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.j();
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["model"], "gpt-any");
  EXPECT_EQ(j["status"], "incomplete");  // max_output_tokens cut it
  EXPECT_EQ(j["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(j["instructions"], "You are terse.");
  EXPECT_EQ(j["usage"]["output_tokens"], 12);
  ASSERT_EQ(j["output"].size(), 1u) << r.body;
  const json msg = j["output"][0];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"][0]["type"], "output_text");
  const std::string text = msg["content"][0]["text"];
  json chat = {{"messages", {{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Say something."}}}},
               {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
  HttpResponse c = test::http(proc_->port, "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.j()["choices"][0]["message"]["content"], text);
  EXPECT_EQ(c.j()["usage"]["prompt_tokens"], j["usage"]["input_tokens"]);
  // The same conversation as input items.
  json items = request(12);
  items.erase("instructions");
  items["input"] = json::parse(R"([{"role": "developer", "content": "You are terse."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say something."}]}])");
  r = post(items);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["output"][0]["content"][0]["text"], text);
  // Streamed.
  r = post(request(12, true));
  ASSERT_EQ(r.status, 200) << r.body;
  const auto evs = events_of(r.body);
  ASSERT_GE(evs.size(), 8u) << r.body;
  EXPECT_EQ(evs[0]["type"], "response.created");
  EXPECT_EQ(evs[0]["response"]["status"], "in_progress");
  EXPECT_EQ(evs[1]["type"], "response.in_progress");
  EXPECT_EQ(evs.back()["type"], "response.incomplete");
  auto [out, fin] = assemble(evs);
  json want = j["output"];
  for (json* a : {&out, &fin["output"], &want}) (*a)[0].erase("id");  // ids are per request
  EXPECT_EQ(out, want) << r.body;
  EXPECT_EQ(fin["output"], want);
  EXPECT_EQ(fin["usage"]["output_tokens"], 12);
}

TEST_F(Responses, HostileBodies) {
  const std::string big(300000, 'a');
  struct Case {
    const char* what;
    json patch;
    const char* param;
  } cases[] = {
      {"no input", {{"input", nullptr}}, "input"},
      {"input a number", {{"input", 5}}, "input"},
      {"input empty", {{"input", json::array()}}, "input"},
      {"item not an object", {{"input", {5}}}, "input[0]"},
      {"unknown item type", {{"input", {{{"type", "computer_call"}}}}}, "input[0].type"},
      {"item reference", {{"input", {{{"type", "item_reference"}, {"id", "x"}}}}}, "input[0].type"},
      {"bad role", {{"input", {{{"role", "wizard"}, {"content", "x"}}}}}, "input[0].role"},
      {"image part", {{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}}}},
       "input[0].content[0].type"},
      {"function_call without name", {{"input", {{{"type", "function_call"}, {"call_id", "c"}, {"arguments", "{}"}}}}},
       "input[0].name"},
      {"function_call_output without output", {{"input", {{{"type", "function_call_output"}, {"call_id", "c"}}}}},
       "input[0].output"},
      {"encrypted reasoning", {{"input", {{{"type", "reasoning"}, {"summary", json::array()}, {"encrypted_content", "x"}}}}},
       "input[0].encrypted_content"},
      {"instructions a number", {{"instructions", 1}}, "instructions"},
      {"store true", {{"store", true}}, "store"},
      {"previous_response_id", {{"previous_response_id", "resp_1"}}, "previous_response_id"},
      {"truncation auto", {{"truncation", "auto"}}, "truncation"},
      {"json schema format", {{"text", {{"format", {{"type", "json_schema"}}}}}}, "text.format"},
      {"include other", {{"include", {"file_search_call.results"}}}, "include[0]"},
      {"web search tool", {{"tools", {{{"type", "web_search"}}}}}, "tools[0].type"},
      {"tool without name", {{"tools", {{{"type", "function"}}}}}, "tools[0].name"},
      {"tool_choice unknown", {{"tool_choice", "sometimes"}}, "tool_choice"},
      {"max_output_tokens 0", {{"max_output_tokens", 0}}, "max_output_tokens"},
      {"max_output_tokens huge", {{"max_output_tokens", 100000000}}, "max_output_tokens"},
      {"max_output_tokens a string", {{"max_output_tokens", "9"}}, "max_output_tokens"},
      {"temperature a string", {{"temperature", "hot"}}, "temperature"},
      {"unknown field", {{"background", true}}, "background"},
      {"stream a string", {{"stream", "yes"}}, "stream"},
      {"parallel_tool_calls a string", {{"parallel_tool_calls", "no"}}, "parallel_tool_calls"},
      {"reasoning effort a number", {{"reasoning", {{"effort", 3}}}}, "reasoning.effort"},
      {"huge input", {{"input", big}}, "input"},
  };
  for (const Case& c : cases) {
    json body = request(4);
    for (auto it = c.patch.begin(); it != c.patch.end(); ++it) {
      if (it->is_null()) body.erase(it.key());
      else body[it.key()] = *it;
    }
    HttpResponse r = post(body);
    EXPECT_EQ(r.status, 400) << c.what << ": " << r.body;
    EXPECT_EQ(r.j()["error"]["param"], c.param) << c.what << ": " << r.body;
  }
  EXPECT_EQ(post(request(2)).status, 200);
}

const json kTools = json::parse(R"([{"type": "function", "name": "get_weather", "description": "The weather in a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}])");

TEST(ResponsesTools, FunctionCallItemsAndToolRoundTrip) {
  const std::string qwen3 = test::slurp(test::data_path("templates/Qwen-Qwen3-0.6B.jinja"));
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::make_model("resp-tools.gguf", qwen3, true), "-t", "2", "-c", "2048"})) << p.log();
  json body = {{"input", "Weather in Paris?"}, {"tools", kTools}, {"max_output_tokens", 2}, {"temperature", 0}};
  for (bool stream : {false, true}) {
    body["stream"] = stream;
    body["parallel_tool_calls"] = true;
    HttpResponse r = test::http(p.port, "POST", "/v1/responses", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json output = stream ? assemble(events_of(r.body)).first : r.j()["output"];
    ASSERT_EQ(output.size(), 2u) << r.body;
    for (const json& it : output) {
      EXPECT_EQ(it["type"], "function_call") << r.body;
      EXPECT_EQ(it["name"], "get_weather");
      EXPECT_EQ(json::parse(it["arguments"].get<std::string>()), json::parse(R"({"city": "Paris"})"));
      EXPECT_FALSE(it["call_id"].get<std::string>().empty());
    }
    body["parallel_tool_calls"] = false;
    r = test::http(p.port, "POST", "/v1/responses", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ((stream ? assemble(events_of(r.body)).first : r.j()["output"]).size(), 1u) << r.body;
  }
  // The round trip: the call and its output as input items, after a reasoning item.
  json round = body;
  round["stream"] = false;
  round["input"] = json::parse(R"([{"role": "user", "content": "Weather in Paris?"},
    {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    {"role": "user", "content": "And tomorrow?"}])");
  HttpResponse r = test::http(p.port, "POST", "/v1/responses", round.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(r.j()["usage"]["input_tokens"].get<int64_t>(), 40) << r.body;
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
}

TEST(ResponsesReasoning, ReasoningItem) {
  const std::string file = test::model_dir() + "/think-resp.jinja";
  std::ofstream(file) << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant><think>\n";
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::data_path("models/fixture-llama-f16.gguf"), "-t", "2", "--chat-template-file", file}))
      << p.log();
  json body = {{"input", "hi"}, {"max_output_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}};
  HttpResponse r = test::http(p.port, "POST", "/v1/responses", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json out = r.j()["output"];
  ASSERT_EQ(out.size(), 1u) << r.body;
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["content"][0]["type"], "reasoning_text");
  const std::string reasoning = out[0]["content"][0]["text"];
  EXPECT_FALSE(reasoning.empty());
  body["stream"] = true;
  r = test::http(p.port, "POST", "/v1/responses", body.dump());
  const json streamed = assemble(events_of(r.body)).first;
  ASSERT_EQ(streamed.size(), 1u) << r.body;
  EXPECT_EQ(streamed[0]["type"], "reasoning");
  EXPECT_NE(streamed[0]["content"][0]["text"].get<std::string>().find(reasoning), std::string::npos) << r.body;
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
}

}  // namespace
}  // namespace kiln
