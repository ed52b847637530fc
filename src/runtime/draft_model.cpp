#include "runtime/draft_model.h"

#include <algorithm>
#include <cmath>

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
                                                       const DraftModelConfig& cfg) {
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
  kc.max_outputs = 1;  // one row per run(): the last token's
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
    if (e < ids.size()) continue;
    if (!want_p) {
      next.id = out.argmax[0];
      break;
    }
    // The argmax (first of equals) and its probability among the top kDraftTopK: p = 1 / sum exp(l_i - l_max).
    const float* row = out.row(0);
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
    for (int32_t j = 0; j < n_top; ++j) sum += std::exp(static_cast<double>(top[j]) - top[0]);
    next.p = sum > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
  }
  return next;
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

int32_t DraftModelProposer::propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) {
  const int32_t k_max = std::min<int32_t>(max_k, static_cast<int32_t>(out.size()));
  if (off_ || k_max <= 0 || tokens.empty()) return 0;
  // Keep the common prefix (at least the newest token runs again: its row gives the first draft).
  size_t keep = 0;
  const size_t lim = std::min(held_.size(), tokens.size() - 1);
  while (keep < lim && held_[keep] == tokens[keep]) ++keep;
  if (keep < held_.size()) {
    m_->engine().cache().truncate(slot_, static_cast<int64_t>(keep));
    held_.resize(keep);
  }
  const bool want_p = p_min_ > 0;
  auto next = m_->run(slot_, tokens.subspan(keep), static_cast<int64_t>(keep), want_p);
  if (!next) {  // e.g. the draft's KV is full: no more drafts for this sequence
    reset();
    off_ = true;
    return 0;
  }
  held_.insert(held_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(keep), tokens.end());
  int32_t got = 0;
  while (next->p >= p_min_) {
    out[static_cast<size_t>(got++)] = next->id;
    if (got == k_max) break;
    const int32_t id = next->id;
    next = m_->run(slot_, std::span<const int32_t>(&id, 1), static_cast<int64_t>(held_.size()), want_p);
    if (!next) break;  // nothing was committed: the drafts so far stand
    held_.push_back(id);
  }
  last_k_ = got;
  return got;
}

void DraftModelProposer::accepted(int32_t n) {
  n_proposed_ += last_k_;
  n_accepted_ += n;
  last_k_ = 0;
}

}  // namespace kiln
