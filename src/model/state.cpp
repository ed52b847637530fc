// ModelState: KV storage, workspace and staging allocated once for StepCaps; execute() = upload + ops; fetch().
//
// Memory, all allocated in make_model_state:
//   per layer       K and V pools on the layer's backend: [n_head_kv * hd, n_blocks * block_size] of kv_type_k /
//                   kv_type_v
//   per layer       (linear-attention layers of hybrid models instead of K/V) the recurrent state: conv history
//                   [(d_conv-1) * conv_dim, max_seqs] and delta-rule matrices [S_v * S_k * H_v, max_seqs], f32;
//                   with n_checkpoints, the same two again with n_checkpoints rows (the checkpoints)
//   per backend     workspace of batch_tokens rows: x h q k v attn g u x_keep attn_keep s (f32), the index region
//                   (I32, the staging layout below) and the block tables [max_blocks_per_seq, max_seqs]
//   output backend  logits f32 [n_vocab, max_outputs], argmax I32 [max_outputs]; where it runs argmax_masked, the
//                   masks I64 [ceil(n_vocab / 64), max_outputs] (zeroed at creation) and their pinned host staging
//                   (StepPlan::out_mask, from the output backend's alloc_host)
//   per backend holding experts apart from their layer (Placement::experts)
//                   zeros f32 [n_embd, batch_tokens] (the start of the experts' sum; its workspace's x and h hold the
//                   normed input's copy and the sum: a backend's workspace is idle while another backend's layer runs)
//   host (pinned)   with caps.hidden: the hidden rows of a hidden step, [batch_tokens][n_embd] f32 (model/step.h)
//   layer 0's backend, a NextN view only (model/mtp.h): its hidden input rows f32 [n_embd, batch_tokens], the
//                   concatenation scratch [2 n_embd, batch_tokens] and the rows' pinned host staging
//                   (StepPlan::hidden_in, from that backend's alloc_host)
//   host (pinned, from the input backend's alloc_host)
//                   staging: index region + out_kind + table mirror; fetch: argmax [max_outputs] and logits
//                   [max_outputs][n_vocab]; a bounce buffer of batch_tokens * n_embd f32 for device-to-device
//                   boundaries without host memory on either side
// Index region (int32 offsets, T = batch_tokens, O = max_outputs, S = max_seqs):
//   token 0 | pos T | slot 2T | tok_table 3T | kv_len 4T | out_rows 5T | seq_row 5T+O | seq_q_start +S |
//   seq_q_len +2S | seq_kv_len +3S | seq_reset +4S | end 5T+O+5S
//
// Tensor parallel (make_tp_model_state): one State per rank, each on its rank's backend with the rank's HParams
// (its heads, KV heads, n_ff, vocabulary rows V/N) and weight shards, plus the rank's Communicator. Per rank, in
// addition: local logits f32 [V/N, max_outputs] and the gathered logits [V/N, max_outputs, N] (rank-major, what
// all_gather writes); rank 0 permutes them into its logits [V, max_outputs] and takes the argmax there. TpState
// drives the ranks: the runtime plans into rank 0's staging, execute mirrors it to the other ranks and runs every
// rank's execute on its own thread (the collectives need one thread per rank), fetch reads rank 0.
#include "model/state.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "model/forward.h"
#include "model/mtp.h"

namespace kiln {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct IndexLayout {
  int64_t T, O, S;
  int64_t token() const { return 0; }
  int64_t pos() const { return T; }
  int64_t slot() const { return 2 * T; }
  int64_t tok_table() const { return 3 * T; }
  int64_t kv_len() const { return 4 * T; }
  int64_t out_rows() const { return 5 * T; }
  int64_t seq_row() const { return 5 * T + O; }
  int64_t seq_q_start() const { return 5 * T + O + S; }
  int64_t seq_q_len() const { return 5 * T + O + 2 * S; }
  int64_t seq_kv_len() const { return 5 * T + O + 3 * S; }
  int64_t seq_reset() const { return 5 * T + O + 4 * S; }
  int64_t ints() const { return 5 * T + O + 5 * S; }
};

// Everything one backend of the placement needs to run its layers (or the input/output).
struct Work {
  Backend* be = nullptr;
  std::unique_ptr<Buffer> act, idx, tables;
  Tensor ws[11];  // x h q k v attn g u x_keep attn_keep s, [width, batch_tokens]
  Tensor idx_t, tables_t;
  Tensor rope_freqs;
  std::unique_ptr<Buffer> zeros;  // experts apart from their layer run here: f32 [n_embd, batch_tokens] of 0
  Tensor zero;
};

class State final : public ModelState {
 public:
  State(const HParams& hp, const ArchDef& arch, const Weights& w, const Placement& place, const StepCaps& caps,
        Communicator* comm = nullptr, int64_t n_vocab_full = 0)
      : hp_(hp), arch_(arch), w_(w), place_(place), caps_(caps),
        L_{caps.batch_tokens, caps.max_outputs, caps.max_seqs}, comm_(comm),
        V_(comm ? n_vocab_full : hp.n_vocab) {}

  Status init();

  const StepCaps& caps() const override { return caps_; }
  bool wants_buckets() const override { return buckets_; }
  bool supports_masked_argmax() const override { return mask_ != nullptr; }
  StepPlan& plan() override { return plan_; }
  Status execute() override;
  Result<StepOutputs> fetch() override;
  KvLayer kv_layer(int64_t il) const override { return kv_[il]; }
  Status copy_block(int32_t src, int32_t dst, int32_t n) override;
  uint64_t kv_bytes() const override { return kv_storage_bytes(hp_, caps_); }
  bool has_recurrent_state() const override { return hp_.hybrid(); }
  Status copy_seq_state(int32_t src, int32_t dst) override;
  uint64_t recurrent_bytes() const override { return recurrent_state_bytes(hp_, caps_); }
  Status save_checkpoint(int32_t seq, int32_t checkpoint) override;
  Status load_checkpoint(int32_t checkpoint, int32_t seq) override;
  uint64_t checkpoint_bytes() const override { return checkpoint_state_bytes(hp_, caps_); }

  // ---- tensor parallel (TpState) ----
  // This rank's plan := src's (the index region, out_kind, the table rows src marks dirty, the counts).
  void mirror_plan(const StepPlan& src);
  // Waits for this rank's queued work (the next plan rewrites the staging its uploads read).
  Status sync_all() {
    for (Work& w : work_)
      if (!w.be->host_memory()) KILN_TRY(w.be->synchronize());
    return Status::ok();
  }

 private:
  Work& work_of(const Backend* be) {
    for (Work& w : work_)
      if (w.be == be) return w;
    return work_[0];  // unreachable: every placement backend has a Work
  }
  // The first m rows of the device masks (argmax_masked's operand).
  Tensor mask_tensor(int64_t m) const {
    return Tensor::make(DType::I64, mask_->data(), place_.output.get(), plan_.mask_words, m > 0 ? m : 1);
  }
  Tensor idx_view(const Work& w, int64_t off, int64_t n) const {
    return Tensor::make(DType::I32, static_cast<int32_t*>(w.idx->data()) + off, w.be, n > 0 ? n : 1);
  }
  void set_layer_ctx(ForwardCtx& c, Work& w, int64_t n, int64_t m);
  // What differs per layer: RoPE base, attention scale, recurrent state.
  void set_layer_params(ForwardCtx& c, int64_t il) const;

  const HParams& hp_;
  const ArchDef& arch_;
  const Weights& w_;
  Placement place_;  // shared ownership of the backends for the state's lifetime
  StepCaps caps_;
  IndexLayout L_;
  bool buckets_ = false;

  std::vector<Work> work_;
  std::vector<std::unique_ptr<Buffer>> kv_bufs_;
  std::vector<KvLayer> kv_;
  std::vector<Tensor> conv_state_, ssm_state_;  // per layer (invalid for attention layers)
  std::vector<Tensor> conv_ckpt_, ssm_ckpt_;    // per layer: the checkpoints (invalid without them)
  // Row `from` of the recurrent tensors `a` ({conv, ssm}: the state or the checkpoints) -> row `to` of `b`, every
  // layer.
  using Rows = const std::vector<Tensor>* const[2];
  Status copy_recurrent(Rows& a, int32_t from, Rows& b, int32_t to);
  std::unique_ptr<Buffer> logits_, argmax_;  // on the output backend
  std::unique_ptr<Buffer> mask_, mask_host_;  // argmax_masked: [W, max_outputs] u64 words, device and pinned host
  std::unique_ptr<Buffer> staging_, host_out_, bounce_;
  std::unique_ptr<Buffer> hidden_host_;  // caps.hidden: [batch_tokens][n_embd] f32, pinned
  Tensor hidden_dev_;                    // the last hidden step's final-norm rows [n_embd, n_bucket] (output backend)
  std::unique_ptr<Buffer> hidden_in_host_, hidden_in_buf_, cat_buf_;  // a NextN view's input rows (model/mtp.h)
  Tensor hidden_in_, cat_;
  StepPlan plan_;
  ForwardCtx ctx_;
  Communicator* comm_ = nullptr;  // tensor parallel: this rank's (nullptr: one rank)
  int64_t V_ = 0;                 // vocabulary of the logits fetched (the full one under tensor parallel)
  std::unique_ptr<Buffer> logits_local_, gathered_;  // tensor parallel: [V/N, O] and [V/N, O, N]
};

Status State::init() {
  const int64_t T = caps_.batch_tokens, S = caps_.max_seqs, MB = caps_.max_blocks_per_seq();
  std::vector<Backend*> bes = place_.backends();
  for (Backend* be : bes) buckets_ = buckets_ || !be->host_memory();

  // KV pools per layer on the layer's backend.
  const int64_t n_slots = caps_.n_blocks * caps_.block_size;
  kv_.resize(static_cast<size_t>(hp_.n_layer));
  for (auto* v : {&conv_state_, &ssm_state_, &conv_ckpt_, &ssm_ckpt_}) v->resize(static_cast<size_t>(hp_.n_layer));
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    Backend* be = place_.layers[il].get();
    KvLayer& l = kv_[il];
    l.n_head_kv = static_cast<int32_t>(hp_.n_head_kv);
    l.head_dim_k = static_cast<int32_t>(hp_.head_dim_k);
    l.head_dim_v = static_cast<int32_t>(hp_.head_dim_v);
    l.block_size = caps_.block_size;
    l.window = hp_.window(il);
    if (hp_.is_recurrent(il)) {  // no K/V: a recurrent state row per sequence slot instead
      const int64_t widths[4] = {hp_.ssm_conv_state(), hp_.ssm_delta_state(), hp_.ssm_conv_state(),
                                 hp_.ssm_delta_state()};
      const int64_t rows[4] = {caps_.max_seqs, caps_.max_seqs, caps_.n_checkpoints, caps_.n_checkpoints};
      Tensor* dst[4] = {&conv_state_[il], &ssm_state_[il], &conv_ckpt_[il], &ssm_ckpt_[il]};
      for (int i = 0; i < 4; ++i) {
        if (rows[i] == 0) continue;
        auto buf = be->alloc(static_cast<size_t>(widths[i] * rows[i]) * sizeof(float));
        if (!buf)
          return buf.status().with_context(std::string(i < 2 ? "recurrent state" : "recurrent-state checkpoints") +
                                           " of layer " + std::to_string(il));
        *dst[i] = Tensor::make(DType::F32, (*buf)->data(), be, widths[i], rows[i]);
        kv_bufs_.push_back(std::move(buf).value());
      }
      continue;
    }
    for (int kv = 0; kv < 2; ++kv) {
      const int64_t width = hp_.n_head_kv * (kv ? hp_.head_dim_v : hp_.head_dim_k);
      const DType t = kv ? caps_.kv_type_v : caps_.kv_type_k;
      const size_t bytes = dtype_row_bytes(t, width).value() * static_cast<size_t>(n_slots);
      auto buf = be->alloc(bytes);
      if (!buf) return buf.status().with_context("KV cache of layer " + std::to_string(il));
      (kv ? l.v : l.k) = Tensor::make(t, (*buf)->data(), be, width, n_slots);
      kv_bufs_.push_back(std::move(buf).value());
    }
  }

  // Workspace, index region and block tables per backend.
  const int64_t q_width = std::max(hp_.n_head * hp_.head_dim_k, hp_.ws_q_width);
  const int64_t widths[] = {hp_.n_embd, hp_.n_embd, q_width, hp_.n_head_kv * hp_.head_dim_k,
                            hp_.n_head_kv * hp_.head_dim_v, hp_.n_head * hp_.head_dim_v, hp_.n_ff, hp_.n_ff,
                            hp_.n_embd, hp_.n_head * hp_.head_dim_v, hp_.ws_extra};
  size_t act_bytes = 0;
  for (int64_t wd : widths) act_bytes += align_up(static_cast<size_t>(wd * T) * sizeof(float));
  for (Backend* be : bes) {
    Work w;
    w.be = be;
    KILN_ASSIGN_OR_RETURN(w.act, be->alloc(act_bytes));
    char* p = static_cast<char*>(w.act->data());
    for (int i = 0; i < 11; ++i) {
      w.ws[i] = Tensor::make(DType::F32, p, be, widths[i], T);
      p += align_up(static_cast<size_t>(widths[i] * T) * sizeof(float));
    }
    KILN_ASSIGN_OR_RETURN(w.idx, be->alloc(static_cast<size_t>(L_.ints()) * sizeof(int32_t)));
    w.idx_t = Tensor::make(DType::I32, w.idx->data(), be, L_.ints());
    KILN_ASSIGN_OR_RETURN(w.tables, be->alloc(static_cast<size_t>(MB * S) * sizeof(int32_t)));
    w.tables_t = Tensor::make(DType::I32, w.tables->data(), be, MB, S);
    w.rope_freqs = w_.rope_freqs_for(be);
    work_.push_back(std::move(w));
  }
  // The zeros of each backend that runs experts apart from their layer.
  for (Work& w : work_) {
    bool hosts = false;
    for (int64_t il = 0; il < hp_.n_layer; ++il)
      hosts = hosts || (place_.experts_of(il) == w.be && place_.layers[il].get() != w.be);
    if (!hosts) continue;
    KILN_ASSIGN_OR_RETURN(w.zeros, w.be->alloc(static_cast<size_t>(hp_.n_embd * T) * sizeof(float)));
    w.zero = Tensor::make(DType::F32, w.zeros->data(), w.be, hp_.n_embd, T);
    const std::vector<float> row(static_cast<size_t>(hp_.n_embd), 0.0f);
    for (int64_t r = 0; r < T; ++r)
      KILN_TRY(w.be->write(w.zero, static_cast<size_t>(r * hp_.n_embd) * sizeof(float), row.data(),
                           row.size() * sizeof(float)));
  }
  // Block tables start as all block 0 (a valid id): a row is only read for kv positions the planner set.
  std::vector<int32_t> zeros(static_cast<size_t>(MB), 0);
  for (Work& w : work_)
    for (int64_t r = 0; r < S; ++r)
      KILN_TRY(w.be->write(w.tables_t, static_cast<size_t>(r * MB) * sizeof(int32_t), zeros.data(),
                           zeros.size() * sizeof(int32_t)));

  // Outputs on the output backend.
  Backend* ob = place_.output.get();
  const size_t O = static_cast<size_t>(caps_.max_outputs), V = static_cast<size_t>(hp_.n_vocab);
  KILN_ASSIGN_OR_RETURN(logits_, ob->alloc(O * static_cast<size_t>(V_) * sizeof(float)));
  if (comm_) {
    KILN_ASSIGN_OR_RETURN(logits_local_, ob->alloc(O * V * sizeof(float)));
    KILN_ASSIGN_OR_RETURN(gathered_, ob->alloc(O * V * static_cast<size_t>(comm_->size()) * sizeof(float)));
  }
  KILN_ASSIGN_OR_RETURN(argmax_, ob->alloc(O * sizeof(int32_t)));
  if (ob->supports(Op::kArgmaxMasked, DType::F32)) {
    const size_t W = static_cast<size_t>((V_ + 63) / 64), bytes = O * W * sizeof(uint64_t);
    KILN_ASSIGN_OR_RETURN(mask_, ob->alloc(bytes));
    KILN_ASSIGN_OR_RETURN(mask_host_, ob->alloc_host(bytes));
    plan_.out_mask = static_cast<uint64_t*>(mask_host_->data());
    plan_.mask_words = static_cast<int32_t>(W);
    std::memset(mask_host_->data(), 0, bytes);  // padded output rows read defined (empty) masks
    KILN_TRY(ob->write(mask_tensor(static_cast<int64_t>(O)), 0, mask_host_->data(), bytes));
    KILN_TRY(ob->synchronize());  // the staging is rewritten by the first plan
  }

  // Host staging (pinned by the backend the plan is uploaded to first: the input's).
  Backend* ib = place_.input.get();
  const size_t idx_bytes = static_cast<size_t>(L_.ints()) * sizeof(int32_t);
  const size_t kind_bytes = align_up(O);
  const size_t table_bytes = static_cast<size_t>(MB * S) * sizeof(int32_t);
  KILN_ASSIGN_OR_RETURN(staging_, ib->alloc_host(align_up(idx_bytes) + kind_bytes + table_bytes));
  std::memset(staging_->data(), 0, staging_->size());
  KILN_ASSIGN_OR_RETURN(host_out_, ob->alloc_host(align_up(O * sizeof(int32_t)) + O * static_cast<size_t>(V_) *
                                                                                      sizeof(float)));
  if (bes.size() > 1) {
    KILN_ASSIGN_OR_RETURN(bounce_, ib->alloc_host(static_cast<size_t>(hp_.n_embd * T) * sizeof(float)));
  }
  if (caps_.hidden) {
    KILN_ASSIGN_OR_RETURN(hidden_host_, ob->alloc_host(static_cast<size_t>(hp_.n_embd * T) * sizeof(float)));
  }
  if (w_.nextn_input) {
    Backend* lb = place_.layers[0].get();
    const size_t row_bytes = static_cast<size_t>(hp_.n_embd * T) * sizeof(float);
    KILN_ASSIGN_OR_RETURN(hidden_in_host_, lb->alloc_host(row_bytes));
    std::memset(hidden_in_host_->data(), 0, row_bytes);  // defined before the first plan (padded rows read it)
    KILN_ASSIGN_OR_RETURN(hidden_in_buf_, lb->alloc(row_bytes));
    KILN_ASSIGN_OR_RETURN(cat_buf_, lb->alloc(2 * row_bytes));
    hidden_in_ = Tensor::make(DType::F32, hidden_in_buf_->data(), lb, hp_.n_embd, T);
    cat_ = Tensor::make(DType::F32, cat_buf_->data(), lb, 2 * hp_.n_embd, T);
    plan_.hidden_in = static_cast<float*>(hidden_in_host_->data());
  }

  int32_t* base = static_cast<int32_t*>(staging_->data());
  plan_.token = base + L_.token();
  plan_.pos = base + L_.pos();
  plan_.slot = base + L_.slot();
  plan_.tok_table = base + L_.tok_table();
  plan_.kv_len = base + L_.kv_len();
  plan_.out_rows = base + L_.out_rows();
  plan_.seq_row = base + L_.seq_row();
  plan_.seq_q_start = base + L_.seq_q_start();
  plan_.seq_q_len = base + L_.seq_q_len();
  plan_.seq_kv_len = base + L_.seq_kv_len();
  plan_.seq_reset = base + L_.seq_reset();
  char* after = static_cast<char*>(staging_->data()) + align_up(idx_bytes);
  plan_.out_kind = reinterpret_cast<OutputKind*>(after);
  plan_.tables = reinterpret_cast<int32_t*>(after + kind_bytes);
  plan_.dirty_rows.reserve(static_cast<size_t>(S));
  return Status::ok();
}

void State::set_layer_ctx(ForwardCtx& c, Work& w, int64_t n, int64_t m) {
  const int64_t S = caps_.max_seqs;
  c.be = w.be;
  Tensor* act[] = {&c.x, &c.h, &c.q, &c.k, &c.v, &c.attn, &c.g, &c.u, &c.x_keep, &c.attn_keep};
  for (int i = 0; i < 10; ++i) *act[i] = w.ws[i].rows(0, n);
  c.s = w.ws[10];
  c.n = n;
  c.n_out = m;
  c.pos = idx_view(w, L_.pos(), n);
  c.slots = idx_view(w, L_.slot(), n);
  c.out_ids = idx_view(w, L_.out_rows(), m);
  c.meta.block_tables = w.tables_t;
  c.meta.tok_table = idx_view(w, L_.tok_table(), n);
  c.meta.kv_len = idx_view(w, L_.kv_len(), n);
  c.meta.seq_row = idx_view(w, L_.seq_row(), S);
  c.meta.seq_q_start = idx_view(w, L_.seq_q_start(), S);
  c.meta.seq_q_len = idx_view(w, L_.seq_q_len(), S);
  c.meta.seq_kv_len = idx_view(w, L_.seq_kv_len(), S);
  c.meta.seq_reset = idx_view(w, L_.seq_reset(), S);
  c.meta.n_seq = plan_.n_seq;
  c.meta.max_kv_len = plan_.max_kv_len;
  c.meta.max_q_len = plan_.max_q_len;
  c.rope.freq_factors = w.rope_freqs;
}

void State::set_layer_params(ForwardCtx& c, int64_t il) const {
  c.rope.freq_base = hp_.rope_base(il);
  c.attn_scale = hp_.attn_scale > 0 ? hp_.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp_.head_dim_k));
  c.conv_state = conv_state_[il];
  c.ssm_state = ssm_state_[il];
}

// The step, top to bottom:
//   1. upload: the index region (one write per backend) and the dirty block-table rows
//   2. x = token_embd[tokens] on the input backend
//   3. per layer, on its backend (x copied over at a boundary): the architecture's block; the last layer keeps
//      only the output rows past attention (a hidden step: every row)
//   4. output rows: output_norm, output projection, argmax (output backend); a hidden step: output_norm of every
//      row, the output rows gathered from it for the projection
Status State::execute() {
  StepPlan& P = plan_;
  const int64_t n = P.n_bucket, m = P.n_out_bucket;
  if (n <= 0 || n > caps_.batch_tokens || m < 0 || m > caps_.max_outputs || m > n || P.n_seq < 0 ||
      P.n_seq > caps_.max_seqs)
    return make_error(ErrorCode::kInternal, "execute: plan of %lld tokens / %lld outputs / %d sequences exceeds the "
                      "state's capacity (%d / %d / %d)", static_cast<long long>(n), static_cast<long long>(m),
                      P.n_seq, caps_.batch_tokens, caps_.max_outputs, caps_.max_seqs);
  if (P.hidden && !caps_.hidden)
    return make_error(ErrorCode::kInternal, "execute: a hidden step on a state created without StepCaps::hidden");
  const int64_t MB = caps_.max_blocks_per_seq();
  // 1. Upload.
  for (Work& w : work_) {
    KILN_TRY(w.be->write(w.idx_t, 0, staging_->data(), static_cast<size_t>(L_.ints()) * sizeof(int32_t)));
    for (int32_t r : P.dirty_rows)
      KILN_TRY(w.be->write(w.tables_t, static_cast<size_t>(r * MB) * sizeof(int32_t), P.tables + r * MB,
                           static_cast<size_t>(MB) * sizeof(int32_t)));
  }
  P.dirty_rows.clear();
  if (P.hidden_in)
    KILN_TRY(hidden_in_.backend->write(hidden_in_, 0, P.hidden_in,
                                       static_cast<size_t>(n * hp_.n_embd) * sizeof(float)));
  // The masks go to the output backend only, and only where the argmax is taken (tensor parallel: rank 0).
  const bool masked = P.masked && (!comm_ || comm_->rank() == 0);
  if (masked && !mask_)
    return make_error(ErrorCode::kInternal, "execute: a masked step on a state without masks");
  if (masked && P.n_out > 0)
    KILN_TRY(place_.output->write(mask_tensor(m), 0, P.out_mask,
                                  static_cast<size_t>(P.n_out) * static_cast<size_t>(P.mask_words) * sizeof(uint64_t)));

  // A decode-sized step (<= 64 tokens) on one backend may be a recorded graph (Backend::graph_*), keyed by every
  // host-side count the ops see, packed without loss: n, m, max_q_len <= 64 (7 bits each), n_seq <= n (16 bits),
  // whether the argmax is masked (1 bit), max_kv_len (26 bits).
  Backend* solo = !P.hidden && work_.size() == 1 && n <= 64 && P.max_q_len <= 64 && P.max_kv_len >= 0 &&
                          P.max_kv_len < (1 << 26) ? work_[0].be : nullptr;
  const uint64_t gkey = static_cast<uint64_t>(n) | static_cast<uint64_t>(m) << 7 |
                        static_cast<uint64_t>(P.max_q_len) << 14 | static_cast<uint64_t>(P.n_seq) << 21 |
                        static_cast<uint64_t>(masked) << 37 | static_cast<uint64_t>(P.max_kv_len) << 38;
  if (solo && solo->graph_replay(gkey)) return Status::ok();
  if (solo) KILN_TRY(solo->graph_begin(gkey));
  auto run_ops = [&]() -> Status {
  ForwardCtx& c = ctx_;
  c.hp = &hp_;
  c.w = &w_;
  c.kv = kv_.data();
  c.comm = comm_;
  c.rope.mode = hp_.rope_type == RopeType::kNeox ? RopeMode::kNeox : RopeMode::kNormal;
  c.rope.n_rot = static_cast<int32_t>(hp_.n_rot);
  c.rope.freq_base = hp_.rope_freq_base;
  c.rope.freq_scale = hp_.rope_freq_scale;
  c.rope.ext_factor = hp_.rope_ext_factor;
  c.rope.attn_factor = hp_.rope_attn_factor;
  c.rope.beta_fast = hp_.yarn_beta_fast;
  c.rope.beta_slow = hp_.yarn_beta_slow;
  c.rope.n_ctx_orig = static_cast<int32_t>(hp_.n_ctx_orig_yarn);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp_.head_dim_k));

  // 2. Embedding.
  Work* cur = &work_of(place_.input.get());
  KILN_TRY(cur->be->get_rows(w_.tok_embd, idx_view(*cur, L_.token(), n), cur->ws[0].rows(0, n)));
  Tensor x = cur->ws[0].rows(0, n);
  const size_t bounce_bytes = bounce_ ? bounce_->size() : 0;
  void* bounce = bounce_ ? bounce_->data() : nullptr;

  // 3. Layers.
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    Work& w = work_of(place_.layers[il].get());
    set_layer_ctx(c, w, n, m);
    if (P.hidden) c.n_out = n;  // every row goes on to the end
    set_layer_params(c, il);
    c.experts = {};
    if (Backend* eb = place_.experts_of(il); eb != w.be) {
      const Work& ew = work_of(eb);
      c.experts = {eb, ew.ws[0], ew.ws[1], ew.zero, bounce, bounce_bytes};
    }
    if (&w != cur) KILN_TRY(copy_between(x, c.x, bounce, bounce_bytes));
    cur = &w;
    if (il == 0 && w_.nextn_input)  // a NextN view: the block's input from the embedding and the hidden rows
      KILN_TRY(nextn_input(*w.be, *w_.nextn_input, hp_.rms_eps, c.x, hidden_in_.rows(0, n), cat_.rows(0, n)));
    KILN_TRY(arch_.block(c, il));
    x = c.x;  // after the last layer: the m kept rows
  }

  // 4. Outputs.
  const int64_t rows = P.hidden ? n : m;  // rows of x after the last layer
  if (rows == 0) return Status::ok();
  if (c.n != rows)
    return make_error(ErrorCode::kInternal, "execute: %lld rows left for %lld outputs", static_cast<long long>(c.n),
                      static_cast<long long>(rows));
  Work& ow = work_of(place_.output.get());
  Tensor xo = x;
  if (&ow != cur) {
    xo = ow.ws[0].rows(0, rows);
    KILN_TRY(copy_between(x, xo, bounce, bounce_bytes));
  }
  Backend& ob = *ow.be;
  Tensor hn = ow.ws[1].rows(0, m);
  if (P.hidden) {
    // Every row's final-norm hidden state stays in ws[1] for fetch; the output rows are gathered into ws[8].
    hidden_dev_ = ow.ws[1].rows(0, n);
    if (w_.output_norm.valid()) KILN_TRY(ob.rms_norm(xo, w_.output_norm, hp_.rms_eps, hidden_dev_));
    else hidden_dev_ = xo;  // an encoder: the last layer's output is the hidden state
    if (m == 0) return Status::ok();
    hn = ow.ws[8].rows(0, m);
    KILN_TRY(ob.get_rows(hidden_dev_, idx_view(ow, L_.out_rows(), m), hn));
  } else {
    KILN_TRY(ob.rms_norm_for_matmul(xo, w_.output_norm, hp_.rms_eps, hn, w_.output.dtype));
  }
  const Tensor lt = Tensor::make(DType::F32, logits_->data(), &ob, V_, m);
  if (comm_) {
    // Tensor parallel: this rank's vocabulary rows [V/N, m], gathered rank-major into [V/N, m, N]; rank 0 copies
    // block r into columns [r V/N, (r+1) V/N) of the [V, m] logits (rows strided by V) and takes the argmax.
    const int64_t Vr = hp_.n_vocab, R = comm_->size();
    const Tensor ll = Tensor::make(DType::F32, logits_local_->data(), &ob, Vr, m);
    KILN_TRY(ob.matmul(w_.output, hn, Tensor{}, ll));
    const Tensor g = Tensor::make(DType::F32, gathered_->data(), &ob, Vr, m, R);
    KILN_TRY(comm_->all_gather(ll, g));
    if (comm_->rank() != 0) return Status::ok();
    for (int64_t r = 0; r < R; ++r) {
      const Tensor src = Tensor::make(DType::F32, static_cast<float*>(gathered_->data()) + r * Vr * m, &ob, Vr, m);
      KILN_TRY(ob.copy(src, strided_view(lt, r * Vr, Vr, m, 1, V_, V_ * m)));
    }
  } else {
    KILN_TRY(ob.matmul(w_.output, hn, Tensor{}, lt));
  }
  const Tensor ids = Tensor::make(DType::I32, argmax_->data(), &ob, m);
  return masked ? ob.argmax_masked(lt, mask_tensor(m), ids) : ob.argmax(lt, ids);
  };
  Status st = run_ops();
  if (solo) {
    Status e = solo->graph_end(gkey);
    if (st.is_ok()) st = e;
  }
  return st;
}

Result<StepOutputs> State::fetch() {
  const StepPlan& P = plan_;
  Backend& ob = *place_.output.get();
  StepOutputs out;
  out.n_out = P.n_out;
  out.n_vocab = V_;
  if (P.hidden) {
    out.n_embd = hp_.n_embd;
    out.hidden = static_cast<const float*>(hidden_host_->data());
    KILN_TRY(ob.read(hidden_dev_, 0, hidden_host_->data(),
                     static_cast<size_t>(P.n_tok) * static_cast<size_t>(hp_.n_embd) * sizeof(float)));
  }
  if (P.n_out == 0) {
    // No read to wait on: wait for the uploads explicitly, since the next plan rewrites the pinned staging they read
    // from (backend.h's reuse rule). Host-memory backends ran synchronously already.
    for (Work& w : work_)
      if (!w.be->host_memory()) KILN_TRY(w.be->synchronize());
    return out;
  }
  const size_t O = static_cast<size_t>(caps_.max_outputs), V = static_cast<size_t>(V_);
  int32_t* ids = static_cast<int32_t*>(host_out_->data());
  float* rows = reinterpret_cast<float*>(static_cast<char*>(host_out_->data()) + align_up(O * sizeof(int32_t)));
  const Tensor am = Tensor::make(DType::I32, argmax_->data(), &ob, P.n_out_bucket);
  KILN_TRY(ob.read(am, 0, ids, static_cast<size_t>(P.n_out) * sizeof(int32_t)));
  const Tensor lt = Tensor::make(DType::F32, logits_->data(), &ob, V_, P.n_out_bucket);
  // Consecutive rows that want logits are read in one piece.
  for (int32_t i = 0; i < P.n_out;) {
    if (P.out_kind[i] != OutputKind::kLogits) {
      ++i;
      continue;
    }
    int32_t j = i;
    while (j < P.n_out && P.out_kind[j] == OutputKind::kLogits) ++j;
    KILN_TRY(ob.read(lt, static_cast<size_t>(i) * V * sizeof(float), rows + static_cast<size_t>(i) * V,
                     static_cast<size_t>(j - i) * V * sizeof(float)));
    i = j;
  }
  out.argmax = ids;
  out.logits = rows;
  return out;
}

Status State::copy_block(int32_t src, int32_t dst, int32_t n) {
  if (src < 0 || dst < 0 || src >= caps_.n_blocks || dst >= caps_.n_blocks || n < 0 || n > caps_.block_size)
    return make_error(ErrorCode::kInternal, "copy_block: %d -> %d (%d slots) is out of range", src, dst, n);
  if (n == 0) return Status::ok();
  for (const KvLayer& l : kv_) {
    const int64_t bs = caps_.block_size;
    for (const Tensor* t : {&l.k, &l.v})
      if (t->valid()) KILN_TRY(t->backend->copy(t->rows(src * bs, n), t->rows(dst * bs, n)));
  }
  return Status::ok();
}

void State::mirror_plan(const StepPlan& src) {
  const int64_t MB = caps_.max_blocks_per_seq();
  const size_t idx_bytes = static_cast<size_t>(L_.ints()) * sizeof(int32_t);
  std::memcpy(plan_.token, src.token, idx_bytes);  // the index region is contiguous from token
  std::memcpy(plan_.out_kind, src.out_kind, static_cast<size_t>(caps_.max_outputs));
  for (int32_t r : src.dirty_rows) {
    std::memcpy(plan_.tables + r * MB, src.tables + r * MB, static_cast<size_t>(MB) * sizeof(int32_t));
    plan_.dirty_rows.push_back(r);  // capacity max_seqs, and src's rows are distinct
  }
  plan_.n_tok = src.n_tok;
  plan_.n_bucket = src.n_bucket;
  plan_.n_out = src.n_out;
  plan_.n_out_bucket = src.n_out_bucket;
  plan_.n_seq = src.n_seq;
  plan_.max_kv_len = src.max_kv_len;
  plan_.max_q_len = src.max_q_len;
  plan_.hidden = src.hidden;
  plan_.masked = src.masked;  // (the masks themselves stay with rank 0, which takes the argmax)
}

// N-1 worker threads, one per rank r >= 1, parked between steps; run(f) calls f(r) for every rank, rank 0 on the
// caller's thread, and returns when all have finished. A plain function pointer + context (no allocation per step).
class RankThreads {
 public:
  using Fn = void (*)(void* ctx, int rank);
  explicit RankThreads(int n) : n_(n) {
    for (int r = 1; r < n; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void run(Fn f, void* ctx) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = f;
      ctx_ = ctx;
      pending_ = n_ - 1;
      ++gen_;
    }
    cv_.notify_all();
    f(ctx, 0);
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
  }

 private:
  void loop(int r) {
    uint64_t seen = 0;
    while (true) {
      Fn f;
      void* ctx;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return gen_ != seen; });
        seen = gen_;
        if (stop_) return;
        f = fn_;
        ctx = ctx_;
      }
      f(ctx, r);
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
  const int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t gen_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  Fn fn_ = nullptr;
  void* ctx_ = nullptr;
};

// Tensor parallel: the ranks' States behind one ModelState (see the top of this file). A rank whose op fails
// before a collective would leave the others waiting there: every op's operands were checked at load
// (supports(), shapes), so what can fail at run time is a backend fault, reported by the rank that saw it.
class TpState final : public ModelState {
 public:
  TpState(std::vector<std::unique_ptr<State>> ranks)
      : ranks_(std::move(ranks)), status_(ranks_.size()), threads_(static_cast<int>(ranks_.size())) {}
  const StepCaps& caps() const override { return ranks_[0]->caps(); }
  bool wants_buckets() const override { return ranks_[0]->wants_buckets(); }
  bool supports_masked_argmax() const override { return ranks_[0]->supports_masked_argmax(); }
  StepPlan& plan() override { return ranks_[0]->plan(); }
  Status execute() override {
    for (size_t r = 1; r < ranks_.size(); ++r) ranks_[r]->mirror_plan(ranks_[0]->plan());
    threads_.run(
        [](void* self, int r) {
          auto* t = static_cast<TpState*>(self);
          t->status_[static_cast<size_t>(r)] = t->ranks_[static_cast<size_t>(r)]->execute();
        },
        this);
    for (size_t r = 0; r < ranks_.size(); ++r)
      if (!status_[r].is_ok()) return status_[r].with_context("tensor-parallel rank " + std::to_string(r));
    return Status::ok();
  }
  Result<StepOutputs> fetch() override {
    for (size_t r = 1; r < ranks_.size(); ++r) KILN_TRY(ranks_[r]->sync_all());
    return ranks_[0]->fetch();
  }
  KvLayer kv_layer(int64_t il) const override { return ranks_[0]->kv_layer(il); }  // rank 0's KV heads
  Status copy_block(int32_t src, int32_t dst, int32_t n) override {
    for (auto& r : ranks_) KILN_TRY(r->copy_block(src, dst, n));
    return Status::ok();
  }
  uint64_t kv_bytes() const override {
    uint64_t b = 0;
    for (const auto& r : ranks_) b += r->kv_bytes();
    return b;
  }
  // The recurrent state of a hybrid model is per rank too (each rank's heads): every rank copies its own.
  bool has_recurrent_state() const override { return ranks_[0]->has_recurrent_state(); }
  Status copy_seq_state(int32_t src, int32_t dst) override {
    for (auto& r : ranks_) KILN_TRY(r->copy_seq_state(src, dst));
    return Status::ok();
  }
  uint64_t recurrent_bytes() const override {
    uint64_t b = 0;
    for (const auto& r : ranks_) b += r->recurrent_bytes();
    return b;
  }
  Status save_checkpoint(int32_t seq, int32_t checkpoint) override {
    for (auto& r : ranks_) KILN_TRY(r->save_checkpoint(seq, checkpoint));
    return Status::ok();
  }
  Status load_checkpoint(int32_t checkpoint, int32_t seq) override {
    for (auto& r : ranks_) KILN_TRY(r->load_checkpoint(checkpoint, seq));
    return Status::ok();
  }
  uint64_t checkpoint_bytes() const override {
    uint64_t b = 0;
    for (const auto& r : ranks_) b += r->checkpoint_bytes();
    return b;
  }

 private:
  std::vector<std::unique_ptr<State>> ranks_;
  std::vector<Status> status_;
  RankThreads threads_;
};

Status State::copy_recurrent(Rows& a, int32_t from, Rows& b, int32_t to) {
  for (int64_t il = 0; il < hp_.n_layer; ++il)
    for (int i = 0; i < 2; ++i) {
      const Tensor& src = (*a[i])[static_cast<size_t>(il)];
      const Tensor& dst = (*b[i])[static_cast<size_t>(il)];
      if (src.valid()) KILN_TRY(src.backend->copy(src.rows(from, 1), dst.rows(to, 1)));
    }
  return Status::ok();
}

Status State::copy_seq_state(int32_t src, int32_t dst) {
  if (src < 0 || dst < 0 || src >= caps_.max_seqs || dst >= caps_.max_seqs)
    return make_error(ErrorCode::kInternal, "copy_seq_state: %d -> %d is out of range", src, dst);
  if (src == dst) return Status::ok();
  Rows st = {&conv_state_, &ssm_state_};
  return copy_recurrent(st, src, st, dst);
}

Status State::save_checkpoint(int32_t seq, int32_t checkpoint) {
  if (seq < 0 || seq >= caps_.max_seqs || checkpoint < 0 || checkpoint >= caps_.n_checkpoints)
    return make_error(ErrorCode::kInternal, "save_checkpoint: sequence %d -> checkpoint %d is out of range [%d, %d)",
                      seq, checkpoint, caps_.max_seqs, caps_.n_checkpoints);
  Rows st = {&conv_state_, &ssm_state_}, ck = {&conv_ckpt_, &ssm_ckpt_};
  return copy_recurrent(st, seq, ck, checkpoint);
}

Status State::load_checkpoint(int32_t checkpoint, int32_t seq) {
  if (seq < 0 || seq >= caps_.max_seqs || checkpoint < 0 || checkpoint >= caps_.n_checkpoints)
    return make_error(ErrorCode::kInternal, "load_checkpoint: checkpoint %d -> sequence %d is out of range [%d, %d)",
                      checkpoint, seq, caps_.n_checkpoints, caps_.max_seqs);
  Rows st = {&conv_state_, &ssm_state_}, ck = {&conv_ckpt_, &ssm_ckpt_};
  return copy_recurrent(ck, checkpoint, st, seq);
}

}  // namespace

uint64_t kv_storage_bytes(const HParams& hp, const StepCaps& caps) {
  auto rb = [&](DType t, int64_t width) -> uint64_t {
    auto r = dtype_row_bytes(t, width);
    return r ? static_cast<uint64_t>(r.value()) : 0;
  };
  const uint64_t per_slot =
      rb(caps.kv_type_k, hp.n_head_kv * hp.head_dim_k) + rb(caps.kv_type_v, hp.n_head_kv * hp.head_dim_v);
  const uint64_t slots = static_cast<uint64_t>(caps.n_blocks) * static_cast<uint64_t>(caps.block_size);
  // Saturates instead of wrapping (n_blocks comes from -c).
  const uint64_t per_layer = slots != 0 && per_slot > UINT64_MAX / slots ? UINT64_MAX : per_slot * slots;
  const uint64_t n_layer = static_cast<uint64_t>(n_kv_layers(hp));
  return n_layer == 0 ? 0 : per_layer > UINT64_MAX / n_layer ? UINT64_MAX : per_layer * n_layer;
}

int64_t n_kv_layers(const HParams& hp) {
  int64_t n = 0;
  for (int64_t il = 0; il < hp.n_layer; ++il) n += hp.is_recurrent(il) ? 0 : 1;
  return n;
}

uint64_t recurrent_state_bytes(const HParams& hp, const StepCaps& caps) {
  return recurrent_row_bytes(hp) * static_cast<uint64_t>(caps.max_seqs);
}

uint64_t checkpoint_state_bytes(const HParams& hp, const StepCaps& caps) {
  return recurrent_row_bytes(hp) * static_cast<uint64_t>(caps.n_checkpoints);
}

uint64_t recurrent_row_bytes(const HParams& hp) {
  const uint64_t per_layer = static_cast<uint64_t>(hp.ssm_conv_state() + hp.ssm_delta_state()) * sizeof(float);
  return per_layer * static_cast<uint64_t>(hp.n_layer - n_kv_layers(hp));
}

namespace {

// The K and V cache types (-ctk / -ctv): types of the op contract, heads of whole blocks of them, and stored and
// read by every backend holding a layer (each type alone, then the pair: a backend may take one type for both).
Status check_cache_types(const HParams& hp, const Placement& place, DType kt, DType vt) {
  const struct {
    const char* flag;
    DType t;
    int64_t head_dim;
    const char* which;
  } sides[] = {{"-ctk", kt, hp.head_dim_k, "K"}, {"-ctv", vt, hp.head_dim_v, "V"}};
  for (const auto& s : sides) {
    if (!is_kv_cache_type(s.t))
      return make_error(ErrorCode::kUnsupported, "%s %s: not a KV cache type", s.flag, dtype_name(s.t));
    const int64_t qb = dtype_block_size(s.t);
    if (s.head_dim % qb)
      return make_error(ErrorCode::kUnsupported, "%s %s: a %s head of %lld values is not a whole number of %s blocks "
                        "(%lld values)", s.flag, dtype_name(s.t), s.which, static_cast<long long>(s.head_dim),
                        dtype_name(s.t), static_cast<long long>(qb));
  }
  for (const auto& l : place.layers) {
    for (const auto& s : sides)
      if (!l->supports(Op::kKvStore, s.t, s.t) || !l->supports(Op::kAttention, s.t, s.t))
        return make_error(ErrorCode::kUnsupported, "%s %s: backend %s stores %s caches", s.flag, dtype_name(s.t),
                          l->name(), stored_cache_types(*l).c_str());
    if (!l->supports(Op::kKvStore, kt, vt) || !l->supports(Op::kAttention, kt, vt))
      return make_error(ErrorCode::kUnsupported, "-ctk %s -ctv %s: backend %s stores K and V in one type",
                        dtype_name(kt), dtype_name(vt), l->name());
  }
  return Status::ok();
}

// The capacities, the KV types, the ops of the architecture and the storage per backend, before anything is
// allocated.
Status check_state(const HParams& hp, const Placement& place, const StepCaps& caps) {
  const DType kt = caps.kv_type_k, vt = caps.kv_type_v;
  if (caps.batch_tokens < 1 || caps.batch_tokens > (1 << 20))
    return make_error(ErrorCode::kInvalidArgument, "batch size %d is out of range [1, %d]", caps.batch_tokens, 1 << 20);
  if (caps.max_outputs < 1 || caps.max_outputs > caps.batch_tokens)
    return make_error(ErrorCode::kInvalidArgument, "output rows per step %d must be in [1, batch size %d]",
                      caps.max_outputs, caps.batch_tokens);
  if (caps.max_seqs < 1 || caps.max_seqs > 65536)
    return make_error(ErrorCode::kInvalidArgument, "sequences %d is out of range [1, 65536]", caps.max_seqs);
  if (caps.block_size < 1 || caps.block_size > 1024 || caps.n_blocks < 1 || caps.n_blocks > (int64_t{1} << 31) / caps.block_size)
    return make_error(ErrorCode::kInvalidArgument, "KV cache of %lld blocks of %d slots is out of range",
                      static_cast<long long>(caps.n_blocks), caps.block_size);
  if (caps.n_checkpoints < 0 || caps.n_checkpoints > (1 << 20))
    return make_error(ErrorCode::kInvalidArgument, "%d recurrent-state checkpoints is out of range [0, %d]",
                      caps.n_checkpoints, 1 << 20);
  KILN_TRY(check_cache_types(hp, place, caps.kv_type_k, caps.kv_type_v));
  // Ops only some architectures use, asked before anything is allocated (a backend without them would fail at the
  // first step, or, for the window, silently attend to the whole prefix).
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    Backend& be = *place.layers[il];
    const bool rec = hp.is_recurrent(il);
    if (!hp.causal && (!be.supports(Op::kAttentionNonCausal, kt, vt) || !be.supports(Op::kLayerNorm, DType::F32) ||
                       !be.supports(Op::kGelu, DType::F32)))
      return make_error(ErrorCode::kUnsupported, "%s is an encoder (bidirectional attention, layer norms), which "
                        "backend %s does not run: place it on the CPU (--device cpu)", hp.arch.c_str(), be.name());
    if (hp.window(il) > 0 && !be.supports(Op::kAttentionWindow, kt, vt))
      return make_error(ErrorCode::kUnsupported, "layer %lld of %s uses sliding-window attention, which backend %s "
                        "does not run (with -ctk %s -ctv %s)", static_cast<long long>(il), hp.arch.c_str(), be.name(),
                        dtype_name(kt), dtype_name(vt));
    if (hp.rope_ext_factor != 0.0f && !be.supports(Op::kRopeYarn, DType::F32))
      return make_error(ErrorCode::kUnsupported, "%s uses YaRN RoPE scaling, which backend %s does not run: place "
                        "it on the CPU (--device cpu)", hp.arch.c_str(), be.name());
    if (hp.attn_sinks && !be.supports(Op::kAttentionSinks, kt, vt))
      return make_error(ErrorCode::kUnsupported, "layer %lld of %s uses attention sinks, which backend %s does not "
                        "run (with -ctk %s -ctv %s): place it on the CPU (--device cpu)", static_cast<long long>(il),
                        hp.arch.c_str(), be.name(), dtype_name(kt), dtype_name(vt));
    if (rec && (!be.supports(Op::kConv1dSilu, DType::F32) || !be.supports(Op::kDeltaNet, DType::F32)))
      return make_error(ErrorCode::kUnsupported, "layer %lld of %s is a Gated DeltaNet layer, which backend %s does "
                        "not run (conv1d_silu, gated_delta_net)", static_cast<long long>(il), hp.arch.c_str(),
                        be.name());
  }
  // Storage per backend against what it can allocate, before allocating any of it: K/V of its attention layers,
  // the recurrent state and checkpoints of its linear layers.
  const int64_t n_kv = n_kv_layers(hp), n_rec = hp.n_layer - n_kv;
  const uint64_t per_layer = n_kv > 0 ? kv_storage_bytes(hp, caps) / static_cast<uint64_t>(n_kv) : 0;
  const uint64_t per_rec = n_rec > 0 ? recurrent_row_bytes(hp) / static_cast<uint64_t>(n_rec) : 0;
  auto sat_add = [](uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; };
  for (Backend* be : place.backends()) {
    uint64_t kv = 0, rec = 0, ckpt = 0;
    for (int64_t il = 0; il < hp.n_layer; ++il) {
      if (place.layers[il].get() != be) continue;
      if (!hp.is_recurrent(il)) {
        kv = sat_add(kv, per_layer);
      } else {
        rec += per_rec * static_cast<uint64_t>(caps.max_seqs);
        ckpt += per_rec * static_cast<uint64_t>(caps.n_checkpoints);
      }
    }
    const uint64_t need = sat_add(kv, rec + ckpt), avail = be->memory_available();
    if (need == 0 || avail == 0 || need <= avail) continue;
    auto gib = [](uint64_t b) { return static_cast<double>(b) / (1 << 30); };
    std::string parts = strprintf("K/V %.2f GiB for %lld token slots of K %s / V %s", gib(kv),
                                  static_cast<long long>(caps.n_blocks * caps.block_size), dtype_name(kt),
                                  dtype_name(vt));
    if (rec > 0) parts += strprintf(", recurrent state %.2f GiB for %d sequences", gib(rec), caps.max_seqs);
    if (ckpt > 0)
      parts += strprintf(", %.2f GiB for %d checkpoints (--ctx-checkpoints)", gib(ckpt), caps.n_checkpoints);
    return make_error(ErrorCode::kOutOfRange, "the KV cache needs %llu bytes (%.2f GiB) on %s (%s), %llu bytes (%.2f "
                      "GiB) are available: lower -c%s", static_cast<unsigned long long>(need), gib(need), be->name(),
                      parts.c_str(), static_cast<unsigned long long>(avail), gib(avail),
                      ckpt > 0 ? " or --ctx-checkpoints" : "");
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ModelState>> make_model_state(const HParams& hp, const ArchDef& arch, const Weights& w,
                                                     const Placement& place, const StepCaps& caps) {
  KILN_TRY(check_state(hp, place, caps));
  auto s = std::make_unique<State>(hp, arch, w, place, caps);
  KILN_TRY(s->init());
  return std::unique_ptr<ModelState>(std::move(s));
}

Result<std::unique_ptr<ModelState>> make_tp_model_state(const ArchDef& arch, const std::vector<TpRankView>& ranks,
                                                        int64_t n_vocab_full, const StepCaps& caps) {
  if (ranks.empty()) return make_error(ErrorCode::kInternal, "tensor parallel state: no ranks");
  for (const TpRankView& r : ranks) KILN_TRY(check_state(*r.hp, r.place, caps));
  std::vector<std::unique_ptr<State>> states;
  for (const TpRankView& r : ranks) {
    auto s = std::make_unique<State>(*r.hp, arch, *r.w, r.place, caps, r.comm, n_vocab_full);
    KILN_TRY(s->init());
    states.push_back(std::move(s));
  }
  return std::unique_ptr<ModelState>(std::make_unique<TpState>(std::move(states)));
}

}  // namespace kiln
