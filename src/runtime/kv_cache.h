// The paged KV cache's bookkeeping (docs/ARCHITECTURE.md, "KV cache"): a pool of fixed-size blocks of
// `block_size` token slots; each sequence owns a block table (logical block i -> physical block) and a length.
// Blocks are reference-counted so sequences can share a prefix (fork). This is the one place where blocks,
// refcounts, forks and sequence lengths live; the K/V storage itself is the model's (ModelState, model/step.h),
// which sees only block ids and slots through the step plan. Pure host state: no backend, no tensors.
//
// Invariants:
//   - seq_len(s) <= table(s).size() * block_size; blocks past the length are reserved but hold no tokens yet.
//   - A block with refcount > 1 is shared by forked sequences and is never written: before a sequence appends into a
//     shared partial block, reserve() gives it a private copy through the block copier (copy-on-write).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "quant/dtype.h"
#include "util/status.h"

namespace kiln {

struct KvCacheConfig {
  int64_t n_ctx = 4096;      // token slots in total, over all sequences (rounded up to whole blocks)
  int32_t block_size = 16;   // token slots per block
  int32_t max_seqs = 1;      // sequence ids 0 .. max_seqs-1
  DType dtype = DType::F16;  // storage type: F16 or Q8_0 (F32 for tests)
  int32_t max_batch = 512;   // tokens per step (the engine splits larger batches)
  int32_t max_outputs = 0;   // output rows per step; 0: max(max_seqs, 8), capped at max_batch
};

class KvCache {
 public:
  // Checks the sizes (before allocating anything proportional to them).
  static Result<std::unique_ptr<KvCache>> create(const KvCacheConfig& cfg);
  static Status validate(const KvCacheConfig& cfg);

  const KvCacheConfig& config() const { return cfg_; }
  int64_t n_blocks_total() const { return n_blocks_; }
  int64_t n_blocks_free() const { return static_cast<int64_t>(free_.size()); }
  bool valid_seq(int32_t seq_id) const { return seq_id >= 0 && seq_id < cfg_.max_seqs; }

  // Tokens stored for a sequence (its next position).
  int64_t seq_len(int32_t seq_id) const { return valid_seq(seq_id) ? seqs_[seq_id].len : 0; }
  const std::vector<int32_t>& table(int32_t seq_id) const { return seqs_[seq_id].table; }
  // Makes room for n more tokens of seq_id (allocates blocks; copy-on-write of a shared partial last block);
  // kOutOfRange with a clear message if the pool is exhausted or the context is full.
  Status reserve(int32_t seq_id, int64_t n_tokens);
  // Records that n reserved tokens were written after the current length.
  Status commit(int32_t seq_id, int64_t n_tokens);
  // Drops a sequence's tokens from position `from` on (from = 0 frees the sequence).
  void truncate(int32_t seq_id, int64_t from);
  // dst shares src's blocks (copy-on-write at the block granularity of the last, partial block).
  Status fork(int32_t src_seq, int32_t dst_seq);
  void clear();

  // Copies slots [0, n) of block src to block dst in the storage (set by the engine that owns the storage).
  using BlockCopier = std::function<Status(int32_t src, int32_t dst, int32_t n)>;
  void set_block_copier(BlockCopier f) { copier_ = std::move(f); }
  // Sequences whose block table changed since the last call (appended to `out`), and forgets them.
  void take_dirty(std::vector<int32_t>& out);

 private:
  explicit KvCache(const KvCacheConfig& cfg);
  struct Seq {
    std::vector<int32_t> table;
    int64_t len = 0;
  };
  int32_t take_block();
  void release_block(int32_t b);
  void mark(int32_t seq_id);

  KvCacheConfig cfg_;
  int64_t n_blocks_ = 0;
  std::vector<Seq> seqs_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::vector<uint8_t> dirty_;
  std::vector<int32_t> dirty_list_;
  BlockCopier copier_;
};

}  // namespace kiln
