#include "runtime/mtp_draft.h"

#include <algorithm>
#include <cstring>

#include "runtime/engine_config.h"

namespace kiln {

Status MtpDraft::check(Model& target) {
  if (target.nextn_model()) return Status::ok();
  // The file's count: a tensor-parallel model leaves its NextN blocks out (HParams::n_nextn 0 there).
  const std::string key = target.hparams().arch + ".nextn_predict_layers";
  auto in_file = target.file().get_i64(key);
  const long long n = in_file ? static_cast<long long>(*in_file) : 0;
  if (n > 0)
    return make_error(ErrorCode::kUnsupported, "--spec-type draft-mtp: not with --split-mode tensor (the %lld "
                      "multi-token-prediction layers of %s are not sharded)", n, target.file().path().c_str());
  return make_error(ErrorCode::kInvalidArgument, "--spec-type draft-mtp: %s has no multi-token-prediction layers "
                    "(nextn_predict_layers %lld)", target.file().path().c_str(), n);
}

Result<std::shared_ptr<MtpDraft>> MtpDraft::create(Model& target, const DraftCacheConfig& cfg) {
  KILN_TRY(check(target));
  Model* view = target.nextn_model();
  std::shared_ptr<MtpDraft> m(new MtpDraft());
  m->model_ = view;
  KvCacheConfig kc = kv_cache_config(cfg);
  kc.max_outputs = 1;  // one row per step: the last position's
  kc.prefix_cache = false;
  kc.hidden = true;
  auto e = Engine::create(*view, kc);
  if (!e) return e.status().with_context("--spec-type draft-mtp: the multi-token-prediction layer's engine");
  m->engine_ = std::move(e).value();
  return m;
}

std::unique_ptr<DraftProposer> MtpDraft::proposer(int32_t slot) {
  return std::make_unique<MtpProposer>(shared_from_this(), slot);
}

Result<int32_t> MtpDraft::run(int32_t slot, std::span<const int32_t> ids, int64_t pos0, std::span<const float> h_in,
                              std::vector<float>* h_out) {
  const size_t cap = static_cast<size_t>(engine_->caps().batch_tokens);
  const size_t E = static_cast<size_t>(model_->hparams().n_embd);
  const OutputKind kind[1] = {OutputKind::kArgmax};
  int32_t id = -1;
  for (size_t i = 0; i < ids.size(); i += cap) {
    const size_t e = std::min(ids.size(), i + cap);
    const bool last = e == ids.size();
    toks_.clear();
    for (size_t j = i; j < e; ++j)
      toks_.push_back({ids[j], static_cast<int32_t>(pos0 + static_cast<int64_t>(j)), slot, last && j + 1 == e});
    KILN_ASSIGN_OR_RETURN(StepOutputs out, engine_->step(toks_, std::span<const OutputKind>(kind, last ? 1 : 0),
                                                         last, {}, h_in.subspan(i * E, (e - i) * E)));
    if (!last) continue;
    id = out.argmax[0];
    const float* row = out.hidden_row(static_cast<int32_t>(e - i - 1));
    h_out->assign(row, row + E);
  }
  return id;
}

MtpProposer::MtpProposer(std::shared_ptr<MtpDraft> m, int32_t slot) : m_(std::move(m)), slot_(slot) { reset(-1); }

MtpProposer::~MtpProposer() { reset(-1); }

void MtpProposer::reset(int64_t base) {
  if (m_->engine().cache().valid_seq(slot_)) m_->engine().cache().truncate(slot_, 0);
  base_ = base;
  held_ = 0;
  rows_.clear();
  next_.n_tokens = 0;
}

void MtpProposer::drop_speculative() {
  KvCache& cache = m_->engine().cache();
  if (cache.seq_len(slot_) > held_) cache.truncate(slot_, held_);
}

void MtpProposer::hidden_rows(std::span<const int32_t> tokens, int64_t pos0, const float* rows, int64_t n,
                              int64_t n_embd) {
  if (off_ || n <= 0) return;
  const size_t E = static_cast<size_t>(n_embd);
  // The trunk position after the last row seen.
  const auto seen_end = [&] { return base_ + held_ + static_cast<int64_t>(rows_.size() / E); };
  if (base_ < 0 || pos0 < base_) reset(pos0);
  // The rows continue those seen (rows of positions seen already are skipped: the same tokens give the same rows);
  // a gap (positions whose rows never came) starts the MTP's sequence over at pos0.
  if (pos0 > seen_end()) reset(pos0);
  const int64_t from = std::max(pos0, seen_end());
  if (from < pos0 + n)
    rows_.insert(rows_.end(), rows + static_cast<size_t>(from - pos0) * E, rows + static_cast<size_t>(n) * E);
  // The catch-up: trunk positions q with row h_q and token t_(q+1) known.
  const int64_t q0 = base_ + held_;
  const int64_t q1 = std::min<int64_t>(q0 + static_cast<int64_t>(rows_.size() / E),
                                       static_cast<int64_t>(tokens.size()) - 1);
  if (q1 <= q0) return;
  drop_speculative();
  const size_t cnt = static_cast<size_t>(q1 - q0);
  auto id = m_->run(slot_, tokens.subspan(static_cast<size_t>(q0 + 1), cnt), held_,
                    std::span<const float>(rows_.data(), cnt * E), &next_.h);
  if (!id) {  // e.g. the MTP's KV is full: no more drafts for this sequence
    reset(-1);
    off_ = true;
    return;
  }
  held_ += static_cast<int64_t>(cnt);
  rows_.erase(rows_.begin(), rows_.begin() + static_cast<std::ptrdiff_t>(cnt * E));
  next_.id = *id;
  next_.n_tokens = static_cast<size_t>(q1) + 1;  // the row after t_(q1) is the first draft of a sequence that long
}

int32_t MtpProposer::propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) {
  const int32_t k = std::min<int32_t>(max_k, static_cast<int32_t>(out.size()));
  if (off_ || k <= 0 || next_.n_tokens != tokens.size() || next_.id < 0) return proposed(0);
  drop_speculative();
  out[0] = next_.id;
  int32_t got = 1;
  h_ = next_.h;
  // Draft j + 1 from the row of trunk position n_tokens - 2 + j: token draft j with the MTP's last output row.
  while (got < k) {
    const int32_t id = out[static_cast<size_t>(got - 1)];
    auto next = m_->run(slot_, std::span<const int32_t>(&id, 1), held_ + got - 1, h_, &h_);
    if (!next || *next < 0) break;  // nothing was committed: the drafts so far stand
    out[static_cast<size_t>(got++)] = *next;
  }
  return proposed(got);
}

}  // namespace kiln
