// llama-server's small endpoints and the serving flags, through a real HTTP client: GET /props, POST
// /apply-template (the rendered prompt, tools included), GET /slots (501 without --slots, the slots with it), any
// model name vs --strict-model (404), CORS (--cors-origin: headers and the preflight OPTIONS; none without it), and
// POST /infill (400 without FIM tokens; with them the prompt laid out as llama-server does, streamed or not).
#include <gtest/gtest.h>

#include <thread>

#include "unit/test_server_models.h"
#include "unit/test_server_util.h"

namespace kiln {
namespace {

using test::HttpResponse;
using test::json;

const json kChat = {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}}}};

class LlamaEndpoints : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string qwen3 = test::slurp(test::data_path("templates/Qwen-Qwen3-0.6B.jinja"));
    proc_ = new test::ServeProcess();
    ASSERT_TRUE(proc_->start({"-m", test::make_model("props.gguf", qwen3, false), "-t", "2", "-c", "1024",
                              "--parallel", "2", "-a", "served", "--slots", "--strict-model", "--cors-origin",
                              "http://localhost:5173", "--api-key", "k"}))
        << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
  }
  static HttpResponse get(const std::string& path) { return test::http(proc_->port, "GET", path, "", "k"); }
  static HttpResponse post(const std::string& path, const json& b) {
    return test::http(proc_->port, "POST", path, b.dump(), "k");
  }
  static test::ServeProcess* proc_;
};
test::ServeProcess* LlamaEndpoints::proc_ = nullptr;

TEST_F(LlamaEndpoints, PropsAndApplyTemplate) {
  HttpResponse r = get("/props");
  ASSERT_EQ(r.status, 200) << r.body;
  const json p = r.j();
  EXPECT_EQ(p["model_alias"], "served");
  EXPECT_EQ(p["default_generation_settings"]["n_ctx"], get("/v1/models").j()["data"][0]["meta"]["n_ctx"]);
  EXPECT_EQ(p["total_slots"], 2);
  EXPECT_EQ(p["modalities"]["vision"], false);
  EXPECT_NE(p["chat_template"].get<std::string>().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(p["build_info"].get<std::string>().rfind("kiln ", 0), 0u) << r.body;
  EXPECT_EQ(p["endpoint_slots"], true);
  EXPECT_EQ(p["infill"], false);
  // apply-template: the rendered prompt, whose tokens are what chat completions counts.
  r = post("/apply-template", kChat);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string prompt = r.j()["prompt"];
  EXPECT_EQ(prompt, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  json tools = kChat;
  tools["tools"] = json::parse(R"([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}])");
  r = post("/apply-template", tools);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.j()["prompt"].get<std::string>().find("\"name\": \"lookup\""), std::string::npos) << r.body;
  for (const json& bad : {json{{"messages", 3}}, json{{"messages", json::array()}}, json::object()}) {
    r = post("/apply-template", bad);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.j()["error"]["param"], "messages") << r.body;
  }
  // A request's chat_template_kwargs are template variables of its render: Qwen3's enable_thinking false writes
  // the empty reasoning block after the generation prompt.
  json no_think = kChat;
  no_think["chat_template_kwargs"] = {{"enable_thinking", false}};
  r = post("/apply-template", no_think);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["prompt"], prompt + "<think>\n\n</think>\n\n");
  // Assistant prefill: a last assistant message is the start of the reply, after the generation prompt.
  json prefill = kChat;
  prefill["messages"].push_back({{"role", "assistant"}, {"content", "Sure, "}});
  r = post("/apply-template", prefill);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["prompt"], prompt + "Sure, ");
  for (const json& kw : {json(3), json{{"messages", json::array()}}}) {
    json bad = kChat;
    bad["chat_template_kwargs"] = kw;
    r = post("/apply-template", bad);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.j()["error"]["param"], "chat_template_kwargs") << r.body;
  }
}

TEST_F(LlamaEndpoints, SlotsStrictModelAndCors) {
  HttpResponse r = get("/slots");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j().size(), 2u) << r.body;
  EXPECT_EQ(r.j()[0]["id"], 0);
  EXPECT_EQ(r.j()[1]["is_processing"], false);
  // A running request shows in its slot.
  json longer = kChat;
  longer["max_tokens"] = 120;
  longer["ignore_eos"] = true;
  longer["stream"] = true;
  std::thread streamer([&] { post("/v1/chat/completions", longer); });
  bool seen = false;
  for (int i = 0; i < 500 && !seen; ++i) {
    for (const json& s : get("/slots").j())
      if (s["is_processing"] == true && s["n_prompt_tokens"].get<int64_t>() > 5 && s["n_decoded"].get<int64_t>() > 0)
        seen = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  streamer.join();
  EXPECT_TRUE(seen) << get("/slots").body;
  // --strict-model: another name is a 404 naming model; the served one and none are accepted.
  json body = kChat;
  body["max_tokens"] = 2;
  body["model"] = "gpt-4";
  r = post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.j()["error"]["param"], "model") << r.body;
  r = post("/v1/messages", json{{"model", "claude"}, {"max_tokens", 2}, {"messages", kChat["messages"][1]}});
  EXPECT_EQ(r.status, 400) << r.body;  // messages must be an array: the field checks come first
  r = post("/v1/messages", json{{"model", "claude"}, {"max_tokens", 2}, {"messages", {kChat["messages"][1]}}});
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_EQ(r.j()["error"]["type"], "not_found_error") << r.body;
  body["model"] = "served";
  EXPECT_EQ(post("/v1/chat/completions", body).status, 200);
  // CORS: every answer names the origin, errors and 401s included; a preflight needs no key.
  EXPECT_NE(r.headers.find("Access-Control-Allow-Origin: http://localhost:5173"), std::string::npos) << r.headers;
  r = test::http(proc_->port, "GET", "/v1/models");
  EXPECT_EQ(r.status, 401);
  EXPECT_NE(r.headers.find("Access-Control-Allow-Origin: http://localhost:5173"), std::string::npos) << r.headers;
  r = test::http(proc_->port, "OPTIONS", "/v1/chat/completions", "", "",
                 "Origin: http://localhost:5173\r\nAccess-Control-Request-Method: POST\r\n"
                 "Access-Control-Request-Headers: authorization, content-type\r\n");
  EXPECT_EQ(r.status, 204) << r.headers;
  EXPECT_NE(r.headers.find("Access-Control-Allow-Origin: http://localhost:5173"), std::string::npos) << r.headers;
  EXPECT_NE(r.headers.find("Access-Control-Allow-Methods: GET, POST, OPTIONS"), std::string::npos) << r.headers;
  EXPECT_NE(r.headers.find("Access-Control-Allow-Headers: authorization, content-type"), std::string::npos) << r.headers;
}

// Without the flags: any model name, /slots 501, no CORS headers, /infill 400 (no FIM tokens).
TEST(LlamaEndpointsDefaults, NoFlags) {
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::data_path("models/fixture-llama-q8_0.gguf"), "-t", "2"})) << p.log();
  json body = kChat;
  body["max_tokens"] = 2;
  body["model"] = "any-name";
  HttpResponse r = test::http(p.port, "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["model"], "any-name");
  EXPECT_EQ(r.headers.find("Access-Control"), std::string::npos) << r.headers;
  r = test::http(p.port, "OPTIONS", "/v1/chat/completions", "", "", "Origin: http://evil.example\r\n");
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.headers.find("Access-Control"), std::string::npos) << r.headers;
  r = test::http(p.port, "GET", "/slots");
  EXPECT_EQ(r.status, 501) << r.body;
  EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("--slots"), std::string::npos) << r.body;
  r = test::http(p.port, "POST", "/infill", json{{"input_prefix", "a"}, {"input_suffix", "b"}}.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.j()["error"]["code"], "fim_not_supported") << r.body;
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
  // A bad --cors-origin is refused before anything loads.
  test::CmdResult c = test::run_kiln("serve --port 0 --cors-origin 'http://a.example\r\nX: y'");
  EXPECT_EQ(c.rc, 1);
  EXPECT_NE(c.err.find("--cors-origin"), std::string::npos) << c.err;
}

TEST(LlamaInfill, PromptLayoutStreamAndHostileBodies) {
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::make_fim_model("fim.gguf"), "-t", "2", "-c", "1024"})) << p.log();
  auto tokens = [&](const std::string& s, bool special) {
    json b = {{"content", s}, {"add_special", special}, {"parse_special", false}};
    return test::http(p.port, "POST", "/tokenize", b.dump()).j()["tokens"];
  };
  // The prompt llama-server builds: [BOS] <fim_prefix> prefix <fim_suffix> suffix <fim_middle>.
  json ids = tokens("", true);
  ids.push_back(990);
  for (auto& t : tokens("def add(a, b):\n    return", false)) ids.push_back(t);
  ids.push_back(991);
  for (auto& t : tokens("\n\nprint(add(1, 2))", false)) ids.push_back(t);
  ids.push_back(992);
  json want = {{"prompt", ids}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
  HttpResponse c = test::http(p.port, "POST", "/v1/completions", want.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  json body = {{"input_prefix", "def add(a, b):\n    return"}, {"input_suffix", "\n\nprint(add(1, 2))"},
               {"n_predict", 8}, {"temperature", 0}, {"ignore_eos", true}};
  HttpResponse r = test::http(p.port, "POST", "/infill", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["content"], c.j()["choices"][0]["text"]) << r.body;
  EXPECT_EQ(r.j()["tokens_evaluated"], ids.size());
  EXPECT_EQ(r.j()["tokens_predicted"], 8);
  EXPECT_EQ(r.j()["stop"], true);
  body["stream"] = true;
  r = test::http(p.port, "POST", "/infill", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  std::string text;
  bool stopped = false;
  for (const std::string& e : test::sse_events(r.body)) {
    const json j = json::parse(e);
    text += j["content"].get<std::string>();
    stopped = j["stop"].get<bool>();
  }
  EXPECT_TRUE(stopped) << r.body;
  EXPECT_EQ(text, c.j()["choices"][0]["text"].get<std::string>());
  struct Case {
    json body;
    const char* param;
  } cases[] = {
      {{{"input_suffix", "x"}}, "input_prefix"},
      {{{"input_prefix", 1}, {"input_suffix", "x"}}, "input_prefix"},
      {{{"input_prefix", "x"}, {"input_suffix", "x"}, {"input_extra", "x"}}, "input_extra"},
      {{{"input_prefix", "x"}, {"input_suffix", "x"}, {"input_extra", {{{"filename", "a"}}}}}, "input_extra[0].text"},
      {{{"input_prefix", "x"}, {"input_suffix", "x"}, {"temperature", -1}}, "temperature"},
      {{{"input_prefix", "x"}, {"input_suffix", "x"}, {"n", 2}}, "n"},
      {{{"input_prefix", "x"}, {"input_suffix", "x"}, {"n_predict", 0}}, "n_predict"},
      {{{"input_prefix", std::string(200000, 'x')}, {"input_suffix", "x"}}, "prompt"},
  };
  for (const Case& k : cases) {
    r = test::http(p.port, "POST", "/infill", k.body.dump());
    EXPECT_EQ(r.status, 400) << k.body.dump().substr(0, 200) << ": " << r.body;
    EXPECT_EQ(r.j()["error"]["param"], k.param) << r.body;
  }
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
}

}  // namespace
}  // namespace kiln
