// Model::load (mmap, hparams, manifest check, zero-copy weights) and Model::forward (the batch driver around the
// architecture's block; the pieces are in forward.cpp).
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "model/arch.h"
#include "model/forward.h"
#include "quant/reference.h"
#include "runtime/kv_cache_paged.h"
#include "util/timer.h"

namespace kiln {
namespace {

// Grow-only backend buffer: reallocated only when a larger batch arrives.
struct Slab {
  std::unique_ptr<Buffer> buf;
  Status ensure(Backend& be, size_t bytes) {
    if (buf && buf->size() >= bytes) return Status::ok();
    buf.reset();
    KILN_ASSIGN_OR_RETURN(buf, be.alloc(std::max<size_t>(bytes, 64)));
    return Status::ok();
  }
};

class LoadedModel final : public Model {
 public:
  const HParams& hparams() const override { return hp_; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  const ModelStats& stats() const override { return stats_; }
  const gguf::File& file() const override { return file_; }
  Backend& backend() override { return *backend_; }
  Status forward(const Batch& batch, KvCache& cache, std::vector<float>* logits) override;

  Status init(gguf::File file, const LoadOptions& opts);

 private:
  Status bind(const std::vector<TensorSpec>& manifest);
  Status ensure_workspace(int64_t n, int64_t n_out, int64_t table_ints);

  gguf::File file_;
  HParams hp_;
  const ArchDef* arch_ = nullptr;
  Weights w_;
  ModelStats stats_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;

  // Workspace (backend memory) and host staging for the batch's index arrays.
  int64_t cap_tok_ = 0;
  Slab act_, idx_, tables_, logits_;
  Tensor ws_[10];  // activation buffers of cap_tok_ rows: x h q k v attn g u x_keep attn_keep
  ForwardCtx ctx_;
  Tensor tokens_t_;
  std::vector<int32_t> h_idx_, h_tables_, h_seqs_, h_seq_row_;
  std::vector<int64_t> h_count_;
};

Status LoadedModel::bind(const std::vector<TensorSpec>& manifest) {
  for (const TensorSpec& s : manifest) {
    const gguf::TensorInfo* ti = file_.find_tensor(s.name);
    if (!ti) {
      if (s.required)
        return make_error(ErrorCode::kNotFound, "tensor '%s' is missing (architecture %s needs it)", s.name.c_str(),
                          hp_.arch.c_str());
      continue;
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
    const bool type_ok = s.kind == TensorSpec::kF32         ? ti->type == DType::F32
                         : s.kind == TensorSpec::kEmbedding ? can_dequantize(ti->type)
                                                            : cpu::matmul_supports(ti->type);
    if (!type_ok)
      return make_error(ErrorCode::kUnsupported, "tensor '%s' has type %s, %s", s.name.c_str(), dtype_name(ti->type),
                        s.kind == TensorSpec::kF32 ? "expected f32" : "which kiln cannot multiply/dequantize");
    KILN_ASSIGN_OR_RETURN(*s.dst, backend_->import_weight(ti->type, ti->ne, ti->data, ti->nbytes));
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

  CpuBackendOptions bo;
  bo.n_threads = opts.n_threads;
  bo.reference = opts.reference_backend;
  backend_ = make_cpu_backend(bo);

  w_.layers.assign(hp_.n_layer, LayerWeights{});
  KILN_TRY(bind(arch_->manifest(hp_, w_)));
  KILN_TRY(arch_->finish(hp_, w_, hp_));

  for (const gguf::TensorInfo& t : file_.tensors()) {
    stats_.weight_bytes += t.nbytes;
    stats_.n_params += static_cast<uint64_t>(t.n_elements());
  }
  if (opts.prefetch) file_.mapping()->prefetch();
  if (opts.show_progress && stats_.weight_bytes > (256ull << 20)) {
    // Touch every page once so the first forward pass does not stall on page faults.
    const uint8_t* p = file_.mapping()->data();
    const size_t n = file_.mapping()->size();
    volatile uint8_t sink = 0;
    int last = -1;
    for (size_t off = 0; off < n; off += 4096) {
      sink = sink + p[off];
      const int pct = static_cast<int>(off * 100 / n);
      if (pct != last && pct % 5 == 0) {
        std::fprintf(stderr, "\rloading %s: %3d%%", file_.path().c_str(), pct);
        last = pct;
      }
    }
    std::fprintf(stderr, "\rloading %s: 100%%\n", file_.path().c_str());
  }

  auto tok = Tokenizer::from_gguf(file_);
  if (!tok) return tok.status().with_context("tokenizer");
  tokenizer_ = std::move(tok).value();

  stats_.load_seconds = timer.seconds();
  if (opts.show_progress)
    std::fprintf(stderr, "model: %s (%s), %.1fM params, %.1f MiB weights mapped, %lld layers, backend %s, %.2f s\n",
                 hp_.name.empty() ? file_.path().c_str() : hp_.name.c_str(), hp_.arch.c_str(),
                 static_cast<double>(stats_.n_params) / 1e6, static_cast<double>(stats_.weight_bytes) / (1 << 20),
                 static_cast<long long>(hp_.n_layer), backend_->name(), stats_.load_seconds);
  return Status::ok();
}

Status LoadedModel::ensure_workspace(int64_t n, int64_t n_out, int64_t table_ints) {
  Backend& be = *backend_;
  const HParams& hp = hp_;
  if (n > cap_tok_) {
    const int64_t widths[] = {hp.n_embd, hp.n_embd, hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k,
                              hp.n_head_kv * hp.head_dim_v, hp.n_head * hp.head_dim_v, hp.n_ff, hp.n_ff,
                              hp.n_embd, hp.n_head * hp.head_dim_v};
    size_t total = 0;
    for (int64_t wd : widths) total += (static_cast<size_t>(wd * n) * sizeof(float) + 63) / 64 * 64;
    KILN_TRY(act_.ensure(be, total));
    KILN_TRY(idx_.ensure(be, static_cast<size_t>(n) * 6 * sizeof(int32_t)));
    char* p = static_cast<char*>(act_.buf->data());
    for (int i = 0; i < 10; ++i) {
      ws_[i] = Tensor::make(DType::F32, p, &be, widths[i], n);
      p += (static_cast<size_t>(widths[i] * n) * sizeof(float) + 63) / 64 * 64;
    }
    cap_tok_ = n;
  }
  KILN_TRY(tables_.ensure(be, static_cast<size_t>(table_ints) * sizeof(int32_t)));
  KILN_TRY(logits_.ensure(be, static_cast<size_t>(std::max<int64_t>(n_out, 1) * hp.n_vocab) * sizeof(float)));
  return Status::ok();
}

// The forward pass of one batch, top to bottom:
//   1. check the batch (ids, sequences, positions) and reserve cache blocks for it
//   2. per token: cache slot, which block table, attention length; upload the index arrays
//   3. x = token_embd[tokens]; per layer: the architecture's block (pre-norm attention + SwiGLU FFN)
//   4. rows that want logits: output_norm, output projection -> host
Status LoadedModel::forward(const Batch& batch, KvCache& cache_base, std::vector<float>* logits) {
  PagedKvCache& cache = static_cast<PagedKvCache&>(cache_base);
  const HParams& hp = hp_;
  const int64_t n = static_cast<int64_t>(batch.size());
  if (logits) logits->clear();
  if (n == 0) return Status::ok();
  if (cache.n_layer() != hp.n_layer)
    return make_error(ErrorCode::kInvalidArgument, "forward: the KV cache was made for %lld layers, the model has %lld",
                      static_cast<long long>(cache.n_layer()), static_cast<long long>(hp.n_layer));

  // 1. Checks; sequences in order of first appearance, with their token counts.
  // seq -> tokens of it so far in this batch / its block-table row (-1: not in the batch). Host scratch sized
  // max_seqs, reused across calls.
  std::vector<int32_t>& seqs = h_seqs_;
  std::vector<int64_t>& count = h_count_;
  std::vector<int32_t>& seq_row = h_seq_row_;
  seqs.clear();
  count.assign(cache.config().max_seqs, 0);
  seq_row.assign(cache.config().max_seqs, -1);
  int64_t n_out = 0;
  for (int64_t i = 0; i < n; ++i) {
    const BatchToken& t = batch.tokens[i];
    if (t.token < 0 || t.token >= hp.n_vocab)
      return make_error(ErrorCode::kInvalidArgument, "batch token %lld: id %d is out of range [0, %lld)",
                        static_cast<long long>(i), t.token, static_cast<long long>(hp.n_vocab));
    if (!cache.valid_seq(t.seq_id))
      return make_error(ErrorCode::kInvalidArgument, "batch token %lld: sequence id %d is out of range [0, %d)",
                        static_cast<long long>(i), t.seq_id, cache.config().max_seqs);
    if (seq_row[t.seq_id] < 0) {
      seq_row[t.seq_id] = static_cast<int32_t>(seqs.size());
      seqs.push_back(t.seq_id);
    }
    const int64_t expect = cache.seq_len(t.seq_id) + count[t.seq_id];
    if (t.pos != expect)
      return make_error(ErrorCode::kInvalidArgument, "batch token %lld: position %d does not continue sequence %d "
                        "(expected %lld)", static_cast<long long>(i), t.pos, t.seq_id, static_cast<long long>(expect));
    ++count[t.seq_id];
    n_out += t.want_logits;
  }
  for (size_t s = 0; s < seqs.size(); ++s) {
    Status st = cache.reserve(seqs[s], count[seqs[s]]);
    if (!st.is_ok()) {
      for (size_t r = 0; r < s; ++r) cache.truncate(seqs[r], cache.seq_len(seqs[r]));  // drop the new reservations
      return st;
    }
  }
  KILN_TRY(cache.ensure_storage(*backend_));

  // 2. Index arrays: tokens, pos, slots, tok_table, kv_len, out_ids (I32 [n] each) and the block tables.
  int64_t max_blocks = 1;
  for (int32_t s : seqs) max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(cache.table(s).size()));
  KILN_TRY(ensure_workspace(n, n_out, static_cast<int64_t>(seqs.size()) * max_blocks));
  h_tables_.assign(seqs.size() * max_blocks, -1);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto& tb = cache.table(seqs[s]);
    std::copy(tb.begin(), tb.end(), h_tables_.begin() + s * max_blocks);
  }
  h_idx_.assign(static_cast<size_t>(n) * 6, 0);
  int32_t* tok = h_idx_.data();
  int32_t* pos = tok + n;
  int32_t* slot = pos + n;
  int32_t* tt = slot + n;
  int32_t* kvl = tt + n;
  int32_t* out = kvl + n;
  const int64_t bs = cache.config().block_size;
  int64_t j = 0;
  int32_t max_len = 0;
  for (int64_t i = 0; i < n; ++i) {
    const BatchToken& t = batch.tokens[i];
    tok[i] = t.token;
    pos[i] = t.pos;
    slot[i] = static_cast<int32_t>(cache.table(t.seq_id)[t.pos / bs] * bs + t.pos % bs);
    tt[i] = seq_row[t.seq_id];
    kvl[i] = t.pos + 1;  // causal: itself and everything before it
    max_len = std::max(max_len, kvl[i]);
    if (t.want_logits) out[j++] = static_cast<int32_t>(i);
  }
  Backend& be = *backend_;
  const Tensor idx = Tensor::make(DType::I32, idx_.buf->data(), &be, n, 6);
  KILN_TRY(be.write(idx, 0, h_idx_.data(), h_idx_.size() * sizeof(int32_t)));
  const Tensor tables = Tensor::make(DType::I32, tables_.buf->data(), &be, max_blocks, static_cast<int64_t>(seqs.size()));
  KILN_TRY(be.write(tables, 0, h_tables_.data(), h_tables_.size() * sizeof(int32_t)));

  ForwardCtx& c = ctx_;
  c.be = &be;
  c.hp = &hp_;
  c.w = &w_;
  c.cache = &cache;
  c.n = n;
  // The workspace tensors cover cap_tok_ rows; this batch uses the first n.
  Tensor* act[] = {&c.x, &c.h, &c.q, &c.k, &c.v, &c.attn, &c.g, &c.u, &c.x_keep, &c.attn_keep};
  for (int i = 0; i < 10; ++i) *act[i] = ws_[i].rows(0, n);
  tokens_t_ = idx.rows(0, 1).reshape(n);
  c.pos = idx.rows(1, 1).reshape(n);
  c.slots = idx.rows(2, 1).reshape(n);
  c.meta.block_tables = tables;
  c.meta.tok_table = idx.rows(3, 1).reshape(n);
  c.meta.kv_len = idx.rows(4, 1).reshape(n);
  c.meta.max_kv_len = max_len;
  c.out_ids = idx.rows(5, 1).reshape(n_out > 0 ? n_out : 1);
  c.n_out = logits ? n_out : 0;
  c.rope.mode = hp.rope_type == RopeType::kNeox ? RopeMode::kNeox : RopeMode::kNormal;
  c.rope.n_rot = static_cast<int32_t>(hp.n_rot);
  c.rope.freq_base = hp.rope_freq_base;
  c.rope.freq_scale = hp.rope_freq_scale;
  c.rope.freq_factors = w_.rope_freqs;
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim_k));

  // 3. Embedding and the layers.
  KILN_TRY(be.get_rows(w_.tok_embd, tokens_t_, c.x));
  for (int64_t il = 0; il < hp.n_layer; ++il) KILN_TRY(arch_->block(c, il));
  for (int32_t s : seqs) KILN_TRY(cache.commit(s, count[s]));

  // 4. Logits for the rows that asked (the last layer kept only those, in order): final norm, output projection.
  if (c.n_out == 0) return Status::ok();
  if (c.n != c.n_out) return make_error(ErrorCode::kInternal, "forward: %lld rows left for %lld logits",
                                        static_cast<long long>(c.n), static_cast<long long>(c.n_out));
  const Tensor xo = c.h.rows(0, n_out);
  KILN_TRY(be.rms_norm(c.x, w_.output_norm, hp.rms_eps, xo));
  const Tensor lt = Tensor::make(DType::F32, logits_.buf->data(), &be, hp.n_vocab, n_out);
  KILN_TRY(be.matmul(w_.output, xo, Tensor{}, lt));
  logits->resize(static_cast<size_t>(n_out * hp.n_vocab));
  return be.read(lt, 0, logits->data(), logits->size() * sizeof(float));
}

}  // namespace

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const LoadOptions& opts) {
  auto file = gguf::File::open(path);
  if (!file) return file.status();
  return load(std::move(file).value(), opts);
}

Result<std::unique_ptr<Model>> Model::load(gguf::File file, const LoadOptions& opts) {
  const std::string path = file.path();
  auto m = std::make_unique<LoadedModel>();
  Status st = m->init(std::move(file), opts);
  if (!st.is_ok()) return st.with_context("loading " + path);
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace kiln
