// Hyperparameters of a decoder-only transformer, parsed once from GGUF metadata (`<arch>.*` keys) into this typed,
// validated struct. Each architecture file (model/arch/*.cpp) says which keys it reads.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

enum class RopeType { kNormal, kNeox };  // normal: rotate pairs (2i, 2i+1); neox: pairs (i, i + n_rot/2)

struct HParams {
  std::string arch;            // general.architecture
  std::string name;            // general.name (may be empty)
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;     // <arch>.context_length
  int64_t n_embd = 0;          // <arch>.embedding_length
  int64_t n_layer = 0;         // <arch>.block_count
  int64_t n_ff = 0;            // <arch>.feed_forward_length
  int64_t n_head = 0;          // <arch>.attention.head_count
  int64_t n_head_kv = 0;       // <arch>.attention.head_count_kv (defaults to n_head)
  int64_t head_dim_k = 0;      // <arch>.attention.key_length (defaults to n_embd / n_head)
  int64_t head_dim_v = 0;      // <arch>.attention.value_length (defaults to head_dim_k)
  float rms_eps = 1e-5f;       // <arch>.attention.layer_norm_rms_epsilon
  RopeType rope_type = RopeType::kNormal;
  int64_t n_rot = 0;           // <arch>.rope.dimension_count (defaults to head_dim_k)
  float rope_freq_base = 10000.0f;   // <arch>.rope.freq_base
  float rope_freq_scale = 1.0f;      // 1 / <arch>.rope.scaling.factor when scaling.type is linear
  bool tied_embeddings = false;      // no output.weight: the output projection reuses token_embd.weight
};

}  // namespace kiln
