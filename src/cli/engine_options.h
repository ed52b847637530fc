// The engine loop's flags, one set for `kiln run`, `kiln chat` and `kiln serve`, filling one EngineConfig
// (runtime/engine_config.h) the same way:
//   -c/--ctx-size, --kv-type, -ctk, -ctv   (CacheOptions, cli/model_source.h)    n_ctx, kv_type_k, kv_type_v
//   -b/--batch-size                                                               batch_tokens
//   -np/--parallel, --no-prefix-cache      serve only (run and chat: one sequence) max_seqs, prefix_cache
//   --spec-type, --spec-draft-n-max/-min/-p-min, --spec-ngram-simple-size-n/-m   spec (speculative decoding)
//   -md/--model-draft, -devd/--device-draft, -ngld/--gpu-layers-draft           the draft model (load_draft_model)
//   -ctkd, -ctvd (with -md)                                                       kv_type_k_draft, kv_type_v_draft
//   --ctx-checkpoints                                                             ctx_checkpoints (hybrid models)
// What -c means differs as it does in llama.cpp: for run and chat it is the one sequence's context (default: the
// model's, at most kContextCap), for serve the KV pool shared by --parallel sequences (default: the model's context
// times --parallel, at most kServePoolCap), each of which holds at most max(training context, -c / --parallel).
// A sequence context above the model's training context is allowed with a warning, as llama.cpp does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cli/args.h"
#include "cli/model_source.h"
#include "runtime/engine_config.h"

namespace kiln::cli {

inline constexpr int64_t kServePoolCap = 65536;  // serve's default -c at most

struct EngineArgs {
  bool server = false;        // serve's meaning of -c, and its -np / --no-prefix-cache
  CacheOptions cache;         // -c, --kv-type, -ctk, -ctv
  int32_t batch_tokens = defaults::kBatch;  // -b
  int32_t max_seqs = 1;       // -np (serve; default 4)
  bool no_prefix_cache = false;
  std::string spec_type;           // --spec-type: none | ngram-simple | draft-simple | draft-mtp ("": draft-simple with
                                   // -md, else none)
  SpecConfig spec;                 // the numbers of the --spec-* flags
  static constexpr int32_t kUnset = INT32_MIN;
  int32_t draft_n_max = kUnset;    // --spec-draft-n-max as given (kUnset: the type's default, into spec.draft_max)
  std::string draft_path;          // -md: the draft model's file ("": none)
  std::string draft_device;        // -devd ("": as --device)
  std::string draft_ngl = "auto";  // -ngld: N, auto or all (auto and all: every layer, as -ngl -1)
  std::string draft_type_k, draft_type_v;  // -ctkd, -ctvd: the draft's KV cache types ("": the model's -ctk / -ctv)
  std::optional<DType> draft_k, draft_v;   // what check_engine_options makes of them
  int32_t ctx_checkpoints = defaults::kCtxCheckpoints;  // --ctx-checkpoints
};

// Registers the flags above (serve: also -np and --no-prefix-cache). The caller sets args->server first.
void add_engine_options(ArgParser& args, EngineArgs* a);
// Range checks before the model loads; errors name the flag (and resolve -ctk/-ctv/--kv-type into cache.k/.v, and
// --spec-type and -md into spec.type).
Status check_engine_options(EngineArgs& a);
// The draft model of -md on -devd (default: the model's --device) with -ngld GPU layers, the model's threads;
// null without -md. Errors name the flag or the file.
Result<std::unique_ptr<Model>> load_draft_model(const ModelSource& model_src, const EngineArgs& a);
// The config for this model: -c resolved against its training context (a warning when a sequence's context is
// above it).
Result<EngineConfig> engine_config(const Model& model, const EngineArgs& a);
// EngineConfig::on_prefill for the CLI: a line on stderr per report, "<prefix>prefill 65536/262144 tokens (25%),
// 12,345 t/s", and at the end "<prefix>prefill 262144/262144 tokens in 21.3 s, 12,345 t/s"; per_slot: "slot N: "
// after the prefix.
std::function<void(const PrefillProgress&)> prefill_printer(std::string prefix, bool per_slot);

}  // namespace kiln::cli
