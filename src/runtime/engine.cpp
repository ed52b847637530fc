#include "runtime/engine.h"

#include <algorithm>
#include <cstring>

namespace kiln {

Result<std::unique_ptr<Engine>> Engine::create(Model& model, const KvCacheConfig& cfg_in) {
  // Hybrid models reuse a prefix only through checkpoints (K/V from the cache would lack the recurrent state that
  // goes with it); other models need none.
  KvCacheConfig cfg = cfg_in;
  if (!model.hparams().hybrid() || !cfg.prefix_cache) cfg.checkpoints = 0;
  if (model.hparams().hybrid() && cfg.checkpoints == 0) cfg.prefix_cache = false;
  StepCaps caps;
  caps.batch_tokens = cfg.batch_tokens;
  caps.max_seqs = cfg.max_seqs;
  caps.block_size = cfg.block_size;
  caps.kv_type_k = cfg.type_k;
  caps.kv_type_v = cfg.type_v;
  // The verify rows follow the prefix cache's checkpoint rows (slot s: row checkpoints + s).
  const bool verify = cfg.verify_states && model.hparams().hybrid();
  caps.n_checkpoints = cfg.checkpoints + (verify ? cfg.max_seqs : 0);
  caps.hidden = cfg.hidden;
  caps.max_outputs = cfg.max_outputs > 0 ? cfg.max_outputs : std::max(cfg.max_seqs, 8);
  caps.max_outputs = std::min(caps.max_outputs, std::max(cfg.batch_tokens, 1));
  // Sizes first, then the storage against the backends' memory (create_state), then the bookkeeping.
  KILN_TRY(KvCache::validate(cfg));
  caps.n_blocks = (cfg.n_ctx + cfg.block_size - 1) / cfg.block_size;
  std::unique_ptr<Engine> e(new Engine(model));
  KILN_ASSIGN_OR_RETURN(e->state_, model.create_state(caps));
  KILN_ASSIGN_OR_RETURN(e->cache_, KvCache::create(cfg));
  ModelState* st = e->state_.get();
  e->cache_->set_block_copier([st](int32_t s, int32_t d, int32_t n) { return st->copy_block(s, d, n); });
  e->count_.assign(cfg.max_seqs, 0);
  e->seq_index_.assign(cfg.max_seqs, -1);
  e->seqs_.reserve(cfg.max_seqs);
  e->dirty_.reserve(cfg.max_seqs);
  e->kinds_.assign(caps.max_outputs, OutputKind::kLogits);
  e->recurrent_ = e->state_->has_recurrent_state();
  e->state_pos_.assign(cfg.max_seqs, -1);
  e->verify_states_ = verify && e->recurrent_;
  e->verify_base_ = cfg.checkpoints;
  e->verify_pos_.assign(cfg.max_seqs, -1);
  return e;
}

Status Engine::fork(int32_t src, int32_t dst) {
  KILN_TRY(cache_->fork(src, dst));
  if (!recurrent_) return Status::ok();
  const Status st = state_->copy_seq_state(src, dst);
  state_pos_[dst] = st.is_ok() ? state_pos_[src] : -1;
  return st;
}

Status Engine::save_verify_state(int32_t seq) {
  if (!verify_states_ || !cache_->valid_seq(seq))
    return make_error(ErrorCode::kInternal, "save_verify_state: sequence %d (verify states: %s)", seq,
                      verify_states_ ? "on" : "off");
  const int64_t len = cache_->seq_len(seq);
  if (state_pos_[seq] != len)
    return make_error(ErrorCode::kInternal, "save_verify_state: the recurrent state of sequence %d is not at its "
                      "length %lld", seq, static_cast<long long>(len));
  verify_pos_[seq] = -1;
  KILN_TRY(state_->save_checkpoint(seq, verify_base_ + seq));
  verify_pos_[seq] = len;
  return Status::ok();
}

Status Engine::restore_verify_state(int32_t seq) {
  if (!verify_states_ || !cache_->valid_seq(seq) || verify_pos_[seq] < 0 || verify_pos_[seq] > cache_->seq_len(seq))
    return make_error(ErrorCode::kInternal, "restore_verify_state: no saved state of sequence %d to restore", seq);
  const int64_t len = verify_pos_[seq];
  verify_pos_[seq] = -1;
  cache_->truncate(seq, len);
  state_pos_[seq] = -1;
  KILN_TRY(state_->load_checkpoint(verify_base_ + seq, seq));
  state_pos_[seq] = len;
  return Status::ok();
}

int64_t Engine::attach_prefix(int32_t seq, std::span<const int32_t> tokens, int64_t limit) {
  KvCache& c = *cache_;
  if (!c.valid_seq(seq) || c.seq_len(seq) > 0 || !c.table(seq).empty()) return c.seq_len(seq);
  int32_t ckpt = -1;
  const int64_t got = c.attach_prefix(seq, tokens, limit, recurrent_ ? &ckpt : nullptr);
  if (!recurrent_ || got == 0) return got;
  // The state the checkpoint holds is for exactly `got` tokens (KvCache attaches whole blocks up to it).
  if (ckpt < 0 || !state_->load_checkpoint(ckpt, seq).is_ok()) {
    c.truncate(seq, 0);
    state_pos_[seq] = -1;
    return 0;
  }
  state_pos_[seq] = got;
  return got;
}

Status Engine::checkpoint(int32_t seq) {
  KvCache& c = *cache_;
  if (!recurrent_ || !checkpoints() || !c.valid_seq(seq)) return Status::ok();
  if (state_pos_[seq] != c.seq_len(seq))
    return make_error(ErrorCode::kInternal, "checkpoint: the recurrent state of sequence %d is not at its length %lld",
                      seq, static_cast<long long>(c.seq_len(seq)));
  const int32_t slot = c.add_checkpoint(seq);
  if (slot < 0) return Status::ok();
  Status st = state_->save_checkpoint(seq, slot);
  if (!st.is_ok()) c.drop_checkpoint(slot);
  return st;
}

int32_t Engine::bucket_tokens(int32_t n) const {
  if (!buckets() || n <= 0) return n;
  int32_t b = 1;
  while (b < n && b < 64) b *= 2;
  if (n > 64) b = (n + 63) / 64 * 64;
  return std::min(b, state_->caps().batch_tokens);
}

int32_t Engine::bucket_kv(int32_t n) const {
  const StepCaps& c = state_->caps();
  const int64_t cap = static_cast<int64_t>(c.max_blocks_per_seq()) * c.block_size;
  if (!buckets()) return n;
  int64_t b = 256;
  while (b < n) b *= 2;
  return static_cast<int32_t>(std::min<int64_t>(b, cap));
}

Status Engine::plan(std::span<const BatchToken> tokens, std::span<const OutputKind> kinds, bool hidden,
                    std::span<const uint64_t* const> masks, std::span<const float> hidden_in) {
  ModelState& S = *state_;
  StepPlan& P = S.plan();
  const StepCaps& caps = S.caps();
  const HParams& hp = model_.hparams();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 1 || n > caps.batch_tokens)
    return make_error(ErrorCode::kInvalidArgument, "step: %lld tokens (1 to %d per step)", static_cast<long long>(n),
                      caps.batch_tokens);
  KvCache& cache = *cache_;

  // 1. Value checks; sequences in order of first appearance; each sequence's tokens must be consecutive in the
  // batch (the per-sequence query ranges of tiled attention).
  seqs_.clear();
  int64_t n_out = 0;
  int32_t last_seq = -1;
  for (int64_t i = 0; i < n; ++i) {
    const BatchToken& t = tokens[i];
    if (t.token < 0 || t.token >= hp.n_vocab)
      return make_error(ErrorCode::kInvalidArgument, "batch token %lld: id %d is out of range [0, %lld)",
                        static_cast<long long>(i), t.token, static_cast<long long>(hp.n_vocab));
    if (!cache.valid_seq(t.seq_id))
      return make_error(ErrorCode::kInvalidArgument, "batch token %lld: sequence id %d is out of range [0, %d)",
                        static_cast<long long>(i), t.seq_id, cache.config().max_seqs);
    if (t.seq_id != last_seq) {
      if (seq_index_[t.seq_id] >= 0) {
        for (int32_t s : seqs_) seq_index_[s] = -1, count_[s] = 0;
        return make_error(ErrorCode::kInvalidArgument, "batch token %lld: the tokens of sequence %d are not "
                          "consecutive in the batch", static_cast<long long>(i), t.seq_id);
      }
      seq_index_[t.seq_id] = static_cast<int32_t>(seqs_.size());
      seqs_.push_back(t.seq_id);
      last_seq = t.seq_id;
    }
    if (hp.max_pos > 0 && t.pos >= hp.max_pos) {
      for (int32_t s : seqs_) seq_index_[s] = -1, count_[s] = 0;
      return make_error(ErrorCode::kInvalidArgument, "batch token %lld: position %d is past the model's %lld learned "
                        "positions", static_cast<long long>(i), t.pos, static_cast<long long>(hp.max_pos));
    }
    const int64_t expect = cache.seq_len(t.seq_id) + count_[t.seq_id];
    if (t.pos != expect) {
      for (int32_t s : seqs_) seq_index_[s] = -1, count_[s] = 0;
      return make_error(ErrorCode::kInvalidArgument, "batch token %lld: position %d does not continue sequence %d "
                        "(expected %lld)", static_cast<long long>(i), t.pos, t.seq_id,
                        static_cast<long long>(expect));
    }
    ++count_[t.seq_id];
    n_out += t.want_logits;
  }
  auto reset_scratch = [&] {
    for (int32_t s : seqs_) seq_index_[s] = -1, count_[s] = 0;
  };
  if (hidden && !caps.hidden) {
    reset_scratch();
    return make_error(ErrorCode::kInvalidArgument, "step: hidden states asked of an engine created without them");
  }
  const size_t in_floats = static_cast<size_t>(n) * static_cast<size_t>(hp.n_embd);
  if (P.hidden_in ? hidden_in.size() != in_floats : !hidden_in.empty()) {
    reset_scratch();
    return make_error(ErrorCode::kInvalidArgument, "step: %zu hidden input floats for %lld tokens (%s)",
                      hidden_in.size(), static_cast<long long>(n),
                      P.hidden_in ? "the model takes a hidden row of n_embd floats per token" : "the model takes none");
  }
  if (n_out > caps.max_outputs || static_cast<int64_t>(kinds.size()) < n_out) {
    reset_scratch();
    return make_error(ErrorCode::kInvalidArgument, "step: %lld outputs (at most %d per step, %zu kinds given)",
                      static_cast<long long>(n_out), caps.max_outputs, kinds.size());
  }
  bool masked = false;
  for (int64_t j = 0; j < n_out; ++j) {
    if (kinds[j] != OutputKind::kMaskedArgmax) continue;
    masked = true;
    if (!S.supports_masked_argmax() || static_cast<int64_t>(masks.size()) <= j || !masks[j]) {
      reset_scratch();
      return make_error(ErrorCode::kInvalidArgument, "step: output %lld is a masked argmax %s",
                        static_cast<long long>(j), S.supports_masked_argmax() ? "without its mask" :
                        "(the output backend does not run argmax_masked)");
    }
  }
  // Encoders: bidirectional attention needs a sequence's every token in the step that runs it, and there are no
  // logits.
  if (!hp.causal) {
    for (int32_t id : seqs_)
      if (cache.seq_len(id) > 0) {
        const int64_t at = cache.seq_len(id);
        reset_scratch();
        return make_error(ErrorCode::kInvalidArgument, "sequence %d continues at position %lld, but %s is an encoder: "
                          "a sequence runs whole in one step", id, static_cast<long long>(at), hp.arch.c_str());
      }
    if (n_out > 0) {
      reset_scratch();
      return make_error(ErrorCode::kUnsupported, "step: %s is an encoder: it gives hidden states (embeddings), not "
                        "logits", hp.arch.c_str());
    }
  }
  // Hybrid models: a sequence continues only from where its recurrent state is (see engine.h).
  if (recurrent_)
    for (int32_t id : seqs_) {
      const int64_t at = cache.seq_len(id);
      if (at > 0 && state_pos_[id] != at) {
        const int64_t have = state_pos_[id];
        reset_scratch();
        return make_error(ErrorCode::kInvalidArgument, "sequence %d continues at position %lld, but its recurrent "
                          "state is %s %lld (a hybrid model cannot resume a truncated sequence: restart it from "
                          "position 0)", id, static_cast<long long>(at), have < 0 ? "invalid, at" : "at",
                          static_cast<long long>(have < 0 ? 0 : have));
      }
    }
  // 2. Blocks.
  for (size_t s = 0; s < seqs_.size(); ++s) {
    Status st = cache.reserve(seqs_[s], count_[seqs_[s]]);
    if (!st.is_ok()) {
      for (size_t r = 0; r < s; ++r) cache.truncate(seqs_[r], cache.seq_len(seqs_[r]));  // drop new reservations
      reset_scratch();
      return st;
    }
  }
  // 3. The plan: per token, per sequence, outputs, buckets, dirty table rows.
  const int32_t nb = bucket_tokens(static_cast<int32_t>(n));
  const int64_t bs = caps.block_size;
  int32_t max_len = 0, j = 0;
  for (int64_t i = 0; i < n; ++i) {
    const BatchToken& t = tokens[i];
    P.token[i] = t.token;
    P.pos[i] = t.pos;
    P.slot[i] = static_cast<int32_t>(cache.table(t.seq_id)[t.pos / bs] * bs + t.pos % bs);
    P.tok_table[i] = t.seq_id;
    P.kv_len[i] = hp.causal ? t.pos + 1 : static_cast<int32_t>(count_[t.seq_id]);  // encoders: the whole sequence
    max_len = std::max(max_len, P.kv_len[i]);
    if (t.want_logits) {
      P.out_kind[j] = kinds[j];
      P.out_rows[j++] = static_cast<int32_t>(i);
    }
  }
  for (int64_t i = n; i < nb; ++i) P.token[i] = 0, P.pos[i] = 0, P.slot[i] = -1, P.tok_table[i] = 0, P.kv_len[i] = 0;
  const int32_t mb = std::min({bucket_tokens(j), nb, caps.max_outputs});
  for (int32_t i = j; i < mb; ++i) P.out_rows[i] = 0;
  int32_t start = 0, max_q = 0;
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const int32_t id = seqs_[s];
    P.seq_row[s] = id;
    P.seq_q_start[s] = start;
    P.seq_q_len[s] = static_cast<int32_t>(count_[id]);
    P.seq_kv_len[s] = static_cast<int32_t>(cache.seq_len(id) + count_[id]);
    P.seq_reset[s] = cache.seq_len(id) == 0 ? 1 : 0;
    start += P.seq_q_len[s];
    max_q = std::max(max_q, P.seq_q_len[s]);
  }
  // Per-sequence entries past n_seq read as empty sequences (a kernel sized by a bucket may look at them).
  if (buckets())
    for (int32_t s = static_cast<int32_t>(seqs_.size()); s < std::min<int32_t>(caps.max_seqs, nb); ++s)
      P.seq_row[s] = 0, P.seq_q_start[s] = static_cast<int32_t>(n), P.seq_q_len[s] = 0, P.seq_kv_len[s] = 0,
      P.seq_reset[s] = 0;
  P.n_tok = static_cast<int32_t>(n);
  P.n_bucket = nb;
  P.n_out = j;
  P.n_out_bucket = j == 0 ? 0 : mb;
  P.n_seq = static_cast<int32_t>(seqs_.size());
  P.max_kv_len = bucket_kv(max_len);
  P.max_q_len = max_q;
  P.hidden = hidden;
  P.masked = masked;
  if (P.hidden_in) std::memcpy(P.hidden_in, hidden_in.data(), in_floats * sizeof(float));
  if (masked) plan_masks(masks);
  dirty_.clear();
  cache.take_dirty(dirty_);
  const int64_t MB = caps.max_blocks_per_seq();
  for (int32_t r : dirty_) {
    const std::vector<int32_t>& tb = cache.table(r);
    int32_t* row = P.tables + static_cast<int64_t>(r) * MB;
    std::copy(tb.begin(), tb.end(), row);
    std::fill(row + tb.size(), row + MB, 0);
    P.dirty_rows.push_back(r);
  }
  return Status::ok();
}

void Engine::plan_masks(std::span<const uint64_t* const> masks) {
  StepPlan& P = state_->plan();
  const size_t W = static_cast<size_t>(P.mask_words);
  for (int32_t j = 0; j < P.n_out; ++j) {
    uint64_t* row = P.out_mask + static_cast<size_t>(j) * W;
    if (P.out_kind[j] == OutputKind::kMaskedArgmax) std::memcpy(row, masks[static_cast<size_t>(j)], W * sizeof(uint64_t));
    else if (P.out_kind[j] == OutputKind::kArgmax) std::fill(row, row + W, ~uint64_t{0});
  }
}

Result<StepOutputs> Engine::step(std::span<const BatchToken> tokens, std::span<const OutputKind> kinds,
                                 bool hidden, std::span<const uint64_t* const> masks,
                                 std::span<const float> hidden_in) {
  KILN_TRY(plan(tokens, kinds, hidden, masks, hidden_in));
  Status st = state_->execute();
  if (st.is_ok())
    for (int32_t s : seqs_) st = st.is_ok() ? cache_->commit(s, count_[s]) : st;
  if (!st.is_ok()) {
    for (int32_t s : seqs_) cache_->truncate(s, cache_->seq_len(s));
  }
  if (recurrent_)  // the state now matches the new length; after a failure it may be half updated: invalid
    for (int32_t s : seqs_) state_pos_[s] = st.is_ok() ? cache_->seq_len(s) : -1;
  for (int32_t s : seqs_) seq_index_[s] = -1, count_[s] = 0;
  if (!st.is_ok()) return st;
  return state_->fetch();
}

Status Engine::forward(const Batch& batch, std::vector<float>* logits) {
  size_t used = 0;  // floats of `logits` written (its storage is kept: no zero fill of rows about to be copied)
  const StepCaps& caps = state_->caps();
  const int64_t n_vocab = model_.hparams().n_vocab;
  const std::vector<BatchToken>& all = batch.tokens;
  size_t i = 0;
  while (i < all.size()) {
    // The longest run within the caps.
    size_t e = i;
    int32_t outs = 0;
    while (e < all.size() && e - i < static_cast<size_t>(caps.batch_tokens) &&
           outs + (all[e].want_logits ? 1 : 0) <= caps.max_outputs)
      outs += all[e++].want_logits;
    std::span<const BatchToken> chunk(all.data() + i, e - i);
    auto out = step(chunk, kinds_);
    if (!out) return out.status();
    if (logits && out->n_out > 0) {
      const size_t n = static_cast<size_t>(out->n_out * n_vocab);
      if (logits->size() < used + n) logits->resize(used + n);
      std::memcpy(logits->data() + used, out->logits, n * sizeof(float));
      used += n;
    }
    i = e;
  }
  if (logits) logits->resize(used);
  return Status::ok();
}

}  // namespace kiln
