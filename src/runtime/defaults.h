// Defaults shared by every command and the server, defined once (and printed from here in -h).
#pragma once

#include <cstdint>

namespace kiln::defaults {

inline constexpr int32_t kBatch = 512;           // -b: tokens per step (prompt chunk)
inline constexpr int64_t kContextCap = 4096;     // -c 0: the model's training context, at most this
inline constexpr int64_t kPerplexityCtx = 512;   // perplexity -c 0: chunk length (llama-perplexity's default)
inline constexpr int32_t kBlockSize = 16;        // KV cache block (token slots)
inline constexpr int kMaxThreadsPerCore = 4;     // -t above this many per core is capped (with a warning)
inline constexpr int32_t kCtxCheckpoints = 8;    // --ctx-checkpoints: hybrid-model checkpoints per sequence slot
inline constexpr int64_t kCheckpointSpacing = 512;  // hybrid models: prompt checkpoints at least this far apart

}  // namespace kiln::defaults
