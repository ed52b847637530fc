#include "cli/engine_options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>

namespace kiln::cli {

void add_engine_options(ArgParser& args, EngineArgs* a) {
  if (a->server) a->max_seqs = 4;
  add_cache_options(args, &a->cache);
  args.option({"-b", "--batch-size"}, &a->batch_tokens, "N",
              "tokens per step: the step's budget for decode tokens and prompt chunks together (default " +
                  std::to_string(defaults::kBatch) + ")");
  args.option({"--spec-type"}, &a->spec_type, "TYPE",
              "speculative decoding: none (default), ngram-simple (drafts by prompt lookup: the tokens that followed "
              "the last earlier occurrence of the context's last N tokens), draft-simple (a draft model, -md: the "
              "default with -md) or draft-mtp (the model's own multi-token-prediction layer, in files that carry "
              "one: Qwen3.5); greedy output is unchanged");
  args.option({"-md", "--model-draft", "--spec-draft-model"}, &a->draft_path, "FILE",
              "draft model for speculative decoding (its vocabulary must be the model's; its own KV cache)");
  args.option({"-devd", "--device-draft", "--spec-draft-device"}, &a->draft_device, "DEV",
              "where the draft model runs: auto, cpu, cuda, cuda:N (default: as --device)");
  args.option({"-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl"}, &a->draft_ngl, "N",
              "with a GPU: the draft model's last N layers on it; auto or all: every layer (default auto)");
  args.option({"-ctkd", "--cache-type-k-draft"}, &a->draft_type_k, "TYPE",
              "the draft model's KV cache type for K: " + kv_cache_type_names() + " (default: as -ctk)");
  args.option({"-ctvd", "--cache-type-v-draft"}, &a->draft_type_v, "TYPE",
              "the draft model's KV cache type for V: " + kv_cache_type_names() + " (default: as -ctv)");
  args.option({"--spec-draft-p-min", "--draft-p-min"}, &a->spec.p_min, "P",
              "draft-simple: stop drafting before a token the draft model gives less than this probability (default " +
                  strprintf("%.2f", static_cast<double>(a->spec.p_min)) + ")");
  args.option({"--spec-draft-n-max"}, &a->draft_n_max, "N",
              "draft tokens verified per step and sequence at most (default " + std::to_string(a->spec.draft_max) +
                  "; draft-mtp: " + std::to_string(SpecConfig::kMtpDraftMax) + ")");
  args.option({"--spec-draft-n-min"}, &a->spec.draft_min, "N",
              "fewer drafts than this: decode one token instead (default " + std::to_string(a->spec.draft_min) + ")");
  args.option({"--spec-ngram-simple-size-n"}, &a->spec.ngram_n, "N",
              "ngram-simple: tokens matched (default " + std::to_string(a->spec.ngram_n) + ")");
  args.option({"--spec-ngram-simple-size-m"}, &a->spec.ngram_m, "M",
              "ngram-simple: tokens proposed after a match at most (default " + std::to_string(a->spec.ngram_m) + ")");
  args.option({"-ctxcp", "--ctx-checkpoints"}, &a->ctx_checkpoints, "N",
              "hybrid models (qwen35): recurrent-state checkpoints kept per sequence for the prefix cache (serve, "
              "chat), each a copy of the whole state on the layers' device; 0: no prefix cache for them (default " +
                  std::to_string(defaults::kCtxCheckpoints) + ")");
  if (a->server) {
    args.option({"-np", "--parallel"}, &a->max_seqs, "N", "sequences decoded at once, 1..256 (default 4)");
    args.flag({"--no-prefix-cache"}, &a->no_prefix_cache,
              "do not keep or reuse the KV blocks of shared prompt prefixes");
  }
}

Status check_engine_options(EngineArgs& a) {
  KILN_TRY(check_cache_options(a.cache));
  if (a.batch_tokens < 1 || a.batch_tokens > (1 << 20))
    return make_error(ErrorCode::kInvalidArgument, "-b: must be in [1, %d] (got %d)", 1 << 20, a.batch_tokens);
  if (a.max_seqs < 1 || a.max_seqs > 256)
    return make_error(ErrorCode::kInvalidArgument, "--parallel: must be in [1, 256] (got %d)", a.max_seqs);
  if (a.ctx_checkpoints < 0 || a.ctx_checkpoints > 1024)
    return make_error(ErrorCode::kInvalidArgument, "--ctx-checkpoints: must be in [0, 1024] (got %d)",
                      a.ctx_checkpoints);
  const bool md = !a.draft_path.empty();
  const std::string type = a.spec_type.empty() ? (md ? "draft-simple" : "none") : a.spec_type;
  if (type == "none") a.spec.type = SpecConfig::Type::kNone;
  else if (type == "ngram-simple") a.spec.type = SpecConfig::Type::kNgram;
  else if (type == "draft-simple") a.spec.type = SpecConfig::Type::kDraft;
  else if (type == "draft-mtp") a.spec.type = SpecConfig::Type::kMtp;
  else
    return make_error(ErrorCode::kInvalidArgument, "--spec-type: unknown type '%s' (none, ngram-simple, draft-simple, "
                      "draft-mtp)", type.c_str());
  if (a.draft_n_max != EngineArgs::kUnset) a.spec.draft_max = a.draft_n_max;
  else a.spec.draft_max = a.spec.type == SpecConfig::Type::kMtp ? SpecConfig::kMtpDraftMax : SpecConfig{}.draft_max;
  if (a.spec.type == SpecConfig::Type::kDraft && !md)
    return make_error(ErrorCode::kInvalidArgument, "--spec-type draft-simple: needs a draft model (-md FILE)");
  if (md && a.spec.type != SpecConfig::Type::kDraft)
    return make_error(ErrorCode::kInvalidArgument, "-md: a draft model is used by --spec-type draft-simple (got %s)",
                      type.c_str());
  a.draft_k.reset();
  a.draft_v.reset();
  for (const auto& [flag, name, t] : {std::tuple<const char*, const std::string&, std::optional<DType>&>{
                                          "-ctkd", a.draft_type_k, a.draft_k},
                                      {"-ctvd", a.draft_type_v, a.draft_v}}) {
    if (name.empty()) continue;
    if (!md)
      return make_error(ErrorCode::kInvalidArgument, "%s: the draft model's KV cache type needs a draft model (-md "
                        "FILE)", flag);
    KILN_ASSIGN_OR_RETURN(t, kv_cache_type_from_name(flag, name));
  }
  if (!a.draft_device.empty()) {
    const std::string& d = a.draft_device;
    if (!(d == "auto" || d == "cpu" || d == "cuda" || d.rfind("cuda:", 0) == 0))
      return make_error(ErrorCode::kInvalidArgument, "-devd: '%s' is not auto, cpu, cuda or cuda:N (one device)",
                        d.c_str());
  }
  if (a.draft_ngl != "auto" && a.draft_ngl != "all") {
    char* end = nullptr;
    const long n = std::strtol(a.draft_ngl.c_str(), &end, 10);
    if (a.draft_ngl.empty() || *end != '\0' || n < -1 || n > (1 << 20))
      return make_error(ErrorCode::kInvalidArgument, "-ngld: '%s' is not a layer count, -1, auto or all",
                        a.draft_ngl.c_str());
  }
  return check_spec(a.spec);
}

Result<std::unique_ptr<Model>> load_draft_model(const ModelSource& model_src, const EngineArgs& a_in) {
  EngineArgs a = a_in;
  KILN_TRY(check_engine_options(a));
  if (a.draft_path.empty()) return std::unique_ptr<Model>();
  ModelSource d;
  d.path = a.draft_path;
  d.n_threads = model_src.n_threads;
  d.device = a.draft_device.empty() ? model_src.device : a.draft_device;
  d.device = d.device.substr(0, d.device.find(','));  // a model split over devices: its draft on the first
  d.n_gpu_layers = a.draft_ngl == "auto" || a.draft_ngl == "all" ? -1 : std::atoi(a.draft_ngl.c_str());
  auto m = load_model(d);
  if (!m) return m.status().with_context("-md");
  return std::move(m->model);
}

Result<EngineConfig> engine_config(const Model& model, const EngineArgs& a_in) {
  EngineArgs a = a_in;
  KILN_TRY(check_engine_options(a));
  EngineConfig c;
  const int64_t train = model.hparams().n_ctx_train;
  if (a.server) {
    c.n_ctx = a.cache.n_ctx > 0 ? a.cache.n_ctx
                                : std::min<int64_t>(effective_ctx(model, 0) * a.max_seqs, kServePoolCap);
    // A sequence may use the training context of the shared pool, or its even share of -c when that is more.
    c.max_seq_ctx = train > 0 ? std::min(std::max(train, c.n_ctx / a.max_seqs), c.n_ctx) : c.n_ctx;
    if (train > 0 && c.max_seq_ctx > train)
      note_once("-c>train", strprintf("kiln: warning: -c %lld over --parallel %d is %lld tokens per sequence, more "
                                      "than the model's training context (%lld tokens): output past that may degrade",
                                      (long long)c.n_ctx, a.max_seqs, (long long)c.max_seq_ctx, (long long)train));
  } else {
    c.n_ctx = effective_ctx(model, a.cache.n_ctx);
    if (train > 0 && c.n_ctx > train)
      note_once("-c>train", strprintf("kiln: warning: -c %lld is more than the model's training context (%lld tokens): "
                                      "output past that may degrade",
                                      (long long)c.n_ctx, (long long)train));
    c.max_seq_ctx = c.n_ctx;
  }
  c.batch_tokens = a.batch_tokens;
  c.max_seqs = a.max_seqs;
  c.block_size = defaults::kBlockSize;
  c.kv_type_k = a.cache.k;
  c.kv_type_v = a.cache.v;
  c.kv_type_k_draft = a.draft_k;
  c.kv_type_v_draft = a.draft_v;
  c.prefix_cache = !a.no_prefix_cache;
  c.ctx_checkpoints = a.ctx_checkpoints;
  c.spec = a.spec;
  return c;
}

namespace {

std::string thousands(int64_t v) {
  std::string d = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return v < 0 ? "-" + out : out;
}

}  // namespace

std::function<void(const PrefillProgress&)> prefill_printer(std::string prefix, bool per_slot) {
  return [prefix = std::move(prefix), per_slot](const PrefillProgress& p) {
    const std::string who = per_slot ? prefix + strprintf("slot %d: ", p.slot) : prefix;
    const int64_t rate = p.seconds > 0 ? static_cast<int64_t>(p.computed / p.seconds + 0.5) : 0;
    const std::string line =
        p.finished ? strprintf("%sprefill %lld/%lld tokens in %.1f s, %s t/s\n", who.c_str(), (long long)p.done,
                               (long long)p.total, p.seconds, thousands(rate).c_str())
                   : strprintf("%sprefill %lld/%lld tokens (%d%%), %s t/s\n", who.c_str(), (long long)p.done,
                               (long long)p.total, static_cast<int>(100 * p.done / std::max<int64_t>(p.total, 1)),
                               thousands(rate).c_str());
    std::fputs(line.c_str(), stderr);
  };
}

}  // namespace kiln::cli
