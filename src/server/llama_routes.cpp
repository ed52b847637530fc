// llama-server's own endpoints: GET /props (model, context, chat template, modalities, build), POST /apply-template
// (a chat request's rendered prompt), GET /slots (behind --slots), and its native completions POST /completion and
// POST /infill (fill-in-the-middle, for vocabularies with FIM tokens), answered in its native shape.
#include <httplib.h>

#include <cmath>

#include "server/fields.h"
#include "server/generation.h"

namespace kiln::server {

namespace {

using httplib::Request;
using httplib::Response;

void answer(RouteHost& host, const Request& req, Response& res, int status, const json& body, uint64_t id) {
  res.status = status;
  res.set_content(dump(body), "application/json");
  host.log(id, req, status, nullptr, 0, nullptr);
}

void props(RouteHost& host, const Request& req, Response& res) {
  const uint64_t id = host.next_request_id();
  if (auto e = host.gate(req, nullptr)) return answer(host, req, res, e->status, error_body(*e), id);
  const Scheduler& S = *host.scheduler();
  const ServerConfig& cfg = host.config();
  const Tokenizer& tok = S.tokenizer();
  const SamplerParams& sp = cfg.sampling;
  const ChatPrompt* chat = host.parse_context().chat;
  json params = {{"temperature", sp.temp},   {"top_k", sp.top_k},       {"top_p", sp.top_p},
                 {"min_p", sp.min_p},        {"repeat_penalty", sp.repeat_penalty},
                 {"repeat_last_n", sp.penalty_last_n}, {"presence_penalty", sp.presence_penalty},
                 {"frequency_penalty", sp.frequency_penalty}, {"typical_p", sp.typical_p},
                 {"xtc_probability", sp.xtc_probability}, {"xtc_threshold", sp.xtc_threshold},
                 {"dry_multiplier", sp.dry_multiplier}, {"dry_base", sp.dry_base},
                 {"dry_allowed_length", sp.dry_allowed_length}, {"dry_penalty_last_n", sp.dry_penalty_last_n},
                 {"dry_sequence_breakers", sp.dry_sequence_breakers}, {"mirostat", sp.mirostat},
                 {"mirostat_tau", sp.mirostat_tau}, {"mirostat_eta", sp.mirostat_eta},
                 {"n_predict", cfg.default_max_new_tokens}};
  json bias = json::array();
  for (const LogitBias& b : sp.logit_bias)  // llama-server's shape; a banned token's bias is false
    bias.push_back({{"token", b.token}, {"bias", std::isinf(b.bias) ? json(false) : json(b.bias)}});
  params["logit_bias"] = bias;
  if (sp.seed != kRandomSeed) params["seed"] = sp.seed;
  const SpecConfig& spec = S.config().spec;  // llama-server's keys; n_max 0 without speculative decoding
  params["speculative.type"] = spec_type_name(spec.type);
  params["speculative.n_max"] = spec.drafts_per_step();
  params["speculative.n_min"] = spec.draft_min;
  params["speculative.p_min"] = spec.p_min;
  const Tokenizer::FimTokens fim = tok.fim();
  json p = {{"default_generation_settings", {{"n_ctx", S.max_seq_ctx()}, {"params", params}}},
            {"total_slots", S.config().max_seqs},
            {"model_alias", cfg.model_id},
            {"model_path", cfg.chat.model_name},
            {"model_description", S.model_description()},
            {"n_ctx", S.max_seq_ctx()},
            {"n_ctx_train", S.n_ctx_train()},
            {"n_vocab", S.n_vocab()},
            {"modalities", {{"vision", false}, {"audio", false}}},
            {"chat_template", chat ? chat->source() : std::string()},
            {"chat_template_name", chat ? chat->describe() : std::string()},
            {"bos_token", tok.bos() >= 0 ? tok.token_text(tok.bos()) : std::string()},
            {"eos_token", tok.eos() >= 0 ? tok.token_text(tok.eos()) : std::string()},
            {"infill", fim.pre >= 0 && fim.suf >= 0 && fim.mid >= 0},
            {"endpoint_slots", cfg.slots},
            {"endpoint_props", false},
            {"endpoint_metrics", true},
            {"webui", cfg.webui},
            {"build_info", "kiln " + cfg.build}};
  answer(host, req, res, 200, p, id);
}

void apply_template(RouteHost& host, const Request& req, Response& res) {
  const uint64_t id = host.next_request_id();
  json body;
  if (auto e = host.gate(req, &body)) return answer(host, req, res, e->status, error_body(*e), id);
  ParsedRequest pr;
  try {
    const ojson ordered = ojson::parse(req.body);
    if (auto e = parse_chat(body, host.parse_context(), &pr, &ordered))
      return answer(host, req, res, e->status, error_body(*e), id);
  } catch (const std::exception& x) {
    return answer(host, req, res, 400, error_body(field_error("", std::string("bad request: ") + x.what())), id);
  }
  answer(host, req, res, 200, json{{"prompt", pr.prompt_text}}, id);
}

void slots(RouteHost& host, const Request& req, Response& res) {
  const uint64_t id = host.next_request_id();
  if (!host.config().slots) {
    ApiError e;
    e.status = 501;
    e.type = "not_supported_error";
    e.code = "slots_disabled";
    e.message = "this server does not serve /slots: start it with --slots";
    return answer(host, req, res, 501, error_body(e), id);
  }
  if (auto e = host.gate(req, nullptr)) return answer(host, req, res, e->status, error_body(*e), id);
  const Scheduler& S = *host.scheduler();
  std::vector<SlotState> st = S.stats().slots;
  if (st.empty())  // no step ran yet: every slot idle
    for (int32_t i = 0; i < S.config().max_seqs; ++i) st.push_back(SlotState{i});
  json out = json::array();
  for (const SlotState& s : st)
    out.push_back({{"id", s.id},
                   {"is_processing", s.busy},
                   {"id_task", s.busy ? json(s.request) : json(-1)},
                   {"n_ctx", s.busy ? s.n_ctx : S.max_seq_ctx()},
                   {"n_prompt_tokens", s.n_prompt},
                   {"n_past", s.n_cached},
                   {"n_decoded", s.n_gen}});
  answer(host, req, res, 200, out, id);
}

// ---- /infill ----

// The prompt, as llama-server lays it out (repo-level FIM): [rep "myproject\n"] ([sep filename "\n"] | "\n\n--- snippet
// ---\n\n") text ... [sep "filename\n"] [BOS] pre prefix prompt suf suffix mid.
std::optional<ApiError> infill_prompt(const ojson& b, const Tokenizer& tok, std::vector<int32_t>* out) {
  const Tokenizer::FimTokens fim = tok.fim();
  if (fim.pre < 0 || fim.suf < 0 || fim.mid < 0) {
    ApiError e = field_error("", "this model's vocabulary has no fill-in-the-middle tokens (prefix, suffix, middle): "
                                 "/infill needs a code model with FIM tokens", "fim_not_supported");
    return e;
  }
  std::string prefix, suffix, prompt;
  for (auto [k, s] : {std::pair<const char*, std::string*>{"input_prefix", &prefix}, {"input_suffix", &suffix}}) {
    if (!b.contains(k)) return missing_field(k);
    if (auto e = opt_string(b, k, k, s)) return e;
  }
  if (auto e = opt_string(b, "prompt", "prompt", &prompt)) return e;
  auto enc = [&](const std::string& s) { return tok.encode(s, false, false); };
  std::vector<int32_t> ids;
  if (fim.rep >= 0) {
    ids.push_back(fim.rep);
    for (int32_t t : enc("myproject\n")) ids.push_back(t);
  }
  if (b.contains("input_extra") && !b["input_extra"].is_null()) {
    const ojson& x = b["input_extra"];
    if (!x.is_array()) return type_error("input_extra", "an array of {\"filename\", \"text\"}", x);
    for (size_t i = 0; i < x.size(); ++i) {
      const std::string p = "input_extra[" + std::to_string(i) + "]";
      if (!x[i].is_object()) return type_error(p, "an object", x[i]);
      if (auto e = check_fields(x[i], {"filename", "text"}, p)) return e;
      std::string text, file = "tmp";
      if (!x[i].contains("text")) return missing_field(p + ".text");
      if (auto e = opt_string(x[i], "text", p + ".text", &text)) return e;
      if (auto e = opt_string(x[i], "filename", p + ".filename", &file)) return e;
      std::vector<int32_t> head = fim.sep >= 0 ? enc(file + "\n") : enc("\n\n--- snippet ---\n\n");
      if (fim.sep >= 0) ids.push_back(fim.sep);
      for (int32_t t : head) ids.push_back(t);
      for (int32_t t : enc(text)) ids.push_back(t);
    }
  }
  if (fim.sep >= 0) {
    ids.push_back(fim.sep);
    for (int32_t t : enc("filename\n")) ids.push_back(t);
  }
  if (tok.add_bos() && tok.bos() >= 0) ids.push_back(tok.bos());
  ids.push_back(fim.pre);
  for (int32_t t : enc(prefix + prompt)) ids.push_back(t);
  ids.push_back(fim.suf);
  for (int32_t t : enc(suffix)) ids.push_back(t);
  ids.push_back(fim.mid);
  *out = std::move(ids);
  return std::nullopt;
}

const char* stop_type(const ChatGeneration& g) {
  switch (g.stop()) {
    case StopReason::kEog: return "eos";
    case StopReason::kStopString: return "word";
    default: return "limit";
  }
}

json native_end(const ChatGeneration& g, const std::string& content) {
  const RequestTimings& t = g.timings();
  return json{{"content", content},         {"stop", true},
              {"model", g.request().model}, {"stop_type", stop_type(g)},
              {"stopping_word", g.stop_string()}, {"tokens_predicted", t.n_gen},
              {"tokens_evaluated", g.prompt_tokens()}, {"tokens_cached", t.n_cached}};
}

// llama-server's native stream: data: {"content": piece, "stop": false} per piece, then the final object.
class NativeWriter : public StreamWriter {
 public:
  std::string begin(const ChatGeneration&) override { return ""; }
  std::string delta(const ReplyStream::Delta& d) override {
    return sse("", {{"content", d.content}, {"stop", false}});
  }
  std::string end(const ChatGeneration& g, const ReplyStream::Delta&) override { return sse("", native_end(g, "")); }
  std::string error(const ApiError& e) override { return sse("", error_body(e)); }
};

// llama-server's native completion endpoints: POST /completion (a prompt: text or token ids) and POST /infill (the
// FIM layout of input_prefix, input_suffix, input_extra and prompt). Both are a completions request underneath
// (n_predict is max_tokens; one prompt, one choice), answered as {"content", "stop", ...} or its stream.
void native_completion(RouteHost& host, const Request& req, Response& res, bool fim) {
  auto sr = std::make_shared<ServedRequest>(host, req);
  Dialect d;
  d.error_body = [](const ApiError& e) { return dump(error_body(e)); };
  json body;
  if (auto e = host.gate(req, &body)) return send_dialect_error(d, res, *e, sr.get());
  ParsedRequest pr;
  try {
    const ojson b = ojson::parse(req.body);
    ojson rest = b;
    if (fim)
      for (const char* k : {"input_prefix", "input_suffix", "input_extra"}) rest.erase(k);
    if (auto e = check_fields(rest, {"prompt", "model", "stream", "max_tokens", "n_predict", "temperature", "top_k",
                                     "top_p", "min_p", "seed", "stop", "ignore_eos", "repeat_penalty", "repeat_last_n",
                                     "presence_penalty", "frequency_penalty", "typical_p", "xtc_probability",
                                     "xtc_threshold", "dry_multiplier", "dry_base", "dry_allowed_length",
                                     "dry_penalty_last_n", "dry_sequence_breakers", "logit_bias", "mirostat",
                                     "mirostat_tau", "mirostat_eta"}, ""))
      return send_dialect_error(d, res, *e, sr.get());
    json c = body;
    if (fim) {
      std::vector<int32_t> ids;
      if (auto e = infill_prompt(b, host.scheduler()->tokenizer(), &ids))
        return send_dialect_error(d, res, *e, sr.get());
      for (const char* k : {"input_prefix", "input_suffix", "input_extra"}) c.erase(k);
      c["prompt"] = ids;
    }
    c.erase("n_predict");
    if (body.contains("n_predict") && !body.contains("max_tokens") && body["n_predict"] != -1)  // -1: no limit
      c["max_tokens"] = body["n_predict"];
    if (auto e = parse_completion(c, host.parse_context(), &pr)) {
      if (e->param == "max_tokens" && body.contains("n_predict") && !body.contains("max_tokens")) e->param = "n_predict";
      return send_dialect_error(d, res, *e, sr.get());
    }
    if (pr.prompts.size() != 1)
      return send_dialect_error(d, res, field_error("prompt", "'prompt' must be one prompt here (a text or a list of "
                                                              "token ids): use /v1/completions for several"), sr.get());
  } catch (const std::exception& x) {
    return send_dialect_error(d, res, field_error("", std::string("bad request: ") + x.what()), sr.get());
  }
  d.response = [](const ChatGeneration& g, const tpl::ParsedReply& r) { return native_end(g, r.content); };
  d.writer = [] { return std::make_unique<NativeWriter>(); };
  const bool stream = pr.stream;
  serve_generation(host, res, std::move(pr), stream, d, sr);
}

}  // namespace

void add_llama_routes(httplib::Server& http, RouteHost& host) {
  http.Get("/props", [&host](const Request& q, Response& r) { props(host, q, r); });
  http.Post("/apply-template", [&host](const Request& q, Response& r) { apply_template(host, q, r); });
  http.Get("/slots", [&host](const Request& q, Response& r) { slots(host, q, r); });
  http.Post("/infill", [&host](const Request& q, Response& r) { native_completion(host, q, r, true); });
  http.Post("/completion", [&host](const Request& q, Response& r) { native_completion(host, q, r, false); });
}

}  // namespace kiln::server
