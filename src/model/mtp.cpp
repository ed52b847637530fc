#include "model/mtp.h"

#include "model/forward.h"
#include "model/state.h"

namespace kiln {
namespace {

class NextnModel final : public Model {
 public:
  NextnModel(const Model& trunk, const ArchDef& arch, HParams hp, Placement place)
      : trunk_(trunk), arch_(arch), hp_(std::move(hp)), place_(std::move(place)) {}
  const HParams& hparams() const override { return hp_; }
  const Tokenizer& tokenizer() const override { return trunk_.tokenizer(); }
  const ModelStats& stats() const override { return stats_; }
  const gguf::File& file() const override { return trunk_.file(); }
  const Placement& placement() const override { return place_; }
  Result<std::unique_ptr<ModelState>> create_state(const StepCaps& caps) override {
    return make_model_state(hp_, arch_, w_, place_, caps);
  }
  uint64_t kv_bytes(const StepCaps& caps) const override { return kv_storage_bytes(hp_, caps); }

  Weights& weights() { return w_; }
  ModelStats& mutable_stats() { return stats_; }

 private:
  const Model& trunk_;
  const ArchDef& arch_;
  HParams hp_;
  Weights w_;
  Placement place_;
  ModelStats stats_;
};

uint64_t tensor_bytes(const Tensor& t) {
  if (!t.valid()) return 0;
  auto r = dtype_row_bytes(t.dtype, t.ne[0]);
  return r ? static_cast<uint64_t>(r.value()) * static_cast<uint64_t>(t.n_rows()) : 0;
}

}  // namespace

Result<std::unique_ptr<Model>> make_nextn_model(const Model& trunk, const HParams& trunk_hp, const ArchDef& arch,
                                                const Weights& trunk_w, const Placement& trunk_place) {
  if (trunk_hp.n_nextn < 1 || trunk_w.nextn.empty())
    return make_error(ErrorCode::kInternal, "make_nextn_model: the model has no NextN blocks");
  const NextnWeights& nw = trunk_w.nextn[0];
  // One full-attention layer: the trunk's sizes, no recurrent or local layers.
  HParams hp = trunk_hp;
  hp.n_layer = 1;
  hp.n_nextn = 0;
  hp.layer_recurrent.assign(1, 0);
  hp.layer_swa.clear();
  // The block's tensors live where the loader put the tensors past the trunk (the output's backend); the
  // embedding where the one it reads lives.
  Placement place;
  place.layers = {trunk_place.output};
  place.input = nw.embed_tokens.valid() ? trunk_place.output : trunk_place.input;
  place.output = trunk_place.output;
  KILN_TRY(place.check(1));
  auto m = std::make_unique<NextnModel>(trunk, arch, std::move(hp), std::move(place));
  Weights& w = m->weights();
  w.tok_embd = nw.embed_tokens.valid() ? nw.embed_tokens : trunk_w.tok_embd;
  w.output_norm = nw.shared_head_norm;
  w.output = nw.shared_head_head.valid() ? nw.shared_head_head : trunk_w.output;
  w.rope_freqs = trunk_w.rope_freqs;
  w.rope_freqs_on = trunk_w.rope_freqs_on;
  w.layers = {nw.block};
  w.nextn_input = &nw;
  const LayerWeights& L = nw.block;
  uint64_t bytes = 0;
  for (const Tensor* t : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.q_norm, &L.k_norm, &L.ffn_norm, &L.w_gate,
                          &L.w_up, &L.w_down, &nw.eh_proj, &nw.enorm, &nw.hnorm, &nw.shared_head_norm,
                          &nw.embed_tokens, &nw.shared_head_head})
    bytes += tensor_bytes(*t);
  m->mutable_stats().weight_bytes = bytes;
  return std::unique_ptr<Model>(std::move(m));
}

Status nextn_input(Backend& be, const NextnWeights& nw, float eps, const Tensor& x, const Tensor& h_in,
                   const Tensor& cat) {
  const int64_t e = x.ne[0], n = x.ne[1];
  const Tensor ce = strided_view(cat, 0, e, n, 1, 2 * e, 2 * e * n);
  const Tensor ch = strided_view(cat, e, e, n, 1, 2 * e, 2 * e * n);
  KILN_TRY(be.rms_norm(x, nw.enorm, eps, ce));
  KILN_TRY(be.rms_norm(h_in, nw.hnorm, eps, ch));
  return be.matmul(nw.eh_proj, cat, Tensor{}, x);
}

}  // namespace kiln
