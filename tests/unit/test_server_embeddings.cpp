// Embeddings and reranking over HTTP (server/embeddings.cpp): POST /v1/embeddings (OpenAI's shape: the pooled
// vector against the generation path's hidden states, token-id inputs, base64, dimensions, usage), /embedding
// (llama-server's shape, per-token vectors with pooling none), hostile inputs answered 400 naming the field, a server
// without embeddings, an embedding model's server refusing generation, and /v1/rerank (Jina's and TEI's shapes)
// against the classification head over the reference hidden state of the rerank prompt.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/embed_models.h"
#include "common/engine_util.h"
#include "runtime/embedding.h"
#include "unit/test_server_util.h"

namespace kiln {
namespace {

using test::HttpResponse;
using test::json;

std::vector<float> floats(const json& a) { return a.get<std::vector<float>>(); }

std::vector<uint8_t> unbase64(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = val(c);
    if (v < 0) break;
    acc = acc << 6 | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) out.push_back(static_cast<uint8_t>(acc >> (bits -= 8)));
  }
  return out;
}

// The mean of the reference hidden rows of `ids` (unnormalized).
std::vector<float> reference_mean(const std::string& model, const std::vector<int32_t>& ids) {
  auto m = test::load_cpu_model(model);
  const auto h = test::reference_hidden(*m, ids);
  std::vector<float> v(h[0].size());
  for (size_t i = 0; i < v.size(); ++i) {
    double s = 0;
    for (const auto& r : h) s += r[i];
    v[i] = static_cast<float>(s / static_cast<double>(h.size()));
  }
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
}

class ServeEmbeddings : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::string(test::make_embed_model("srv-embed.gguf", {}));
    proc_ = new test::ServeProcess();
    ASSERT_TRUE(proc_->start({"-m", *model_, "-t", "2", "-c", "1024", "--parallel", "4", "--pooling", "mean"}))
        << proc_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(proc_->stop(SIGTERM), 0) << proc_->log();
    delete proc_;
    delete model_;
  }
  static HttpResponse post(const std::string& path, const json& b) { return test::http(proc_->port, "POST", path, b.dump()); }
  static std::vector<int32_t> tokens(const std::string& text) {
    HttpResponse r = post("/tokenize", {{"content", text}, {"add_special", true}});
    return r.j()["tokens"].get<std::vector<int32_t>>();
  }
  static void expect_400(const json& body, const std::string& param, const std::string& path = "/v1/embeddings") {
    HttpResponse r = post(path, body);
    EXPECT_EQ(r.status, 400) << body.dump().substr(0, 200) << " -> " << r.body;
    EXPECT_EQ(r.j()["error"]["param"], param) << body.dump().substr(0, 200) << " -> " << r.body;
  }
  static test::ServeProcess* proc_;
  static std::string* model_;
};
test::ServeProcess* ServeEmbeddings::proc_ = nullptr;
std::string* ServeEmbeddings::model_ = nullptr;

TEST_F(ServeEmbeddings, OpenAIShapeAgainstTheReference) {
  const std::string text = "The quick brown fox";
  HttpResponse r = post("/v1/embeddings", {{"input", text}, {"model", "any-name"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.j();
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "any-name");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["object"], "embedding");
  EXPECT_EQ(j["data"][0]["index"], 0);
  const std::vector<int32_t> ids = tokens(text);
  EXPECT_EQ(ids, embedding_tokens(test::load_cpu_model(*model_)->tokenizer(), text));
  EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(j["usage"]["total_tokens"], ids.size());
  const std::vector<float> v = floats(j["data"][0]["embedding"]);
  const std::vector<float> mean = reference_mean(*model_, ids);
  expect_close(v, test::l2_normalized(mean), 1e-6);
  // embd_normalize -1: the mean itself.
  r = post("/v1/embeddings", {{"input", text}, {"embd_normalize", -1}});
  expect_close(floats(r.j()["data"][0]["embedding"]), mean, 1e-5);
  // Token ids give the same vector as the text they spell; a list keeps its order.
  r = post("/v1/embeddings", {{"input", json::array({"other text", ids, text})}});
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j()["data"].size(), 3u);
  EXPECT_EQ(r.j()["data"][2]["index"], 2);
  expect_close(floats(r.j()["data"][1]["embedding"]), v, 1e-6);
  expect_close(floats(r.j()["data"][2]["embedding"]), v, 1e-6);
  EXPECT_EQ(r.j()["usage"]["prompt_tokens"], 2 * ids.size() + tokens("other text").size());
  r = post("/v1/embeddings", {{"input", ids}});
  expect_close(floats(r.j()["data"][0]["embedding"]), v, 1e-6);
}

TEST_F(ServeEmbeddings, Base64DimensionsAndTheLlamaShape) {
  const std::string text = "Embeddings are vectors.";
  const std::vector<float> v = floats(post("/v1/embeddings", {{"input", text}}).j()["data"][0]["embedding"]);
  HttpResponse r = post("/v1/embeddings", {{"input", text}, {"encoding_format", "base64"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<uint8_t> bytes = unbase64(r.j()["data"][0]["embedding"].get<std::string>());
  ASSERT_EQ(bytes.size(), v.size() * 4);
  std::vector<float> back(v.size());
  std::memcpy(back.data(), bytes.data(), bytes.size());
  EXPECT_EQ(back, v);  // the same floats, bit for bit
  // dimensions: the first k, renormalized.
  r = post("/v1/embeddings", {{"input", text}, {"dimensions", 16}});
  ASSERT_EQ(r.status, 200) << r.body;
  expect_close(floats(r.j()["data"][0]["embedding"]), test::l2_normalized({v.begin(), v.begin() + 16}), 1e-6);
  r = post("/v1/embeddings", {{"input", text}, {"dimensions", 256}});
  expect_close(floats(r.j()["data"][0]["embedding"]), v, 1e-7);
  // llama-server's /embedding: a list of {index, embedding: [vector]}; "content" or "input".
  for (const char* path : {"/embedding", "/embeddings"}) {
    r = post(path, {{"content", json::array({text, "x"})}});
    ASSERT_EQ(r.status, 200) << r.body;
    ASSERT_TRUE(r.j().is_array());
    ASSERT_EQ(r.j().size(), 2u);
    EXPECT_EQ(r.j()[1]["index"], 1);
    ASSERT_EQ(r.j()[0]["embedding"].size(), 1u);
    expect_close(floats(r.j()[0]["embedding"][0]), v, 1e-7);
  }
  // Generation is served beside them.
  r = post("/v1/completions", {{"prompt", text}, {"max_tokens", 3}});
  EXPECT_EQ(r.status, 200) << r.body;
  const json meta = test::http(proc_->port, "GET", "/v1/models").j()["data"][0]["meta"];
  EXPECT_EQ(meta["embeddings"]["pooling"], "mean");
  EXPECT_EQ(meta["embeddings"]["n_embd"], 256);
  EXPECT_EQ(meta["generation"], true);
}

TEST_F(ServeEmbeddings, HostileInputsNameTheField) {
  expect_400(json::object(), "input");
  expect_400({{"input", 5}}, "input");
  expect_400({{"input", json::object()}}, "input");
  expect_400({{"input", json::array()}}, "input");
  expect_400({{"input", json::array({""})}}, "input[0]");
  expect_400({{"input", ""}}, "input");
  expect_400({{"input", json::array({"ok", json::array()})}}, "input[1]");
  expect_400({{"input", json::array({json::array({"a"})})}}, "input[0][0]");
  expect_400({{"input", json::array({1, "a"})}}, "input[1]");
  expect_400({{"input", json::array({json::array({1, 2, 5000})})}}, "input[0][2]");
  expect_400({{"input", json::array({json::array({1, -1})})}}, "input[0][1]");
  expect_400({{"input", json::array({"ok", true})}}, "input[1]");
  expect_400({{"input", json::array({"x", 1})}}, "input[1]");
  expect_400({{"input", std::vector<std::string>(10000, "a")}}, "input");
  expect_400({{"input", json::array({"ok", std::vector<int32_t>(1100, 5)})}}, "input[1]");  // > 1024 tokens (-c)
  expect_400({{"input", "x"}, {"dimensions", 0}}, "dimensions");
  expect_400({{"input", "x"}, {"dimensions", 257}}, "dimensions");
  expect_400({{"input", "x"}, {"dimensions", "8"}}, "dimensions");
  expect_400({{"input", "x"}, {"encoding_format", "hex"}}, "encoding_format");
  expect_400({{"input", "x"}, {"embd_normalize", 99}}, "embd_normalize");
  expect_400({{"input", "x"}, {"stream", true}}, "stream");
  expect_400({{"input", "x"}, {"model", 3}}, "model");
  expect_400({{"content", "x"}, {"input", "y"}}, "input", "/embedding");
  expect_400(json::object(), "content", "/embedding");
  HttpResponse r = test::http(proc_->port, "POST", "/v1/embeddings", "{\"input\": [");
  EXPECT_EQ(r.status, 400);
  // The server is still serving.
  EXPECT_EQ(post("/v1/embeddings", {{"input", "still here"}}).status, 200);
}

TEST(ServeEmbeddingsModes, PoolingNoneOffAndAnEmbeddingModel) {
  const std::string model = test::make_embed_model("srv-modes.gguf", {});
  {
    test::ServeProcess p;
    ASSERT_TRUE(p.start({"-m", model, "-t", "1", "--embedding"})) << p.log();  // the file has no pooling: none
    HttpResponse r = test::http(p.port, "POST", "/v1/embeddings", json{{"input", "hello there"}}.dump());
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.j()["error"]["code"], "pooling_none");
    r = test::http(p.port, "POST", "/embedding", json{{"content", "hello there"}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    auto m = test::load_cpu_model(model);
    const std::vector<int32_t> ids = embedding_tokens(m->tokenizer(), "hello there");
    const auto h = test::reference_hidden(*m, ids);
    const json rows = r.j()[0]["embedding"];
    ASSERT_EQ(rows.size(), ids.size());  // one vector per token, as the model computed it (not normalized)
    for (size_t t = 0; t < ids.size(); ++t) expect_close(floats(rows[t]), h[t], 1e-6);
    EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
  }
  {
    test::ServeProcess p;
    ASSERT_TRUE(p.start({"-m", model, "-t", "1"})) << p.log();
    HttpResponse r = test::http(p.port, "POST", "/v1/embeddings", json{{"input", "x"}}.dump());
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.j()["error"]["code"], "embeddings_disabled");
    EXPECT_NE(r.j()["error"]["message"].get<std::string>().find("--embedding"), std::string::npos);
    r = test::http(p.port, "POST", "/v1/rerank", json{{"query", "q"}, {"documents", {"d"}}}.dump());
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.j()["error"]["code"], "rerank_disabled");
    EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
  }
  {
    test::EmbedModelSpec spec;
    spec.pooling = 3;  // last: an embedding model by its file
    const std::string emb = test::make_embed_model("srv-last.gguf", spec);
    test::ServeProcess p;
    ASSERT_TRUE(p.start({"-m", emb, "-t", "1"})) << p.log();
    EXPECT_NE(p.log().find("embedding model (pooling last; no generation)"), std::string::npos) << p.log();
    HttpResponse r = test::http(p.port, "POST", "/v1/embeddings", json{{"input", "hello there"}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    auto m = test::load_cpu_model(emb);
    const auto h = test::reference_hidden(*m, embedding_tokens(m->tokenizer(), "hello there"));
    expect_close(floats(r.j()["data"][0]["embedding"]), test::l2_normalized(h.back()), 1e-6);
    for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
      const json body = {{"prompt", "hi"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
      json b = body;
      b.erase(std::string(path) == "/v1/completions" ? "messages" : "prompt");
      r = test::http(p.port, "POST", path, b.dump());
      EXPECT_EQ(r.status, 400) << path << " " << r.body;
      EXPECT_NE(r.body.find("embedding model"), std::string::npos) << r.body;
    }
    EXPECT_EQ(test::http(p.port, "GET", "/v1/models").j()["data"][0]["meta"]["generation"], false);
    EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
  }
}

// softmax over two logits: the probability of the first.
double p_first(double a, double b) { return 1.0 / (1.0 + std::exp(b - a)); }

TEST(ServeRerank, JinaAndTeiShapesAgainstTheHead) {
  test::EmbedModelSpec spec;
  spec.src = "models/fixture-qwen3-q4_0.gguf";
  spec.pooling = 4;
  spec.cls_out = 2;
  spec.rerank_template = "Query: {query}\nDocument: {document}\nRelevant:";
  const std::string model = test::make_embed_model("srv-rank.gguf", spec);
  test::ServeProcess p;
  ASSERT_TRUE(p.start({"-m", model, "-t", "2", "--parallel", "4"})) << p.log();
  const std::vector<std::string> docs = {"a cat sat on the mat", "stock prices fell", "the cat purred", "rain"};
  const std::string query = "cats";
  HttpResponse r = test::http(p.port, "POST", "/v1/rerank", json{{"query", query}, {"documents", docs}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json res = r.j()["results"];
  ASSERT_EQ(res.size(), docs.size());
  // The reference: the head over the last token's hidden state of each pair's prompt, softmax, P(first output).
  auto m = test::load_cpu_model(model);
  const int64_t d = m->hparams().n_embd;
  const std::vector<float> w = test::cls_rows(d, 2, false);
  std::vector<double> want;
  int64_t n_tok = 0;
  for (const std::string& doc : docs) {
    const std::vector<int32_t> ids = rerank_prompt(m->tokenizer(), spec.rerank_template, query, doc);
    n_tok += static_cast<int64_t>(ids.size());
    const auto h = test::reference_hidden(*m, ids);
    double z[2] = {0, 0};
    for (int c = 0; c < 2; ++c)
      for (int64_t i = 0; i < d; ++i) z[c] += double(w[static_cast<size_t>(c * d + i)]) * h.back()[static_cast<size_t>(i)];
    want.push_back(p_first(z[0], z[1]));
  }
  std::vector<bool> seen(docs.size(), false);
  for (size_t k = 0; k < res.size(); ++k) {
    const size_t i = res[k]["index"];
    ASSERT_LT(i, docs.size());
    EXPECT_FALSE(seen[i]);
    seen[i] = true;
    EXPECT_NEAR(res[k]["relevance_score"].get<double>(), want[i], 1e-5) << "document " << i;
    if (k > 0) EXPECT_GE(res[k - 1]["relevance_score"].get<double>(), res[k]["relevance_score"].get<double>());
    EXPECT_FALSE(res[k].contains("document"));
  }
  EXPECT_EQ(r.j()["usage"]["prompt_tokens"], n_tok);
  EXPECT_EQ(r.j()["object"], "list");
  // top_n and return_documents.
  r = test::http(p.port, "POST", "/rerank",
                 json{{"query", query}, {"documents", docs}, {"top_n", 2}, {"return_documents", true}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j()["results"].size(), 2u);
  EXPECT_EQ(r.j()["results"][0]["index"], res[0]["index"]);
  EXPECT_EQ(r.j()["results"][0]["document"]["text"], docs[res[0]["index"].get<size_t>()]);
  // TEI's shape: "texts", a bare list with "score" (and "text" with return_text).
  r = test::http(p.port, "POST", "/reranking", json{{"query", query}, {"texts", docs}, {"return_text", true}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_TRUE(r.j().is_array());
  EXPECT_EQ(r.j()[0]["index"], res[0]["index"]);
  EXPECT_NEAR(r.j()[0]["score"].get<double>(), res[0]["relevance_score"].get<double>(), 1e-7);
  EXPECT_EQ(r.j()[0]["text"], docs[res[0]["index"].get<size_t>()]);
  // Refusals name the field.
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"documents", docs}}, "query"},
      {{{"query", 1}, {"documents", docs}}, "query"},
      {{{"query", "q"}}, "documents"},
      {{{"query", "q"}, {"documents", json::array()}}, "documents"},
      {{{"query", "q"}, {"documents", "d"}}, "documents"},
      {{{"query", "q"}, {"documents", json::array({"d", 2})}}, "documents[1]"},
      {{{"query", "q"}, {"documents", docs}, {"top_n", -1}}, "top_n"},
      {{{"query", "q"}, {"documents", docs}, {"return_documents", "yes"}}, "return_documents"},
      {{{"query", "q"}, {"documents", docs}, {"rank_fields", 1}}, "rank_fields"},
  };
  for (const auto& [b, param] : bad) {
    r = test::http(p.port, "POST", "/v1/rerank", b.dump());
    EXPECT_EQ(r.status, 400) << b.dump() << " -> " << r.body;
    EXPECT_EQ(r.j()["error"]["param"], param) << b.dump() << " -> " << r.body;
  }
  EXPECT_EQ(p.stop(SIGTERM), 0) << p.log();
}

}  // namespace
}  // namespace kiln
