// What the engine loop (runtime/scheduler.h) is sized by: one name per quantity, filled the same way from the
// flags of `kiln run`, `kiln chat` and `kiln serve` (cli/engine_options.h) and by tests.
//
//   n_ctx           KV token slots in total, shared by every sequence through the paged cache (-c; run and chat:
//                   the one sequence's context)
//   max_seq_ctx     the most tokens one sequence may hold (prompt + generated); 0: n_ctx
//   batch_tokens    the step's token budget (-b): decode tokens and prompt chunks of all sequences together
//   max_seqs        sequences running at once (--parallel; run and chat: 1), 1..256
//   max_outputs     output rows (logits or argmax) per step; 0: max_seqs
//   block_size      KV block in token slots
//   kv_type_k/_v    K and V storage, independently: a cache type (runtime/kv_cache.h, kv_cache_type_from_name:
//                   -ctk / -ctv, --kv-type for both); which ones a backend stores is checked when the engine is
//                   created
//   prefix_cache    keep and reuse the KV blocks of shared prompt prefixes (--no-prefix-cache turns it off)
//   ctx_checkpoints hybrid models: recurrent-state checkpoints kept per sequence slot (--ctx-checkpoints), the
//                   prefix cache's way to resume such a model (runtime/scheduler.h); 0: no prefix cache for them
//   on_prefill      progress of long prompts (PrefillProgress below), e.g. a line on stderr
//   spec            speculative decoding (SpecConfig below; hybrid models run only kMtp, whose rejected drafts
//                   roll the recurrent state back: KvCacheConfig::verify_states; the other types are off for them)
//   embeddings      embedding requests are served (runtime/embedding.h): steps that run one fetch every token's
//                   hidden state (a host buffer of batch_tokens x n_embd floats)
//   pooling         how they are pooled; unset: the model file's pooling type, else none
//   generation      generation requests are served (false: an embedding model's server refuses them)
// The generation limit of a request is GenRequest::max_new_tokens (-n, "max_tokens" in the API).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>

#include "quant/dtype.h"
#include "runtime/defaults.h"
#include "runtime/embedding.h"
#include "runtime/kv_cache.h"
#include "util/status.h"

namespace kiln {

// Speculative decoding (llama.cpp's flags): each decoding sequence proposes up to draft_max tokens per step
// (--spec-draft-n-max), verified in the same forward pass as its pending token (k + 1 output rows); fewer than
// draft_min proposed (--spec-draft-n-min) and the step decodes one token. kNgram: prompt lookup
// (runtime/ngram_draft.h; --spec-type ngram-simple, --spec-ngram-simple-size-n / -size-m). kDraft: a draft model
// (runtime/draft_model.h; --spec-type draft-simple, -md FILE, handed to Scheduler::create) proposes greedily and
// stops before a token whose probability is below p_min (--spec-draft-p-min). A request may lower draft_max and
// set its own draft_min and p_min (GenRequest::spec). kMtp: the model's own multi-token-prediction layer
// (runtime/mtp_draft.h; --spec-type draft-mtp, a file with NextN blocks: model/mtp.h) drafts greedily from the
// model's hidden states; its default draft_max is kMtpDraftMax (the CLI's when --spec-draft-n-max is not given).
struct SpecConfig {
  enum class Type { kNone, kNgram, kDraft, kMtp };
  static constexpr int32_t kMtpDraftMax = 3;
  Type type = Type::kNone;
  int32_t draft_max = 16, draft_min = 0;
  float p_min = 0.0f;
  int32_t ngram_n = 12, ngram_m = 48;
  int32_t drafts_per_step() const { return type == Type::kNone ? 0 : draft_max; }
};
// llama.cpp's names: "none", "ngram-simple", "draft-simple", "draft-mtp".
inline const char* spec_type_name(SpecConfig::Type t) {
  switch (t) {
    case SpecConfig::Type::kNgram: return "ngram-simple";
    case SpecConfig::Type::kDraft: return "draft-simple";
    case SpecConfig::Type::kMtp: return "draft-mtp";
    default: return "none";
  }
}
// Range checks; errors name the flag.
inline Status check_spec(const SpecConfig& sp) {
  if (sp.draft_max < 0 || sp.draft_max > 256)
    return make_error(ErrorCode::kInvalidArgument, "--spec-draft-n-max: must be in [0, 256] (got %d)", sp.draft_max);
  if (sp.draft_min < 0 || sp.draft_min > sp.draft_max)
    return make_error(ErrorCode::kInvalidArgument, "--spec-draft-n-min: must be in [0, --spec-draft-n-max %d] (got %d)",
                      sp.draft_max, sp.draft_min);
  if (!(sp.p_min >= 0.0f && sp.p_min <= 1.0f))
    return make_error(ErrorCode::kInvalidArgument, "--spec-draft-p-min: must be in [0, 1] (got %g)",
                      static_cast<double>(sp.p_min));
  if (sp.ngram_n < 1 || sp.ngram_n > 1024)
    return make_error(ErrorCode::kInvalidArgument, "--spec-ngram-simple-size-n: must be in [1, 1024] (got %d)",
                      sp.ngram_n);
  if (sp.ngram_m < 1 || sp.ngram_m > 1024)
    return make_error(ErrorCode::kInvalidArgument, "--spec-ngram-simple-size-m: must be in [1, 1024] (got %d)",
                      sp.ngram_m);
  return Status::ok();
}

// Where a prompt's prefill stands (EngineConfig::on_prefill), per sequence, on the engine thread: after a step that
// computed its prompt, at most every progress_interval_s seconds, the first time that long after its prefill
// began; and once with `finished` when the prefill ends, if it was reported before (short prompts are not).
struct PrefillProgress {
  uint64_t request = 0;   // RequestHandle::id()
  int32_t slot = 0;       // the sequence slot (GET /slots)
  int64_t done = 0;       // tokens of the sequence in the KV cache (the prefix cache's included)
  int64_t total = 0;      // tokens to prefill up to (the prompt, or more when recomputed after a preemption)
  int64_t computed = 0;   // tokens computed since the prefill began
  double seconds = 0;     // since the prefill began
  bool finished = false;
};

struct EngineConfig {
  int64_t n_ctx = 4096;
  int64_t max_seq_ctx = 0;
  int32_t batch_tokens = defaults::kBatch;
  int32_t max_seqs = 4;
  int32_t max_outputs = 0;
  int32_t block_size = defaults::kBlockSize;
  DType kv_type_k = DType::F16, kv_type_v = DType::F16;
  // The draft model's K and V cache types (-ctkd / -ctvd; SpecConfig::kDraft only); unset: kv_type_k / kv_type_v.
  std::optional<DType> kv_type_k_draft, kv_type_v_draft;
  bool prefix_cache = true;
  int32_t ctx_checkpoints = defaults::kCtxCheckpoints;
  SpecConfig spec;
  std::function<void(const PrefillProgress&)> on_prefill;  // null: none
  double progress_interval_s = 1.0;
  bool embeddings = false;
  std::optional<Pooling> pooling;
  bool generation = true;
  int sampling_threads = 0;  // threads sampling the output rows of a step; 0: min(max_seqs, cores)
  bool start = true;         // start the engine thread in Scheduler::create (tests may call start() later)
};

// The KV cache of a drafter that runs beside the engine loop's model: a draft model (runtime/draft_model.h) or the
// model's multi-token-prediction layer (runtime/mtp_draft.h).
struct DraftCacheConfig {
  int64_t n_ctx = 4096;       // KV token slots in total (all sequences and their drafts)
  int32_t max_seqs = 1;       // sequence slots (the engine loop's)
  int32_t batch_tokens = defaults::kBatch;
  int32_t block_size = defaults::kBlockSize;
  DType kv_type_k = DType::F16, kv_type_v = DType::F16;
};

// The KV cache an engine sized by cfg holds (EngineConfig, or DraftCacheConfig: the same field names): slots,
// blocks, sequences, types and the batch. Its output rows and prefix cache are the caller's (the scheduler's verify
// rows, the draft model's one row).
template <class Config>
KvCacheConfig kv_cache_config(const Config& cfg) {
  KvCacheConfig kc;
  kc.n_ctx = cfg.n_ctx;
  kc.block_size = cfg.block_size;
  kc.max_seqs = cfg.max_seqs;
  kc.type_k = cfg.kv_type_k;
  kc.type_v = cfg.kv_type_v;
  kc.batch_tokens = static_cast<int32_t>(std::min<int64_t>(cfg.batch_tokens, cfg.n_ctx));
  return kc;
}

}  // namespace kiln
