#include "runtime/draft_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "runtime/engine_config.h"

namespace kiln {

namespace {

std::string quoted(const std::string& s) {
  std::string o = "'";
  for (unsigned char c : s) {
    if (c < 0x20) o += strprintf("\\x%02x", c);
    else o += static_cast<char>(c);
  }
  return o + "'";
}

std::string id_or_none(int32_t id) { return id < 0 ? "none" : std::to_string(id); }

// Output row j's next token: the device's argmax, or from the logits the argmax (first of equals) and its
// probability among the top kDraftTopK: p = 1 / sum exp(l_i - l_max).
DraftModel::Next next_of(const StepOutputs& out, size_t j, bool want_p) {
  DraftModel::Next next;
  if (!want_p) {
    next.id = out.argmax[j];
    return next;
  }
  const float* row = out.row(static_cast<int64_t>(j));
  const int64_t nv = out.n_vocab;
  float top[kDraftTopK];
  int32_t n_top = 0;
  for (int64_t v = 0; v < nv; ++v) {
    const float x = row[v];
    if (n_top == kDraftTopK && !(x > top[n_top - 1])) continue;
    if (n_top == 0 || x > top[0]) next.id = static_cast<int32_t>(v);
    int32_t at = n_top < kDraftTopK ? n_top++ : n_top - 1;
    while (at > 0 && top[at - 1] < x) top[at] = top[at - 1], --at;
    top[at] = x;
  }
  double sum = 0;
  for (int32_t i = 0; i < n_top; ++i) sum += std::exp(static_cast<double>(top[i]) - top[0]);
  next.p = sum > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
  return next;
}

}  // namespace

Status check_draft_vocab(const Tokenizer& t, const Tokenizer& d) {
  if (t.model_name() != d.model_name())
    return make_error(ErrorCode::kInvalidArgument, "-md: the draft model's tokenizer is '%s', the model's '%s' (a "
                      "draft needs the model's vocabulary)", d.model_name().c_str(), t.model_name().c_str());
  const int32_t nt = t.n_vocab(), nd = d.n_vocab();
  if (std::abs(nt - nd) > kMaxVocabDiff)
    return make_error(ErrorCode::kInvalidArgument, "-md: the draft model's vocabulary has %d tokens, the model's %d "
                      "(at most %d apart)", nd, nt, kMaxVocabDiff);
  if (t.bos() != d.bos() || t.add_bos() != d.add_bos())
    return make_error(ErrorCode::kInvalidArgument, "-md: the BOS token differs: the model's is %s (added: %s), the "
                      "draft's %s (added: %s)", id_or_none(t.bos()).c_str(), t.add_bos() ? "yes" : "no",
                      id_or_none(d.bos()).c_str(), d.add_bos() ? "yes" : "no");
  if (t.eos() != d.eos() || t.add_eos() != d.add_eos())
    return make_error(ErrorCode::kInvalidArgument, "-md: the EOS token differs: the model's is %s (added: %s), the "
                      "draft's %s (added: %s)", id_or_none(t.eos()).c_str(), t.add_eos() ? "yes" : "no",
                      id_or_none(d.eos()).c_str(), d.add_eos() ? "yes" : "no");
  const int32_t n = std::min(nt, nd);
  for (int32_t i = 0; i < n; ++i) {
    if (t.is_eog(i) != d.is_eog(i))
      return make_error(ErrorCode::kInvalidArgument, "-md: token %d %s ends generation in the %s but not in the %s",
                        i, quoted(t.token_text(i)).c_str(), t.is_eog(i) ? "model" : "draft model",
                        t.is_eog(i) ? "draft model" : "model");
    if (i >= kVocabCheckFrom && t.token_text(i) != d.token_text(i))
      return make_error(ErrorCode::kInvalidArgument, "-md: token %d is %s in the model, %s in the draft model (the "
                        "vocabularies differ)", i, quoted(t.token_text(i)).c_str(), quoted(d.token_text(i)).c_str());
  }
  return Status::ok();
}

Result<std::shared_ptr<DraftModel>> DraftModel::create(const Model& target, std::unique_ptr<Model> draft,
                                                       const DraftCacheConfig& cfg) {
  if (!draft) return make_error(ErrorCode::kInvalidArgument, "-md: no draft model");
  const HParams& hp = draft->hparams();
  if (!hp.causal)
    return make_error(ErrorCode::kUnsupported, "-md: the draft model (%s) is an encoder: it cannot generate",
                      hp.arch.c_str());
  if (hp.hybrid())
    return make_error(ErrorCode::kUnsupported, "-md: the draft model (%s) has recurrent layers: its state cannot be "
                      "rolled back past rejected drafts", hp.arch.c_str());
  KILN_TRY(check_draft_vocab(target.tokenizer(), draft->tokenizer()));
  std::shared_ptr<DraftModel> m(new DraftModel());
  m->model_ = std::move(draft);
  KvCacheConfig kc = kv_cache_config(cfg);
  kc.max_outputs = std::max(1, std::min(cfg.max_seqs, kc.batch_tokens));  // a row per sequence of a batched step
  kc.prefix_cache = false;
  auto e = Engine::create(*m->model_, kc);
  if (!e) return e.status().with_context("-md: the draft model's engine");
  m->engine_ = std::move(e).value();
  return m;
}

std::unique_ptr<DraftProposer> DraftModel::proposer(int32_t slot, float p_min) {
  return std::make_unique<DraftModelProposer>(shared_from_this(), slot, p_min);
}

Result<DraftModel::Next> DraftModel::run(int32_t slot, std::span<const int32_t> ids, int64_t pos0, bool want_p) {
  const size_t cap = static_cast<size_t>(engine_->caps().batch_tokens);
  const OutputKind kind[1] = {want_p ? OutputKind::kLogits : OutputKind::kArgmax};
  Next next;
  for (size_t i = 0; i < ids.size(); i += cap) {
    const size_t e = std::min(ids.size(), i + cap);
    toks_.clear();
    for (size_t j = i; j < e; ++j)
      toks_.push_back({ids[j], static_cast<int32_t>(pos0 + static_cast<int64_t>(j)), slot, j + 1 == ids.size()});
    KILN_ASSIGN_OR_RETURN(StepOutputs out, engine_->step(toks_, std::span<const OutputKind>(kind, 1)));
    if (e == ids.size()) next = next_of(out, 0, want_p);
  }
  return next;
}

void DraftModel::flush(std::span<Lane> lanes) {
  if (toks_.empty()) return;
  auto out = engine_->step(toks_, kinds_);
  if (!out) {  // nothing of this step was committed: its sequences fail (the caller rolls them back)
    for (const BatchToken& t : toks_)
      for (Lane& l : lanes)
        if (l.p->slot_ == t.seq_id) l.ok = false;
  } else {
    for (size_t j = 0; j < out_lane_.size(); ++j) {
      Lane& l = lanes[out_lane_[j]];
      l.next = next_of(*out, j, l.want_p);
    }
  }
  toks_.clear();
  kinds_.clear();
  out_lane_.clear();
}

void DraftModel::run_lanes(std::span<Lane> lanes) {
  KvCache& cache = engine_->cache();
  const int64_t max_pos = model_->hparams().max_pos;
  // Blocks first, lane by lane: a lane that does not fit fails alone (the engine's plan finds the rest reserved).
  for (Lane& l : lanes) {
    const int64_t n = static_cast<int64_t>(l.ids.size());
    l.ok = !(max_pos > 0 && l.pos0 + n > max_pos) && cache.reserve(l.p->slot_, n).is_ok();
  }
  const size_t cap_t = static_cast<size_t>(engine_->caps().batch_tokens);
  const size_t cap_o = static_cast<size_t>(engine_->caps().max_outputs);
  toks_.clear();
  kinds_.clear();
  out_lane_.clear();
  for (size_t li = 0; li < lanes.size(); ++li) {
    Lane& l = lanes[li];
    for (size_t j = 0; j < l.ids.size() && l.ok; ++j) {
      const bool last = j + 1 == l.ids.size();
      if (toks_.size() == cap_t || (last && out_lane_.size() == cap_o)) flush(lanes);
      if (!l.ok) break;  // its earlier tokens were in the step that failed
      toks_.push_back({l.ids[j], static_cast<int32_t>(l.pos0 + static_cast<int64_t>(j)), l.p->slot_, last});
      if (last) {
        kinds_.push_back(l.want_p ? OutputKind::kLogits : OutputKind::kArgmax);
        out_lane_.push_back(li);
      }
    }
  }
  flush(lanes);
  // A failed lane keeps no reservation past what its cache holds.
  for (Lane& l : lanes)
    if (!l.ok) cache.truncate(l.p->slot_, cache.seq_len(l.p->slot_));
}

void DraftModel::propose(std::span<const DraftJob> jobs, int64_t budget) {
  ++gen_;
  // 1. The catch-up of every job that has room by the budget (one token for each job before it).
  lanes_.clear();
  lane_of_job_.assign(jobs.size(), SIZE_MAX);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const DraftJob& job = jobs[i];
    if (!job.proposer || job.proposer->batch() != this) continue;
    auto* p = static_cast<DraftModelProposer*>(job.proposer);  // batch() == this: one of this model's proposers
    p->d_.clear();
    const int64_t k = std::min<int64_t>(job.max_k, budget - static_cast<int64_t>(i) - 1);
    if (p->off_ || k <= 0 || job.tokens.empty()) continue;
    const size_t keep = p->rollback(job.tokens);
    Lane l;
    l.p = p;
    l.ids = job.tokens.subspan(keep);
    l.pos0 = static_cast<int64_t>(keep);
    l.want_p = p->p_min_ > 0;
    lane_of_job_[i] = lanes_.size();
    lanes_.push_back(l);
  }
  if (lanes_.empty()) return;
  run_lanes(lanes_);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (lane_of_job_[i] == SIZE_MAX) continue;
    Lane& l = lanes_[lane_of_job_[i]];
    DraftModelProposer& p = *l.p;
    if (!l.ok) {  // e.g. the draft's KV is full: no more drafts for this sequence
      p.fail();
      lane_of_job_[i] = SIZE_MAX;
      continue;
    }
    p.held_.insert(p.held_.end(), l.ids.begin(), l.ids.end());
    p.d_.gen = gen_;
    p.d_.n_tokens = jobs[i].tokens.size();
    p.d_.next = l.next;
    p.d_.valid = true;
  }
  // 2. Rounds: each live lane takes its row's token while it may (extend()'s rule, with its share of the budget
  // given the drafts of the jobs before it so far); those that go on feed their newest draft, all in one step.
  for (;;) {
    round_.clear();
    int64_t used = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const size_t li = lane_of_job_[i];
      if (li == SIZE_MAX) {
        ++used;
        continue;
      }
      Lane& l = lanes_[li];
      DraftModelProposer& p = *l.p;
      DraftModelProposer::Drafting& d = p.d_;
      const int64_t k = std::min<int64_t>(jobs[i].max_k, budget - used - 1);
      while (l.live) {
        if (d.stopped || static_cast<int64_t>(d.drafts.size()) >= k) {
          l.live = false;
        } else if (d.n_fed < d.drafts.size()) {
          Lane r;
          r.p = &p;
          r.ids = std::span<const int32_t>(&d.drafts.back(), 1);
          r.pos0 = static_cast<int64_t>(p.held_.size());
          r.want_p = l.want_p;
          round_.push_back(r);
          break;
        } else if (!(d.next.p >= p.p_min_)) {
          d.stopped = true;
        } else {
          d.drafts.push_back(d.next.id);
        }
      }
      used += 1 + static_cast<int64_t>(d.drafts.size());
    }
    if (round_.empty()) break;
    run_lanes(round_);
    for (Lane& r : round_) {
      DraftModelProposer::Drafting& d = r.p->d_;
      if (!r.ok) {  // nothing was committed: the drafts so far stand
        d.stopped = true;
        continue;
      }
      r.p->held_.push_back(r.ids[0]);
      ++d.n_fed;
      d.next = r.next;
    }
  }
}

DraftModelProposer::DraftModelProposer(std::shared_ptr<DraftModel> m, int32_t slot, float p_min)
    : m_(std::move(m)), slot_(slot), p_min_(p_min) {
  reset();
}

DraftModelProposer::~DraftModelProposer() { reset(); }

void DraftModelProposer::reset() {
  if (m_->engine().cache().valid_seq(slot_)) m_->engine().cache().truncate(slot_, 0);
  held_.clear();
}

size_t DraftModelProposer::rollback(std::span<const int32_t> tokens) {
  size_t keep = 0;
  const size_t lim = std::min(held_.size(), tokens.size() - 1);
  while (keep < lim && held_[keep] == tokens[keep]) ++keep;
  if (keep < held_.size()) {
    m_->engine().cache().truncate(slot_, static_cast<int64_t>(keep));
    held_.resize(keep);
  }
  return keep;
}

void DraftModelProposer::fail() {
  reset();
  off_ = true;
  d_.clear();
}

void DraftModelProposer::extend(size_t k) {
  const bool want_p = p_min_ > 0;
  while (!d_.stopped && d_.drafts.size() < k) {
    if (d_.n_fed < d_.drafts.size()) {
      const int32_t id = d_.drafts.back();
      auto next = m_->run(slot_, std::span<const int32_t>(&id, 1), static_cast<int64_t>(held_.size()), want_p);
      if (!next) {  // nothing was committed: the drafts so far stand
        d_.stopped = true;
        break;
      }
      held_.push_back(id);
      ++d_.n_fed;
      d_.next = *next;
    }
    if (!(d_.next.p >= p_min_)) {
      d_.stopped = true;
      break;
    }
    d_.drafts.push_back(d_.next.id);
  }
}

int32_t DraftModelProposer::propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) {
  const int32_t k_max = std::min<int32_t>(max_k, static_cast<int32_t>(out.size()));
  const bool batched = d_.valid && d_.gen == m_->generation() && d_.n_tokens == tokens.size();
  if (off_ || k_max <= 0 || tokens.empty()) {
    d_.clear();
    return 0;
  }
  if (!batched) d_.clear();
  if (!batched) {
    // The catch-up: what the draft's cache lacks of the sequence, the newest token at least (its row gives the
    // first draft).
    const size_t keep = rollback(tokens);
    auto next = m_->run(slot_, tokens.subspan(keep), static_cast<int64_t>(keep), p_min_ > 0);
    if (!next) {  // e.g. the draft's KV is full: no more drafts for this sequence
      fail();
      return 0;
    }
    held_.insert(held_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(keep), tokens.end());
    d_.next = *next;
  }
  extend(static_cast<size_t>(k_max));
  const int32_t got = std::min<int32_t>(k_max, static_cast<int32_t>(d_.drafts.size()));
  std::copy(d_.drafts.begin(), d_.drafts.begin() + got, out.begin());
  d_.clear();
  return proposed(got);
}

}  // namespace kiln
