// Embeddings and reranking (runtime/embedding.h):
//   POST /v1/embeddings            OpenAI's shape: input (a string, a list of strings, a token-id list or a list of
//                                  them), encoding_format float|base64, dimensions (truncate, then renormalize),
//                                  usage; plus llama-server's embd_normalize
//   POST /embedding, /embeddings   llama-server's shape: content (or input), embd_normalize; answers
//                                  [{"index", "embedding": [[...], ...]}] (one vector per token with pooling none,
//                                  which is not normalized, as llama-server)
//   POST /v1/rerank, /rerank, /reranking, /v1/reranking
//                                  Jina's shape as llama-server serves it: query, documents, top_n,
//                                  return_documents; results {index, relevance_score[, document]} by decreasing
//                                  score; TEI's when the body has "texts" (return_text; a bare list of {index,
//                                  score[, text]})
// Every input is one request to the engine loop (GenRequest::embed); they run side by side, --parallel per step.
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "server/fields.h"
#include "server/routes.h"

namespace kiln::server {

namespace {

using httplib::Request;
using httplib::Response;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxInputs = 2048;  // OpenAI's limit of inputs per request

struct Call {
  RouteHost& host;
  const Request& req;
  Response& res;
  uint64_t id;
  Clock::time_point t0 = Clock::now();
  RequestTimings t;  // prompt tokens of every input, for the log line
  Call(RouteHost& h, const Request& q, Response& r) : host(h), req(q), res(r), id(h.next_request_id()) {
    ++host.in_flight_count();
  }
  ~Call() { --host.in_flight_count(); }
  double ms() const { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
  void answer(int status, const json& body) {
    res.status = status;
    res.set_content(dump(body), "application/json");
    host.log(id, req, status, status == 200 ? &t : nullptr, ms(), status == 200 ? "stop" : nullptr);
  }
  void error(const ApiError& e) { answer(e.status, error_body(e)); }
};

ApiError refused(const std::string& code, const std::string& msg) {
  ApiError e = field_error("", msg, code);
  return e;
}

// Embeddings served at all, and (oai) pooled into one vector per input.
std::optional<ApiError> embeddings_on(const Scheduler& S, bool oai) {
  const EmbeddingSetup& es = S.embedding();
  if (!es.on)
    return refused("embeddings_disabled", "this server does not compute embeddings: start it with --embedding (a "
                   "model whose file declares a pooling type has them on by default)");
  if (oai && es.pooling == Pooling::kNone)
    return refused("pooling_none", "the server pools with 'none' (one vector per token), which the OpenAI shape "
                   "cannot carry: start it with --pooling mean|cls|last, or POST /embedding for per-token vectors");
  return std::nullopt;
}

// One input's tokens: a string (tokenized as an embedding input) or a list of token ids (as given).
std::optional<ApiError> one_input(const ojson& v, const std::string& p, const Scheduler& S,
                                  std::vector<int32_t>* out) {
  const Tokenizer& tok = S.tokenizer();
  if (v.is_string()) {
    const std::string text = v.get<std::string>();
    if (text.empty()) return field_error(p, "'" + p + "' is empty: an input needs at least one token");
    *out = embedding_tokens(tok, text);
  } else if (v.is_array()) {
    if (v.empty()) return field_error(p, "'" + p + "' is an empty token list");
    for (size_t j = 0; j < v.size(); ++j) {
      const std::string pj = index_path(p, j);
      if (!v[j].is_number_integer()) return type_error(pj, "a token id (an integer)", v[j]);
      const int64_t id = v[j].get<int64_t>();
      if (id < 0 || id >= tok.n_vocab())
        return field_error(pj, "'" + pj + "': token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                   std::to_string(tok.n_vocab()) + ")");
      out->push_back(static_cast<int32_t>(id));
    }
  } else {
    return type_error(p, "a string or a list of token ids", v);
  }
  if (out->empty()) return field_error(p, "'" + p + "' has no tokens");
  if (static_cast<int64_t>(out->size()) > S.max_seq_ctx())
    return field_error(p, "'" + p + "' is " + std::to_string(out->size()) + " tokens, more than the " +
                              std::to_string(S.max_seq_ctx()) + " tokens a sequence holds (-c)",
                       "context_length_exceeded");
  return std::nullopt;
}

// `input` of either shape: a string, a token-id list, or a list of strings and/or token-id lists.
std::optional<ApiError> inputs(const ojson& v, const std::string& p, const Scheduler& S,
                               std::vector<std::vector<int32_t>>* out) {
  const bool one = v.is_string() || (v.is_array() && !v.empty() && v[0].is_number());
  if (one) {
    out->emplace_back();
    return one_input(v, p, S, &out->back());
  }
  if (!v.is_array()) return type_error(p, "a string, a list of strings or a list of token-id lists", v);
  if (v.empty()) return field_error(p, "'" + p + "' is an empty list: give at least one input");
  if (v.size() > kMaxInputs)
    return field_error(p, "'" + p + "' has " + std::to_string(v.size()) + " inputs: at most " +
                              std::to_string(kMaxInputs) + " per request");
  for (size_t i = 0; i < v.size(); ++i) {
    out->emplace_back();
    if (v[i].is_number()) return type_error(index_path(p, i), "a string or a token-id list (the list mixes them)", v[i]);
    if (auto e = one_input(v[i], index_path(p, i), S, &out->back())) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> opt_int(const ojson& b, const char* k, int64_t lo, int64_t hi, int64_t* out) {
  auto it = b.find(k);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return type_error(k, "an integer", *it);
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    return field_error(k, std::string("'") + k + "' is " + std::to_string(v) + ": must be in [" + std::to_string(lo) +
                              ", " + std::to_string(hi) + "]");
  *out = v;
  return std::nullopt;
}

// `model` checked as the completions endpoints check it; *name = the name to echo.
std::optional<ApiError> model_field(const ojson& b, const ParseContext& ctx, std::string* name) {
  *name = ctx.model_id;
  std::string m;
  if (auto e = opt_string(b, "model", "model", &m)) return e;
  if (ctx.strict_model && !m.empty() && m != ctx.model_id) {
    ApiError e = field_error("model", "The model '" + m + "' does not exist; this server serves '" + ctx.model_id +
                                          "' (GET /v1/models)", "model_not_found");
    e.status = 404;
    return e;
  }
  if (!m.empty()) *name = m;
  return std::nullopt;
}

// Runs every prompt as an embedding request; out[i] = the pooled result of prompt i. On a refusal or a failure the
// rest are cancelled.
std::optional<ApiError> run(Scheduler& S, const ParseContext& ctx, std::vector<std::vector<int32_t>> prompts,
                            std::vector<std::vector<float>>* out, RequestTimings* t) {
  std::vector<std::shared_ptr<RequestHandle>> hs;
  struct CancelRest {
    std::vector<std::shared_ptr<RequestHandle>>& hs;
    ~CancelRest() {
      for (auto& h : hs)
        if (!h->finished()) h->cancel();
    }
  } guard{hs};
  for (auto& p : prompts) {
    t->n_prompt += static_cast<int64_t>(p.size());
    GenRequest g;
    g.embed = true;
    g.prompt = std::move(p);
    g.timeout_s = ctx.timeout_s;
    auto h = S.submit(std::move(g));
    if (!h) return submit_error(h.status());
    hs.push_back(*h);
  }
  for (size_t i = 0; i < hs.size(); ++i) {
    hs[i]->wait_all();
    std::vector<float> v = hs[i]->take_embedding();
    if (v.empty()) {
      ApiError e;
      e.status = 500;
      e.type = "server_error";
      const FinishReason r = hs[i]->finish_reason();
      e.message = r == FinishReason::kError       ? hs[i]->error().to_string()
                  : r == FinishReason::kCancelled ? "the request was cancelled (the server is shutting down)"
                                                  : "the request ran out of time (--timeout)";
      return e;
    }
    out->push_back(std::move(v));
  }
  return std::nullopt;
}

std::string base64(const void* data, size_t n) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string s;
  s.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t v = static_cast<uint32_t>(p[i]) << 16 | (i + 1 < n ? static_cast<uint32_t>(p[i + 1]) << 8 : 0) |
                       (i + 2 < n ? p[i + 2] : 0);
    s += k[v >> 18 & 63];
    s += k[v >> 12 & 63];
    s += i + 1 < n ? k[v >> 6 & 63] : '=';
    s += i + 2 < n ? k[v & 63] : '=';
  }
  return s;
}

// The body as an ordered object (the gate parsed it already; this keeps the error paths in one place).
std::optional<ApiError> body_of(RouteHost& host, const Request& req, ojson* b) {
  json body;
  if (auto e = host.gate(req, &body)) return e;
  try {
    *b = ojson::parse(req.body);
  } catch (const std::exception& x) {
    return field_error("", std::string("bad request: ") + x.what());
  }
  return std::nullopt;
}

void embeddings_oai(RouteHost& host, const Request& req, Response& res) {
  Call c(host, req, res);
  ojson b;
  if (auto e = body_of(host, req, &b)) return c.error(*e);
  Scheduler& S = *host.scheduler();
  if (auto e = embeddings_on(S, true)) return c.error(*e);
  if (auto e = check_fields(b, {"input", "model", "encoding_format", "dimensions", "user", "embd_normalize"}, ""))
    return c.error(*e);
  if (!b.contains("input")) return c.error(missing_field("input"));
  std::string model, fmt = "float", user;
  if (auto e = model_field(b, host.parse_context(), &model)) return c.error(*e);
  if (auto e = opt_string(b, "encoding_format", "encoding_format", &fmt)) return c.error(*e);
  if (fmt != "float" && fmt != "base64")
    return c.error(field_error("encoding_format", "'encoding_format' must be 'float' or 'base64', not '" + fmt + "'"));
  if (auto e = opt_string(b, "user", "user", &user)) return c.error(*e);  // an end-user id: no effect on the output
  const EmbeddingSetup& es = S.embedding();
  int64_t dims = es.n_out, norm = 2;
  if (b.contains("dimensions") && b["dimensions"].is_number_integer() && b["dimensions"].get<int64_t>() > es.n_out)
    return c.error(field_error("dimensions", "'dimensions' is " + std::to_string(b["dimensions"].get<int64_t>()) +
                                                 ": this model's embeddings have " + std::to_string(es.n_out)));
  if (auto e = opt_int(b, "dimensions", 1, es.n_out, &dims)) return c.error(*e);
  if (auto e = opt_int(b, "embd_normalize", -1, 64, &norm)) return c.error(*e);
  std::vector<std::vector<int32_t>> prompts;
  if (auto e = inputs(b["input"], "input", S, &prompts)) return c.error(*e);
  std::vector<std::vector<float>> vs;
  if (auto e = run(S, host.parse_context(), std::move(prompts), &vs, &c.t)) return c.error(*e);
  json data = json::array();
  for (size_t i = 0; i < vs.size(); ++i) {
    std::vector<float>& v = vs[i];
    v.resize(static_cast<size_t>(dims));  // Matryoshka truncation, then the norm of what is left
    if (es.pooling != Pooling::kRank) normalize(v, static_cast<int32_t>(norm));
    json d = {{"object", "embedding"}, {"index", i}};
    if (fmt == "base64") d["embedding"] = base64(v.data(), v.size() * sizeof(float));
    else d["embedding"] = v;
    data.push_back(std::move(d));
  }
  c.answer(200, json{{"object", "list"},
                     {"data", std::move(data)},
                     {"model", model},
                     {"usage", {{"prompt_tokens", c.t.n_prompt}, {"total_tokens", c.t.n_prompt}}}});
}

void embeddings_llama(RouteHost& host, const Request& req, Response& res) {
  Call c(host, req, res);
  ojson b;
  if (auto e = body_of(host, req, &b)) return c.error(*e);
  Scheduler& S = *host.scheduler();
  if (auto e = embeddings_on(S, false)) return c.error(*e);
  if (auto e = check_fields(b, {"content", "input", "model", "embd_normalize"}, "")) return c.error(*e);
  const char* field = b.contains("content") ? "content" : "input";
  if (b.contains("content") && b.contains("input"))
    return c.error(field_error("input", "give 'content' or 'input', not both"));
  if (!b.contains(field)) return c.error(missing_field("content"));
  std::string model;
  if (auto e = model_field(b, host.parse_context(), &model)) return c.error(*e);
  int64_t norm = 2;
  if (auto e = opt_int(b, "embd_normalize", -1, 64, &norm)) return c.error(*e);
  std::vector<std::vector<int32_t>> prompts;
  if (auto e = inputs(b[field], field, S, &prompts)) return c.error(*e);
  std::vector<std::vector<float>> vs;
  if (auto e = run(S, host.parse_context(), std::move(prompts), &vs, &c.t)) return c.error(*e);
  const EmbeddingSetup& es = S.embedding();
  json out = json::array();
  for (size_t i = 0; i < vs.size(); ++i) {
    json rows = json::array();
    const size_t d = static_cast<size_t>(es.pooling == Pooling::kNone ? es.n_embd : es.n_out);
    for (size_t k = 0; k + d <= vs[i].size(); k += d) {
      std::vector<float> r(vs[i].begin() + static_cast<std::ptrdiff_t>(k),
                           vs[i].begin() + static_cast<std::ptrdiff_t>(k + d));
      if (es.pooling != Pooling::kNone && es.pooling != Pooling::kRank) normalize(r, static_cast<int32_t>(norm));
      rows.push_back(std::move(r));
    }
    out.push_back({{"index", i}, {"embedding", std::move(rows)}});
  }
  c.answer(200, out);
}

void rerank(RouteHost& host, const Request& req, Response& res) {
  Call c(host, req, res);
  ojson b;
  if (auto e = body_of(host, req, &b)) return c.error(*e);
  Scheduler& S = *host.scheduler();
  const EmbeddingSetup& es = S.embedding();
  if (!es.on || es.pooling != Pooling::kRank)
    return c.error(refused("rerank_disabled", "this server does not rerank: start it with a reranker model (its file "
                           "declares pooling_type rank, or give --pooling rank; --reranking) that has a "
                           "classification head (cls.output.weight, or a qwen3 vocabulary with 'yes' and 'no')"));
  const bool tei = b.contains("texts");
  const char* docs_field = tei ? "texts" : "documents";
  if (tei) {
    if (auto e = check_fields(b, {"query", "texts", "return_text", "model", "top_n"}, "")) return c.error(*e);
  } else if (auto e = check_fields(b, {"query", "documents", "top_n", "return_documents", "model"}, "")) {
    return c.error(*e);
  }
  if (!b.contains("query")) return c.error(missing_field("query"));
  if (!b["query"].is_string()) return c.error(type_error("query", "a string", b["query"]));
  if (!b.contains(docs_field)) return c.error(missing_field(docs_field));
  const ojson& docs = b[docs_field];
  if (!docs.is_array()) return c.error(type_error(docs_field, "a list of strings", docs));
  if (docs.empty()) return c.error(field_error(docs_field, std::string("'") + docs_field + "' is an empty list"));
  if (docs.size() > kMaxInputs)
    return c.error(field_error(docs_field, std::string("'") + docs_field + "' has " + std::to_string(docs.size()) +
                                               " documents: at most " + std::to_string(kMaxInputs) + " per request"));
  std::string model;
  if (auto e = model_field(b, host.parse_context(), &model)) return c.error(*e);
  int64_t top_n = static_cast<int64_t>(docs.size());
  if (auto e = opt_int(b, "top_n", 0, INT32_MAX, &top_n)) return c.error(*e);
  const char* ret_field = tei ? "return_text" : "return_documents";
  bool ret = false;
  if (b.contains(ret_field) && !b[ret_field].is_null()) {
    if (!b[ret_field].is_boolean()) return c.error(type_error(ret_field, "a boolean", b[ret_field]));
    ret = b[ret_field].get<bool>();
  }
  const std::string query = b["query"].get<std::string>();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string p = index_path(docs_field, i);
    if (!docs[i].is_string()) return c.error(type_error(p, "a string", docs[i]));
    prompts.push_back(rerank_prompt(S.tokenizer(), es.rerank_template, query, docs[i].get<std::string>()));
    if (prompts.back().empty()) return c.error(field_error(p, "'" + p + "': the pair has no tokens"));
    if (static_cast<int64_t>(prompts.back().size()) > S.max_seq_ctx())
      return c.error(field_error(p, "'" + p + "' with the query is " + std::to_string(prompts.back().size()) +
                                        " tokens, more than the " + std::to_string(S.max_seq_ctx()) +
                                        " tokens a sequence holds (-c)", "context_length_exceeded"));
  }
  std::vector<std::vector<float>> vs;
  if (auto e = run(S, host.parse_context(), std::move(prompts), &vs, &c.t)) return c.error(*e);
  std::vector<size_t> order(vs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return vs[x][0] > vs[y][0]; });
  order.resize(std::min<size_t>(order.size(), static_cast<size_t>(top_n)));
  json results = json::array();
  for (size_t i : order) {
    json r = {{"index", i}, {tei ? "score" : "relevance_score", vs[i][0]}};
    if (ret && tei) r["text"] = docs[i].get<std::string>();
    if (ret && !tei) r["document"] = {{"text", docs[i].get<std::string>()}};
    results.push_back(std::move(r));
  }
  if (tei) return c.answer(200, results);
  c.answer(200, json{{"model", model},
                     {"object", "list"},
                     {"usage", {{"prompt_tokens", c.t.n_prompt}, {"total_tokens", c.t.n_prompt}}},
                     {"results", std::move(results)}});
}

}  // namespace

void add_embedding_routes(httplib::Server& http, RouteHost& host) {
  http.Post("/v1/embeddings", [&host](const Request& q, Response& r) { embeddings_oai(host, q, r); });
  for (const char* p : {"/embedding", "/embeddings"})
    http.Post(p, [&host](const Request& q, Response& r) { embeddings_llama(host, q, r); });
  for (const char* p : {"/v1/rerank", "/rerank", "/reranking", "/v1/reranking"})
    http.Post(p, [&host](const Request& q, Response& r) { rerank(host, q, r); });
}

}  // namespace kiln::server
