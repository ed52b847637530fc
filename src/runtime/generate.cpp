#include "runtime/generate.h"

#include <algorithm>

#include "util/timer.h"

namespace kiln {

Generator::Generator(Model& model, KvCache& cache, int32_t seq_id, const GenerateOptions& opts, int64_t n_ctx)
    : model_(model), cache_(cache), opts_(opts),
      seq_(seq_id, model.tokenizer(), static_cast<int32_t>(model.hparams().n_vocab),
           n_ctx > 0 ? std::min<int64_t>(n_ctx, cache.config().n_ctx) : cache.config().n_ctx, opts.seq) {}

Status Generator::validate() const {
  if (opts_.n_batch < 1) return make_error(ErrorCode::kInvalidArgument, "n_batch: must be >= 1 (got %d)", opts_.n_batch);
  return seq_.validate();
}

Status Generator::run_pending(bool count_as_prompt) {
  Timer t;
  int64_t n_fed = 0;
  while (seq_.n_pending() > 0) {
    batch_.clear();
    const size_t n = seq_.schedule(batch_, static_cast<size_t>(opts_.n_batch));
    const bool want = seq_.scheduled_wants_logits();
    Status st = model_.forward(batch_, cache_, &logits_);
    if (!st.is_ok()) {
      seq_.rollback();
      logits_ready_ = false;
      return st;
    }
    seq_.commit();
    n_fed += static_cast<int64_t>(n);
    logits_ready_ = want;
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
  cache_.truncate(seq_.id(), static_cast<int64_t>(common));
  seq_.truncate(static_cast<int64_t>(common));
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
  const int64_t n_vocab = model_.hparams().n_vocab;
  t.reset();
  while (stop == StopReason::kNone) {
    const size_t n_rows = logits_.size() / static_cast<size_t>(n_vocab);
    std::span<const float> row(logits_.data() + (n_rows - 1) * n_vocab, static_cast<size_t>(n_vocab));
    Sequence::Step step = seq_.on_logits(row);
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
