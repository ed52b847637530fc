// kiln serve through a real HTTP client (plain sockets, tests/unit/test_server_util.h) on 127.0.0.1, with a
// fixture model from tests/data: non-streaming and streaming chat and completions (greedy output equals `kiln run`),
// 32 concurrent streaming clients, the prefix cache (timings and /metrics), malformed requests (each its 4xx with
// the parameter named, while a stream keeps going), a disconnect mid-stream or before a non-streamed answer frees its
// KV blocks, the API key, /tokenize and /detokenize, SIGTERM exits 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "unit/test_server_util.h"

namespace kiln {
namespace {

using test::http;
using test::HttpResponse;
using test::json;

const char* kKey = "sekrit-key";
std::string model_path() { return test::data_path("models/fixture-llama-q8_0.gguf"); }

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    proc_ = new test::ServeProcess();
    const bool ok = proc_->start({"-m", model_path(), "-t", "2", "--parallel", "4", "-c", "4096", "-b", "64",
                                  "--api-key", kKey, "-a", "fixture", "--body-limit", "1048576"});
    ASSERT_TRUE(ok) << proc_->log();
  }
  static void TearDownTestSuite() {
    const int rc = proc_->stop(SIGTERM);
    EXPECT_EQ(rc, 0) << proc_->log();
    delete proc_;
  }
  static HttpResponse post(const std::string& path, const json& body) {
    return http(proc_->port, "POST", path, body.dump(), kKey);
  }
  static HttpResponse post_raw(const std::string& path, const std::string& body) {
    return http(proc_->port, "POST", path, body, kKey);
  }
  static std::string metrics() { return http(proc_->port, "GET", "/metrics", "", kKey).body; }
  static test::ServeProcess* proc_;
};
test::ServeProcess* Serve::proc_ = nullptr;

json completion(const std::string& prompt, int n, bool stream = false) {
  return json{{"model", "fixture"}, {"prompt", prompt},   {"max_tokens", n},
              {"temperature", 0},   {"ignore_eos", true}, {"stream", stream}};
}

TEST_F(Serve, HealthModelsAndAuth) {
  EXPECT_EQ(http(proc_->port, "GET", "/health").status, 200);  // open without the key
  HttpResponse r = http(proc_->port, "GET", "/v1/models");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.j()["error"]["code"], "invalid_api_key") << r.body;
  r = http(proc_->port, "GET", "/v1/models", "", "wrong-key");
  EXPECT_EQ(r.status, 401);
  r = http(proc_->port, "POST", "/v1/completions", completion("x", 2).dump(), "sekrit-kez");
  EXPECT_EQ(r.status, 401);
  r = http(proc_->port, "GET", "/v1/models", "", kKey);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["data"][0]["id"], "fixture");
  EXPECT_EQ(r.j()["object"], "list");
}

// Greedy text through the server equals `kiln run` on the same prompt; streaming gives the same text.
TEST_F(Serve, CompletionEqualsKilnRunAndStreams) {
  const std::string prompt = "The quick brown fox";
  auto run = test::run_kiln("run --device cpu -m '" + model_path() + "' -p '" + prompt + "' -n 24 --temp 0 --ignore-eos -t 1");
  ASSERT_EQ(run.rc, 0) << run.err;
  std::string want = run.out;
  ASSERT_FALSE(want.empty());
  want.pop_back();  // kiln run ends with a newline
  HttpResponse r = post("/v1/completions", completion(prompt, 24));
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.j();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], want);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(j["timings"]["predicted_n"], 24);
  EXPECT_TRUE(j["timings"].contains("prompt_ms") && j["timings"].contains("predicted_per_second"));

  r = post("/v1/completions", completion(prompt, 24, true));
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("text/event-stream"), std::string::npos);
  test::Streamed s = test::parse_stream(r.body);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text, want);
  EXPECT_EQ(s.finish, "length");
  EXPECT_EQ(s.usage["completion_tokens"], 24);

  // Token-id prompts, and a batch of prompts.
  json ids = post("/tokenize", {{"content", prompt}}).j()["tokens"];
  ASSERT_TRUE(ids.is_array() && !ids.empty());
  json b = completion("", 24);
  b["prompt"] = ids;
  r = post("/v1/completions", b);
  ASSERT_EQ(r.status, 200) << r.body;
  b["prompt"] = json::array({prompt, ids});
  r = post("/v1/completions", b);
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j()["choices"].size(), 2u);
  EXPECT_EQ(r.j()["choices"][1]["index"], 1);
}

// Seeded sampling (temperature, top-k/p, min-p, a repeat penalty): `kiln run` (one request to the engine loop) and
// the server (one of its sequences, beside other requests) give the same text from the same token prompt.
TEST_F(Serve, SeededSamplingEqualsKilnRun) {
  json ids = post("/tokenize", {{"content", "The quick brown fox"}}).j()["tokens"];
  ASSERT_TRUE(ids.is_array() && !ids.empty());
  std::string list;
  for (auto& id : ids) list += (list.empty() ? "" : ",") + std::to_string(id.get<int>());
  const std::string sampling = " --temp 0.9 -s 11 --repeat-penalty 1.1 -n 20 --ignore-eos";
  auto run = test::run_kiln("run --device cpu -t 1 -m '" + model_path() + "' --tokens " + list + sampling);
  ASSERT_EQ(run.rc, 0) << run.err;
  ASSERT_NE(run.err.find("generated 20 tokens"), std::string::npos) << run.err;
  std::string want = run.out;
  want.pop_back();  // kiln run ends with a newline
  json b = {{"prompt", ids},        {"max_tokens", 20},       {"temperature", 0.9},
            {"seed", 11},           {"repeat_penalty", 1.1},  {"ignore_eos", true}};
  json other = completion("A different prompt that runs beside it", 30);  // a neighbour in the same steps
  HttpResponse r, o;
  std::thread t([&] { o = post("/v1/completions", other); });
  r = post("/v1/completions", b);
  t.join();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(o.status, 200) << o.body;
  EXPECT_EQ(r.j()["choices"][0]["text"], want);
  EXPECT_EQ(r.j()["usage"]["completion_tokens"], 20);
}

TEST_F(Serve, ChatStreamAndNonStream) {
  json body = {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello!"}}}},
               {"max_tokens", 12},
               {"temperature", 0},
               {"ignore_eos", true}};
  HttpResponse r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.j();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  const std::string text = j["choices"][0]["message"]["content"];
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  auto evs = test::sse_events(r.body);
  ASSERT_GE(evs.size(), 3u);
  EXPECT_EQ(evs.back(), "[DONE]");
  json first = json::parse(evs.front());
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  json last = json::parse(evs[evs.size() - 2]);  // include_usage: choices [] and the usage
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], 12);
  test::Streamed s = test::parse_stream(r.body);
  EXPECT_EQ(s.text, text);
  EXPECT_EQ(s.finish, "length");
  // Logprobs: one entry per token, top alternatives sorted.
  body["stream"] = false;
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json content = r.j()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 12u);
  ASSERT_EQ(content[0]["top_logprobs"].size(), 3u);
  EXPECT_LE(content[0]["logprob"].get<double>(), 0.0);
  EXPECT_GE(content[0]["top_logprobs"][0]["logprob"].get<double>(), content[0]["top_logprobs"][1]["logprob"].get<double>());
  // Greedy: the chosen token is the most likely one.
  EXPECT_NEAR(content[0]["logprob"].get<double>(), content[0]["top_logprobs"][0]["logprob"].get<double>(), 1e-5);
}

// 32 concurrent streaming clients (4 sequences at a time): all complete, each with its length and the text it
// gets alone.
TEST_F(Serve, ThirtyTwoConcurrentStreams) {
  const std::vector<std::string> prompts = {"Once upon a time", "In the beginning", "It was a dark and stormy night",
                                            "Call me Ishmael"};
  std::vector<std::string> alone;
  for (auto& p : prompts) {
    HttpResponse r = post("/v1/completions", completion(p, 16));
    ASSERT_EQ(r.status, 200) << r.body;
    alone.push_back(r.j()["choices"][0]["text"]);
  }
  std::vector<test::Streamed> got(32);
  std::vector<int> status(32);
  std::vector<std::thread> ts;
  for (int i = 0; i < 32; ++i)
    ts.emplace_back([&, i] {
      HttpResponse r = post("/v1/completions", completion(prompts[i % 4], 16, true));
      status[i] = r.status;
      got[i] = test::parse_stream(r.body);
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(status[i], 200) << "client " << i;
    EXPECT_TRUE(got[i].done) << "client " << i;
    EXPECT_EQ(got[i].text, alone[i % 4]) << "client " << i;
    EXPECT_EQ(got[i].usage["completion_tokens"], 16) << "client " << i;
  }
}

// A second request sharing a long prefix prefills only the rest.
TEST_F(Serve, PrefixCacheSkipsSharedPrefix) {
  std::vector<int> ids;
  for (int i = 0; i < 200; ++i) ids.push_back((i * 37 + 11) % 1000);
  json b = completion("", 4);
  b["prompt"] = ids;
  const double hits0 = test::metric(metrics(), "kiln_prefix_cache_hit_tokens_total");
  HttpResponse r = post("/v1/completions", b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["timings"]["prompt_n"], 200);
  ids.insert(ids.end(), {5, 6, 7, 8, 9});
  b["prompt"] = ids;
  r = post("/v1/completions", b);
  ASSERT_EQ(r.status, 200) << r.body;
  json t = r.j()["timings"];
  EXPECT_EQ(t["cache_n"], 192) << t;  // 12 whole blocks of 16
  EXPECT_EQ(t["prompt_n"], 205 - 192) << t;
  EXPECT_EQ(r.j()["usage"]["prompt_tokens_details"]["cached_tokens"], 192);
  const double hits1 = test::metric(metrics(), "kiln_prefix_cache_hit_tokens_total");
  EXPECT_GE(hits1 - hits0, 192) << metrics();
}

// Every kind of malformed request gets its 4xx with an OpenAI error body naming the parameter, while a stream
// started before them finishes normally; the server keeps serving.
TEST_F(Serve, MalformedRequestsGet4xxWhileAStreamFinishes) {
  std::string stream_body;
  int stream_status = 0;
  std::thread streamer([&] {
    HttpResponse r = post("/v1/completions", completion("A long story about", 64, true));
    stream_status = r.status;
    stream_body = r.body;
  });
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto chat = [&](json extra) {
    json b = {{"messages", msgs}, {"max_tokens", 4}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b.dump();
  };
  struct Case {
    const char* what;
    std::string path, body;
    int status;
    const char* param;  // nullptr: null
  };
  std::string long_prompt;
  for (int i = 0; i < 3000; ++i) long_prompt += " hello";
  const std::vector<Case> cases = {
      {"malformed JSON", "/v1/chat/completions", "{\"messages\": [", 400, nullptr},
      {"not an object", "/v1/chat/completions", "[1, 2]", 400, nullptr},
      {"empty body", "/v1/chat/completions", "", 400, nullptr},
      {"invalid UTF-8", "/v1/chat/completions",
       "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe bad\"}]}", 400, nullptr},
      {"messages missing", "/v1/chat/completions", "{}", 400, "messages"},
      {"messages empty", "/v1/chat/completions", "{\"messages\": []}", 400, "messages"},
      {"messages wrong type", "/v1/chat/completions", "{\"messages\": \"hi\"}", 400, "messages"},
      {"unknown role", "/v1/chat/completions", "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", 400,
       "messages[0].role"},
      {"content wrong type", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400,
       "messages[0].content"},
      {"model wrong type", "/v1/chat/completions", chat({{"model", 5}}), 400, "model"},
      {"temperature < 0", "/v1/chat/completions", chat({{"temperature", -0.5}}), 400, "temperature"},
      {"temperature wrong type", "/v1/chat/completions", chat({{"temperature", "hot"}}), 400, "temperature"},
      {"top_p 0", "/v1/chat/completions", chat({{"top_p", 0}}), 400, "top_p"},
      {"top_p > 1", "/v1/chat/completions", chat({{"top_p", 1.5}}), 400, "top_p"},
      {"top_k < 0", "/v1/chat/completions", chat({{"top_k", -3}}), 400, "top_k"},
      {"min_p > 1", "/v1/chat/completions", chat({{"min_p", 2}}), 400, "min_p"},
      {"max_tokens < 0", "/v1/chat/completions", chat({{"max_tokens", -1}}), 400, "max_tokens"},
      {"max_tokens absurd", "/v1/chat/completions", chat({{"max_tokens", 1e15}}), 400, "max_tokens"},
      {"max_tokens fractional", "/v1/chat/completions", chat({{"max_tokens", 2.5}}), 400, "max_tokens"},
      {"max_completion_tokens wrong type", "/v1/chat/completions", chat({{"max_completion_tokens", "ten"}}), 400,
       "max_completion_tokens"},
      {"stop wrong type", "/v1/chat/completions", chat({{"stop", 7}}), 400, "stop"},
      {"stream wrong type", "/v1/chat/completions", chat({{"stream", "yes"}}), 400, "stream"},
      {"known field of the wrong type", "/v1/chat/completions", chat({{"user", 12}}), 400, "user"},
      {"logit_bias wrong type", "/v1/chat/completions", chat({{"logit_bias", "x"}}), 400, "logit_bias"},
      {"typical_p > 1", "/v1/chat/completions", chat({{"typical_p", 1.5}}), 400, "typical_p"},
      {"mirostat out of range", "/v1/completions", json{{"prompt", "x"}, {"mirostat", 3}}.dump(), 400, "mirostat"},
      {"dry_multiplier < 0", "/v1/chat/completions", chat({{"dry_multiplier", -0.8}}), 400, "dry_multiplier"},
      {"xtc_probability wrong type", "/v1/chat/completions", chat({{"xtc_probability", "x"}}), 400, "xtc_probability"},
      {"structured_outputs", "/v1/chat/completions", chat({{"structured_outputs", json::object()}}), 400,
       "structured_outputs"},
      {"top_logprobs without logprobs", "/v1/chat/completions", chat({{"top_logprobs", 2}}), 400, "top_logprobs"},
      {"presence_penalty out of range", "/v1/chat/completions", chat({{"presence_penalty", 9}}), 400,
       "presence_penalty"},
      {"seed wrong type", "/v1/chat/completions", chat({{"seed", "abc"}}), 400, "seed"},
      {"prompt longer than the context", "/v1/completions", json{{"prompt", long_prompt}}.dump(), 400, "prompt"},
      {"token id outside the vocabulary", "/v1/completions", "{\"prompt\": [1, 2, 1000]}", 400, "prompt"},
      {"negative token id", "/v1/completions", "{\"prompt\": [1, -2]}", 400, "prompt"},
      {"token id not an integer", "/v1/completions", "{\"prompt\": [1, 2.5]}", 400, "prompt"},
      {"prompt missing", "/v1/completions", "{}", 400, "prompt"},
      {"prompt wrong type", "/v1/completions", "{\"prompt\": {\"a\": 1}}", 400, "prompt"},
      {"detokenize id outside the vocabulary", "/detokenize", "{\"tokens\": [1, 5000]}", 400, "tokens"},
      {"tokenize wrong type", "/tokenize", "{\"content\": 5}", 400, "content"},
      {"body over the limit", "/v1/completions", std::string(1100000, 'x'), 413, nullptr},
      {"no such endpoint", "/v1/nothing", "{}", 404, nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    HttpResponse r = post_raw(c.path, c.body);
    EXPECT_EQ(r.status, c.status) << r.body;
    json j = r.j();
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string() && !j["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_TRUE(j["error"].contains("code"));
    if (c.param) EXPECT_EQ(j["error"]["param"], c.param);
    else EXPECT_TRUE(j["error"]["param"].is_null()) << j;
  }
  // A request line httplib cannot parse, and a connection that hangs up mid-body.
  int fd = test::connect_to(proc_->port);
  test::send_all(fd, "GARBAGE\r\n\r\n");
  char buf[256];
  EXPECT_GT(::recv(fd, buf, sizeof buf, 0), 0);
  ::close(fd);
  fd = test::connect_to(proc_->port);
  test::send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit-key\r\n"
                     "Content-Length: 1000\r\n\r\n{\"prompt\":");
  ::close(fd);
  streamer.join();
  EXPECT_EQ(stream_status, 200);
  test::Streamed s = test::parse_stream(stream_body);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.usage["completion_tokens"], 64);
  // Still serving.
  EXPECT_EQ(post("/v1/completions", completion("still here", 3)).status, 200);
  EXPECT_GE(test::metric(metrics(), "kiln_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}"), 20);
}

// A client that hangs up mid-stream: its sequence is cancelled and its blocks freed (visible in /metrics).
TEST_F(Serve, DisconnectMidStreamFreesBlocks) {
  const std::string before = metrics();
  const double cancelled0 = test::metric(before, "kiln_sequences_finished_total{reason=\"cancelled\"}");
  const int fd = test::connect_to(proc_->port);
  ASSERT_GE(fd, 0);
  const std::string body = completion("Tell me everything", 1500, true).dump();
  test::send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit-key\r\n"
                     "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  std::string got;
  char buf[4096];
  while (got.find("\"text\"") == std::string::npos) {  // the first token chunk
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  // It holds blocks while running (the gauges are published at the end of the step that sent the first token).
  bool held = false;
  for (int i = 0; i < 100 && !held; ++i) {
    held = test::metric(metrics(), "kiln_kv_blocks_used") > 0;
    if (!held) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(held) << metrics();
  ::close(fd);
  bool freed = false;
  for (int i = 0; i < 200 && !freed; ++i) {
    const std::string m = metrics();
    freed = test::metric(m, "kiln_kv_blocks_used") == 0 && test::metric(m, "kiln_running_sequences") == 0 &&
            test::metric(m, "kiln_sequences_finished_total{reason=\"cancelled\"}") == cancelled0 + 1;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(freed) << metrics();
}

// A client that hangs up while its non-streamed request runs: the request is cancelled (not run to max_tokens) and
// its blocks freed, on /v1/completions and on the dialects' generation path (/v1/messages). httplib gives the
// handler no hang-up signal; the server watches the socket while it waits.
TEST_F(Serve, DisconnectBeforeANonStreamedAnswerCancels) {
  const int max_tokens = 1500;
  const std::string msgs = json{{"model", "fixture"}, {"max_tokens", max_tokens}, {"temperature", 0},
                                {"messages", {{{"role", "user"}, {"content", "Tell me everything"}}}}}.dump();
  for (const auto& [path, body] : {std::pair<std::string, std::string>{"/v1/completions",
                                                                       completion("Tell me everything", max_tokens).dump()},
                                   {"/v1/messages", msgs}}) {
    SCOPED_TRACE(path);
    const std::string before = metrics();
    const std::string closed = "kiln_requests_total{endpoint=\"" + path + "\",status=\"499\"}";
    const double cancelled0 = test::metric(before, "kiln_sequences_finished_total{reason=\"cancelled\"}");
    const double gen0 = test::metric(before, "kiln_generated_tokens_total");
    const double closed0 = std::max(0.0, test::metric(before, closed));
    const int fd = test::connect_to(proc_->port);
    ASSERT_GE(fd, 0);
    test::send_all(fd, "POST " + path + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit-key\r\n"
                       "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                       "\r\n\r\n" + body);
    // Running: a sequence holds a slot and has generated some tokens.
    bool running = false;
    for (int i = 0; i < 400 && !running; ++i) {
      const std::string m = metrics();
      running = test::metric(m, "kiln_running_sequences") > 0 && test::metric(m, "kiln_generated_tokens_total") > gen0;
      if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(running) << metrics();
    ::close(fd);
    bool cancelled = false;
    std::string m;
    for (int i = 0; i < 200 && !cancelled; ++i) {
      m = metrics();
      cancelled = test::metric(m, "kiln_sequences_finished_total{reason=\"cancelled\"}") == cancelled0 + 1 &&
                  test::metric(m, "kiln_running_sequences") == 0 && test::metric(m, "kiln_kv_blocks_used") == 0;
      if (!cancelled) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(cancelled) << m;
    EXPECT_LT(test::metric(m, "kiln_generated_tokens_total") - gen0, max_tokens / 2) << m;
    // Logged as the client's hang-up (499), once.
    EXPECT_EQ(test::metric(m, closed), closed0 + 1) << m;
  }
  EXPECT_EQ(post("/v1/completions", completion("still here", 3)).status, 200);
}

TEST_F(Serve, TokenizeDetokenizeAndMetrics) {
  HttpResponse r = post("/tokenize", {{"content", "hello world"}, {"with_pieces", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  json toks = r.j()["tokens"];
  ASSERT_FALSE(toks.empty());
  EXPECT_TRUE(toks[0].contains("id") && toks[0].contains("piece"));
  json ids = json::array();
  for (auto& t : toks) ids.push_back(t["id"]);
  r = post("/detokenize", {{"tokens", ids}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["content"], "hello world");
  const std::string m = metrics();
  for (const char* name : {"kiln_generated_tokens_total", "kiln_prompt_tokens_total", "kiln_queue_depth",
                           "kiln_running_sequences", "kiln_kv_blocks_free", "kiln_kv_blocks_cached",
                           "kiln_time_to_first_token_seconds_count", "kiln_inter_token_latency_seconds_count",
                           "kiln_generated_tokens_per_second", "kiln_prefix_cache_hit_tokens_total"})
    EXPECT_GE(test::metric(m, name), 0) << name << "\n" << m;
  EXPECT_NE(m.find("kiln_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
}

// SIGTERM while a stream runs: the stream ends (finished or cancelled), new requests get 503, exit code 0.
TEST(ServeShutdown, SigtermExitsZero) {
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", model_path(), "-a", "fixture", "-t", "1", "--shutdown-timeout", "2"})) << p.log();
  std::string body;
  std::thread streamer([&] {
    body = http(p.port, "POST", "/v1/completions", completion("and so on", 400, true).dump()).body;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(p.pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  HttpResponse late = http(p.port, "POST", "/v1/completions", completion("late", 2).dump());
  if (late.status != 0) {  // else the listener is closed already
    EXPECT_EQ(late.status, 503) << late.body;
  }
  streamer.join();
  const int rc = p.stop(SIGTERM, 30);
  EXPECT_EQ(rc, 0) << p.log();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20);
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << body.substr(0, 400);
  EXPECT_NE(p.log().find("kiln serve: stopped"), std::string::npos) << p.log();
}

// Bad flags are refused before anything is loaded.
TEST(ServeShutdown, BadFlags) {
  EXPECT_EQ(test::run_kiln("serve --parallel 0").rc, 1);
  EXPECT_EQ(test::run_kiln("serve --parallel 257").rc, 1);
  EXPECT_EQ(test::run_kiln("serve --port 70000").rc, 1);
  auto bad = test::run_kiln("serve --ctx-checkpoints -1");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("--ctx-checkpoints: must be in [0, 1024] (got -1)"), std::string::npos) << bad.err;
  auto r = test::run_kiln("serve -h");
  EXPECT_EQ(r.rc, 0);
  for (const char* f : {"--host", "--port", "--api-key", "--parallel", "-c", "-b", "--no-prefix-cache", "--device",
                        "--ctx-checkpoints"})
    EXPECT_NE(r.out.find(f), std::string::npos) << f;
}

// -c over --parallel above the model's training context (the fixture's: 2048) is allowed with a warning, as
// llama.cpp does; the pool's default share stays within it.
TEST(ServeShutdown, ContextAboveTheTrainingContextWarns) {
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", model_path(), "-t", "1", "--parallel", "1", "-c", "4096"})) << p.log();
  EXPECT_NE(p.log().find("-c 4096 over --parallel 1 is 4096 tokens per sequence, more than the model's training "
                         "context (2048 tokens)"), std::string::npos) << p.log();
  EXPECT_NE(p.log().find("(at most 4096 each)"), std::string::npos) << p.log();
  EXPECT_EQ(p.stop(SIGTERM), 0);
  test::ServeProcess q;
  ASSERT_TRUE(q.start({"-m", model_path(), "-t", "1", "--parallel", "4", "-c", "4096"})) << q.log();
  EXPECT_EQ(q.log().find("training context"), std::string::npos) << q.log();
  EXPECT_NE(q.log().find("(at most 2048 each)"), std::string::npos) << q.log();
  EXPECT_EQ(q.stop(SIGTERM), 0);
}

// A hybrid model (Qwen3.5: recurrent DeltaNet layers) keeps recurrent-state checkpoints with its cached blocks: the
// next turn of a conversation resumes at the checkpoint of the turn before instead of prefilling from 0.
TEST(ServeHybrid, NextTurnResumesFromACheckpoint) {
  KILN_REQUIRE_FIXTURES();
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", test::fixtures_dir() + "/models-next/fixture-qwen35-f16.gguf", "-t", "1", "--parallel",
                       "1", "-c", "1024", "--ctx-checkpoints", "2"}))
      << p.log();
  // Two checkpoints of the fixture's 3 DeltaNet layers: 2 x 3 x (3 x 1024 + 128 x 128 x 4) floats.
  EXPECT_NE(p.log().find("prefix cache on (2 recurrent-state checkpoints, 1.6 MiB)"), std::string::npos) << p.log();
  std::vector<int> ids;
  for (int i = 0; i < 70; ++i) ids.push_back((i * 37 + 11) % 990 + 3);
  json b = completion("", 4);
  b["prompt"] = ids;
  HttpResponse r = http(p.port, "POST", "/v1/completions", b.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["timings"]["cache_n"], 0);
  for (int i = 0; i < 20; ++i) ids.push_back(500 + i);
  b["prompt"] = ids;
  r = http(p.port, "POST", "/v1/completions", b.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["timings"]["cache_n"], 64) << r.body;  // the first prompt's checkpoint: 69 rounded down to blocks
  EXPECT_EQ(r.j()["timings"]["prompt_n"], 90 - 64) << r.body;
  const std::string m = http(p.port, "GET", "/metrics").body;
  EXPECT_EQ(test::metric(m, "kiln_kv_checkpoints_total"), 2) << m;
  EXPECT_EQ(test::metric(m, "kiln_kv_checkpoints_used"), 2) << m;  // at 64 and at 80
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
}

}  // namespace
}  // namespace kiln
