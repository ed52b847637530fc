#include "runtime/kv_cache.h"

#include <algorithm>


namespace kiln {

Result<std::unique_ptr<KvCache>> KvCache::create(const KvCacheConfig& cfg) {
  KILN_TRY(validate(cfg));
  return std::unique_ptr<KvCache>(new KvCache(cfg));
}

Status KvCache::validate(const KvCacheConfig& cfg) {
  if (cfg.n_ctx <= 0) return make_error(ErrorCode::kInvalidArgument, "kv cache: n_ctx must be > 0 (got %lld)",
                                        static_cast<long long>(cfg.n_ctx));
  if (cfg.block_size <= 0 || cfg.block_size > 1024)
    return make_error(ErrorCode::kInvalidArgument, "kv cache: block_size must be in [1, 1024] (got %d)",
                      cfg.block_size);
  if (cfg.max_seqs <= 0 || cfg.max_seqs > 65536)
    return make_error(ErrorCode::kInvalidArgument, "kv cache: max_seqs must be in [1, 65536] (got %d)", cfg.max_seqs);
  // Block ids and slots are int32 on every backend: the pool holds at most 2^31 slots.
  if (cfg.n_ctx > (int64_t{1} << 31) - cfg.block_size)
    return make_error(ErrorCode::kOutOfRange, "-c %lld: the context is limited to %lld token slots",
                      static_cast<long long>(cfg.n_ctx), static_cast<long long>((int64_t{1} << 31) - cfg.block_size));
  if (cfg.dtype != DType::F16 && cfg.dtype != DType::F32 && cfg.dtype != DType::Q8_0)
    return make_error(ErrorCode::kUnsupported, "kv cache: type %s is not supported (f16, q8_0, f32)",
                      dtype_name(cfg.dtype));
  if (cfg.max_batch < 1 || cfg.max_batch > (1 << 20))
    return make_error(ErrorCode::kInvalidArgument, "-b: batch size must be in [1, %d] (got %d)", 1 << 20,
                      cfg.max_batch);
  return Status::ok();
}

KvCache::KvCache(const KvCacheConfig& cfg) : cfg_(cfg) {
  n_blocks_ = (cfg.n_ctx + cfg.block_size - 1) / cfg.block_size;
  seqs_.resize(cfg.max_seqs);
  dirty_.assign(cfg.max_seqs, 0);
  dirty_list_.reserve(cfg.max_seqs);
  refcount_.assign(n_blocks_, 0);
  clear();
}

void KvCache::mark(int32_t seq_id) {
  if (!dirty_[seq_id]) {
    dirty_[seq_id] = 1;
    dirty_list_.push_back(seq_id);
  }
}

void KvCache::take_dirty(std::vector<int32_t>& out) {
  for (int32_t s : dirty_list_) {
    out.push_back(s);
    dirty_[s] = 0;
  }
  dirty_list_.clear();
}

void KvCache::clear() {
  for (int32_t i = 0; i < static_cast<int32_t>(seqs_.size()); ++i) {
    if (!seqs_[i].table.empty()) mark(i);
    seqs_[i] = Seq{};
  }
  std::fill(refcount_.begin(), refcount_.end(), 0);
  free_.resize(n_blocks_);
  // Stack: lowest ids are taken first.
  for (int64_t i = 0; i < n_blocks_; ++i) free_[i] = static_cast<int32_t>(n_blocks_ - 1 - i);
}

int32_t KvCache::take_block() {
  const int32_t b = free_.back();
  free_.pop_back();
  refcount_[b] = 1;
  return b;
}

void KvCache::release_block(int32_t b) {
  if (--refcount_[b] == 0) free_.push_back(b);
}

Status KvCache::reserve(int32_t seq_id, int64_t n_tokens) {
  if (!valid_seq(seq_id))
    return make_error(ErrorCode::kInvalidArgument, "kv cache: sequence id %d is out of range [0, %d)", seq_id,
                      cfg_.max_seqs);
  if (n_tokens < 0) return make_error(ErrorCode::kInvalidArgument, "kv cache: negative token count %lld",
                                      static_cast<long long>(n_tokens));
  Seq& s = seqs_[seq_id];
  if (s.len + n_tokens > cfg_.n_ctx)
    return make_error(ErrorCode::kOutOfRange, "context full: sequence %d has %lld tokens, %lld more exceed the "
                      "context size %lld", seq_id, static_cast<long long>(s.len), static_cast<long long>(n_tokens),
                      static_cast<long long>(cfg_.n_ctx));
  const int64_t bs = cfg_.block_size;
  const int64_t need = (s.len + n_tokens + bs - 1) / bs;
  const int64_t add = std::max<int64_t>(0, need - static_cast<int64_t>(s.table.size()));
  // Appending into a shared partial block needs a private copy of it first.
  const bool cow = n_tokens > 0 && s.len % bs != 0 && refcount_[s.table[s.len / bs]] > 1;
  if (add + (cow ? 1 : 0) > n_blocks_free())
    return make_error(ErrorCode::kOutOfRange, "out of KV cache blocks: sequence %d (%lld tokens) needs %lld more "
                      "blocks of %lld tokens, %lld of %lld are free", seq_id, static_cast<long long>(s.len),
                      static_cast<long long>(add + (cow ? 1 : 0)), static_cast<long long>(bs),
                      static_cast<long long>(n_blocks_free()), static_cast<long long>(n_blocks_));
  if (cow) {
    const int32_t old = s.table[s.len / bs];
    const int32_t nb = take_block();
    if (copier_) {
      Status st = copier_(old, nb, static_cast<int32_t>(s.len % bs));
      if (!st.is_ok()) {
        release_block(nb);
        return st;
      }
    }
    s.table[s.len / bs] = nb;
    release_block(old);
    mark(seq_id);
  }
  for (int64_t i = 0; i < add; ++i) s.table.push_back(take_block());
  if (add > 0) mark(seq_id);
  return Status::ok();
}

Status KvCache::commit(int32_t seq_id, int64_t n_tokens) {
  if (!valid_seq(seq_id))
    return make_error(ErrorCode::kInvalidArgument, "kv cache: sequence id %d is out of range", seq_id);
  Seq& s = seqs_[seq_id];
  if (s.len + n_tokens > static_cast<int64_t>(s.table.size()) * cfg_.block_size)
    return make_error(ErrorCode::kInternal, "kv cache: commit of %lld tokens to sequence %d beyond its reservation",
                      static_cast<long long>(n_tokens), seq_id);
  s.len += n_tokens;
  return Status::ok();
}

void KvCache::truncate(int32_t seq_id, int64_t from) {
  if (!valid_seq(seq_id)) return;
  Seq& s = seqs_[seq_id];
  s.len = std::clamp<int64_t>(from, 0, s.len);
  const size_t keep = static_cast<size_t>((s.len + cfg_.block_size - 1) / cfg_.block_size);
  while (s.table.size() > keep) {
    release_block(s.table.back());
    s.table.pop_back();
    mark(seq_id);
  }
}

Status KvCache::fork(int32_t src_seq, int32_t dst_seq) {
  if (!valid_seq(src_seq) || !valid_seq(dst_seq))
    return make_error(ErrorCode::kInvalidArgument, "kv cache: fork %d -> %d: sequence ids must be in [0, %d)",
                      src_seq, dst_seq, cfg_.max_seqs);
  if (src_seq == dst_seq) return Status::ok();
  truncate(dst_seq, 0);
  Seq& src = seqs_[src_seq];
  Seq& dst = seqs_[dst_seq];
  // Share only the blocks that hold tokens (reserved tails stay with the source).
  const size_t used = static_cast<size_t>((src.len + cfg_.block_size - 1) / cfg_.block_size);
  dst.table.assign(src.table.begin(), src.table.begin() + used);
  for (int32_t b : dst.table) ++refcount_[b];
  dst.len = src.len;
  mark(dst_seq);
  return Status::ok();
}

}  // namespace kiln
