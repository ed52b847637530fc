#include "runtime/generate.h"

#include <algorithm>

#include "util/timer.h"

namespace kiln {

Generator::Generator(Engine& engine, int32_t seq_id, const GenerateOptions& opts, int64_t n_ctx)
    : engine_(engine), opts_(opts),
      seq_(seq_id, engine.model().tokenizer(), static_cast<int32_t>(engine.model().hparams().n_vocab),
           n_ctx > 0 ? std::min<int64_t>(n_ctx, engine.cache().config().n_ctx) : engine.cache().config().n_ctx,
           opts.seq, engine.cache()) {}

Status Generator::validate() const {
  if (opts_.n_batch < 1) return make_error(ErrorCode::kInvalidArgument, "n_batch: must be >= 1 (got %d)", opts_.n_batch);
  return seq_.validate();
}

Status Generator::run_pending(bool count_as_prompt) {
  Timer t;
  int64_t n_fed = 0;
  const size_t chunk = static_cast<size_t>(std::min(opts_.n_batch, engine_.caps().max_tokens));
  while (seq_.n_pending() > 0) {
    batch_.clear();
    const size_t n = seq_.schedule(batch_, chunk);
    const bool want = seq_.scheduled_wants_logits();
    const OutputKind kind = opts_.keep_logits ? OutputKind::kLogits : seq_.output_kind();
    auto out = engine_.step(batch_.tokens, std::span<const OutputKind>(&kind, 1));
    if (!out) {
      seq_.rollback();
      logits_ready_ = false;
      return out.status();
    }
    seq_.commit();
    n_fed += static_cast<int64_t>(n);
    logits_ready_ = want;
    if (want) {
      argmax_ = out->argmax[0];
      have_row_ = kind == OutputKind::kLogits;
      if (have_row_) logits_.assign(out->row(0), out->row(0) + out->n_vocab);
    }
  }
  if (count_as_prompt) {
    timings_.n_prompt += n_fed;
    timings_.prompt_s += t.seconds();
  }
  return Status::ok();
}

Status Generator::feed(std::span<const int32_t> tokens) {
  KILN_TRY(seq_.append(tokens));
  return run_pending(true);
}

Status Generator::sync(std::span<const int32_t> tokens) {
  const auto& have = seq_.tokens();
  size_t common = 0;
  const size_t cached = static_cast<size_t>(seq_.n_cached());
  while (common < cached && common < tokens.size() && have[common] == tokens[common]) ++common;
  // Re-feed at least the last token: its logits are what the next sample needs.
  if (common == tokens.size() && common > 0) --common;
  // A hybrid model's recurrent state cannot be cut back: any truncation restarts the sequence (Engine).
  if (engine_.recurrent() && common < cached) common = 0;
  seq_.truncate(static_cast<int64_t>(common));  // and the cache
  logits_ready_ = false;
  return feed(tokens.subspan(common));
}

Result<StopReason> Generator::generate(const TokenCallback& on_token) {
  seq_.begin_turn();
  Timer t;
  StopReason stop = StopReason::kNone;
  if (seq_.n_pending() > 0) KILN_TRY(run_pending(true));
  if (!logits_ready_)
    return make_error(ErrorCode::kInvalidArgument, "generate: no logits to sample from (feed a prompt first)");
  // n_predict 0: nothing to generate.
  if (opts_.seq.n_predict == 0) return StopReason::kLimit;
  t.reset();
  while (stop == StopReason::kNone) {
    Sequence::Step step = have_row_ ? seq_.on_logits(logits_) : seq_.on_token(argmax_);
    logits_ready_ = false;
    if (step.token >= 0) {
      ++timings_.n_gen;
      if (on_token && !on_token(step.token, step.piece)) {
        seq_.stop(StopReason::kCallback);
        // The sampled token was queued for feeding; it is not needed any more.
        seq_.truncate(seq_.n_cached());
        stop = StopReason::kCallback;
        break;
      }
    }
    stop = step.stop;
    if (stop != StopReason::kNone) break;
    Status st = run_pending(false);
    if (!st.is_ok()) {
      timings_.gen_s += t.seconds();
      return st;
    }
  }
  timings_.gen_s += t.seconds();
  if (on_token) {
    std::string tail = seq_.flush_text();
    if (!tail.empty()) on_token(-1, tail);
  }
  return stop;
}

}  // namespace kiln
