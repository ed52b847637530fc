// llama-server's sampler fields through kiln serve (fixture model, real HTTP): logit_bias in OpenAI's object form
// and llama-server's array form (ids, texts, false) moves and forces greedy tokens on /v1/completions and
// /v1/chat/completions; typical_p, xtc_*, dry_* and logit_bias give the text `kiln run` gives with the same flags
// and seed (so the fields reach the sampler as the flags do) and change it; out-of-range values are 400s naming
// the field; llama-server's native /completion takes them too; /props reports the defaults.
#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <string>
#include <vector>

#include "common/engine_test_util.h"
#include "unit/test_server_util.h"

namespace kiln {
namespace {

using test::HttpResponse;
using test::json;

std::string model_path() { return test::data_path("models/fixture-llama-q8_0.gguf"); }

class ServeSampling : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    proc_ = new test::ServeProcess();
    ASSERT_TRUE(proc_->start({"-m", model_path(), "-t", "2", "--parallel", "2", "-c", "2048", "-a", "fixture"}))
        << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
  }
  static HttpResponse post(const std::string& path, const json& b) {
    return test::http(proc_->port, "POST", path, b.dump());
  }
  static test::ServeProcess* proc_;
};
test::ServeProcess* ServeSampling::proc_ = nullptr;

// A greedy completion of the token prompt (n tokens, EOG ignored) with extra fields.
json greedy(const json& ids, int n, const json& extra = json::object()) {
  json b = {{"prompt", ids}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

// `kiln run --ids` on the same token prompt: the generated ids.
std::vector<int> cli_ids(const std::string& list, const std::string& flags) {
  auto r = test::run_kiln("run --device cpu -t 1 -m '" + model_path() + "' --tokens " + list + " --ignore-eos --ids " +
                          flags);
  EXPECT_EQ(r.rc, 0) << r.err;
  std::vector<int> out;
  std::string num;
  for (char c : r.out) {
    if (c >= '0' && c <= '9') {
      num += c;
    } else if (!num.empty()) {
      out.push_back(std::stoi(num));
      num.clear();
    }
  }
  return out;
}

std::string cli_text(const std::string& list, const std::string& flags) {
  auto r = test::run_kiln("run --device cpu -t 1 -m '" + model_path() + "' --tokens " + list + " --ignore-eos " + flags);
  EXPECT_EQ(r.rc, 0) << r.err;
  std::string t = r.out;
  if (!t.empty()) t.pop_back();  // kiln run ends with a newline
  return t;
}

class Prompt {
 public:
  explicit Prompt(int port) {
    ids = test::http(port, "POST", "/tokenize", json{{"content", "The quick brown fox"}}.dump()).j()["tokens"];
    for (auto& id : ids) list += (list.empty() ? "" : ",") + std::to_string(id.get<int>());
  }
  json ids;
  std::string list;
};

// The generated pieces of a completion asked with logprobs.
std::vector<std::string> pieces(const HttpResponse& r) {
  std::vector<std::string> out;
  const json j = r.j();
  for (auto& t : j["choices"][0]["logprobs"]["tokens"]) out.push_back(t.get<std::string>());
  return out;
}

TEST_F(ServeSampling, LogitBiasMovesAndForcesGreedyTokens) {
  const Prompt p(proc_->port);
  ASSERT_FALSE(p.list.empty());
  const std::vector<int> g = cli_ids(p.list, "-n 6 --temp 0");
  ASSERT_EQ(g.size(), 6u);
  HttpResponse base = post("/v1/completions", greedy(p.ids, 6));
  ASSERT_EQ(base.status, 200) << base.body;
  const std::string text0 = base.j()["choices"][0]["text"];
  EXPECT_EQ(text0, cli_text(p.list, "-n 6 --temp 0"));

  // -100 on the greedy first token (OpenAI's form): the text changes, as `kiln run -l ID-100` changes it.
  const std::string g0 = std::to_string(g[0]);
  HttpResponse down = post("/v1/completions", greedy(p.ids, 6, {{"logit_bias", {{g0, -100}}}}));
  ASSERT_EQ(down.status, 200) << down.body;
  const std::string moved = down.j()["choices"][0]["text"];
  EXPECT_NE(moved, text0);
  EXPECT_EQ(moved, cli_text(p.list, "-n 6 --temp 0 -l " + g0 + "-100"));
  // llama-server's array form, and false (never this token): the same here.
  for (const json& form : {json::array({json::array({g[0], -100})}), json::array({json::array({g[0], false})})}) {
    HttpResponse r = post("/v1/completions", greedy(p.ids, 6, {{"logit_bias", form}}));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.j()["choices"][0]["text"], moved) << form;
  }

  // +100 on another token: every generated token is it (its piece, six times), on completions and on chat.
  const int forced = g[0] == 7 ? 8 : 7;
  EXPECT_EQ(cli_ids(p.list, "-n 6 --temp 0 -l " + std::to_string(forced) + "+100"), std::vector<int>(6, forced));
  HttpResponse up = post("/v1/completions",
                         greedy(p.ids, 6, {{"logit_bias", {{std::to_string(forced), 100}}}, {"logprobs", 0}}));
  ASSERT_EQ(up.status, 200) << up.body;
  const std::vector<std::string> ps = pieces(up);
  ASSERT_EQ(ps.size(), 6u);
  for (const std::string& s : ps) EXPECT_EQ(s, ps[0]);
  EXPECT_EQ(up.j()["choices"][0]["text"], cli_text(p.list, "-n 6 --temp 0 -l " + std::to_string(forced) + "+100"));
  json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4}, {"temperature", 0},
               {"ignore_eos", true}, {"logprobs", true}, {"logit_bias", {{std::to_string(forced), 100}}}};
  HttpResponse c = post("/v1/chat/completions", chat);
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = c.j();
  const json& content = cj["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u) << c.body;
  for (auto& t : content) EXPECT_EQ(t["token"], ps[0]);
}

TEST_F(ServeSampling, TextEntriesBiasEachOfTheirTokens) {
  const Prompt p(proc_->port);
  const std::string text = "brown fox";
  // The tokens the server biases: the text encoded without BOS and without special-token parsing.
  json tok = post("/tokenize", {{"content", text}, {"add_special", false}, {"parse_special", false},
                                {"with_pieces", true}}).j()["tokens"];
  ASSERT_FALSE(tok.empty());
  std::set<std::string> allowed;
  for (auto& t : tok) allowed.insert(t["piece"].get<std::string>());
  for (const json& form : {json::array({json::array({text, 100})}), json{{text, 100}}}) {
    HttpResponse r = post("/v1/completions", greedy(p.ids, 6, {{"logit_bias", form}, {"logprobs", 0}}));
    ASSERT_EQ(r.status, 200) << r.body;
    for (const std::string& s : pieces(r)) EXPECT_TRUE(allowed.count(s)) << "'" << s << "' " << form;
  }
}

TEST_F(ServeSampling, FieldsEqualTheFlagsAndAct) {
  const Prompt p(proc_->port);
  const std::string plain_flags = "-n 16 --temp 0.9 -s 5";
  const std::string flags = plain_flags + " --typical 0.9 --xtc-probability 0.5 --xtc-threshold 0.05 "
                            "--dry-multiplier 0.8 --dry-base 2 --dry-allowed-length 1 --dry-penalty-last-n 64 "
                            "--dry-sequence-breaker none --dry-sequence-breaker '.' -l 7+2";
  json b = {{"prompt", p.ids},          {"max_tokens", 16},          {"temperature", 0.9},
            {"seed", 5},                {"ignore_eos", true},        {"typical_p", 0.9},
            {"xtc_probability", 0.5},   {"xtc_threshold", 0.05},     {"dry_multiplier", 0.8},
            {"dry_base", 2},            {"dry_allowed_length", 1},   {"dry_penalty_last_n", 64},
            {"dry_sequence_breakers", {"."}}, {"logit_bias", {{"7", 2}}}};
  HttpResponse r = post("/v1/completions", b);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string with = r.j()["choices"][0]["text"];
  EXPECT_EQ(with, cli_text(p.list, flags));
  EXPECT_NE(with, cli_text(p.list, plain_flags));
  // Greedy with XTC at probability 1 and threshold 0 keeps only the least likely token: not the greedy text.
  json wide = greedy(p.ids, 6, {{"top_k", 0}, {"top_p", 1}, {"min_p", 0}});
  HttpResponse g = post("/v1/completions", wide);
  wide["xtc_probability"] = 1;
  wide["xtc_threshold"] = 0;
  HttpResponse x = post("/v1/completions", wide);
  ASSERT_EQ(x.status, 200) << x.body;
  EXPECT_NE(x.j()["choices"][0]["text"], g.j()["choices"][0]["text"]);
  // Mirostat: the fields give the flags' text (mu lives with the request's sequence and starts at 2 * tau).
  for (int v : {1, 2}) {
    json m = {{"prompt", p.ids}, {"max_tokens", 16}, {"temperature", 0.9}, {"seed", 5}, {"ignore_eos", true},
              {"mirostat", v}, {"mirostat_tau", 3}, {"mirostat_eta", 0.2}};
    HttpResponse mr = post("/v1/completions", m);
    ASSERT_EQ(mr.status, 200) << mr.body;
    EXPECT_EQ(mr.j()["choices"][0]["text"].get<std::string>(),
              cli_text(p.list, plain_flags + " --mirostat " + std::to_string(v) + " --mirostat-ent 3 --mirostat-lr 0.2"))
        << v;
  }
}

// llama-server's native POST /completion: the /v1/completions text in {"content", "stop", ...}, the sampler fields
// honoured, streamed as its native events; n_predict is max_tokens; unknown fields and several prompts refused.
TEST_F(ServeSampling, NativeCompletionTakesTheFields) {
  HttpResponse v1 = post("/v1/completions", greedy("The quick brown fox", 5, {{"logit_bias", {{"7", 100}}}}));
  ASSERT_EQ(v1.status, 200) << v1.body;
  json nb = {{"prompt", "The quick brown fox"}, {"n_predict", 5}, {"temperature", 0}, {"ignore_eos", true},
             {"logit_bias", {{"7", 100}}}};
  HttpResponse r = post("/completion", nb);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.j();
  EXPECT_EQ(j["content"], v1.j()["choices"][0]["text"]) << r.body;
  EXPECT_EQ(j["stop"], true);
  EXPECT_EQ(j["tokens_predicted"], 5);
  EXPECT_EQ(j["tokens_evaluated"], v1.j()["usage"]["prompt_tokens"]);
  json sb = nb;
  sb["stream"] = true;
  r = post("/completion", sb);
  ASSERT_EQ(r.status, 200) << r.body;
  std::string text;
  for (const std::string& e : test::sse_events(r.body)) text += json::parse(e)["content"].get<std::string>();
  EXPECT_EQ(text, j["content"].get<std::string>());
  // The bias acts: without it the text differs.
  nb.erase("logit_bias");
  EXPECT_NE(post("/completion", nb).j()["content"], j["content"]);
  const std::vector<std::pair<json, const char*>> bad = {
      {{{"prompt", "x"}, {"typical_p", 2}}, "typical_p"},
      {{{"prompt", "x"}, {"mirostat", 3}}, "mirostat"},
      {{{"prompt", "x"}, {"n_predict", 0}}, "n_predict"},
      {{{"prompt", {"a", "b"}}}, "prompt"},
      {{{"prompt", "x"}, {"input_prefix", "y"}}, "input_prefix"},
  };
  for (const auto& [b, param] : bad) {
    HttpResponse e = post("/completion", b);
    EXPECT_EQ(e.status, 400) << b << e.body;
    EXPECT_EQ(e.j()["error"]["param"], param) << e.body;
  }
}

TEST_F(ServeSampling, OutOfRangeValuesNameTheField) {
  struct Case {
    json extra;
    const char* param;
  };
  const std::vector<Case> cases = {
      {{{"typical_p", 1.5}}, "typical_p"},
      {{{"typical_p", "x"}}, "typical_p"},
      {{{"xtc_probability", 2}}, "xtc_probability"},
      {{{"xtc_threshold", -0.1}}, "xtc_threshold"},
      {{{"dry_multiplier", -1}}, "dry_multiplier"},
      {{{"dry_base", 0.5}}, "dry_base"},
      {{{"dry_allowed_length", -1}}, "dry_allowed_length"},
      {{{"dry_allowed_length", 1.5}}, "dry_allowed_length"},
      {{{"dry_penalty_last_n", -2}}, "dry_penalty_last_n"},
      {{{"dry_sequence_breakers", json::array()}}, "dry_sequence_breakers"},
      {{{"dry_sequence_breakers", "\n"}}, "dry_sequence_breakers"},
      {{{"dry_sequence_breakers", {1}}}, "dry_sequence_breakers"},
      {{{"dry_sequence_breakers", {""}}}, "dry_sequence_breakers"},
      {{{"logit_bias", "x"}}, "logit_bias"},
      {{{"logit_bias", {{"5", 200}}}}, "logit_bias"},
      {{{"logit_bias", {{"5", "a"}}}}, "logit_bias"},
      {{{"logit_bias", {{"5", true}}}}, "logit_bias"},
      {{{"logit_bias", {{"100000", 1}}}}, "logit_bias"},
      {{{"logit_bias", json::array({json::array({-1, 1})})}}, "logit_bias"},
      {{{"logit_bias", json::array({json::array({1})})}}, "logit_bias"},
      {{{"logit_bias", json::array({5})}}, "logit_bias"},
      {{{"tfs_z", 0.9}}, "tfs_z"},
      {{{"mirostat", 3}}, "mirostat"},
      {{{"mirostat", -1}}, "mirostat"},
      {{{"mirostat", 1.5}}, "mirostat"},
      {{{"mirostat_tau", -1}}, "mirostat_tau"},
      {{{"mirostat_tau", "x"}}, "mirostat_tau"},
      {{{"mirostat_eta", -0.1}}, "mirostat_eta"},
  };
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(path) + " " + c.extra.dump());
      json b = {{"max_tokens", 2}};
      if (std::string(path) == "/v1/completions") b["prompt"] = "hi";
      else b["messages"] = {{{"role", "user"}, {"content", "hi"}}};
      for (auto& [k, v] : c.extra.items()) b[k] = v;
      HttpResponse r = post(path, b);
      EXPECT_EQ(r.status, 400) << r.body;
      EXPECT_EQ(r.j()["error"]["param"], c.param) << r.body;
    }
  }
  // Neutral values of the samplers kiln does not have are accepted; an empty bias list is no bias.
  HttpResponse ok = post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"tfs_z", 1}, {"mirostat", 0},
                                             {"logit_bias", json::object()}, {"typical_p", 1}});
  EXPECT_EQ(ok.status, 200) << ok.body;
}

// Without speculative decoding a request may not ask for drafts (n_max 0 is honoured: none).
TEST_F(ServeSampling, SpeculativeFieldsNeedSpeculativeDecoding) {
  const json base = {{"prompt", "hello"}, {"max_tokens", 4}, {"temperature", 0}};
  json b = base;
  b["speculative.n_max"] = 4;
  HttpResponse r = post("/v1/completions", b);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.j()["error"]["param"], "speculative.n_max") << r.body;
  b = base;
  b["speculative.n_max"] = 0;
  r = post("/v1/completions", b);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(r.j()["timings"].contains("draft_n")) << r.body;
}

// kiln serve -md: a draft model of the same vocabulary; llama-server's speculative.* fields and the acceptance in
// the timings.
class ServeSpeculative : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    proc_ = new test::ServeProcess();
    ASSERT_TRUE(proc_->start({"-m", test::data_path("models/fixture-llama-f16.gguf"), "-md",
                              test::data_path("models/fixture-llama-q4_k_m.gguf"), "-t", "2", "--parallel", "2", "-c",
                              "2048", "--spec-draft-n-max", "6"}))
        << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
  }
  static HttpResponse post(const json& b) { return test::http(proc_->port, "POST", "/v1/completions", b.dump()); }
  static test::ServeProcess* proc_;
};
test::ServeProcess* ServeSpeculative::proc_ = nullptr;

TEST_F(ServeSpeculative, FieldsActAndTimingsReportTheAcceptance) {
  const json prompt = test::read_ids(test::data_path("models/prompt.txt"));
  const json base = {{"prompt", prompt}, {"max_tokens", 32}, {"temperature", 0}};
  const HttpResponse a = post(base);
  ASSERT_EQ(a.status, 200) << a.body;
  const json ta = a.j()["timings"];
  ASSERT_TRUE(ta.contains("draft_n")) << a.body;
  EXPECT_GT(ta["draft_n"].get<int64_t>(), 0);
  EXPECT_GT(ta["draft_n_accepted"].get<int64_t>(), 0);
  EXPECT_LE(ta["draft_n_accepted"].get<int64_t>(), ta["draft_n"].get<int64_t>());
  json b = base;
  b["speculative.n_max"] = 2;
  b["speculative.n_min"] = 1;
  b["speculative.p_min"] = 0.0;
  b["speculative.type"] = "draft-simple";
  const HttpResponse r2 = post(b);
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r2.j()["choices"][0]["text"], a.j()["choices"][0]["text"]);
  EXPECT_LE(r2.j()["timings"]["draft_n"].get<int64_t>(), 2 * 32);
  EXPECT_LT(r2.j()["timings"]["draft_n"].get<int64_t>(), ta["draft_n"].get<int64_t>());
  b = base;
  b["speculative.n_max"] = 0;
  const HttpResponse r0 = post(b);
  ASSERT_EQ(r0.status, 200) << r0.body;
  EXPECT_EQ(r0.j()["choices"][0]["text"], a.j()["choices"][0]["text"]);
  EXPECT_FALSE(r0.j()["timings"].contains("draft_n")) << r0.body;
  // /props: the server's settings under llama-server's keys.
  const HttpResponse p = test::http(proc_->port, "GET", "/props");
  ASSERT_EQ(p.status, 200) << p.body;
  const json props = p.j();
  const json& params = props["default_generation_settings"]["params"];
  EXPECT_EQ(params["speculative.n_max"], 6);
  EXPECT_EQ(params["speculative.type"], "draft-simple");
}

TEST_F(ServeSpeculative, WhatCannotBeHonouredIsRefusedNamingTheField) {
  const json base = {{"prompt", "hello"}, {"max_tokens", 4}, {"temperature", 0}};
  struct Case {
    const char* field;
    json value;
  };
  for (const Case& c : {Case{"speculative.n_max", 7}, Case{"speculative.n_max", -1}, Case{"speculative.n_max", "4"},
                        Case{"speculative.n_min", 7}, Case{"speculative.p_min", 1.5},
                        Case{"speculative.type", "ngram-simple"}, Case{"speculative.ngram_size_n", 3},
                        Case{"speculative", json{{"n_max", 2}}}}) {
    json b = base;
    b[c.field] = c.value;
    const HttpResponse r = post(b);
    EXPECT_EQ(r.status, 400) << c.field << " " << c.value.dump() << ": " << r.body;
    EXPECT_EQ(r.j()["error"]["param"], c.field) << r.body;
  }
}

TEST_F(ServeSampling, PropsReportTheDefaults) {
  HttpResponse r = test::http(proc_->port, "GET", "/props");
  ASSERT_EQ(r.status, 200) << r.body;
  const json props = r.j();
  const json& p = props["default_generation_settings"]["params"];
  EXPECT_FLOAT_EQ(p["typical_p"].get<float>(), 1.0f);
  EXPECT_FLOAT_EQ(p["dry_base"].get<float>(), 1.75f);
  EXPECT_EQ(p["dry_allowed_length"], 2);
  EXPECT_EQ(p["dry_penalty_last_n"], -1);
  EXPECT_EQ(p["dry_sequence_breakers"], json({"\n", ":", "\"", "*"}));
  EXPECT_FLOAT_EQ(p["xtc_threshold"].get<float>(), 0.1f);
  EXPECT_EQ(p["logit_bias"], json::array());
  EXPECT_EQ(p["mirostat"], 0);
  EXPECT_FLOAT_EQ(p["mirostat_tau"].get<float>(), 5.0f);
  EXPECT_FLOAT_EQ(p["mirostat_eta"].get<float>(), 0.1f);
}

}  // namespace
}  // namespace kiln
