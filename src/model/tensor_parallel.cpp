// load_tensor_parallel (model/tensor_parallel.h): hparams once, then per rank its HParams, its shards imported onto
// its backend, and a ModelState that runs the ranks together (model/state.cpp, make_tp_model_state).
#include "model/tensor_parallel.h"

#include <cstdlib>
#include <cstring>

#include "model/arch.h"
#include "model/state.h"
#include "util/timer.h"

namespace kiln {
namespace {

// How the ranks divide the heads, KV heads, FFN features and vocabulary.
struct TpLayout {
  int n = 1;
  int64_t head = 0, head_kv = 0, ff = 0, vocab = 0;  // per rank
  bool kv_replicated = false;                         // n_head_kv < n: each rank holds one KV head
  int64_t kv_first(int r, const HParams& hp) const {
    return kv_replicated ? (r * head) / (hp.n_head / hp.n_head_kv) : r * head_kv;
  }
};

Status divides(const char* tensor, const std::string& shape, const char* what, int64_t count, int n) {
  if (count % n == 0) return Status::ok();
  return make_error(ErrorCode::kInvalidArgument, "tensor parallel over %d ranks: tensor '%s' %s has %lld %s, not "
                    "divisible by %d", n, tensor, shape.c_str(), static_cast<long long>(count), what, n);
}

std::string shape_of(const gguf::File& f, const char* name) {
  const gguf::TensorInfo* ti = f.find_tensor(name);
  return ti ? ti->shape_string() : "(absent)";
}

Result<TpLayout> make_layout(const gguf::File& f, const HParams& hp, int n) {
  TpLayout l;
  l.n = n;
  KILN_TRY(divides("blk.0.attn_q.weight", shape_of(f, "blk.0.attn_q.weight"), "heads", hp.n_head, n));
  KILN_TRY(divides("blk.0.ffn_gate.weight", shape_of(f, "blk.0.ffn_gate.weight"), "rows (feed_forward_length)",
                   hp.n_ff, n));
  const char* out = f.find_tensor("output.weight") ? "output.weight" : "token_embd.weight";
  KILN_TRY(divides(out, shape_of(f, out), "vocabulary rows", hp.n_vocab, n));
  l.head = hp.n_head / n;
  l.ff = hp.n_ff / n;
  l.vocab = hp.n_vocab / n;
  if (hp.n_head_kv >= n) {
    KILN_TRY(divides("blk.0.attn_k.weight", shape_of(f, "blk.0.attn_k.weight"), "KV heads", hp.n_head_kv, n));
    l.head_kv = hp.n_head_kv / n;
  } else {
    if (n % hp.n_head_kv != 0)
      return make_error(ErrorCode::kInvalidArgument, "tensor parallel over %d ranks: tensor 'blk.0.attn_k.weight' %s "
                        "has %lld KV heads: replicating them needs a rank count that is a multiple of that", n,
                        shape_of(f, "blk.0.attn_k.weight").c_str(), static_cast<long long>(hp.n_head_kv));
    l.head_kv = 1;
    l.kv_replicated = true;
  }
  return l;
}

// The part of a tensor that a rank holds: all of it, rows [off, off + count) of ne[1] (elements of ne[0] for a 1-D
// bias), or columns [off, off + count) of ne[0] in every row.
struct Slice {
  enum Kind { kAll, kRows, kCols } kind = kAll;
  int64_t off = 0, count = 0;
};

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

Slice slice_for(const std::string& name, const HParams& hp, const TpLayout& l, int r) {
  const int64_t q = l.head * hp.head_dim_k;
  if (name == "output.weight") return {Slice::kRows, r * l.vocab, l.vocab};
  if (name.rfind("blk.", 0) != 0) return {};
  if (ends_with(name, ".attn_q.weight") || ends_with(name, ".attn_q.bias")) return {Slice::kRows, r * q, q};
  if (ends_with(name, ".attn_k.weight") || ends_with(name, ".attn_k.bias"))
    return {Slice::kRows, l.kv_first(r, hp) * hp.head_dim_k, l.head_kv * hp.head_dim_k};
  if (ends_with(name, ".attn_v.weight") || ends_with(name, ".attn_v.bias"))
    return {Slice::kRows, l.kv_first(r, hp) * hp.head_dim_v, l.head_kv * hp.head_dim_v};
  if (ends_with(name, ".attn_output.weight"))
    return {Slice::kCols, r * l.head * hp.head_dim_v, l.head * hp.head_dim_v};
  if (ends_with(name, ".ffn_gate.weight") || ends_with(name, ".ffn_up.weight")) return {Slice::kRows, r * l.ff, l.ff};
  if (ends_with(name, ".ffn_down.weight")) return {Slice::kCols, r * l.ff, l.ff};
  return {};
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class TpModel final : public Model {
 public:
  const HParams& hparams() const override { return hp_; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  const ModelStats& stats() const override { return stats_; }
  const gguf::File& file() const override { return file_; }
  const Placement& placement() const override { return place_; }
  Result<std::unique_ptr<ModelState>> create_state(const StepCaps& caps) override {
    std::vector<TpRankView> views;
    for (Rank& r : ranks_) views.push_back({&r.hp, &r.w, r.place, r.comm.get()});
    return make_tp_model_state(*arch_, views, hp_.n_vocab, caps);
  }
  uint64_t kv_bytes(const StepCaps& caps) const override {
    uint64_t b = 0;
    for (const Rank& r : ranks_) b += kv_storage_bytes(r.hp, caps);
    return b;
  }

  Status init(gguf::File file, const LoadOptions& opts);

 private:
  struct Rank {
    HParams hp;
    Weights w;
    Placement place;
    std::shared_ptr<Communicator> comm;
  };
  // The shard `s` of tensor ti on backend be (checked against the rank manifest's shape `want`).
  Result<Tensor> import_shard(const gguf::TensorInfo& ti, const Slice& s, Backend* be,
                              const std::vector<int64_t>& want);

  gguf::File file_;
  HParams hp_;
  const ArchDef* arch_ = nullptr;
  TpLayout layout_;
  std::vector<Rank> ranks_;
  ModelStats stats_;
  Placement place_;
  std::unique_ptr<Tokenizer> tokenizer_;
  // Column shards are gathered from every row into buffers of their own; the CPU backend's import is a zero-copy
  // view, so they live as long as the model.
  std::vector<std::unique_ptr<uint8_t, FreeDeleter>> owned_;
};

Result<Tensor> TpModel::import_shard(const gguf::TensorInfo& ti, const Slice& s, Backend* be,
                                     const std::vector<int64_t>& want) {
  int64_t ne[4] = {ti.ne[0], ti.ne[1], ti.ne[2], ti.ne[3]};
  const uint8_t* data = ti.data;
  size_t nbytes = ti.nbytes;
  const int n = layout_.n;
  if (s.kind != Slice::kAll && (ne[2] != 1 || ne[3] != 1))
    return make_error(ErrorCode::kInvalidFile, "tensor '%s' %s: expected at most 2 dimensions", ti.name.c_str(),
                      ti.shape_string().c_str());
  const int dim = s.kind == Slice::kCols || (s.kind == Slice::kRows && ti.n_dims <= 1) ? 0 : 1;
  if (s.kind != Slice::kAll && (s.off < 0 || s.count <= 0 || s.off + s.count > ne[dim]))
    return make_error(ErrorCode::kInvalidArgument, "tensor parallel over %d ranks: tensor '%s' %s has no %lld-wide "
                      "shard at %lld", n, ti.name.c_str(), ti.shape_string().c_str(),
                      static_cast<long long>(s.count), static_cast<long long>(s.off));
  const int64_t blk = dtype_block_size(ti.type);
  if (s.kind == Slice::kRows && dim == 1) {  // whole rows: one contiguous range of the mapping
    KILN_ASSIGN_OR_RETURN(const uint64_t row, dtype_row_bytes(ti.type, ne[0]));
    data += static_cast<size_t>(s.off) * row;
    ne[1] = s.count;
    nbytes = static_cast<size_t>(s.count) * row;
  } else if (s.kind != Slice::kAll) {  // a range of ne[0] in every row (a 1-D f32 bias: one row)
    if (s.off % blk != 0 || s.count % blk != 0)
      return make_error(ErrorCode::kInvalidArgument, "tensor parallel over %d ranks: tensor '%s' %s (%s): a shard of "
                        "%lld %s at %lld does not fall on the type's %lld-element blocks", n, ti.name.c_str(),
                        ti.shape_string().c_str(), dtype_name(ti.type), static_cast<long long>(s.count),
                        dim == 0 && ti.n_dims > 1 ? "input columns" : "elements", static_cast<long long>(s.off),
                        static_cast<long long>(blk));
    KILN_ASSIGN_OR_RETURN(const uint64_t row, dtype_row_bytes(ti.type, ne[0]));
    KILN_ASSIGN_OR_RETURN(const uint64_t skip, dtype_row_bytes(ti.type, s.off));
    KILN_ASSIGN_OR_RETURN(const uint64_t part, dtype_row_bytes(ti.type, s.count));
    nbytes = static_cast<size_t>(part * static_cast<uint64_t>(ne[1]));
    void* buf = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
    if (!buf) return make_error(ErrorCode::kOutOfRange, "tensor '%s': out of host memory for its shard", ti.name.c_str());
    owned_.emplace_back(static_cast<uint8_t*>(buf));
    for (int64_t i = 0; i < ne[1]; ++i)
      std::memcpy(static_cast<uint8_t*>(buf) + static_cast<size_t>(i) * part,
                  ti.data + static_cast<size_t>(i) * row + skip, static_cast<size_t>(part));
    data = static_cast<const uint8_t*>(buf);
    ne[0] = s.count;
  }
  for (int d = 0; d < 4; ++d)
    if (ne[d] != (d < static_cast<int>(want.size()) ? want[d] : 1))
      return make_error(ErrorCode::kInternal, "tensor parallel: shard of '%s' has the wrong shape", ti.name.c_str());
  return be->import_weight(ti.type, ne, data, nbytes);
}

Status TpModel::init(gguf::File file, const LoadOptions& opts) {
  Timer timer;
  file_ = std::move(file);
  KILN_ASSIGN_OR_RETURN(hp_.arch, file_.get_str("general.architecture"));
  arch_ = find_arch(hp_.arch);
  if (!arch_)
    return make_error(ErrorCode::kUnsupported, "architecture '%s' is not supported (supported: %s)", hp_.arch.c_str(),
                      supported_archs().c_str());
  if (hp_.arch != "llama" && hp_.arch != "qwen2" && hp_.arch != "qwen3")
    return make_error(ErrorCode::kUnsupported, "tensor parallel (--split-mode tensor) supports llama, qwen2 and "
                      "qwen3; architecture '%s' runs with --split-mode layer or none", hp_.arch.c_str());
  KILN_TRY(read_common_hparams(file_, hp_));
  KILN_TRY(arch_->read_hparams(file_, hp_));
  KILN_TRY(validate_hparams(hp_));
  hp_.n_nextn = 0;  // NextN blocks (model/mtp.h) are not sharded: a tensor-parallel model runs without them

  TensorParallelGroup group = opts.tensor_parallel;
  if (group.empty()) {
    KILN_ASSIGN_OR_RETURN(group, make_tensor_parallel_group(opts.devices));
  }
  if (group.comms.size() != group.ranks.size())
    return make_error(ErrorCode::kInvalidArgument, "tensor parallel: %zu ranks but %zu communicators",
                      group.ranks.size(), group.comms.size());
  const int n = group.size();
  for (int r = 0; r < n; ++r)
    if (!group.ranks[r] || !group.comms[r] || group.comms[r]->rank() != r || group.comms[r]->size() != n)
      return make_error(ErrorCode::kInvalidArgument, "tensor parallel: rank %d has no backend or a communicator of "
                        "another rank or group size", r);
  KILN_ASSIGN_OR_RETURN(layout_, make_layout(file_, hp_, n));
  if (opts.prefetch) file_.mapping()->prefetch();

  // The full manifest: what the file must hold (shapes as Model::load checks them).
  Weights unused;
  unused.layers.assign(hp_.n_layer, LayerWeights{});
  const std::vector<TensorSpec> full = arch_->manifest(hp_, unused);
  for (const TensorSpec& s : full) KILN_TRY(manifest_tensor(file_, s, hp_.arch).status());
  const gguf::TensorInfo* embd = file_.find_tensor("token_embd.weight");
  hp_.tied_embeddings = file_.find_tensor("output.weight") == nullptr;

  ranks_.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Rank& R = ranks_[static_cast<size_t>(r)];
    Backend* be = group.ranks[r].get();
    R.comm = group.comms[r];
    R.hp = hp_;
    R.hp.n_head = layout_.head;
    R.hp.n_head_kv = layout_.head_kv;
    R.hp.n_ff = layout_.ff;
    R.hp.n_vocab = layout_.vocab;
    R.place.layers.assign(static_cast<size_t>(hp_.n_layer), group.ranks[r]);
    R.place.input = R.place.output = group.ranks[r];
    R.w.layers.assign(hp_.n_layer, LayerWeights{});
    const std::vector<TensorSpec> mine = arch_->manifest(R.hp, R.w);
    if (mine.size() != full.size()) return make_error(ErrorCode::kInternal, "tensor parallel: manifest sizes differ");
    for (size_t i = 0; i < mine.size(); ++i) {
      const TensorSpec& s = mine[i];
      const gguf::TensorInfo* ti = file_.find_tensor(s.name);
      if (!ti) continue;  // optional (required ones were checked above)
      const bool embedding = s.kind == TensorSpec::kEmbedding;
      KILN_TRY(check_tensor_type(s, ti->type, *be));
      // token_embd is replicated (its manifest shape says V/N rows on a rank: the rank's vocabulary is that of
      // the output projection only).
      const Slice sl = embedding ? Slice{} : slice_for(s.name, hp_, layout_, r);
      KILN_ASSIGN_OR_RETURN(*s.dst, import_shard(*ti, sl, be, embedding ? full[i].shape : s.shape));
    }
    if (hp_.tied_embeddings) {  // the rank's vocabulary rows of token_embd as its output projection
      if (!be->supports(Op::kMatmul, embd->type))
        return make_error(ErrorCode::kUnsupported, "tensor 'token_embd.weight' (tied output) has type %s, which "
                          "backend %s cannot multiply", dtype_name(embd->type), be->name());
      KILN_ASSIGN_OR_RETURN(R.w.output, import_shard(*embd, Slice{Slice::kRows, r * layout_.vocab, layout_.vocab},
                                                     be, {hp_.n_embd, layout_.vocab}));
    }
    HParams unused_hp = R.hp;
    KILN_TRY(arch_->finish(R.hp, R.w, unused_hp));  // the output is set: nothing to tie
    if (R.w.rope_freqs.valid()) R.w.rope_freqs_on.push_back({be, R.w.rope_freqs});
  }
  place_ = ranks_[0].place;
  place_.tp_ranks = group.ranks;
  KILN_TRY(finish_load(file_, &stats_, &tokenizer_));
  stats_.load_seconds = timer.seconds();
  return Status::ok();
}

}  // namespace

Result<const gguf::TensorInfo*> manifest_tensor(const gguf::File& file, const TensorSpec& s,
                                                const std::string& arch) {
  const gguf::TensorInfo* ti = file.find_tensor(s.name);
  if (!ti) {
    if (s.required)
      return make_error(ErrorCode::kNotFound, "tensor '%s' is missing (architecture %s needs it)", s.name.c_str(),
                        arch.c_str());
    return static_cast<const gguf::TensorInfo*>(nullptr);
  }
  bool shape_ok = ti->n_dims <= 4;
  for (int d = 0; d < 4 && shape_ok; ++d)
    shape_ok = ti->ne[d] == (d < static_cast<int>(s.shape.size()) ? s.shape[d] : 1);
  if (!shape_ok) {
    std::string want = "[";
    for (size_t d = 0; d < s.shape.size(); ++d) want += (d ? ", " : "") + std::to_string(s.shape[d]);
    want += "]";
    return make_error(ErrorCode::kInvalidFile, "tensor '%s' has shape %s, expected %s", s.name.c_str(),
                      ti->shape_string().c_str(), want.c_str());
  }
  return ti;
}

Status check_tensor_type(const TensorSpec& s, DType t, const Backend& be) {
  switch (s.kind) {
    case TensorSpec::kF32:
      if (t == DType::F32) return Status::ok();
      return make_error(ErrorCode::kUnsupported, "tensor '%s' has type %s, expected f32", s.name.c_str(),
                        dtype_name(t));
    case TensorSpec::kEmbedding:
    case TensorSpec::kMatrix:
      if (be.supports(s.kind == TensorSpec::kEmbedding ? Op::kGetRows : Op::kMatmul, t)) return Status::ok();
      return make_error(ErrorCode::kUnsupported, "tensor '%s' has type %s, which backend %s cannot %s",
                        s.name.c_str(), dtype_name(t), be.name(),
                        s.kind == TensorSpec::kEmbedding ? "dequantize (get_rows)" : "multiply (matmul)");
    case TensorSpec::kExperts:
      if (be.supports(Op::kMoeFfn, t)) return Status::ok();
      if (!be.supports(Op::kMoeFfn, DType::F32) && !be.supports(Op::kMoeFfn, DType::F16))
        return make_error(ErrorCode::kUnsupported, "tensor '%s' is a mixture-of-experts stack: backend %s does not "
                          "run the moe_ffn op yet (place this model's layers on the CPU: --device cpu or -ngl 0)",
                          s.name.c_str(), be.name());
      return make_error(ErrorCode::kUnsupported, "tensor '%s' has type %s, which backend %s's moe_ffn cannot read",
                        s.name.c_str(), dtype_name(t), be.name());
  }
  return make_error(ErrorCode::kInternal, "tensor '%s': unknown manifest kind", s.name.c_str());
}

Status finish_load(const gguf::File& file, ModelStats* stats, std::unique_ptr<Tokenizer>* tokenizer) {
  for (const gguf::TensorInfo& t : file.tensors()) {
    stats->weight_bytes += t.nbytes;
    stats->n_params += static_cast<uint64_t>(t.n_elements());
  }
  auto tok = Tokenizer::from_gguf(file);
  if (!tok) return tok.status().with_context("tokenizer");
  *tokenizer = std::move(tok).value();
  return Status::ok();
}

Result<std::unique_ptr<Model>> load_tensor_parallel(gguf::File file, const LoadOptions& opts) {
  auto m = std::make_unique<TpModel>();
  KILN_TRY(m->init(std::move(file), opts));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace kiln
