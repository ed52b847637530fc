// One step of the engine loop (runtime/scheduler.h): schedule -> execute -> update, on the engine thread.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "runtime/ngram_draft.h"
#include "runtime/scheduler_impl.h"

namespace kiln {

namespace {

// Log-softmax of the raw logits: the sampled token's logprob and the top k alternatives.
void logprobs_of(std::span<const float> row, int32_t id, int32_t k, TokenEvent* ev) {
  float mx = -INFINITY;
  for (float v : row) mx = std::max(mx, v);
  double sum = 0;
  for (float v : row) sum += std::exp(static_cast<double>(v - mx));
  const double logz = mx + std::log(sum);
  if (id >= 0 && id < static_cast<int32_t>(row.size())) ev->logprob = static_cast<float>(row[id] - logz);
  if (k <= 0) return;
  std::vector<TokenLogprob> top;
  top.reserve(k + 1);
  for (int32_t i = 0; i < static_cast<int32_t>(row.size()); ++i) {
    if (static_cast<int32_t>(top.size()) == k && !(row[i] > top.back().logprob)) continue;
    TokenLogprob t{i, row[i]};
    auto it = std::upper_bound(top.begin(), top.end(), t,
                               [](const TokenLogprob& a, const TokenLogprob& b) { return a.logprob > b.logprob; });
    top.insert(it, t);
    if (static_cast<int32_t>(top.size()) > k) top.pop_back();
  }
  for (auto& t : top) t.logprob = static_cast<float>(t.logprob - logz);
  ev->top = std::move(top);
}

}  // namespace

// ---- the loop ----

void Scheduler::Impl::loop() {
  while (step()) {
  }
  // Shutdown: everything left is cancelled.
  for (auto& a : active) finish(*a, StopReason::kCancelled);
  active.clear();
  for (auto& h : waiting) finish_waiting(h, StopReason::kCancelled);
  waiting.clear();
  publish();
}

bool Scheduler::Impl::step() {
  if (!take_incoming()) return false;
  expire();
  if (active.empty() && waiting.empty()) {
    publish();
    return true;
  }
  schedule();
  if (batch.size() == 0) {
    stall();
  } else {
    StepOutputs out;
    if (execute(&out)) update(out);
  }
  publish();
  return true;
}

bool Scheduler::Impl::take_incoming() {
  std::unique_lock<std::mutex> lk(mu);
  if (active.empty() && waiting.empty() && incoming.empty() && !stop)
    cv.wait(lk, [&] { return stop || !incoming.empty(); });
  if (stop) return false;
  while (!incoming.empty()) {
    waiting.push_back(std::move(incoming.front()));
    incoming.pop_front();
  }
  if (cancel_all) {
    for (auto& a : active) a->h->cancel();
    for (auto& h : waiting) h->cancel();
  }
  return true;
}

void Scheduler::Impl::expire() {
  const auto now = Clock::now();
  for (auto& a : active) {
    if (a->h->cancelled()) finish(*a, StopReason::kCancelled);
    else if (now >= a->deadline) finish(*a, StopReason::kTimeout);
  }
  remove_finished();
  for (auto it = waiting.begin(); it != waiting.end();) {
    RequestHandle& h = **it;
    const bool late = h.request().timeout_s > 0 &&
                      now - h.submitted() >= std::chrono::duration<double>(h.request().timeout_s);
    if (h.cancelled() || late) {
      finish_waiting(*it, h.cancelled() ? StopReason::kCancelled : StopReason::kTimeout);
      it = waiting.erase(it);
    } else {
      ++it;
    }
  }
}

// ---- schedule(): which sequences, how many tokens each ----

bool Scheduler::Impl::has_kv(const Active& a) const {
  const KvCache& cache = engine->cache();
  return cache.seq_len(a.slot) > 0 || !cache.table(a.slot).empty();
}

bool Scheduler::Impl::decoding(const Active& a) const {
  // (an embedding request only ever has prompt left)
  return !a.pool && has_kv(a) && (a.seq->n_pending() == 1 || (a.replay && a.seq->n_pending() > 0));
}

int64_t Scheduler::Impl::fit(const Active& a, int64_t n, int64_t free_blocks) const {
  const KvCache& cache = engine->cache();
  if (cache.blocks_needed(a.slot, n) <= free_blocks) return n;
  int64_t lo = 0, hi = n;  // blocks_needed(lo) fits, blocks_needed(hi) does not
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (cache.blocks_needed(a.slot, mid) <= free_blocks ? lo : hi) = mid;
  }
  return lo;
}

void Scheduler::Impl::attach(Active& a) {
  // Embedding requests pool every token's state (mean, none, cls): they compute their whole input.
  if (!cfg.prefix_cache || has_kv(a) || a.pool) return;
  const auto& toks = a.seq->tokens();
  const int64_t got = engine->attach_prefix(a.slot, toks, static_cast<int64_t>(toks.size()) - 1);
  if (!a.started) a.tm.n_cached = got;
  std::lock_guard<std::mutex> lk(stats_mu);
  stats.prefix_hit_tokens += static_cast<uint64_t>(got);
}

bool Scheduler::Impl::checkpoint_at(const Active& a, int64_t pos) const {
  if (pos <= 0 || pos > a.ckpt_last) return false;
  return pos == a.ckpt_last || (a.ckpt_every > 0 && pos % a.ckpt_every == 0);
}

int64_t Scheduler::Impl::next_checkpoint(const Active& a, int64_t pos) const {
  if (pos >= a.ckpt_last) return INT64_MAX;
  const int64_t every = a.ckpt_every > 0 ? (pos / a.ckpt_every + 1) * a.ckpt_every : INT64_MAX;
  return std::min(every, a.ckpt_last);
}

int64_t Scheduler::Impl::prompt_chunk(const Active& a) const {
  const int64_t at = a.seq->n_cached();
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(a.seq->n_pending()), tokens_left);
  const int64_t next = next_checkpoint(a, at);
  return next == INT64_MAX ? n : std::min(n, next - at);
}

void Scheduler::Impl::preempt(Active& a) {
  engine->cache().truncate(a.slot, 0);  // the tokens stay in the Sequence: all pending again
  a.prefill_from = -1;                  // its recomputation is a prefill of its own (on_prefill)
  a.replay = false;
  if (a.pool) a.pool->reset();          // its rows come again
  ++a.tm.n_preempted;
  a.preempted_now = true;
  ++info.n_preempted;
}

void Scheduler::Impl::put(Active& a, size_t n) {
  // The blocks now (the engine's plan finds them reserved); n fits: checked by the caller.
  if (!engine->cache().reserve(a.slot, static_cast<int64_t>(n)).is_ok()) return;
  // A hybrid model verifies drafts from a saved recurrent state (rolled back in settle()); without it, no drafts.
  if (!a.draft.empty() && engine->recurrent() && !engine->save_verify_state(a.slot).is_ok()) a.draft.clear();
  a.tok0 = batch.size();
  a.pos0 = a.seq->n_cached();
  const size_t pending = a.seq->n_pending();
  const size_t got = a.draft.empty() ? a.seq->schedule(batch, n) : a.seq->schedule_drafts(batch, a.draft);
  a.n_sched = got;
  if (got >= pending) a.replay = false;
  a.scheduled = true;
  a.wants = a.seq->scheduled_wants_logits();
  if (!a.started) {
    a.started = true;
    a.t_sched = Clock::now();
    a.tm.queue_ms = ms_between(a.h->submitted(), a.t_sched);
  }
  tokens_left -= static_cast<int64_t>(got);
  if (a.wants) outs_left -= 1 + static_cast<int64_t>(a.draft.size());
  sched.push_back(&a);
  if (observer) info.entries.push_back({a.h->id(), static_cast<int32_t>(got), a.wants});
}

int64_t Scheduler::Impl::decode_room(Active& a) {
  if (a.preempted_now || !decoding(a)) return 0;  // preempted by an older sequence's decode in this step
  KvCache& cache = engine->cache();
  // The pending token; a replay's tokens, as many as the step has room for (drafts only after all of them).
  const int64_t pending = static_cast<int64_t>(a.seq->n_pending()), p = std::min(pending, tokens_left);
  // No free block: preempt the newest sequence that holds blocks and is not in this step (itself, when newest).
  while (cache.blocks_needed(a.slot, p) > cache.n_blocks_free()) {
    Active* victim = nullptr;
    for (size_t j = active.size(); j-- > 0;)
      if (has_kv(*active[j]) && !active[j]->scheduled) {
        victim = active[j].get();
        break;
      }
    if (!victim) return 0;
    preempt(*victim);
    if (victim == &a) return 0;
  }
  return p < pending ? p : p + propose_drafts(a);
}

// Drafts to verify after a's pending token (runtime/hooks.h DraftProposer), within what the step has left: tokens,
// output rows, the sequence's context and free KV blocks (drafts never preempt). Fewer than spec.draft_min: none.
int64_t Scheduler::Impl::propose_drafts(Active& a) {
  DraftProposer* d = a.seq->hooks().drafts.get();
  if (!d) return 0;
  KvCache& cache = engine->cache();
  const int64_t p = static_cast<int64_t>(a.seq->n_pending());
  const int64_t room = std::max<int64_t>(0, std::min({draft_limit(a), tokens_left - p, outs_left - 1}));
  int64_t k = d->propose(a.seq->tokens(), static_cast<int32_t>(room),
                         std::span<int32_t>(drafts.data(), static_cast<size_t>(room)));
  k = std::clamp<int64_t>(k, 0, room);
  for (int64_t i = 0; i < k; ++i)  // a proposer's id outside the vocabulary ends the drafts there
    if (drafts[static_cast<size_t>(i)] < 0 || drafts[static_cast<size_t>(i)] >= model->hparams().n_vocab) k = i;
  while (k > 0 && cache.blocks_needed(a.slot, p + k) > cache.n_blocks_free()) --k;
  if (k == 0 || k < a.spec_min) return 0;
  a.draft.assign(drafts.begin(), drafts.begin() + k);
  return k;
}

// A sequence's own draft limit: the request's, the proposers' buffer, its last token and its context.
int64_t Scheduler::Impl::draft_limit(const Active& a) const {
  // Past the request's last token a draft could not be emitted: the pending token's sample is one of those left.
  const int32_t max_new = a.h->request().max_new_tokens;
  const int64_t left = max_new < 0 ? INT64_MAX : static_cast<int64_t>(max_new) - a.seq->n_generated() - 1;
  return std::max<int64_t>(0, std::min<int64_t>({static_cast<int64_t>(drafts.size()), static_cast<int64_t>(a.spec_max),
                                                 left, a.seq->n_ctx() - static_cast<int64_t>(a.seq->tokens().size())}));
}

// Batched drafting (runtime/hooks.h DraftBatch): the decoding sequences whose proposers share a batch (the first
// such batch met; a proposer of another drafts alone) draft together, in the order the step takes them, before
// decode_room asks each one; propose_drafts then gets the same ids as without the batch.
void Scheduler::Impl::draft_ahead() {
  draft_jobs.clear();
  DraftBatch* group = nullptr;
  for (Active* a : order) {
    if (!decoding(*a)) break;  // the decoding sequences come first
    DraftJob j;
    DraftProposer* d = a->seq->hooks().drafts.get();
    DraftBatch* b = d ? d->batch() : nullptr;
    if (b && (!group || b == group)) {
      group = b;
      j.proposer = d;
      j.tokens = a->seq->tokens();
      j.max_k = static_cast<int32_t>(draft_limit(*a));
    }
    draft_jobs.push_back(j);
  }
  if (group) group->propose(draft_jobs, std::min(tokens_left, outs_left));
}

int64_t Scheduler::Impl::chunk_room(Active& a) {
  if (a.scheduled || a.preempted_now || a.seq->n_pending() == 0) return 0;
  if (has_kv(a) && a.seq->n_pending() == 1 && a.got_first) return 0;  // a decode that found no room
  attach(a);
  return whole_or_none(a, fit(a, prompt_chunk(a), engine->cache().n_blocks_free()));
}

int64_t Scheduler::Impl::whole_or_none(const Active& a, int64_t n) const {
  return model->hparams().causal || n >= static_cast<int64_t>(a.seq->n_pending()) ? n : 0;
}

std::unique_ptr<Active> Scheduler::Impl::make_active(const std::shared_ptr<RequestHandle>& h, int32_t slot) {
  const GenRequest& rq = h->request();
  auto a = std::make_unique<Active>();
  a->h = h;
  a->slot = slot;
  SequenceOptions so;
  so.max_new_tokens = rq.max_new_tokens;
  so.ignore_eos = rq.ignore_eos;
  so.sampling = rq.sampling;
  so.text_tokens = rq.text_tokens;
  so.reasoning = rq.reasoning;
  so.no_outputs = rq.embed;
  a->seq = std::make_unique<Sequence>(slot, model->tokenizer(), static_cast<int32_t>(model->hparams().n_vocab),
                                      max_seq_ctx, so, engine->cache());
  if (rq.embed) a->pool = std::make_unique<Pooler>(emb.pooling, emb_info);
  if (rq.hooks && !rq.embed) a->seq->set_hooks(rq.hooks());
  a->spec_max = rq.spec.n_max >= 0 ? std::min(rq.spec.n_max, cfg.spec.draft_max) : cfg.spec.draft_max;
  a->spec_min = rq.spec.n_min >= 0 ? rq.spec.n_min : cfg.spec.draft_min;
  if (!rq.embed && !a->seq->hooks().drafts && a->spec_max > 0) {
    if (cfg.spec.type == SpecConfig::Type::kNgram)
      a->seq->hooks().drafts = std::make_unique<NgramDraft>(NgramDraftParams{cfg.spec.ngram_n, cfg.spec.ngram_m});
    else if (cfg.spec.type == SpecConfig::Type::kDraft && draft)
      a->seq->hooks().drafts = draft->proposer(slot, rq.spec.p_min >= 0 ? rq.spec.p_min : cfg.spec.p_min);
    else if (cfg.spec.type == SpecConfig::Type::kMtp && mtp)
      a->seq->hooks().drafts = mtp->proposer(slot);
  }
  a->stops = StopFilter(rq.stop);
  a->tm.n_prompt = static_cast<int64_t>(rq.prompt.size());
  if (engine->checkpoints()) {  // the checkpoint positions of the prompt (runtime/scheduler.h)
    const int64_t P = a->tm.n_prompt, bs = cfg.block_size, N = cfg.ctx_checkpoints;
    a->ckpt_last = (P - 1) / bs * bs;
    if (N > 1) {
      int64_t every = defaults::kCheckpointSpacing;
      while (every < (P + N - 2) / (N - 1)) every *= 2;
      a->ckpt_every = (every + bs - 1) / bs * bs;
    }
  }
  if (rq.timeout_s > 0)
    a->deadline = h->submitted() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(std::min(rq.timeout_s, 1e7)));
  return a;
}

// Admission while a slot, tokens, an output row and blocks are free (one free block kept per running sequence, so
// the decodes of the next step do not preempt at once).
void Scheduler::Impl::admit() {
  KvCache& cache = engine->cache();
  while (!waiting.empty() && !free_slots.empty() && tokens_left > 0 && outs_left > 0) {
    std::shared_ptr<RequestHandle> h = waiting.front();
    const int32_t slot = free_slots.back();
    std::unique_ptr<Active> a = make_active(h, slot);
    if (Status st = a->seq->append(h->request().prompt); !st.is_ok()) {  // checked in submit(); a backstop
      waiting.pop_front();
      RequestEnd end;
      end.reason = FinishReason::kError;
      end.error = st;
      notify.push_back({h, std::move(end)});
      continue;
    }
    a->seq->begin_turn();
    attach(*a);
    int64_t keep = 0;
    for (auto& o : active) keep += has_kv(*o) ? 1 : 0;
    const int64_t room = cache.n_blocks_free() - keep;
    const int64_t n = room > 0 ? whole_or_none(*a, fit(*a, prompt_chunk(*a), room)) : 0;
    if (n <= 0) {  // admission waits for blocks
      cache.truncate(slot, 0);
      std::lock_guard<std::mutex> lk(stats_mu);
      stats.prefix_hit_tokens -= static_cast<uint64_t>(a->tm.n_cached);
      break;
    }
    waiting.pop_front();
    free_slots.pop_back();
    active.push_back(std::move(a));
    put(*active.back(), static_cast<size_t>(n));
    info.n_prefill_tokens += static_cast<int32_t>(n);
    ++info.n_admitted;
    std::lock_guard<std::mutex> lk(stats_mu);
    stats.prompt_tokens += h->request().prompt.size();
  }
}

void Scheduler::Impl::schedule() {
  batch.clear();
  sched.clear();
  info = StepInfo{};
  tokens_left = engine->caps().batch_tokens;
  outs_left = engine->caps().max_outputs;
  for (auto& a : active) {
    a->scheduled = a->preempted_now = false;
    a->draft.clear();
  }
  // One pass over the running sequences: those decoding first (a token each keeps their latency steady), then
  // those with prompt left (chunks, or recomputation after a preemption), oldest first within each.
  order.clear();
  for (auto& a : active)
    if (decoding(*a)) order.push_back(a.get());
  for (auto& a : active)
    if (!decoding(*a)) order.push_back(a.get());
  draft_ahead();
  for (Active* a : order) {
    if (tokens_left <= 0 || outs_left <= 0) break;
    const bool decode = decoding(*a);
    const int64_t n = decode ? decode_room(*a) : chunk_room(*a);
    if (n <= 0) continue;
    put(*a, static_cast<size_t>(n));
    if (decode) ++info.n_decode;
    else info.n_prefill_tokens += static_cast<int32_t>(n);
  }
  admit();
  std::lock_guard<std::mutex> lk(stats_mu);
  stats.preemptions += static_cast<uint64_t>(info.n_preempted);
}

void Scheduler::Impl::stall() {
  // Nothing fits: blocks are held by sequences that cannot grow. Preempt the newest holder; a sequence that holds
  // every block alone and still cannot grow fails (it needs more than the pool).
  Active* victim = nullptr;
  int holders = 0;
  for (auto& o : active) holders += has_kv(*o) ? 1 : 0;
  for (size_t j = active.size(); j-- > 0;)
    if (has_kv(*active[j])) {
      victim = active[j].get();
      break;
    }
  if (victim && holders > 1) {
    preempt(*victim);
    std::lock_guard<std::mutex> lk(stats_mu);
    ++stats.preemptions;
  } else if (!active.empty()) {
    Active& a = victim ? *victim : *active.front();
    finish(a, StopReason::kNone,
           make_error(ErrorCode::kOutOfRange, "out of KV cache: the request needs more than the %lld token slots of -c",
                      (long long)engine->cache().n_blocks_total() * cfg.block_size));
    remove_finished();
  } else {
    // Waiting requests only and none admitted: cannot happen with an empty pool; avoid a busy loop anyway.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// ---- execute(): plan -> forward -> fetch ----

// Each output's kind; a greedy sequence whose mask may be asked ahead computes it now (Sequence::prepare_output),
// the sequences in parallel as in update(): each task touches only its own sequence.
void Scheduler::Impl::prepare_outputs() {
  const Clock::time_point t0 = Clock::now();
  auto prepare = [&](Active& a) {
    a.kind = a.h->request().logprobs ? OutputKind::kLogits : a.seq->prepare_output(device_mask && a.draft.empty());
  };
  if (outs.size() >= 2 && pool->size() > 1) {
    pool->parallel_for(static_cast<int64_t>(outs.size()), [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) prepare(*outs[j]);
    });
  } else {
    for (Active* a : outs) prepare(*a);
  }
  std::lock_guard<std::mutex> lk(stats_mu);
  stats.mask_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

bool Scheduler::Impl::execute(StepOutputs* out) {
  outs.clear();
  for (Active* a : sched)
    if (a->wants) outs.push_back(a);
  prepare_outputs();
  if (observer)  // info.entries are in sched's order (put())
    for (size_t i = 0; i < sched.size() && i < info.entries.size(); ++i) {
      info.entries[i].row = sched[i]->wants && sched[i]->kind == OutputKind::kLogits;
      info.entries[i].masked = sched[i]->wants && sched[i]->kind == OutputKind::kMaskedArgmax;
    }
  size_t n_rows = 0;  // a sequence verifying k drafts has k + 1 consecutive rows
  for (Active* a : outs) {
    a->row0 = n_rows;
    for (size_t r = 0; r <= a->draft.size(); ++r) {
      row_masks[n_rows] = a->kind == OutputKind::kMaskedArgmax ? a->seq->step_mask() : nullptr;
      kinds[n_rows++] = a->kind;
    }
  }
  bool hidden = false;  // an embedding request or a proposer that wants them: every token's hidden state comes back
  for (Active* a : sched) {
    const DraftProposer* d = a->seq->hooks().drafts.get();
    hidden = hidden || a->pool != nullptr || (d && d->wants_hidden());
  }
  const Clock::time_point t_step = Clock::now();
  auto r = engine->step(batch.tokens, std::span<const OutputKind>(kinds.data(), n_rows), hidden,
                        std::span<const uint64_t* const>(row_masks.data(), n_rows));
  if (!r) {
    for (Active* a : sched) {
      a->seq->rollback();
      finish(*a, StopReason::kNone, r.status());
    }
    remove_finished();
    return false;
  }
  *out = *r;
  n_prompt_tok = 0;
  const Clock::time_point now = Clock::now();
  for (Active* a : sched) {
    a->seq->commit();
    if (cfg.prefix_cache && !a->pool) engine->cache().cache_blocks(a->slot, a->seq->tokens());
    // A failed copy leaves the sequence as it was: only the cache goes without this checkpoint.
    if (checkpoint_at(*a, a->seq->n_cached())) (void)engine->checkpoint(a->slot);
    if (!a->got_first || !a->wants || a->n_sched > 1) {
      n_prompt_tok += static_cast<int64_t>(a->n_sched);
      if (cfg.on_prefill) progress(*a, t_step, now);
    }
  }
  info.n_tokens = static_cast<int32_t>(batch.size());
  info.n_seqs = static_cast<int32_t>(sched.size());
  return true;
}

// ---- update(): sample, append, stop checks, stream out, free ----

// a's rows in order: row r holds the logits after draft r - 1; its sample confirms draft r when equal (and the
// sequence goes on), else it is the step's last token (the drafts after it are rejected).
void Scheduler::Impl::sample(Active& a, const StepOutputs& out) {
  const GenRequest& rq = a.h->request();
  a.outs.clear();
  size_t n_confirmed = 0;
  for (size_t r = 0; r <= a.draft.size(); ++r) {
    const size_t row = a.row0 + r;
    Active::Out o;
    if (a.kind == OutputKind::kLogits) {
      std::span<const float> logits(out.row(static_cast<int32_t>(row)), static_cast<size_t>(out.n_vocab));
      o.st = a.seq->on_logits(logits);
      if (rq.logprobs && o.st.token >= 0) logprobs_of(logits, o.st.token, rq.top_logprobs, &o.ev);
    } else if (a.kind == OutputKind::kMaskedArgmax) {
      o.st = a.seq->on_masked_token(out.argmax[row]);
    } else {
      o.st = a.seq->on_token(out.argmax[row]);
    }
    o.ev.id = o.st.token;
    if (o.st.token >= 0) o.ev.text = a.stops.push(o.st.piece);
    const bool goes_on = r < a.draft.size() && o.st.token == a.draft[r] && o.st.stop == StopReason::kNone &&
                         o.st.error.is_ok() && !a.stops.hit();
    a.outs.push_back(std::move(o));
    if (!goes_on) break;
    ++n_confirmed;
  }
  if (!a.draft.empty()) a.seq->settle_drafts(n_confirmed);
  if (DraftProposer* d = a.seq->hooks().drafts.get()) d->accepted(static_cast<int32_t>(n_confirmed));
}

void Scheduler::Impl::settle(Active& a, const StepOutputs& out) {
  if (a.pool) return;
  const bool verified = !a.draft.empty() && a.wants;
  // The rows that stay: a verify step's pending tokens and confirmed drafts (one per sample but the last), else
  // the whole chunk.
  const size_t kept = verified ? a.n_sched - a.draft.size() - 1 + a.outs.size() : a.n_sched;
  // Not every draft confirmed: the state went past the rejected ones. Back to before the step; the confirmed
  // tokens are pending again with the last sample, a replay that decodes with the next step (a failed copy ends the
  // sequence: its state is lost).
  if (verified && a.outs.size() < 1 + a.draft.size() && engine->recurrent()) {
    if (Status st = engine->restore_verify_state(a.slot); !st.is_ok()) {
      a.outs.back().st.error = st;
      a.outs.back().st.stop = StopReason::kNone;
    } else {
      a.replay = true;
    }
  }
  DraftProposer* d = a.seq->hooks().drafts.get();
  if (d && d->wants_hidden() && out.hidden && kept > 0)
    d->hidden_rows(a.seq->tokens(), a.pos0, out.hidden_row(static_cast<int32_t>(a.tok0)),
                   static_cast<int64_t>(kept), out.n_embd);
}

void Scheduler::Impl::deliver(Active& a, Clock::time_point now) {
  if (!a.got_first) {
    a.got_first = true;
    a.t_first = now;
    a.tm.prompt_ms = ms_between(a.t_sched, now);
    a.tm.ttft_ms = ms_between(a.h->submitted(), now);
    ttft.push_back(a.tm.ttft_ms / 1000.0);
  } else {
    itl.push_back(ms_between(a.t_last, now) / 1000.0);
  }
  a.t_last = now;
  for (Active::Out& o : a.outs)
    if (o.st.token >= 0) {
      ++a.tm.n_gen;
      a.h->push(std::move(o.ev));
    }
  // Only the step's last token can end the sequence (sample() stops at an error, a stop or a stop string).
  const Sequence::Step& st = a.outs.back().st;
  if (!st.error.is_ok()) {
    finish(a, StopReason::kNone, st.error);
  } else if (a.stops.hit()) {
    a.seq->stop(StopReason::kStopString);
    finish(a, StopReason::kStopString);
  } else if (st.stop != StopReason::kNone) {
    finish(a, st.stop);
  }
}

void Scheduler::Impl::record(Clock::time_point now, int64_t n_gen, uint64_t drafted, uint64_t confirmed) {
  std::lock_guard<std::mutex> lk(stats_mu);
  SchedulerStats& S = stats;
  S.draft_tokens += drafted;
  S.draft_accepted += confirmed;
  for (double v : ttft) S.ttft.add(v);
  for (double v : itl) S.itl.add(v);
  S.steps += 1;
  S.generated_tokens += static_cast<uint64_t>(n_gen);
  S.prompt_tokens_computed += static_cast<uint64_t>(n_prompt_tok);
  window.push_back({now, n_prompt_tok, n_gen});
  while (!window.empty() && now - window.front().t > std::chrono::seconds(10)) window.pop_front();
}

void Scheduler::Impl::progress(Active& a, Clock::time_point t_step, Clock::time_point now) {
  const int64_t done = a.seq->n_cached(), total = static_cast<int64_t>(a.seq->tokens().size());
  if (a.prefill_from < 0) {
    a.prefill_from = done - static_cast<int64_t>(a.n_sched);
    a.t_prefill = t_step;
    a.shown = false;
  }
  PrefillProgress p;
  p.request = a.h->id();
  p.slot = a.slot;
  p.done = done;
  p.total = total;
  p.computed = done - a.prefill_from;
  p.seconds = std::chrono::duration<double>(now - a.t_prefill).count();
  p.finished = done >= total;
  const double since = std::chrono::duration<double>(now - (a.shown ? a.t_shown : a.t_prefill)).count();
  if (p.finished) a.prefill_from = -1;
  if (p.finished ? !a.shown : since < cfg.progress_interval_s) return;
  a.shown = !p.finished;
  a.t_shown = now;
  cfg.on_prefill(p);
}

void Scheduler::Impl::update(const StepOutputs& out) {
  // Sampling of every output row, in parallel: each task touches only its own sequence.
  const Clock::time_point t0 = Clock::now();
  if (outs.size() >= 2 && pool->size() > 1) {
    pool->parallel_for(static_cast<int64_t>(outs.size()), [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) sample(*outs[j], out);
    });
  } else {
    for (Active* a : outs) sample(*a, out);
  }
  {
    std::lock_guard<std::mutex> lk(stats_mu);
    stats.sample_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  // In batch order: tokens out, stop rules, finished sequences free their slots and blocks.
  const auto now = Clock::now();
  ttft.clear();
  itl.clear();
  int64_t n_gen = 0;
  uint64_t drafted = 0, confirmed = 0;  // every out but the last of a verifying sequence confirmed a draft
  for (Active* a : sched)
    if (a->wants || a->seq->hooks().drafts) settle(*a, out);
  for (Active* a : outs) {
    for (const Active::Out& o : a->outs) n_gen += o.st.token >= 0 ? 1 : 0;
    if (!a->draft.empty()) {
      drafted += a->draft.size(), confirmed += a->outs.size() - 1;
      a->tm.n_draft += static_cast<int64_t>(a->draft.size());
      a->tm.n_draft_accepted += static_cast<int64_t>(a->outs.size() - 1);
    }
    deliver(*a, now);
  }
  for (Active* a : sched)
    if (a->pool) pool_rows(*a, out);
  remove_finished();
  record(now, n_gen, drafted, confirmed);
  if (observer) observer(info);
}

// An embedding request's rows of this step (its chunk is committed: the cache holds it), pooled; at the end of its
// input it finishes with the result.
void Scheduler::Impl::pool_rows(Active& a, const StepOutputs& out) {
  const int64_t n = static_cast<int64_t>(a.n_sched);
  const bool ends = a.seq->n_pending() == 0;
  a.pool->add(out.hidden_row(static_cast<int32_t>(a.tok0)), n, a.seq->n_cached() - n, ends);
  if (ends) finish(a, StopReason::kLimit);
}

// ---- the end of a request ----

void Scheduler::Impl::finish(Active& a, StopReason r, Status err) {
  if (err.is_ok()) {
    // The decoder's held-back tail may complete a stop string; then whatever text was held for one goes out.
    std::string rest = a.stops.push(a.seq->flush_text());
    if (a.stops.hit()) r = StopReason::kStopString;
    rest += a.stops.flush();
    if (!rest.empty()) {
      TokenEvent ev;
      ev.text = std::move(rest);
      a.h->push(std::move(ev));
    }
  }
  const auto now = Clock::now();
  if (a.got_first) a.tm.gen_ms = ms_between(a.t_first, now);
  else if (a.started) a.tm.prompt_ms = ms_between(a.t_sched, now);
  RequestEnd end;
  end.reason = err.is_ok() ? finish_reason_of(r) : FinishReason::kError;
  end.stop = r;
  if (r == StopReason::kStopString) end.stop_string = a.stops.matched();
  end.timings = a.tm;
  end.timings.n_reasoning = a.seq->n_reasoning();
  end.error = std::move(err);
  end.seed = a.seq->sampler().seed();
  if (a.pool && end.error.is_ok() && r == StopReason::kLimit) end.embedding = a.pool->result();  // see pool_rows()
  notify.push_back({a.h, std::move(end)});
  engine->cache().truncate(a.slot, 0);
  free_slots.push_back(a.slot);
  a.slot = -1;
}

void Scheduler::Impl::finish_waiting(const std::shared_ptr<RequestHandle>& h, StopReason r) {
  RequestEnd end;
  end.reason = finish_reason_of(r);
  end.stop = r;
  end.timings.n_prompt = static_cast<int64_t>(h->request().prompt.size());
  end.timings.queue_ms = ms_between(h->submitted(), Clock::now());
  notify.push_back({h, std::move(end)});
}

void Scheduler::Impl::remove_finished() {
  active.erase(std::remove_if(active.begin(), active.end(), [](auto& a) { return a->slot < 0; }), active.end());
}

// The gauges first, then the requests hear that they finished (so a client that saw its request end sees the
// blocks it held freed in the stats).
void Scheduler::Impl::publish() {
  const KvCache& cache = engine->cache();
  {
    std::lock_guard<std::mutex> lk(stats_mu);
    SchedulerStats& S = stats;
    S.queue_depth = static_cast<int64_t>(waiting.size());
    S.running = static_cast<int64_t>(active.size());
    S.kv_blocks_total = cache.n_blocks_total();
    S.kv_blocks_used = cache.n_blocks_used();
    S.kv_blocks_cached = cache.n_blocks_cached();
    S.kv_blocks_free = cache.n_blocks_free() - cache.n_blocks_cached();
    S.kv_checkpoints_total = cache.config().checkpoints;
    S.kv_checkpoints_used = cache.n_checkpoints_used();
    for (auto& n : notify) ++S.finished[static_cast<int>(n.end.reason)];
    S.slots.resize(static_cast<size_t>(cfg.max_seqs));
    for (size_t i = 0; i < S.slots.size(); ++i) S.slots[i] = SlotState{static_cast<int32_t>(i)};
    for (const auto& a : active) {
      if (a->slot < 0 || a->slot >= cfg.max_seqs) continue;
      S.slots[static_cast<size_t>(a->slot)] =
          SlotState{a->slot, true, a->h->id(), static_cast<int64_t>(a->h->request().prompt.size()), a->seq->n_cached(),
                    a->seq->n_generated(), a->seq->n_ctx()};
    }
  }
  for (auto& n : notify) {
    n.h->finish(std::move(n.end));
    n_pending.fetch_sub(1);
  }
  notify.clear();
}

}  // namespace kiln
