// Tensor-parallel model execution (issue 17): N ranks, each holding a shard of every layer's matrices on its own
// backend, with one Communicator per rank (backend/comm.h: NCCL between GPUs, the in-process group on the CPU).
//
// Shards of rank r of N (GGUF order: ne[0] = the input width, rows = outputs; a "row split" keeps whole rows,
// which are contiguous in every type; a "column split" keeps a range of every row, which for a quantized type
// must start and end on a block boundary: 32 elements for the legacy types, 256 for the k-quants):
//   attn_q.weight / .bias   rows of query heads [r*H/N, (r+1)*H/N)                      (H = n_head)
//   attn_k/v.weight / .bias rows of KV heads: [r*Hkv/N, (r+1)*Hkv/N) when N divides Hkv; when Hkv < N (and N is a
//                           multiple of Hkv) the KV heads are *replicated*: rank r holds the one KV head its query
//                           heads read, (r*H/N) / (H/Hkv)
//   attn_output.weight      input columns of rank r's heads [r*H/N*hd_v, (r+1)*H/N*hd_v)
//   ffn_gate/up.weight      rows [r*n_ff/N, (r+1)*n_ff/N); ffn_down.weight: the same range of input columns
//   output.weight           vocabulary rows [r*V/N, (r+1)*V/N) (tied: those rows of token_embd.weight)
//   everything else         replicated: token_embd (every rank embeds the whole batch: no collective before the
//                           first layer), the norms (attn_q/k_norm act per head, so a rank's heads use them whole),
//                           rope_freqs
// So a rank runs the ordinary block (model/arch/*.cpp) on its HParams (n_head/N, its KV heads, n_ff/N, V/N) and its
// shards: attention of its heads over its own KV cache storage (pools of its KV heads only), SwiGLU of its n_ff/N
// features; the attention-output and down projections give partial sums, all-reduced in f32 (forward.h,
// project_add) before the residual add, so x is the same on every rank. Logits: each rank's [V/N, n_out] are
// all-gathered and rank 0 assembles [V, n_out] and the argmax (state.cpp).
//
// Architectures: llama, qwen2, qwen3 (q/k biases split with their rows; q/k norms replicated). Others (gemma3:
// post-norms and GeGLU are shardable but untested; qwen35: recurrent layers) refuse with an error.
// A shape that does not divide is an error naming the tensor and its shape; so is a column split that does not
// fall on a block boundary (e.g. the 256-wide k-quant blocks of a 384-column shard).
#pragma once

#include <memory>

#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/model.h"

namespace kiln {

// Model::load's tensor-parallel path: opts.tensor_parallel, or the group made from opts.devices (split mode
// tensor). One rank is allowed (the shards are the whole tensors; useful to test the path).
Result<std::unique_ptr<Model>> load_tensor_parallel(gguf::File file, const LoadOptions& opts);

// The tensor of manifest entry s in the file, checked for presence (a missing required tensor is an error naming
// it and the architecture; a missing optional one gives nullptr) and shape (an error naming both shapes).
Result<const gguf::TensorInfo*> manifest_tensor(const gguf::File& file, const TensorSpec& s,
                                                const std::string& arch);

// Whether backend `be` can use a tensor of type t as manifest entry s wants it (f32; a matmul weight; an embedding
// get_rows reads; an expert stack moe_ffn reads); the error names the tensor, the type, the backend and the op.
Status check_tensor_type(const TensorSpec& s, DType t, const Backend& be);

// The end of both load paths: parameter and byte counts of every tensor of the file, the tokenizer.
Status finish_load(const gguf::File& file, ModelStats* stats, std::unique_ptr<Tokenizer>* tokenizer);

}  // namespace kiln
