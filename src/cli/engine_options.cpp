#include "cli/engine_options.h"

#include <algorithm>
#include <string>

namespace kiln::cli {

void add_engine_options(ArgParser& args, EngineArgs* a) {
  if (a->server) a->max_seqs = 4;
  add_cache_options(args, &a->cache);
  args.option({"-b", "--batch-size"}, &a->batch_tokens, "N",
              "tokens per step: the step's budget for decode tokens and prompt chunks together (default " +
                  std::to_string(defaults::kBatch) + ")");
  args.option({"--spec-type"}, &a->spec_type, "TYPE",
              "speculative decoding: none (default) or ngram-simple (drafts by prompt lookup: the tokens that followed "
              "the last earlier occurrence of the context's last N tokens; greedy output is unchanged)");
  args.option({"--spec-draft-n-max"}, &a->spec.draft_max, "N",
              "draft tokens verified per step and sequence at most (default " + std::to_string(a->spec.draft_max) + ")");
  args.option({"--spec-draft-n-min"}, &a->spec.draft_min, "N",
              "fewer drafts than this: decode one token instead (default " + std::to_string(a->spec.draft_min) + ")");
  args.option({"--spec-ngram-simple-size-n"}, &a->spec.ngram_n, "N",
              "ngram-simple: tokens matched (default " + std::to_string(a->spec.ngram_n) + ")");
  args.option({"--spec-ngram-simple-size-m"}, &a->spec.ngram_m, "M",
              "ngram-simple: tokens proposed after a match at most (default " + std::to_string(a->spec.ngram_m) + ")");
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
  if (a.spec_type == "none") a.spec.type = SpecConfig::Type::kNone;
  else if (a.spec_type == "ngram-simple") a.spec.type = SpecConfig::Type::kNgram;
  else if (a.spec_type == "draft-simple" || a.spec_type == "draft-mtp")
    return make_error(ErrorCode::kUnsupported, "--spec-type %s: not supported yet (none, ngram-simple)",
                      a.spec_type.c_str());
  else
    return make_error(ErrorCode::kInvalidArgument, "--spec-type: unknown type '%s' (none, ngram-simple)",
                      a.spec_type.c_str());
  return check_spec(a.spec);
}

Result<EngineConfig> engine_config(const Model& model, const EngineArgs& a_in) {
  EngineArgs a = a_in;
  KILN_TRY(check_engine_options(a));
  EngineConfig c;
  const int64_t train = model.hparams().n_ctx_train;
  if (a.server) {
    c.n_ctx = a.cache.n_ctx > 0 ? a.cache.n_ctx
                                : std::min<int64_t>(effective_ctx(model, 0) * a.max_seqs, kServePoolCap);
    c.max_seq_ctx = train > 0 ? std::min(train, c.n_ctx) : c.n_ctx;
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
  c.prefix_cache = !a.no_prefix_cache;
  c.spec = a.spec;
  return c;
}

}  // namespace kiln::cli
