// The paged KV cache implementation behind KvCache (runtime/kv_cache.h), with what the forward pass (model/) needs
// beyond the public interface. Internal to kiln: the runtime creates caches with KvCache::create and hands them to
// Model::forward, which static_casts to PagedKvCache (every KvCache is one).
//
// Bookkeeping (block tables, reference counts, free list, lengths) lives on the host; the K/V storage is allocated
// by the model's backend on the first forward (ensure_storage), so the same cache object works for CPU or device
// backends. Invariants:
//   - seq_len(s) <= table(s).size() * block_size; blocks past the length are reserved but hold no tokens yet.
//   - A block with refcount > 1 is shared by forked sequences and is never written: before a sequence appends
//     into a shared partial block, reserve() gives it a private copy (copy-on-write at block granularity).
// Methods the model calls are inline or virtual so kiln_model needs no link-time symbol from kiln_runtime.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "runtime/kv_cache.h"

namespace kiln {

class PagedKvCache : public KvCache {
 public:
  PagedKvCache(const HParams& hp, const KvCacheConfig& cfg);

  int64_t n_blocks_free() const override { return static_cast<int64_t>(free_.size()); }
  int64_t seq_len(int32_t seq_id) const override;
  Status reserve(int32_t seq_id, int64_t n_tokens) override;
  void truncate(int32_t seq_id, int64_t from) override;
  Status fork(int32_t src_seq, int32_t dst_seq) override;
  void clear() override;

  // ---- for the forward pass ----
  // Allocates the per-layer K/V storage from `be` (once; a cache is bound to the backend that first used it).
  virtual Status ensure_storage(Backend& be);
  // Records that n tokens were written after the current length (they must have been reserved).
  virtual Status commit(int32_t seq_id, int64_t n_tokens);

  bool valid_seq(int32_t seq_id) const { return seq_id >= 0 && seq_id < cfg_.max_seqs; }
  const std::vector<int32_t>& table(int32_t seq_id) const { return seqs_[seq_id].table; }
  int64_t n_slots() const { return n_blocks_ * cfg_.block_size; }
  int64_t n_layer() const { return n_layer_; }
  KvLayer layer(int64_t il) const {
    KvLayer l;
    l.k = Tensor::make(cfg_.dtype, k_[il]->data(), backend_, n_head_kv_ * hd_k_, n_slots());
    l.v = Tensor::make(cfg_.dtype, v_[il]->data(), backend_, n_head_kv_ * hd_v_, n_slots());
    l.n_head_kv = static_cast<int32_t>(n_head_kv_);
    l.head_dim_k = static_cast<int32_t>(hd_k_);
    l.head_dim_v = static_cast<int32_t>(hd_v_);
    l.block_size = cfg_.block_size;
    return l;
  }
  // Bytes of K+V storage over all layers (allocated or to be allocated).
  uint64_t storage_bytes() const;

 private:
  struct Seq {
    std::vector<int32_t> table;
    int64_t len = 0;
  };
  int32_t take_block();
  void release_block(int32_t b);
  // Copies slots [0, n) of block `src` to block `dst` in every layer (no-op before storage exists).
  Status copy_block(int32_t src, int32_t dst, int64_t n);

  int64_t n_layer_, n_head_kv_, hd_k_, hd_v_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;  // stack of free block ids
  Backend* backend_ = nullptr;
  std::vector<std::unique_ptr<Buffer>> k_, v_;
};

}  // namespace kiln
