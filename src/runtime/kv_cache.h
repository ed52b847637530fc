// Paged KV cache (DESIGN.md section 3): per layer, one pool of fixed-size blocks of `block_size` token slots for K
// and for V; each sequence owns a block table (logical block i -> physical block). Blocks are reference-counted so
// sequences can share a prefix (fork). f16 storage by default, q8_0 as an option.
//
// Layout per layer and block: K [block_size][n_head_kv][head_dim_k], V [block_size][n_head_kv][head_dim_v]
// (token-major, so one token's K of all heads is contiguous for kv_store). Attention gathers through the table.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/hparams.h"
#include "quant/dtype.h"
#include "util/status.h"

namespace kiln {

struct KvCacheConfig {
  int64_t n_ctx = 4096;      // token slots in total, over all sequences (rounded up to whole blocks)
  int32_t block_size = 16;   // token slots per block
  int32_t max_seqs = 1;      // sequence ids 0 .. max_seqs-1
  DType dtype = DType::F16;  // F16 or Q8_0 (F32 allowed for tests)
};

class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(const HParams& hp, const KvCacheConfig& cfg);
  virtual ~KvCache() = default;

  const KvCacheConfig& config() const { return cfg_; }
  int64_t n_blocks_total() const { return n_blocks_; }
  virtual int64_t n_blocks_free() const = 0;

  // Tokens stored for a sequence (its next position).
  virtual int64_t seq_len(int32_t seq_id) const = 0;
  // Makes room for n more tokens of seq_id (allocates blocks); kOutOfRange with a clear message if the pool is
  // exhausted. forward() calls this; a scheduler may call it first to decide admission.
  virtual Status reserve(int32_t seq_id, int64_t n_tokens) = 0;
  // Drops a sequence's tokens from position `from` on (from = 0 frees the sequence).
  virtual void truncate(int32_t seq_id, int64_t from) = 0;
  // dst shares src's blocks (copy-on-write at the block granularity of the last, partial block).
  virtual Status fork(int32_t src_seq, int32_t dst_seq) = 0;
  virtual void clear() = 0;

 protected:
  explicit KvCache(const KvCacheConfig& cfg) : cfg_(cfg) {}
  KvCacheConfig cfg_;
  int64_t n_blocks_ = 0;
};

}  // namespace kiln
