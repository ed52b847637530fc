// One step of the network = plan -> execute -> fetch (docs/ARCHITECTURE.md, "A step").
//
//   plan    (host, runtime/planner): token ids, positions, cache slots, per-sequence query ranges and kv lengths,
//           which rows want outputs, written into StepPlan: arrays in pinned staging (Backend::alloc_host) at fixed
//           offsets sized by StepCaps. The planner validates every value (ids, positions, slots, block ids) there.
//   execute (ModelState::execute): one write() of the index region per backend of the placement (plus the block-
//           table rows marked dirty), then backend ops only, on buffers allocated when the state was created. No
//           allocation, no host read, no shape derived from data: the shapes come from the host-side counts of the
//           plan (n_bucket, n_out_bucket, n_seq, max_kv_len), so one execute per bucket can be captured as a graph.
//   fetch   (ModelState::fetch): per output row, the argmax id computed on the output backend, or the full logits
//           row copied into pinned host memory; in a hidden step (StepPlan::hidden) also every token's hidden state.
//
// Masked argmax (OutputKind::kMaskedArgmax, grammar-constrained greedy decoding): the runtime gives a row's
// allowed-token bits before the step, the planner writes them into StepPlan::out_mask, execute uploads the rows
// [0, n_out) of it with the index region (one write) and takes Backend::argmax_masked instead of argmax over all
// rows (a kArgmax row's mask is all ones); only the id comes back. The output backend must support
// Op::kArgmaxMasked (ModelState::supports_masked_argmax).
//
// Hidden steps (embeddings, StepCaps::hidden): the last layer keeps every row (no output-row selection), output_norm
// runs over all n_tok rows, and fetch brings back that final-norm hidden state of every token ([n_tok][n_embd], the
// input of the output projection); the output rows, if any, are then gathered from it for the projection. Such a
// step is never a recorded graph.
//
// Buckets (when ModelState::wants_buckets(): a device backend is in the placement): n_tok is rounded up to
// 1, 2, 4, 8, 16, 32, 64 (the decode sizes, capturable), above 64 to a multiple of 64; n_out likewise; max_kv_len to
// a power of two >= 256 (capped at the per-sequence capacity). Padding: token id 0 at position 0, slot -1 (writes
// nothing), kv_len 0 (zero attention output), table row 0; padded output rows read token row 0 and are never
// fetched. A CPU-only placement runs exact sizes (padding would only cost time there).
//
// KV storage: one K and one V pool per layer on that layer's backend, n_blocks * block_size token slots
// (KvLayer in backend.h). Which blocks a sequence owns, refcounts, forks and lengths are the runtime's
// (runtime/kv_cache.h): the model only sees block ids and slots through the plan.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "quant/dtype.h"
#include "util/status.h"

namespace kiln {

// Capacities a ModelState is created for; everything execute touches is allocated for these.
struct StepCaps {
  int32_t batch_tokens = 512; // tokens per execute (the runtime splits larger batches)
  int32_t max_outputs = 8;    // output rows per execute (logits/argmax), <= batch_tokens
  int32_t max_seqs = 1;       // sequence slots = block-table rows
  int64_t n_blocks = 256;     // KV pool blocks (per layer)
  int32_t block_size = 16;    // token slots per block
  DType kv_type_k = DType::F16, kv_type_v = DType::F16;  // K and V storage (backend.h, kKvCacheTypes)
  int32_t n_checkpoints = 0;  // recurrent-state checkpoint slots (hybrid models; ModelState::save_checkpoint)
  bool hidden = false;        // hidden steps allowed: a host buffer of batch_tokens x n_embd f32 is allocated
  int32_t max_blocks_per_seq() const {
    return static_cast<int32_t>(n_blocks);  // one sequence may hold the whole pool
  }
};

// What one output row wants back. kMaskedArgmax: the argmax over the tokens the row's mask allows (-1 when it
// allows none; see the top of this file).
enum class OutputKind : uint8_t { kArgmax = 0, kLogits = 1, kMaskedArgmax = 2 };

// The host side of a step. Pointers are into pinned staging owned by the ModelState, at fixed offsets:
// [batch_tokens] arrays first, then [max_outputs], then [max_seqs]; `tables` is the host mirror of the block tables
// [max_seqs][max_blocks_per_seq] (row-major), uploaded row by row when marked dirty.
struct StepPlan {
  int32_t n_tok = 0;         // real tokens
  int32_t n_bucket = 0;      // tokens executed (>= n_tok; padded)
  int32_t n_out = 0;         // real output rows
  int32_t n_out_bucket = 0;  // output rows executed
  int32_t n_seq = 0;         // sequences in the step (entries of the per-sequence arrays)
  int32_t max_kv_len = 0;    // bound of kv_len (a bucket)
  int32_t max_q_len = 0;     // bound of seq_q_len
  bool hidden = false;       // fetch every token's final-norm hidden state too (caps().hidden must be set)
  bool masked = false;       // some output row is kMaskedArgmax: out_mask rows [0, n_out) are uploaded and used
  int32_t mask_words = 0;    // ceil(n_vocab / 64): words per out_mask row (0: the state takes no masks)

  int32_t* token = nullptr;      // [batch_tokens]
  int32_t* pos = nullptr;        // [batch_tokens]
  int32_t* slot = nullptr;       // [batch_tokens] block * block_size + offset, -1 = padding
  int32_t* tok_table = nullptr;  // [batch_tokens] block-table row of the token's sequence
  int32_t* kv_len = nullptr;     // [batch_tokens] pos + 1, 0 = padding
  int32_t* out_rows = nullptr;   // [max_outputs] token rows that want output, increasing
  int32_t* seq_row = nullptr;    // [max_seqs]
  int32_t* seq_q_start = nullptr;
  int32_t* seq_q_len = nullptr;
  int32_t* seq_kv_len = nullptr;
  int32_t* seq_reset = nullptr;    // [max_seqs] 1: the sequence starts (position 0) in this step: zero recurrent state
  OutputKind* out_kind = nullptr;  // [max_outputs] host only: what fetch returns per output row
  // [max_outputs][mask_words] with a masked step: row i's allowed-token bits (bit t % 64 of word t / 64 = token t),
  // all ones for a kArgmax row, anything for a kLogits row. Null when the state takes no masks.
  uint64_t* out_mask = nullptr;
  int32_t* tables = nullptr;       // [max_seqs][max_blocks_per_seq]
  // [batch_tokens][n_embd] f32: a NextN view's hidden row per token (model/mtp.h), rows [0, n_tok) written by the
  // planner, uploaded with the index region. Null when the model takes none.
  float* hidden_in = nullptr;
  std::vector<int32_t> dirty_rows;  // table rows to upload this step (capacity max_seqs, reserved at creation)
};

// What fetch() returns for the outputs of the last execute, in output order.
struct StepOutputs {
  int32_t n_out = 0;
  int64_t n_vocab = 0;
  const int32_t* argmax = nullptr;  // [n_out] (valid where out_kind is kArgmax or kMaskedArgmax; computed for every
                                    // row; -1 for a kMaskedArgmax row whose mask allows no token)
  const float* logits = nullptr;    // [n_out][n_vocab] pinned host (rows valid where out_kind is kLogits)
  const float* row(int32_t i) const { return logits + static_cast<size_t>(i) * static_cast<size_t>(n_vocab); }
  // A hidden step: [n_tok][n_embd] the final-norm hidden state of every token of the step, in batch order.
  int64_t n_embd = 0;
  const float* hidden = nullptr;
  const float* hidden_row(int32_t t) const { return hidden + static_cast<size_t>(t) * static_cast<size_t>(n_embd); }
};

// The per-engine state of a model: KV storage, workspace, staging, output buffers. Made by Model::create_state.
class ModelState {
 public:
  virtual ~ModelState() = default;
  virtual const StepCaps& caps() const = 0;
  // Whether the planner should round sizes up to buckets (a device backend is in the placement).
  virtual bool wants_buckets() const = 0;
  // Whether output rows may be kMaskedArgmax (the output backend runs Backend::argmax_masked).
  virtual bool supports_masked_argmax() const { return false; }
  virtual StepPlan& plan() = 0;
  // Runs the planned step (see the top of this file).
  virtual Status execute() = 0;
  // Waits for the outputs of the last execute and brings back what plan().out_kind asks for.
  virtual Result<StepOutputs> fetch() = 0;

  // ---- KV storage (the runtime's block manager drives these) ----
  virtual KvLayer kv_layer(int64_t il) const = 0;
  // Copies token slots [0, n) of block src to block dst in every layer (copy-on-write of a shared partial block).
  virtual Status copy_block(int32_t src, int32_t dst, int32_t n) = 0;
  // Bytes of K+V storage over all layers.
  virtual uint64_t kv_bytes() const = 0;

  // ---- recurrent state (hybrid models: linear-attention layers; one row per sequence slot = table row) ----
  // A sequence's state is the result of every token it has seen: it continues only from where its last step
  // ended, or restarts from zero at position 0 (StepPlan::seq_reset). The runtime keeps that so (Engine).
  virtual bool has_recurrent_state() const { return false; }
  // Copies slot src's recurrent state to slot dst in every layer (fork).
  virtual Status copy_seq_state(int32_t src, int32_t dst) {
    (void)src, (void)dst;
    return Status::ok();
  }
  // Bytes of recurrent state over all layers and slots.
  virtual uint64_t recurrent_bytes() const { return 0; }
  // Checkpoints: StepCaps::n_checkpoints more rows of recurrent state per layer, on the layer's backend, that keep
  // a sequence's state at some position for a later sequence with the same prefix (which blocks they belong to is
  // the runtime's: KvCache). save: slot seq's state -> checkpoint; load: checkpoint -> slot seq. Backend::copy
  // within the layer's backend (a device copy on a device backend).
  virtual Status save_checkpoint(int32_t seq, int32_t checkpoint) {
    (void)seq, (void)checkpoint;
    return make_error(ErrorCode::kUnsupported, "recurrent-state checkpoints: this model state keeps none");
  }
  virtual Status load_checkpoint(int32_t checkpoint, int32_t seq) {
    (void)checkpoint, (void)seq;
    return make_error(ErrorCode::kUnsupported, "recurrent-state checkpoints: this model state keeps none");
  }
  // Bytes of checkpoint storage over all layers and slots.
  virtual uint64_t checkpoint_bytes() const { return 0; }
};

}  // namespace kiln
