// Model::load: mmap, hparams, placement, manifest check, weights imported onto the backend that holds each tensor.
// The step machinery (KV storage, workspace, execute, fetch) is in model/state.cpp.
#include "model/model.h"

#include <algorithm>

#include "backend/backend.h"
#include "model/arch.h"
#include "model/mtp.h"
#include "model/state.h"
#include "model/tensor_parallel.h"
#include "util/timer.h"

namespace kiln {
namespace {

class LoadedModel final : public Model {
 public:
  const HParams& hparams() const override { return hp_; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  const ModelStats& stats() const override { return stats_; }
  const gguf::File& file() const override { return file_; }
  const Placement& placement() const override { return place_; }
  Result<std::unique_ptr<ModelState>> create_state(const StepCaps& caps) override {
    return make_model_state(hp_, *arch_, w_, place_, caps);
  }
  uint64_t kv_bytes(const StepCaps& caps) const override { return kv_storage_bytes(hp_, caps); }
  Model* nextn_model() override { return nextn_.get(); }

  Status init(gguf::File file, const LoadOptions& opts);

 private:
  // Which backend holds tensor `name` (the one place that decides it): blk.N.* on layer N's, except layer N's expert
  // tensors and router (goes_with_experts) on the backend of its experts (Placement::experts_of: the layer's unless
  // --cpu-moe / --n-cpu-moe / -ot put them on the CPU); token_embd on the input's; the rest (output_norm, output,
  // rope_freqs) on the output's. rope_freqs is used by every layer: see rehome_shared().
  Backend* home_of(const std::string& name) const;
  Status bind(const std::vector<TensorSpec>& manifest, const LoadOptions& opts);
  // Weights used outside their home backend are imported again where they are used (zero-copy on the CPU): a tied
  // output (= token_embd) when the output and input backends differ, and rope_freqs on every layer's backend.
  Status rehome_shared();

  gguf::File file_;
  HParams hp_;
  const ArchDef* arch_ = nullptr;
  Weights w_;
  ModelStats stats_;
  Placement place_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Model> nextn_;  // hp_.n_nextn > 0: the view of NextN block 0
};

Backend* LoadedModel::home_of(const std::string& name) const {
  if (name.rfind("blk.", 0) == 0) {
    const long il = std::strtol(name.c_str() + 4, nullptr, 10);
    if (il >= 0 && il < static_cast<long>(place_.layers.size()))
      return goes_with_experts(name) ? place_.experts_of(il) : place_.layers[il].get();
  }
  if (name.rfind("token_embd", 0) == 0) return place_.input.get();
  return place_.output.get();
}

Status LoadedModel::bind(const std::vector<TensorSpec>& manifest, const LoadOptions& opts) {
  // Every tensor's presence, shape and type first: a file the placement cannot run fails before anything is
  // uploaded. (The token embedding is read by get_rows; when the output is tied to it, rehome_shared checks that
  // the output backend multiplies it.)
  std::vector<const gguf::TensorInfo*> found(manifest.size(), nullptr);
  uint64_t total = 0, done = 0;
  for (size_t i = 0; i < manifest.size(); ++i) {
    const TensorSpec& s = manifest[i];
    KILN_ASSIGN_OR_RETURN(found[i], manifest_tensor(file_, s, hp_.arch));
    if (!found[i]) continue;
    KILN_TRY(check_tensor_type(s, found[i]->type, *home_of(s.name)));
    total += found[i]->nbytes;
  }
  const bool report = opts.progress && total > (256ull << 20);
  int last_pct = -1;
  for (size_t i = 0; i < manifest.size(); ++i) {
    const gguf::TensorInfo* ti = found[i];
    if (!ti) continue;
    const TensorSpec& s = manifest[i];
    KILN_ASSIGN_OR_RETURN(*s.dst, home_of(s.name)->import_weight(ti->type, ti->ne, ti->data, ti->nbytes));
    done += ti->nbytes;
    if (report) {
      const int pct = static_cast<int>(done * 100 / total);
      if (pct != last_pct) opts.progress(done, total);
      last_pct = pct;
    }
  }
  return Status::ok();
}

Status LoadedModel::rehome_shared() {
  auto import_on = [&](const char* name, Backend* be) -> Result<Tensor> {
    const gguf::TensorInfo* ti = file_.find_tensor(name);
    if (!ti) return make_error(ErrorCode::kInternal, "tensor '%s' vanished", name);
    return be->import_weight(ti->type, ti->ne, ti->data, ti->nbytes);
  };
  if (w_.output.valid() && w_.output.backend != place_.output.get()) {
    if (!place_.output->supports(Op::kMatmul, w_.output.dtype))
      return make_error(ErrorCode::kUnsupported, "tensor 'token_embd.weight' (tied output) has type %s, which "
                        "backend %s cannot multiply", dtype_name(w_.output.dtype), place_.output->name());
    KILN_ASSIGN_OR_RETURN(w_.output, import_on("token_embd.weight", place_.output.get()));
  }
  w_.rope_freqs_on.clear();
  if (w_.rope_freqs.valid())
    for (Backend* be : place_.backends()) {
      if (be == w_.rope_freqs.backend) {
        w_.rope_freqs_on.push_back({be, w_.rope_freqs});
        continue;
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, import_on("rope_freqs.weight", be));
      w_.rope_freqs_on.push_back({be, t});
    }
  return Status::ok();
}

Status LoadedModel::init(gguf::File file, const LoadOptions& opts) {
  Timer timer;
  file_ = std::move(file);
  KILN_ASSIGN_OR_RETURN(hp_.arch, file_.get_str("general.architecture"));
  arch_ = find_arch(hp_.arch);
  if (!arch_)
    return make_error(ErrorCode::kUnsupported, "architecture '%s' is not supported (supported: %s)", hp_.arch.c_str(),
                      supported_archs().c_str());
  KILN_TRY(read_common_hparams(file_, hp_));
  KILN_TRY(arch_->read_hparams(file_, hp_));
  KILN_TRY(validate_hparams(hp_));

  if (!opts.placement.empty()) {
    place_ = opts.placement;
  } else {
    KILN_ASSIGN_OR_RETURN(place_, place_layers(opts.devices, hp_.n_layer));
    // The expert flags against the file's tensor names (a pattern matching a non-expert tensor fails here, before
    // any weight is read), then the layers on a device whose experts stay in host memory.
    std::vector<std::string> names;
    for (const gguf::TensorInfo& t : file_.tensors()) names.push_back(t.name);
    KILN_ASSIGN_OR_RETURN(std::vector<bool> on_cpu, resolve_expert_layers(opts.devices.experts, names, hp_.n_layer));
    KILN_TRY(place_experts(on_cpu, opts.devices.backend, place_));
  }
  KILN_TRY(place_.check(hp_.n_layer));

  if (opts.prefetch) file_.mapping()->prefetch();
  w_.layers.assign(hp_.n_layer, LayerWeights{});
  KILN_TRY(bind(arch_->manifest(hp_, w_), opts));
  KILN_TRY(arch_->finish(hp_, w_, hp_));
  KILN_TRY(rehome_shared());
  KILN_TRY(finish_load(file_, &stats_, &tokenizer_));
  if (hp_.n_nextn > 0) {
    KILN_ASSIGN_OR_RETURN(nextn_, make_nextn_model(*this, hp_, *arch_, w_, place_));
  }
  stats_.load_seconds = timer.seconds();
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const LoadOptions& opts) {
  auto file = gguf::File::open(path);
  if (!file) return file.status();
  return load(std::move(file).value(), opts);
}

Result<std::unique_ptr<Model>> Model::load(gguf::File file, const LoadOptions& opts) {
  const std::string path = file.path();
  if (!opts.tensor_parallel.empty() || (opts.placement.empty() && opts.devices.split_mode == SplitMode::kTensor)) {
    if (!opts.devices.experts.empty())
      return make_error(ErrorCode::kInvalidArgument, "--cpu-moe / --n-cpu-moe / -ot: not with --split-mode tensor "
                        "(every rank holds a shard of every expert)");
    auto m = load_tensor_parallel(std::move(file), opts);
    if (!m) return m.status().with_context("loading " + path);
    return m;
  }
  auto m = std::make_unique<LoadedModel>();
  Status st = m->init(std::move(file), opts);
  if (!st.is_ok()) return st.with_context("loading " + path);
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace kiln
