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
//   kv_type         KV storage: F16 or Q8_0 (--kv-type, -ctk/-ctv)
//   prefix_cache    keep and reuse the KV blocks of shared prompt prefixes (--no-prefix-cache turns it off; off for
//                   hybrid models whatever is asked: their recurrent state cannot be reused)
// The generation limit of a request is GenRequest::max_new_tokens (-n, "max_tokens" in the API).
#pragma once

#include <cstdint>

#include "quant/dtype.h"
#include "runtime/defaults.h"

namespace kiln {

struct EngineConfig {
  int64_t n_ctx = 4096;
  int64_t max_seq_ctx = 0;
  int32_t batch_tokens = defaults::kBatch;
  int32_t max_seqs = 4;
  int32_t max_outputs = 0;
  int32_t block_size = defaults::kBlockSize;
  DType kv_type = DType::F16;
  bool prefix_cache = true;
  int sampling_threads = 0;  // threads sampling the output rows of a step; 0: min(max_seqs, cores)
  bool start = true;         // start the engine thread in Scheduler::create (tests may call start() later)
};

}  // namespace kiln
