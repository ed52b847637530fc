// The engine loop's outer side: creation, submission, the engine thread, statistics. One step (schedule ->
// execute -> update) is in scheduler_step.cpp.
#include "runtime/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "runtime/scheduler_impl.h"

namespace kiln {

void Histogram::add(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

uint64_t model_identity(const Model& m, DType type_k, DType type_v) {
  const HParams& hp = m.hparams();
  uint64_t h = 1469598103934665603ull;
  auto add = [&](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  for (char c : hp.arch) add(static_cast<unsigned char>(c));
  for (char c : hp.name) add(static_cast<unsigned char>(c));
  add(hp.n_vocab), add(hp.n_layer), add(hp.n_embd), add(hp.n_head), add(hp.n_head_kv), add(hp.n_ff);
  add(m.stats().weight_bytes), add(m.stats().n_params);
  add(static_cast<uint64_t>(type_k)), add(static_cast<uint64_t>(type_v));
  return h;
}

namespace {

Status check_config(const EngineConfig& cfg) {
  if (cfg.max_seqs < 1 || cfg.max_seqs > 256)
    return make_error(ErrorCode::kInvalidArgument, "--parallel: must be in [1, 256] (got %d)", cfg.max_seqs);
  if (cfg.batch_tokens < 1)
    return make_error(ErrorCode::kInvalidArgument, "-b: batch size must be >= 1 (got %d)", cfg.batch_tokens);
  if (cfg.n_ctx < 1)
    return make_error(ErrorCode::kInvalidArgument, "-c: must be >= 1 (got %lld)", (long long)cfg.n_ctx);
  if (cfg.max_seq_ctx < 0)
    return make_error(ErrorCode::kInvalidArgument, "max_seq_ctx: must be >= 0 (got %lld)", (long long)cfg.max_seq_ctx);
  if (cfg.ctx_checkpoints < 0 || cfg.ctx_checkpoints > 1024)
    return make_error(ErrorCode::kInvalidArgument, "--ctx-checkpoints: must be in [0, 1024] (got %d)",
                      cfg.ctx_checkpoints);
  if (!(cfg.progress_interval_s >= 0))
    return make_error(ErrorCode::kInvalidArgument, "progress_interval_s: must be >= 0");
  if (cfg.max_outputs < 0)
    return make_error(ErrorCode::kInvalidArgument, "max_outputs: must be >= 0 (got %d)", cfg.max_outputs);
  KILN_TRY(check_spec(cfg.spec));
  return Status::ok();
}

}  // namespace

Status check_spec_request(const SpecRequest& r, const SpecConfig& sp) {
  if (!r.any()) return Status::ok();
  if (r.n_max < -1) return make_error(ErrorCode::kInvalidArgument, "speculative.n_max: must be >= 0 (got %d)", r.n_max);
  if (r.n_min < -1) return make_error(ErrorCode::kInvalidArgument, "speculative.n_min: must be >= 0 (got %d)", r.n_min);
  if (!(r.p_min == -1.0f || (r.p_min >= 0.0f && r.p_min <= 1.0f)))
    return make_error(ErrorCode::kInvalidArgument, "speculative.p_min: must be in [0, 1] (got %g)",
                      static_cast<double>(r.p_min));
  if (sp.type == SpecConfig::Type::kNone) {
    const char* f = r.n_max > 0 ? "speculative.n_max" : r.n_min > 0 ? "speculative.n_min"
                                  : r.p_min > 0 ? "speculative.p_min" : nullptr;
    if (f)
      return make_error(ErrorCode::kInvalidArgument, "%s: this engine runs without speculative decoding (start it "
                        "with -md FILE, --spec-type ngram-simple or --spec-type draft-mtp)", f);
    return Status::ok();
  }
  if (r.n_max > sp.draft_max)
    return make_error(ErrorCode::kInvalidArgument, "speculative.n_max: must be in [0, %d] (the engine's "
                      "--spec-draft-n-max; got %d)", sp.draft_max, r.n_max);
  const int32_t n_max = r.n_max >= 0 ? r.n_max : sp.draft_max;
  if (r.n_min > n_max)
    return make_error(ErrorCode::kInvalidArgument, "speculative.n_min: must be in [0, speculative.n_max %d] (got %d)",
                      n_max, r.n_min);
  if (r.p_min > 0 && sp.type != SpecConfig::Type::kDraft)
    return make_error(ErrorCode::kInvalidArgument, "speculative.p_min: %s drafts carry no probability (only a draft "
                      "model's do: -md FILE); only 0 is accepted", spec_type_name(sp.type));
  return Status::ok();
}

namespace {

// The prompt format Qwen3-Reranker documents, for a rank model whose file brings none but whose vocabulary has
// the chat markers it uses.
constexpr const char* kQwenRerankTemplate =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a "
    "web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: "
    "{document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

Status setup_embeddings(const Model& model, const EngineConfig& cfg, EmbeddingInfo* info, EmbeddingSetup* e) {
  KILN_ASSIGN_OR_RETURN(*info, read_embedding_info(model));
  e->on = true;
  e->model_pooling = info->pooling_type >= 0;
  e->pooling = cfg.pooling ? *cfg.pooling : e->model_pooling ? static_cast<Pooling>(info->pooling_type) : Pooling::kNone;
  e->n_embd = model.hparams().n_embd;
  e->n_out = e->n_embd;
  if (e->pooling != Pooling::kRank) return Status::ok();
  if (info->n_cls == 0)
    return make_error(ErrorCode::kUnsupported, "--pooling rank: the model has no classification head (no "
                      "cls.output.weight or cls.weight%s)", model.hparams().arch == "qwen3"
                          ? ", and its vocabulary lacks the tokens 'yes' and 'no' of the Qwen3-Reranker recipe" : "");
  e->n_out = info->n_cls;
  e->labels = info->labels;
  e->rerank_template = info->rerank_template;
  const Tokenizer& tok = model.tokenizer();
  if (e->rerank_template.empty()) {
    bool start = false, end = false;
    for (int32_t i = 0; i < tok.n_vocab(); ++i) {
      start = start || tok.token_text(i) == "<|im_start|>";
      end = end || tok.token_text(i) == "<|im_end|>";
    }
    if (start && end) e->rerank_template = kQwenRerankTemplate;
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Scheduler>> Scheduler::create(std::unique_ptr<Model> model, const EngineConfig& cfg,
                                                     std::unique_ptr<Model> draft) {
  if (!model) return make_error(ErrorCode::kInvalidArgument, "scheduler: no model");
  KILN_TRY(check_config(cfg));
  const bool want_draft = cfg.spec.type == SpecConfig::Type::kDraft;
  if (want_draft && !draft)
    return make_error(ErrorCode::kInvalidArgument, "--spec-type draft-simple: needs a draft model (-md FILE)");
  if (!want_draft && draft)
    return make_error(ErrorCode::kInvalidArgument, "-md: a draft model is used by --spec-type draft-simple (got %s)",
                      spec_type_name(cfg.spec.type));
  if (!draft && (cfg.kv_type_k_draft || cfg.kv_type_v_draft))
    return make_error(ErrorCode::kInvalidArgument, "%s: the draft model's KV cache type needs a draft model (-md FILE)",
                      cfg.kv_type_k_draft ? "-ctkd" : "-ctvd");
  if (want_draft && model->hparams().hybrid())
    return make_error(ErrorCode::kUnsupported, "-md: speculative decoding is off for %s (a hybrid model: a rejected "
                      "draft would have advanced its recurrent state)", model->hparams().arch.c_str());
  const bool want_mtp = cfg.spec.type == SpecConfig::Type::kMtp;
  if (want_mtp) KILN_TRY(MtpDraft::check(*model));
  std::unique_ptr<Scheduler> s(new Scheduler());
  s->impl_ = std::make_unique<Impl>();
  Impl& I = *s->impl_;
  I.cfg = cfg;
  if (model->hparams().hybrid() && !want_mtp) I.cfg.spec.type = SpecConfig::Type::kNone;  // engine_config.h: spec
  KvCacheConfig kc = kv_cache_config(cfg);
  // Each decoding sequence may verify drafts: 1 + drafts_per_step output rows.
  kc.max_outputs = std::min(cfg.max_outputs > 0 ? cfg.max_outputs : cfg.max_seqs * (1 + I.cfg.spec.drafts_per_step()),
                            kc.batch_tokens);
  kc.prefix_cache = cfg.prefix_cache;
  kc.checkpoints = cfg.prefix_cache ? cfg.ctx_checkpoints * cfg.max_seqs : 0;  // Engine::create: hybrid models only
  kc.prefix_seed = model_identity(*model, cfg.kv_type_k, cfg.kv_type_v);
  if (cfg.embeddings) {
    KILN_TRY(setup_embeddings(*model, cfg, &I.emb_info, &I.emb));
    kc.hidden = true;
  }
  // draft-mtp drafts from every token's hidden row, and rolls a hybrid model's state back past rejected drafts.
  kc.hidden = kc.hidden || want_mtp;
  kc.verify_states = want_mtp;
  KILN_ASSIGN_OR_RETURN(I.engine, Engine::create(*model, kc));
  // A drafter's cache holds what the sequences hold plus each one's drafts (and a partial block).
  const auto draft_cache = [&](DType type_k, DType type_v) {
    DraftCacheConfig dc;
    dc.n_ctx = cfg.n_ctx + static_cast<int64_t>(cfg.max_seqs) * (cfg.spec.draft_max + cfg.block_size);
    dc.max_seqs = cfg.max_seqs;
    dc.batch_tokens = cfg.batch_tokens;
    dc.block_size = cfg.block_size;
    dc.kv_type_k = type_k;
    dc.kv_type_v = type_v;
    return dc;
  };
  if (want_mtp) {
    KILN_ASSIGN_OR_RETURN(I.mtp, MtpDraft::create(*model, draft_cache(cfg.kv_type_k, cfg.kv_type_v)));
  }
  if (want_draft) {
    const DraftCacheConfig dc =
        draft_cache(cfg.kv_type_k_draft.value_or(cfg.kv_type_k), cfg.kv_type_v_draft.value_or(cfg.kv_type_v));
    KILN_ASSIGN_OR_RETURN(I.draft, DraftModel::create(*model, std::move(draft), dc));
  }
  I.model = std::move(model);
  I.max_seq_ctx = cfg.max_seq_ctx > 0 ? std::min(cfg.max_seq_ctx, cfg.n_ctx) : cfg.n_ctx;
  if (I.model->hparams().max_pos > 0) I.max_seq_ctx = std::min(I.max_seq_ctx, I.model->hparams().max_pos);
  I.cfg.prefix_cache = I.engine->cache().config().prefix_cache;  // off for a hybrid model without checkpoints
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int nt = cfg.sampling_threads > 0 ? cfg.sampling_threads : std::min(cfg.max_seqs, cores);
  I.pool = std::make_unique<ThreadPool>(std::max(1, nt));
  for (int32_t i = cfg.max_seqs - 1; i >= 0; --i) I.free_slots.push_back(i);
  I.kinds.resize(static_cast<size_t>(I.engine->caps().max_outputs));
  I.row_masks.resize(static_cast<size_t>(I.engine->caps().max_outputs));
  // The masked argmax takes the sequences' masks as they are: words over the model's whole vocabulary.
  I.device_mask = I.engine->supports_masked_argmax() &&
                  I.engine->state().plan().mask_words == (I.model->hparams().n_vocab + 63) / 64;
  I.drafts.resize(static_cast<size_t>(I.cfg.spec.drafts_per_step()));
  I.stats.ttft = Histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  I.stats.itl = Histogram({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5});
  I.stats.block_size = cfg.block_size;
  I.stats.kv_checkpoints_total = I.engine->cache().config().checkpoints;
  if (cfg.start) s->start();
  return s;
}

Scheduler::~Scheduler() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  // Whatever never reached the engine thread.
  for (auto& h : impl_->incoming) {
    RequestEnd end;
    end.reason = FinishReason::kCancelled;
    end.stop = StopReason::kCancelled;
    h->finish(std::move(end));
  }
}

void Scheduler::start() {
  if (!impl_->thread.joinable()) impl_->thread = std::thread([this] { impl_->loop(); });
}

const Tokenizer& Scheduler::tokenizer() const { return impl_->model->tokenizer(); }
int32_t Scheduler::n_vocab() const { return static_cast<int32_t>(impl_->model->hparams().n_vocab); }
int64_t Scheduler::max_seq_ctx() const { return impl_->max_seq_ctx; }
int64_t Scheduler::n_ctx_train() const { return impl_->model->hparams().n_ctx_train; }
const EngineConfig& Scheduler::config() const { return impl_->cfg; }
const EmbeddingSetup& Scheduler::embedding() const { return impl_->emb; }
const Model& Scheduler::model() const { return *impl_->model; }
const Model* Scheduler::draft_model() const { return impl_->draft ? &impl_->draft->model() : nullptr; }
const KvCacheConfig* Scheduler::draft_cache_config() const {
  return impl_->draft ? &impl_->draft->engine().cache().config() : nullptr;
}
uint64_t Scheduler::kv_bytes() const { return impl_->engine->state().kv_bytes(); }
uint64_t Scheduler::checkpoint_bytes() const { return impl_->engine->state().checkpoint_bytes(); }
void Scheduler::set_step_observer(std::function<void(const StepInfo&)> f) { impl_->observer = std::move(f); }

std::string Scheduler::model_description() const {
  const Model& m = *impl_->model;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, %.1fM params, on %s", m.hparams().arch.c_str(),
                static_cast<double>(m.stats().n_params) / 1e6, m.placement().describe().c_str());
  return buf;
}

Result<std::shared_ptr<RequestHandle>> Scheduler::submit(GenRequest req) {
  const int32_t nv = n_vocab();
  const int64_t ctx = impl_->max_seq_ctx;
  if (req.prompt.empty()) return make_error(ErrorCode::kInvalidArgument, "prompt: empty (no tokens)");
  for (size_t i = 0; i < req.prompt.size(); ++i)
    if (req.prompt[i] < 0 || req.prompt[i] >= nv)
      return make_error(ErrorCode::kInvalidArgument, "prompt: token %zu: id %d is outside the vocabulary [0, %d)", i,
                        req.prompt[i], nv);
  const HParams& hp = impl_->model->hparams();
  if (!req.embed && !hp.causal)
    return make_error(ErrorCode::kUnsupported, "model: %s is an encoder: it computes embeddings, not text",
                      hp.arch.c_str());
  if (req.embed && !hp.causal && static_cast<int64_t>(req.prompt.size()) > impl_->engine->caps().batch_tokens)
    return make_error(ErrorCode::kOutOfRange, "input: %zu tokens: %s sees its whole input in one step, of at most %d "
                      "tokens (-b)", req.prompt.size(), hp.arch.c_str(), impl_->engine->caps().batch_tokens);
  if (!req.embed && !impl_->cfg.generation)
    return make_error(ErrorCode::kUnsupported, "model: this is an embedding model (its file declares a pooling type): "
                      "it serves embeddings (POST /v1/embeddings%s), not text generation",
                      impl_->emb.pooling == Pooling::kRank ? " and /v1/rerank" : "");
  if (req.embed && !impl_->emb.on)
    return make_error(ErrorCode::kUnsupported, "embeddings are off for this engine (EngineConfig::embeddings; kiln "
                      "serve --embedding)");
  if (req.embed && static_cast<int64_t>(req.prompt.size()) > ctx)
    return make_error(ErrorCode::kOutOfRange, "input: %zu tokens do not fit the context of %lld tokens per sequence",
                      req.prompt.size(), (long long)ctx);
  if (!req.embed && static_cast<int64_t>(req.prompt.size()) >= ctx)
    return make_error(ErrorCode::kOutOfRange,
                      "prompt: %zu tokens do not fit the context of %lld tokens per sequence (at least one token "
                      "must be left to generate)", req.prompt.size(), (long long)ctx);
  if (req.max_new_tokens < -1)
    return make_error(ErrorCode::kInvalidArgument, "max_new_tokens: must be >= -1 (got %d)", req.max_new_tokens);
  if (req.top_logprobs < 0 || req.top_logprobs > 20)
    return make_error(ErrorCode::kInvalidArgument, "top_logprobs: must be in [0, 20] (got %d)", req.top_logprobs);
  for (const std::string& s : req.stop)
    if (s.empty()) return make_error(ErrorCode::kInvalidArgument, "stop: empty stop string");
  if (!(req.timeout_s >= 0)) return make_error(ErrorCode::kInvalidArgument, "timeout: must be >= 0");
  KILN_TRY(check_spec_request(req.spec, impl_->cfg.spec));
  {
    Sampler probe(req.sampling, nv);
    KILN_TRY(probe.validate());
  }
  if (req.sampling.dry_enabled() && !req.sampling.dry_breakers && !req.sampling.dry_sequence_breakers.empty())
    req.sampling.dry_breakers = impl_->dry_breakers(req.sampling.dry_sequence_breakers);
  std::shared_ptr<RequestHandle> h;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (impl_->draining || impl_->stop) return make_error(ErrorCode::kUnsupported, "the server is shutting down");
    h = std::make_shared<RequestHandle>(impl_->next_id++, std::move(req));
    h->set_submitted(Clock::now());
    impl_->incoming.push_back(h);
    impl_->n_pending.fetch_add(1);
  }
  impl_->cv.notify_all();
  return h;
}

std::shared_ptr<const DryBreakers> Scheduler::Impl::dry_breakers(const std::vector<std::string>& strings) {
  {
    std::lock_guard<std::mutex> lk(dry_mu);
    auto it = dry_cache.find(strings);
    if (it != dry_cache.end()) return it->second;
  }
  auto b = std::make_shared<const DryBreakers>(DryBreakers::for_vocabulary(model->tokenizer(), strings));
  std::lock_guard<std::mutex> lk(dry_mu);
  if (dry_cache.size() >= kDryCacheSize) dry_cache.clear();
  dry_cache.emplace(strings, b);
  return b;
}

void Scheduler::shutdown(bool cancel) {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->draining = true;
    if (cancel) impl_->cancel_all = true;
  }
  impl_->cv.notify_all();
}

bool Scheduler::wait_idle(std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (impl_->n_pending.load() > 0) {
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  SchedulerStats s = impl_->stats;
  const auto now = Clock::now();
  int64_t p = 0, g = 0;
  for (const auto& t : impl_->window)
    if (now - t.t <= std::chrono::seconds(10)) p += t.prompt, g += t.gen;
  s.prompt_tps = p / 10.0;
  s.gen_tps = g / 10.0;
  return s;
}

}  // namespace kiln
