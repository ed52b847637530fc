// CPU paged attention kernels (the op contract is Backend::attention in backend/backend.h). Arguments are checked
// by the caller (cpu_backend.cpp): every block id a token reads is in range, kv_len[t] >= 1, dtypes supported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/dtype.h"
#include "util/thread_pool.h"

namespace kiln::cpu {

struct AttnArgs {
  const float* q = nullptr;  // token t, head h at q + t * q_tok_stride + h * q_head_stride (floats)
  size_t q_tok_stride = 0, q_head_stride = 0;
  float* dst = nullptr;      // contiguous [hd_v, n_head, n_tok]
  const uint8_t* k = nullptr;  // slot s, kv head g at k + s * k_slot_bytes + g * k_head_bytes
  const uint8_t* v = nullptr;
  size_t k_slot_bytes = 0, v_slot_bytes = 0, k_head_bytes = 0, v_head_bytes = 0;
  DType k_type = DType::F16, v_type = DType::F16;  // cache types (backend.h, kKvCacheTypes), independent
  int32_t n_tok = 0, n_head = 0, n_head_kv = 0, hd_k = 0, hd_v = 0, block_size = 0;
  const int32_t* tables = nullptr;  // row r at tables + r * table_stride
  int64_t table_stride = 0;
  const int32_t* tok_table = nullptr;
  const int32_t* kv_len = nullptr;
  float scale = 1.0f;
  int32_t window = 0;  // > 0: token t reads positions [max(0, kv_len[t] - window), kv_len[t]) only (KvLayer::window)
  const float* sinks = nullptr;  // optional [n_head]: head h's sink logit joins its softmax denominator (KvLayer::sinks)
};

// Scalar reference: per (token, head), all scores, then max, exp, sum, weighted sum of V (two passes).
// Numerics (as llama.cpp's tiled CPU flash attention, the path of its batched prefill of >= 64 query rows, which made
// the fixtures' reference logits): q stays f32 (K and V are widened to f32), scores, softmax and the V accumulation
// are f32. (llama.cpp's one-row path, which its decode takes, rounds q to f16 and accumulates V in f16: keeping q
// f32 halved kiln's mean NMSE against the reference on the quantized fixtures, e.g. llama q8_0 1.2e-4 -> 4.9e-5,
// qwen3 q4_k_m 4.3e-4 -> 1.7e-4, and removed a routing flip of the qwen3moe q8_0 fixture.)
void attention_ref(const AttnArgs& a);

// Fast path: flash-style online softmax over the sequence's blocks, one work item per (token, kv head) covering
// the n_head / n_head_kv query heads that share it (each K/V row is loaded once per group); items interleaved over
// the pool's threads. F16 and F32 rows are read in place (SIMD dot / axpy); the other types are dequantized a cache
// block at a time (block_size rows of one head) into a per-thread buffer, once per group, then read as f32: the
// same values attention_ref reads. scratch: per-thread buffers, grown on demand.
void attention_fast(const AttnArgs& a, ThreadPool& pool, std::vector<std::vector<float>>& scratch);

}  // namespace kiln::cpu
