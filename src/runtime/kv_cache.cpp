#include "runtime/kv_cache.h"

#include <algorithm>
#include <utility>

#include "backend/backend.h"

namespace kiln {

Result<DType> kv_cache_type_from_name(const char* flag, std::string_view name) {
  for (DType t : kKvCacheTypes)
    if (name == dtype_name(t)) return t;
  return make_error(ErrorCode::kInvalidArgument, "%s: '%.*s' is not a KV cache type (%s)", flag,
                    static_cast<int>(name.size()), name.data(), kv_cache_type_names().c_str());
}

std::string kv_cache_type_names() {
  std::string s;
  for (DType t : kKvCacheTypes) s += std::string(s.empty() ? "" : ", ") + dtype_name(t);
  return s;
}

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
  for (const auto& [flag, t] : {std::pair<const char*, DType>{"-ctk", cfg.type_k}, {"-ctv", cfg.type_v}})
    if (!is_kv_cache_type(t))
      return make_error(ErrorCode::kUnsupported, "%s %s: not a KV cache type (%s)", flag, dtype_name(t),
                        kv_cache_type_names().c_str());
  if (cfg.checkpoints < 0 || cfg.checkpoints > (1 << 20))
    return make_error(ErrorCode::kInvalidArgument, "--ctx-checkpoints: %d checkpoint slots is out of range [0, %d]",
                      cfg.checkpoints, 1 << 20);
  if (cfg.batch_tokens < 1 || cfg.batch_tokens > (1 << 20))
    return make_error(ErrorCode::kInvalidArgument, "-b: batch size must be in [1, %d] (got %d)", 1 << 20,
                      cfg.batch_tokens);
  return Status::ok();
}

KvCache::KvCache(const KvCacheConfig& cfg) : cfg_(cfg) {
  n_blocks_ = (cfg.n_ctx + cfg.block_size - 1) / cfg.block_size;
  seqs_.resize(cfg.max_seqs);
  dirty_.assign(cfg.max_seqs, 0);
  dirty_list_.reserve(cfg.max_seqs);
  refcount_.assign(n_blocks_, 0);
  if (cfg.prefix_cache) {
    hashed_.assign(n_blocks_, 0);
    hash_.assign(n_blocks_, 0);
    parent_.assign(n_blocks_, 0);
    block_tokens_.assign(static_cast<size_t>(n_blocks_) * cfg.block_size, 0);
    lru_prev_.assign(n_blocks_, -1);
    lru_next_.assign(n_blocks_, -1);
  }
  if (cfg.prefix_cache && cfg.checkpoints > 0) {
    ckpt_of_.assign(n_blocks_, -1);
    ckpt_block_.assign(static_cast<size_t>(cfg.checkpoints), -1);
    ckpt_used_.assign(static_cast<size_t>(cfg.checkpoints), 0);
  } else {
    cfg_.checkpoints = 0;
  }
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
  std::fill(hashed_.begin(), hashed_.end(), 0);
  std::fill(ckpt_of_.begin(), ckpt_of_.end(), -1);
  std::fill(ckpt_block_.begin(), ckpt_block_.end(), -1);
  n_ckpt_used_ = 0;
  index_.clear();
  lru_head_ = lru_tail_ = -1;
  lru_size_ = 0;
  free_.resize(n_blocks_);
  // Stack: lowest ids are taken first.
  for (int64_t i = 0; i < n_blocks_; ++i) free_[i] = static_cast<int32_t>(n_blocks_ - 1 - i);
}

// Never-indexed blocks first; then the least recently used cached block loses its index entry.
int32_t KvCache::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    b = lru_head_;
    lru_remove(b);
    unindex(b);
  }
  refcount_[b] = 1;
  return b;
}

void KvCache::release_block(int32_t b) {
  if (--refcount_[b] != 0) return;
  if (!hashed_.empty() && hashed_[b]) lru_push(b);
  else free_.push_back(b);
}

void KvCache::lru_push(int32_t b) {
  lru_prev_[b] = lru_tail_;
  lru_next_[b] = -1;
  if (lru_tail_ >= 0) lru_next_[lru_tail_] = b;
  else lru_head_ = b;
  lru_tail_ = b;
  ++lru_size_;
}

void KvCache::lru_remove(int32_t b) {
  const int32_t p = lru_prev_[b], n = lru_next_[b];
  if (p >= 0) lru_next_[p] = n;
  else lru_head_ = n;
  if (n >= 0) lru_prev_[n] = p;
  else lru_tail_ = p;
  lru_prev_[b] = lru_next_[b] = -1;
  --lru_size_;
}

void KvCache::unindex(int32_t b) {
  if (hashed_.empty() || !hashed_[b]) return;
  auto it = index_.find(hash_[b]);
  if (it != index_.end() && it->second == b) index_.erase(it);
  hashed_[b] = 0;
  if (!ckpt_of_.empty() && ckpt_of_[b] >= 0) drop_checkpoint(ckpt_of_[b]);
}

int32_t KvCache::add_checkpoint(int32_t seq_id) {
  if (cfg_.checkpoints == 0 || !valid_seq(seq_id)) return -1;
  const Seq& s = seqs_[seq_id];
  const int64_t bs = cfg_.block_size;
  if (s.len == 0 || s.len % bs != 0 || static_cast<int64_t>(s.hashes.size()) < s.len / bs) return -1;
  const size_t i = static_cast<size_t>(s.len / bs - 1);
  auto it = index_.find(s.hashes[i]);
  if (it == index_.end() || parent_[it->second] != (i == 0 ? cfg_.prefix_seed : s.hashes[i - 1])) return -1;
  const int32_t b = it->second;
  if (ckpt_of_[b] >= 0) {
    ckpt_used_[static_cast<size_t>(ckpt_of_[b])] = ++ckpt_clock_;
    return -1;
  }
  // A free slot, else the least recently used (slots are few: a scan is cheaper than a list to keep in order).
  int32_t c = -1;
  for (int32_t i = 0; i < cfg_.checkpoints; ++i) {
    if (ckpt_block_[static_cast<size_t>(i)] < 0) {
      c = i;
      break;
    }
    if (c < 0 || ckpt_used_[static_cast<size_t>(i)] < ckpt_used_[static_cast<size_t>(c)]) c = i;
  }
  if (ckpt_block_[static_cast<size_t>(c)] >= 0) drop_checkpoint(c);
  ckpt_block_[static_cast<size_t>(c)] = b;
  ckpt_used_[static_cast<size_t>(c)] = ++ckpt_clock_;
  ckpt_of_[b] = c;
  ++n_ckpt_used_;
  return c;
}

void KvCache::drop_checkpoint(int32_t slot) {
  if (slot < 0 || slot >= cfg_.checkpoints) return;
  const int32_t b = ckpt_block_[static_cast<size_t>(slot)];
  if (b < 0) return;
  ckpt_of_[b] = -1;
  ckpt_block_[static_cast<size_t>(slot)] = -1;
  --n_ckpt_used_;
}

// splitmix64-style mixing over (parent, tokens); collisions are checked against the stored tokens and parent.
uint64_t KvCache::chain(uint64_t parent, const int32_t* toks) const {
  auto mix = [](uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(parent ^ 0x9e3779b97f4a7c15ull);
  for (int32_t i = 0; i < cfg_.block_size; ++i) h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(toks[i])) +
                                                          0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1)));
  return h;
}

int32_t KvCache::lookup(uint64_t parent, uint64_t h, const int32_t* toks) const {
  auto it = index_.find(h);
  if (it == index_.end()) return -1;
  const int32_t b = it->second;
  const int32_t* have = block_tokens_.data() + static_cast<size_t>(b) * cfg_.block_size;
  if (parent_[b] != parent || !std::equal(toks, toks + cfg_.block_size, have)) return -1;
  return b;
}

int64_t KvCache::cached_prefix(std::span<const int32_t> tokens) const {
  if (!cfg_.prefix_cache) return 0;
  const size_t bs = static_cast<size_t>(cfg_.block_size);
  uint64_t parent = cfg_.prefix_seed;
  int64_t n = 0, at_checkpoint = 0;
  for (size_t i = 0; (i + 1) * bs <= tokens.size(); ++i) {
    const uint64_t h = chain(parent, tokens.data() + i * bs);
    const int32_t b = lookup(parent, h, tokens.data() + i * bs);
    if (b < 0) break;
    parent = h;
    n += static_cast<int64_t>(bs);
    if (cfg_.checkpoints > 0 && ckpt_of_[b] >= 0) at_checkpoint = n;
  }
  return cfg_.checkpoints > 0 ? at_checkpoint : n;
}

int64_t KvCache::attach_prefix(int32_t seq_id, std::span<const int32_t> tokens, int64_t limit, int32_t* checkpoint) {
  if (checkpoint) *checkpoint = -1;
  if (!cfg_.prefix_cache || !valid_seq(seq_id)) return 0;
  Seq& s = seqs_[seq_id];
  if (s.len != 0 || !s.table.empty() || limit <= 0) return s.len;
  const size_t bs = static_cast<size_t>(cfg_.block_size);
  const bool ckpt = cfg_.checkpoints > 0;
  // Matched blocks (with checkpoints: whole blocks within the limit), then, with checkpoints, back to the last one
  // that carries a checkpoint.
  uint64_t parent = cfg_.prefix_seed;
  std::vector<int32_t>& t = s.table;
  for (size_t i = 0; (i + 1) * bs <= tokens.size(); ++i) {
    // A block that starts before the limit may be held partly; with checkpoints only whole blocks count.
    if (static_cast<int64_t>(ckpt ? (i + 1) * bs : i * bs + 1) > limit) break;
    const uint64_t h = chain(parent, tokens.data() + i * bs);
    const int32_t b = lookup(parent, h, tokens.data() + i * bs);
    if (b < 0) break;
    t.push_back(b);
    s.hashes.push_back(h);
    parent = h;
  }
  if (ckpt)
    while (!t.empty() && ckpt_of_[t.back()] < 0) t.pop_back();
  if (t.empty()) {
    s.hashes.clear();
    return 0;
  }
  for (int32_t b : t)
    if (refcount_[b]++ == 0) lru_remove(b);
  s.len = std::min<int64_t>(static_cast<int64_t>(t.size() * bs), limit);
  s.hashes.resize(static_cast<size_t>(s.len) / bs);
  if (ckpt) {
    const int32_t c = ckpt_of_[t.back()];
    ckpt_used_[static_cast<size_t>(c)] = ++ckpt_clock_;
    if (checkpoint) *checkpoint = c;
  }
  mark(seq_id);
  return s.len;
}

void KvCache::cache_blocks(int32_t seq_id, std::span<const int32_t> tokens) {
  if (!cfg_.prefix_cache || !valid_seq(seq_id)) return;
  Seq& s = seqs_[seq_id];
  const size_t bs = static_cast<size_t>(cfg_.block_size);
  const size_t full = static_cast<size_t>(std::min<int64_t>(s.len, static_cast<int64_t>(tokens.size()))) / bs;
  while (s.hashes.size() < full) {
    const size_t i = s.hashes.size();
    const uint64_t parent = i == 0 ? cfg_.prefix_seed : s.hashes[i - 1];
    const int32_t* toks = tokens.data() + i * bs;
    const uint64_t h = chain(parent, toks);
    s.hashes.push_back(h);
    const int32_t b = s.table[i];
    if (hashed_[b] || index_.count(h)) continue;  // indexed already (attached), or another copy is
    hashed_[b] = 1;
    hash_[b] = h;
    parent_[b] = parent;
    std::copy(toks, toks + bs, block_tokens_.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(b) * bs));
    index_.emplace(h, b);
  }
}

void KvCache::drop_cached() {
  while (lru_head_ >= 0) {
    const int32_t b = lru_head_;
    lru_remove(b);
    unindex(b);
    free_.push_back(b);
  }
}

int64_t KvCache::blocks_needed(int32_t seq_id, int64_t n_tokens) const {
  if (!valid_seq(seq_id) || n_tokens <= 0) return 0;
  const Seq& s = seqs_[seq_id];
  const int64_t bs = cfg_.block_size;
  const int64_t need = (s.len + n_tokens + bs - 1) / bs;
  const int64_t add = std::max<int64_t>(0, need - static_cast<int64_t>(s.table.size()));
  const bool cow = s.len % bs != 0 && immutable(s.table[s.len / bs]);
  return add + (cow ? 1 : 0);
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
  const bool cow = n_tokens > 0 && s.len % bs != 0 && immutable(s.table[s.len / bs]);
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
  if (s.hashes.size() > static_cast<size_t>(s.len / cfg_.block_size)) s.hashes.resize(s.len / cfg_.block_size);
  // Back to front: the tail of a sequence enters the LRU first, so it is evicted before the shared head.
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
  dst.hashes.assign(src.hashes.begin(),
                    src.hashes.begin() + std::min<size_t>(src.hashes.size(), src.len / cfg_.block_size));
  mark(dst_seq);
  return Status::ok();
}

}  // namespace kiln
