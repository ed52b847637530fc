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
//
// Prefix cache (KvCacheConfig::prefix_cache; the server's scheduler turns it on, like vLLM's block pool): a full
// block can be indexed by a hash chained over the tokens of every block up to it (seeded with the model's
// identity): hash(block i) = H(hash(block i-1), tokens of block i). cache_blocks() indexes a sequence's full
// blocks once they are written; when the last sequence holding an indexed block lets it go, the block is not
// freed but kept, unreferenced, in LRU order (the tail of a sequence first), and taken back (its index entry
// dropped) only when a reservation finds no never-indexed block free. attach_prefix() gives an empty sequence
// the longest indexed prefix of its tokens; an indexed block is never written (a sequence appending into one that
// it holds partly gets a private copy, as with a shared block). n_blocks_free() counts the cached blocks as free
// (a reservation may take them); n_blocks_cached() says how many of them there are.
//
// Checkpoints (KvCacheConfig::checkpoints > 0; hybrid models, whose recurrent layers keep a state that K/V blocks
// alone cannot restore): a full indexed block may carry one of `checkpoints` slots, each holding the recurrent state
// of a sequence right after that block's last token (the storage is the model's: ModelState::save_checkpoint; this
// class only says which slot belongs to which block). A block loses its checkpoint when its index entry goes (the
// LRU takes it back, drop_cached(), clear()) or when add_checkpoint() needs a slot and none is free: then the least
// recently used checkpoint goes (its block keeps its K/V). With checkpoints on, attach_prefix() resumes a sequence
// only at the end of a matched block that carries one: the block's hash covers every token before it, so a
// checkpoint is never given to a sequence whose prefix differs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "quant/dtype.h"
#include "util/status.h"

namespace kiln {

struct KvCacheConfig {
  int64_t n_ctx = 4096;      // token slots in total, over all sequences (rounded up to whole blocks)
  int32_t block_size = 16;   // token slots per block
  int32_t max_seqs = 1;      // sequence ids 0 .. max_seqs-1
  DType type_k = DType::F16, type_v = DType::F16;  // K and V storage: cache types (kv_cache_type_from_name)
  int32_t batch_tokens = 512; // tokens per step (the engine splits larger batches)
  int32_t max_outputs = 0;   // output rows per step; 0: max(max_seqs, 8), capped at batch_tokens
  bool prefix_cache = false; // index full blocks by content and keep them after their sequences end (see above)
  uint64_t prefix_seed = 0;  // the first link of the hash chain: the model's identity (a cache holds one model)
  int32_t checkpoints = 0;   // recurrent-state checkpoint slots (see above); needs prefix_cache
  bool hidden = false;       // the engine runs hidden steps (embeddings: model/step.h StepCaps::hidden)
  // Hybrid models: one more recurrent-state row per sequence slot, where Engine::save_verify_state keeps a
  // sequence's state before a step that verifies drafts, for restore_verify_state after a rejection.
  bool verify_states = false;
};

// llama.cpp's name of a KV cache type (-ctk / -ctv: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, spelled
// exactly so) -> its DType; an unknown name is an error naming `flag` and listing the accepted names. Which backend
// stores which of them is the backend's answer (Backend::supports), checked when the model state is created.
Result<DType> kv_cache_type_from_name(const char* flag, std::string_view name);
// The accepted names, "f32, f16, ..., q5_1" (help texts).
std::string kv_cache_type_names();

class KvCache {
 public:
  // Checks the sizes (before allocating anything proportional to them).
  static Result<std::unique_ptr<KvCache>> create(const KvCacheConfig& cfg);
  static Status validate(const KvCacheConfig& cfg);

  const KvCacheConfig& config() const { return cfg_; }
  int64_t n_blocks_total() const { return n_blocks_; }
  // Blocks a reservation can take: never-indexed free blocks plus unreferenced cached ones.
  int64_t n_blocks_free() const { return static_cast<int64_t>(free_.size()) + lru_size_; }
  // Unreferenced blocks kept for their contents (prefix cache); included in n_blocks_free().
  int64_t n_blocks_cached() const { return lru_size_; }
  // Blocks held by at least one sequence.
  int64_t n_blocks_used() const { return n_blocks_ - n_blocks_free(); }
  bool valid_seq(int32_t seq_id) const { return seq_id >= 0 && seq_id < cfg_.max_seqs; }

  // Tokens stored for a sequence (its next position).
  int64_t seq_len(int32_t seq_id) const { return valid_seq(seq_id) ? seqs_[seq_id].len : 0; }
  const std::vector<int32_t>& table(int32_t seq_id) const { return seqs_[seq_id].table; }
  // Makes room for n more tokens of seq_id (allocates blocks; copy-on-write of a shared partial last block);
  // kOutOfRange with a clear message if the pool is exhausted or the context is full.
  Status reserve(int32_t seq_id, int64_t n_tokens);
  // Blocks reserve(seq_id, n_tokens) would take (new blocks plus a copy-on-write copy).
  int64_t blocks_needed(int32_t seq_id, int64_t n_tokens) const;
  // Records that n reserved tokens were written after the current length.
  Status commit(int32_t seq_id, int64_t n_tokens);
  // Drops a sequence's tokens from position `from` on (from = 0 frees the sequence).
  void truncate(int32_t seq_id, int64_t from);
  // dst shares src's blocks (copy-on-write at the block granularity of the last, partial block).
  Status fork(int32_t src_seq, int32_t dst_seq);
  void clear();

  // ---- prefix cache (no-ops unless config().prefix_cache) ----
  // Gives the empty sequence seq_id the longest indexed prefix of `tokens` in whole blocks, holding at most
  // `limit` of them (a last block past `limit` is held partly: the next append copies it). Returns the
  // sequence's new length (0: nothing cached, or the sequence was not empty). With checkpoints: the longest prefix
  // of at most `limit` tokens that ends with a block carrying a checkpoint, whose slot goes to *checkpoint (-1 when
  // nothing is attached); the caller restores the state from it or truncates the sequence.
  int64_t attach_prefix(int32_t seq_id, std::span<const int32_t> tokens, int64_t limit,
                        int32_t* checkpoint = nullptr);
  // How many leading tokens of `tokens` attach_prefix would find (whole blocks; no limit applied).
  int64_t cached_prefix(std::span<const int32_t> tokens) const;
  // Indexes the full blocks of seq_id written since the last call; tokens: the sequence's tokens (at least
  // seq_len(seq_id) of them). A block whose content is indexed already (another copy) stays unindexed.
  void cache_blocks(int32_t seq_id, std::span<const int32_t> tokens);
  // Drops every cached block's index entry (they become plain free blocks). Held blocks stay indexed.
  void drop_cached();

  // ---- checkpoints (no-ops unless config().checkpoints > 0) ----
  // A slot for the recurrent state of seq_id at its current length, for the caller to fill: the length must be a
  // whole number of blocks whose last one cache_blocks() has indexed (or whose content another indexed block holds:
  // that one gets the slot). -1: nothing to do (not a block boundary, not indexed, the block has a checkpoint).
  // Takes a free slot, else the least recently used one.
  int32_t add_checkpoint(int32_t seq_id);
  // Frees a slot add_checkpoint() gave out (the caller could not fill it).
  void drop_checkpoint(int32_t slot);
  int32_t n_checkpoints_used() const { return n_ckpt_used_; }

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
    std::vector<uint64_t> hashes;  // chain hash of each full block the prefix cache has seen (<= len / block_size)
  };
  int32_t take_block();
  void release_block(int32_t b);
  void mark(int32_t seq_id);
  bool immutable(int32_t b) const { return refcount_[b] > 1 || (!hashed_.empty() && hashed_[b]); }
  uint64_t chain(uint64_t parent, const int32_t* toks) const;
  int32_t lookup(uint64_t parent, uint64_t h, const int32_t* toks) const;  // -1: not indexed
  void unindex(int32_t b);
  void lru_push(int32_t b);
  void lru_remove(int32_t b);

  KvCacheConfig cfg_;
  int64_t n_blocks_ = 0;
  std::vector<Seq> seqs_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;  // stack of free block ids (never indexed, or unindexed)
  // Prefix cache (sized only when enabled): per block its hash, parent hash and tokens; the hash -> block index;
  // the LRU list of unreferenced indexed blocks (oldest first) as an intrusive doubly linked list.
  std::vector<uint8_t> hashed_;
  std::vector<uint64_t> hash_, parent_;
  std::vector<int32_t> block_tokens_;
  std::unordered_map<uint64_t, int32_t> index_;
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  int64_t lru_size_ = 0;
  // Checkpoints: per block its slot (-1: none); per slot its block (-1: free) and when it was last made or used.
  std::vector<int32_t> ckpt_of_, ckpt_block_;
  std::vector<uint64_t> ckpt_used_;
  uint64_t ckpt_clock_ = 0;
  int32_t n_ckpt_used_ = 0;
  std::vector<uint8_t> dirty_;
  std::vector<int32_t> dirty_list_;
  BlockCopier copier_;
};

}  // namespace kiln
