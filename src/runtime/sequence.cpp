#include "runtime/sequence.h"

#include <algorithm>
#include <cmath>

namespace kiln {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kNone: return "none";
    case StopReason::kEog: return "eog";
    case StopReason::kLimit: return "limit";
    case StopReason::kContextFull: return "context_full";
    case StopReason::kStopString: return "stop_string";
    case StopReason::kCancelled: return "cancelled";
    case StopReason::kTimeout: return "timeout";
  }
  return "?";
}

Sequence::Sequence(int32_t seq_id, const Tokenizer& tok, int32_t n_vocab, int64_t n_ctx, const SequenceOptions& opts,
                   KvCache& cache)
    : id_(seq_id), tok_(tok), n_vocab_(n_vocab), n_ctx_(n_ctx), opts_(opts), sampler_(opts.sampling, n_vocab),
      decoder_(tok), cache_(cache), reasoning_(opts.reasoning) {
  if (!opts.text_tokens.empty()) decoder_.render_as_text(opts.text_tokens);
}

Status Sequence::validate() const {
  KILN_TRY(sampler_.validate());
  if (opts_.max_new_tokens < -1)
    return make_error(ErrorCode::kInvalidArgument, "max_new_tokens: must be >= -1 (got %d)", opts_.max_new_tokens);
  if (n_ctx_ <= 0) return make_error(ErrorCode::kInvalidArgument, "n_ctx: must be > 0 (got %lld)", (long long)n_ctx_);
  return Status::ok();
}

Status Sequence::append(std::span<const int32_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= n_vocab_)
      return make_error(ErrorCode::kInvalidArgument, "token %zu: id %d is outside the vocabulary [0, %d)", i, ids[i],
                        n_vocab_);
  if (static_cast<int64_t>(tokens_.size() + ids.size()) > n_ctx_)
    return make_error(ErrorCode::kOutOfRange,
                      "context full: sequence %d holds %zu tokens and %zu more exceed its context of %lld tokens "
                      "(raise -c)",
                      id_, tokens_.size(), ids.size(), (long long)n_ctx_);
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  for (int32_t t : ids) sampler_.accept(t);
  return Status::ok();
}

void Sequence::truncate(int64_t pos) {
  pos = std::clamp<int64_t>(pos, 0, static_cast<int64_t>(tokens_.size()));
  tokens_.resize(static_cast<size_t>(pos));
  cache_.truncate(id_, pos);
  n_scheduled_ = 0;
  scheduled_logits_ = false;
  sampler_.clear_history();
  const int64_t last_n = sampler_.history_window();
  size_t from = last_n < 0 ? 0 : tokens_.size() - std::min(tokens_.size(), static_cast<size_t>(last_n));
  for (size_t i = from; i < tokens_.size(); ++i) sampler_.accept(tokens_[i]);
}

size_t Sequence::schedule(Batch& batch, size_t max_n) {
  if (n_scheduled_ != 0) return 0;
  const size_t start = static_cast<size_t>(n_cached());
  const size_t n = std::min(max_n, tokens_.size() - start);
  for (size_t i = 0; i < n; ++i) {
    const size_t p = start + i;
    batch.add(tokens_[p], static_cast<int32_t>(p), id_, !opts_.no_outputs && p + 1 == tokens_.size());
  }
  n_scheduled_ = static_cast<int64_t>(n);
  scheduled_logits_ = !opts_.no_outputs && n > 0 && start + n == tokens_.size();
  return n;
}

size_t Sequence::schedule_drafts(Batch& batch, std::span<const int32_t> drafts) {
  const size_t np = n_pending();
  if (n_scheduled_ != 0 || np == 0) return 0;
  const int64_t p = n_cached(), end = p + static_cast<int64_t>(np);
  for (int64_t i = p; i < end; ++i) batch.add(tokens_[static_cast<size_t>(i)], static_cast<int32_t>(i), id_, i + 1 == end);
  for (size_t i = 0; i < drafts.size(); ++i) batch.add(drafts[i], static_cast<int32_t>(end + static_cast<int64_t>(i)), id_, true);
  n_scheduled_ = static_cast<int64_t>(np);
  verify_base_ = end;
  scheduled_logits_ = true;
  return np + drafts.size();
}

void Sequence::settle_drafts(size_t n_confirmed) {
  if (verify_base_ < 0) return;
  // tokens_ now ends with the confirmed drafts and, unless the sequence stopped, the last sample (pending)
  const int64_t keep = std::min<int64_t>(verify_base_ + static_cast<int64_t>(n_confirmed),
                                         static_cast<int64_t>(tokens_.size()));
  cache_.truncate(id_, keep);
  verify_base_ = -1;
}

void Sequence::commit() { n_scheduled_ = 0; }

void Sequence::rollback() {
  n_scheduled_ = 0;
  scheduled_logits_ = false;
  verify_base_ = -1;
}

void Sequence::begin_turn() {
  n_generated_ = 0;
  stop_ = StopReason::kNone;
  reasoning_ = ReasoningTracker(opts_.reasoning);
}

OutputKind Sequence::output_kind() const {
  const bool hooks_read_row = !hooks_.processors.empty() || (hooks_.mask && hooks_.mask->restricts());
  return sampler_.argmax_only() && !hooks_read_row ? OutputKind::kArgmax : OutputKind::kLogits;
}

OutputKind Sequence::prepare_output(bool device_mask) {
  const OutputKind k = output_kind();
  TokenMaskProvider* m = hooks_.mask.get();
  if (k != OutputKind::kLogits || !device_mask || !sampler_.argmax_only() || !hooks_.processors.empty() || !m ||
      !m->allowed_ahead())
    return k;
  // on_token emits a forced token whatever the device chose (and on_logits would not ask the mask); a stopped
  // sequence emits nothing.
  if (reasoning_.forced() >= 0 || stop_ != StopReason::kNone) return OutputKind::kArgmax;
  mask_.assign((static_cast<size_t>(n_vocab_) + 63) / 64, ~uint64_t{0});
  return m->allowed(mask_) ? OutputKind::kMaskedArgmax : OutputKind::kArgmax;
}

Sequence::Step Sequence::no_token_allowed() {
  scheduled_logits_ = false;
  Step s;
  s.stop = stop_ = StopReason::kCancelled;
  s.error = make_error(ErrorCode::kInvalidArgument, "token mask: no token of the vocabulary is allowed next "
                       "(after %d generated tokens)", n_generated_);
  return s;
}

Sequence::Step Sequence::on_masked_token(int32_t id) {
  if (id < 0 && stop_ == StopReason::kNone && reasoning_.forced() < 0) return no_token_allowed();
  return on_token(id);
}

Sequence::Step Sequence::on_logits(std::span<const float> row) {
  if (stop_ != StopReason::kNone) {
    scheduled_logits_ = false;
    Step s;
    s.stop = stop_;
    return s;
  }
  // A forced token (the close of a spent reasoning budget) needs no sampling, and no mask: on_token emits it.
  if (const int32_t f = reasoning_.forced(); f >= 0) return on_token(f);
  if (hooks_.processors.empty() && !hooks_.mask) return on_token(sampler_.sample(row));
  // The chain works on this sequence's own copy; the fetched row stays as the model wrote it (logprobs read it).
  row_.assign(row.begin(), row.end());
  for (auto& p : hooks_.processors) p->process(row_);
  if (hooks_.mask) {
    mask_.assign((row_.size() + 63) / 64, ~uint64_t{0});
    if (hooks_.mask->allowed(mask_)) {
      // Word by word: a grammar's masks are mostly all-zero words (and all-one runs inside strings).
      size_t n_allowed = 0;
      for (size_t w = 0; w < mask_.size(); ++w) {
        const size_t b = w * 64, e = std::min(b + 64, row_.size());
        const uint64_t bits = e - b == 64 ? mask_[w] : mask_[w] & ((uint64_t{1} << (e - b)) - 1);
        n_allowed += static_cast<size_t>(__builtin_popcountll(bits));
        if (bits == ~uint64_t{0}) continue;
        if (bits == 0) {
          std::fill(row_.begin() + static_cast<std::ptrdiff_t>(b), row_.begin() + static_cast<std::ptrdiff_t>(e),
                    -INFINITY);
          continue;
        }
        for (size_t i = b; i < e; ++i)
          if (!((bits >> (i - b)) & 1)) row_[i] = -INFINITY;
      }
      if (n_allowed == 0) return no_token_allowed();
      // Greedy on the argmax alone: the argmax of the allowed tokens with the backend's rule (Backend::
      // argmax_masked), as the device path takes it: never a disallowed token, even where every allowed logit is
      // -inf or NaN.
      if (sampler_.argmax_only()) return on_token(masked_argmax(row_, mask_));
    }
  }
  return on_token(sampler_.sample(row_));
}

Sequence::Step Sequence::on_token(int32_t t) {
  Step s;
  scheduled_logits_ = false;
  if (stop_ != StopReason::kNone) {
    s.stop = stop_;
    return s;
  }
  if (opts_.max_new_tokens == 0) {  // nothing to generate: the prompt only fills the cache
    s.stop = stop_ = StopReason::kLimit;
    return s;
  }
  if (const int32_t f = reasoning_.forced(); f >= 0) t = f;  // the device's argmax gives way to a forced token
  const bool eog = !opts_.ignore_eos && tok_.is_eog(t);
  if (!eog && reasoning_.state() != ReasoningTracker::State::kDone) {
    // The tracker reads the token first: the mask learns which of its bytes are the thinking block's.
    const std::string piece = tok_.token_to_piece(t, true);
    const size_t n_block = reasoning_.accept(t, piece);
    if (hooks_.mask) hooks_.mask->accept_in_block(t, piece, n_block);
  } else if (hooks_.mask) {
    hooks_.mask->accept(t);
  }
  if (eog) {
    s.stop = stop_ = StopReason::kEog;
    return s;
  }
  s.token = t;
  s.piece = decoder_.push(t);
  ++n_generated_;
  if (hooks_.mask && hooks_.mask->finished()) {  // e.g. a grammar that accepted and allows nothing more
    s.stop = stop_ = StopReason::kEog;
    return s;
  }
  if (opts_.max_new_tokens >= 0 && n_generated_ >= opts_.max_new_tokens) {
    s.stop = stop_ = StopReason::kLimit;
    return s;
  }
  // The sampled token needs a slot to be fed (so the next one can be sampled).
  if (static_cast<int64_t>(tokens_.size()) + 1 > n_ctx_) {
    s.stop = stop_ = StopReason::kContextFull;
    return s;
  }
  tokens_.push_back(t);
  sampler_.accept(t);
  return s;
}

}  // namespace kiln
