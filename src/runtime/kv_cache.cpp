#include "runtime/kv_cache.h"

#include <algorithm>

#include "runtime/kv_cache_paged.h"

namespace kiln {

Result<std::unique_ptr<KvCache>> KvCache::create(const HParams& hp, const KvCacheConfig& cfg) {
  if (cfg.n_ctx <= 0) return make_error(ErrorCode::kInvalidArgument, "kv cache: n_ctx must be > 0 (got %lld)",
                                        static_cast<long long>(cfg.n_ctx));
  if (cfg.block_size <= 0)
    return make_error(ErrorCode::kInvalidArgument, "kv cache: block_size must be > 0 (got %d)", cfg.block_size);
  if (cfg.max_seqs <= 0)
    return make_error(ErrorCode::kInvalidArgument, "kv cache: max_seqs must be > 0 (got %d)", cfg.max_seqs);
  if (cfg.dtype != DType::F16 && cfg.dtype != DType::F32 && cfg.dtype != DType::Q8_0)
    return make_error(ErrorCode::kUnsupported, "kv cache: type %s is not supported (f16, q8_0, f32)",
                      dtype_name(cfg.dtype));
  if (hp.n_layer <= 0 || hp.n_head_kv <= 0 || hp.head_dim_k <= 0 || hp.head_dim_v <= 0)
    return make_error(ErrorCode::kInvalidArgument, "kv cache: hyperparameters not set (n_layer %lld, n_head_kv %lld, "
                      "head_dim %lld/%lld)", static_cast<long long>(hp.n_layer), static_cast<long long>(hp.n_head_kv),
                      static_cast<long long>(hp.head_dim_k), static_cast<long long>(hp.head_dim_v));
  const int64_t bs = dtype_block_size(cfg.dtype);
  if (hp.head_dim_k % bs || hp.head_dim_v % bs)
    return make_error(ErrorCode::kUnsupported, "kv cache: %s needs head dims that are multiples of %lld (got %lld/%lld)",
                      dtype_name(cfg.dtype), static_cast<long long>(bs), static_cast<long long>(hp.head_dim_k),
                      static_cast<long long>(hp.head_dim_v));
  return std::unique_ptr<KvCache>(new PagedKvCache(hp, cfg));
}

PagedKvCache::PagedKvCache(const HParams& hp, const KvCacheConfig& cfg)
    : KvCache(cfg), n_layer_(hp.n_layer), n_head_kv_(hp.n_head_kv), hd_k_(hp.head_dim_k), hd_v_(hp.head_dim_v) {
  n_blocks_ = (cfg.n_ctx + cfg.block_size - 1) / cfg.block_size;
  seqs_.resize(cfg.max_seqs);
  refcount_.assign(n_blocks_, 0);
  clear();
}

uint64_t PagedKvCache::storage_bytes() const {
  const uint64_t rk = dtype_row_bytes(cfg_.dtype, n_head_kv_ * hd_k_).value();
  const uint64_t rv = dtype_row_bytes(cfg_.dtype, n_head_kv_ * hd_v_).value();
  return (rk + rv) * static_cast<uint64_t>(n_slots()) * static_cast<uint64_t>(n_layer_);
}

void PagedKvCache::clear() {
  for (auto& s : seqs_) s = Seq{};
  std::fill(refcount_.begin(), refcount_.end(), 0);
  free_.resize(n_blocks_);
  // Stack: lowest ids are taken first.
  for (int64_t i = 0; i < n_blocks_; ++i) free_[i] = static_cast<int32_t>(n_blocks_ - 1 - i);
}

int32_t PagedKvCache::take_block() {
  const int32_t b = free_.back();
  free_.pop_back();
  refcount_[b] = 1;
  return b;
}

void PagedKvCache::release_block(int32_t b) {
  if (--refcount_[b] == 0) free_.push_back(b);
}

int64_t PagedKvCache::seq_len(int32_t seq_id) const { return valid_seq(seq_id) ? seqs_[seq_id].len : 0; }

Status PagedKvCache::reserve(int32_t seq_id, int64_t n_tokens) {
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
    KILN_TRY(copy_block(old, nb, s.len % bs));
    s.table[s.len / bs] = nb;
    release_block(old);
  }
  for (int64_t i = 0; i < add; ++i) s.table.push_back(take_block());
  return Status::ok();
}

Status PagedKvCache::commit(int32_t seq_id, int64_t n_tokens) {
  if (!valid_seq(seq_id))
    return make_error(ErrorCode::kInvalidArgument, "kv cache: sequence id %d is out of range", seq_id);
  Seq& s = seqs_[seq_id];
  if (s.len + n_tokens > static_cast<int64_t>(s.table.size()) * cfg_.block_size)
    return make_error(ErrorCode::kInternal, "kv cache: commit of %lld tokens to sequence %d beyond its reservation",
                      static_cast<long long>(n_tokens), seq_id);
  s.len += n_tokens;
  return Status::ok();
}

void PagedKvCache::truncate(int32_t seq_id, int64_t from) {
  if (!valid_seq(seq_id)) return;
  Seq& s = seqs_[seq_id];
  s.len = std::clamp<int64_t>(from, 0, s.len);
  const size_t keep = static_cast<size_t>((s.len + cfg_.block_size - 1) / cfg_.block_size);
  while (s.table.size() > keep) {
    release_block(s.table.back());
    s.table.pop_back();
  }
}

Status PagedKvCache::fork(int32_t src_seq, int32_t dst_seq) {
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
  return Status::ok();
}

Status PagedKvCache::ensure_storage(Backend& be) {
  if (backend_ == &be) return Status::ok();
  if (backend_ != nullptr)
    return make_error(ErrorCode::kInvalidArgument, "kv cache: already bound to backend '%s', used with '%s'",
                      backend_->name(), be.name());
  const size_t rows = static_cast<size_t>(n_slots());
  KILN_ASSIGN_OR_RETURN(const uint64_t rk, dtype_row_bytes(cfg_.dtype, n_head_kv_ * hd_k_));
  KILN_ASSIGN_OR_RETURN(const uint64_t rv, dtype_row_bytes(cfg_.dtype, n_head_kv_ * hd_v_));
  std::vector<std::unique_ptr<Buffer>> k, v;
  for (int64_t il = 0; il < n_layer_; ++il) {
    auto kb = be.alloc(rk * rows);
    if (!kb) return kb.status().with_context("kv cache: layer " + std::to_string(il) + " K");
    auto vb = be.alloc(rv * rows);
    if (!vb) return vb.status().with_context("kv cache: layer " + std::to_string(il) + " V");
    k.push_back(std::move(kb).value());
    v.push_back(std::move(vb).value());
  }
  k_ = std::move(k);
  v_ = std::move(v);
  backend_ = &be;
  return Status::ok();
}

Status PagedKvCache::copy_block(int32_t src, int32_t dst, int64_t n) {
  if (backend_ == nullptr || n <= 0) return Status::ok();
  const int64_t bs = cfg_.block_size;
  for (int64_t il = 0; il < n_layer_; ++il) {
    const KvLayer l = layer(il);
    KILN_TRY(backend_->copy(l.k.rows(src * bs, n), l.k.rows(dst * bs, n)));
    KILN_TRY(backend_->copy(l.v.rows(src * bs, n), l.v.rows(dst * bs, n)));
  }
  return Status::ok();
}

}  // namespace kiln
