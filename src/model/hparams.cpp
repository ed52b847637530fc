// Common hyperparameter keys and their validation (HParams, model/hparams.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <unordered_set>

#include "model/arch.h"

namespace kiln {
namespace {

std::string key(const HParams& hp, const char* suffix) { return hp.arch + "." + suffix; }

Result<int64_t> get_int(const gguf::File& f, const std::string& k) {
  const gguf::Value* v = f.find(k);
  if (!v) return make_error(ErrorCode::kNotFound, "missing metadata key '%s'", k.c_str());
  if (v->is_array())
    return make_error(ErrorCode::kUnsupported, "metadata key '%s' is an array (per-layer values are not supported)",
                      k.c_str());
  return f.get_i64(k);
}

Result<int64_t> get_int_or(const gguf::File& f, const std::string& k, int64_t fallback) {
  if (!f.has(k)) return fallback;
  return get_int(f, k);
}

// Upper bounds that hold for any model whatever its file says (checked before any arithmetic on the values):
// widths and head sizes fit int32 (token ids, positions and tensor dimensions are int32 in the kernels), and so
// does the training context (positions are int32).
constexpr int64_t kMaxDim = INT32_MAX;
constexpr int64_t kMaxLayers = 1 << 16;

// The block indices N of the file's `blk.N.*` tensors (a set bounded by the tensor count).
std::unordered_set<int64_t> block_indices(const gguf::File& f) {
  std::unordered_set<int64_t> idx;
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.name.compare(0, 4, "blk.") != 0) continue;
    const char* p = t.name.c_str() + 4;
    char* end = nullptr;
    const long long n = std::strtoll(p, &end, 10);
    if (end != p && *end == '.' && n >= 0) idx.insert(n);
  }
  return idx;
}

// The counts read from metadata against what the file holds, before anything proportional to them is allocated
// (the layer vector and the tensor manifest are sized by n_layer; shapes are checked exactly by the manifest
// afterwards, this bounds them first): n_layer <= the number of distinct blk.N blocks in the file; n_vocab and
// n_embd equal token_embd.weight's shape when the file has it; every width is at most the largest tensor's
// element count (a weight with that width has at least that many elements).
Status check_against_file(const gguf::File& f, const HParams& hp, const std::string& vocab_source) {
  const std::unordered_set<int64_t> blocks = block_indices(f);
  if (hp.n_layer > static_cast<int64_t>(blocks.size()))
    return make_error(ErrorCode::kInvalidFile,
                      "%s is %lld, but the file holds tensors of only %zu block(s) (blk.N.*, %zu tensors in all)",
                      key(hp, "block_count").c_str(), static_cast<long long>(hp.n_layer), blocks.size(),
                      f.tensors().size());
  int64_t max_elements = 0;
  for (const gguf::TensorInfo& t : f.tensors()) max_elements = std::max(max_elements, t.n_elements());
  struct Width { std::string k; int64_t v; };
  const Width widths[] = {{key(hp, "embedding_length"), hp.n_embd},
                          {key(hp, "feed_forward_length"), hp.n_ff},
                          {key(hp, "attention.head_count"), hp.n_head},
                          {key(hp, "attention.head_count_kv"), hp.n_head_kv},
                          {key(hp, "attention.key_length"), hp.head_dim_k},
                          {key(hp, "attention.value_length"), hp.head_dim_v},
                          {vocab_source, hp.n_vocab}};
  for (const Width& w : widths)
    if (w.v > max_elements)
      return make_error(ErrorCode::kInvalidFile, "%s is %lld, more than the largest tensor in the file holds (%lld elements)",
                        w.k.c_str(), static_cast<long long>(w.v), static_cast<long long>(max_elements));
  if (const gguf::TensorInfo* te = f.find_tensor("token_embd.weight")) {
    if (te->ne[0] != hp.n_embd)
      return make_error(ErrorCode::kInvalidFile, "%s is %lld, but token_embd.weight has shape %s (n_embd first)",
                        key(hp, "embedding_length").c_str(), static_cast<long long>(hp.n_embd),
                        te->shape_string().c_str());
    if (te->ne[1] != hp.n_vocab)
      return make_error(ErrorCode::kInvalidFile, "vocabulary size %lld (from %s) does not match token_embd.weight's "
                        "%lld rows (shape %s)", static_cast<long long>(hp.n_vocab), vocab_source.c_str(),
                        static_cast<long long>(te->ne[1]), te->shape_string().c_str());
  }
  return Status::ok();
}

// Bounds of each count on its own, so that products of them (head count x head size, the manifest's shapes)
// cannot overflow.
Status check_bounds(const HParams& hp) {
  struct Bound { const char* k; int64_t v; int64_t max; };
  const Bound bounds[] = {{"context_length", hp.n_ctx_train, kMaxDim},
                          {"embedding_length", hp.n_embd, kMaxDim},
                          {"block_count", hp.n_layer, kMaxLayers},
                          {"feed_forward_length", hp.n_ff, kMaxDim},
                          {"attention.head_count", hp.n_head, kMaxDim},
                          {"attention.head_count_kv", hp.n_head_kv, kMaxDim},
                          {"attention.key_length", hp.head_dim_k, kMaxDim},
                          {"attention.value_length", hp.head_dim_v, kMaxDim},
                          {"rope.dimension_count", hp.n_rot, kMaxDim}};
  for (const Bound& b : bounds)
    if (b.v > b.max)
      return make_error(ErrorCode::kInvalidFile, "%s.%s is %lld: more than kiln supports (%lld)", hp.arch.c_str(),
                        b.k, static_cast<long long>(b.v), static_cast<long long>(b.max));
  const struct { const char* what; int64_t a, b; } products[] = {
      {"attention.head_count x attention.key_length", hp.n_head, hp.head_dim_k},
      {"attention.head_count x attention.value_length", hp.n_head, hp.head_dim_v},
      {"attention.head_count_kv x attention.key_length", hp.n_head_kv, hp.head_dim_k},
      {"attention.head_count_kv x attention.value_length", hp.n_head_kv, hp.head_dim_v}};
  for (const auto& p : products)
    if (p.a > 0 && p.b > 0 && p.a * p.b > kMaxDim)  // both <= INT32_MAX: the product fits int64
      return make_error(ErrorCode::kInvalidFile, "%s.%s = %lld x %lld is more than kiln supports (%lld)",
                        hp.arch.c_str(), p.what, static_cast<long long>(p.a), static_cast<long long>(p.b),
                        static_cast<long long>(kMaxDim));
  return Status::ok();
}

}  // namespace

Result<int64_t> read_int_or(const gguf::File& file, const std::string& k, int64_t fallback) {
  return get_int_or(file, k, fallback);
}

// rope.scaling.type yarn: the factor (default 1), original context and attention factor, as llama.cpp's context
// setup derives them (HParams). yarn_log_multiplier (DeepSeek's mscale) is refused rather than ignored.
static Status read_yarn(const gguf::File& f, HParams& hp) {
  KILN_ASSIGN_OR_RETURN(const float factor, f.get_f32_or(key(hp, "rope.scaling.factor"), 1.0f));
  if (!(factor > 0))
    return make_error(ErrorCode::kInvalidFile, "%s is %g: must be > 0", key(hp, "rope.scaling.factor").c_str(), factor);
  KILN_ASSIGN_OR_RETURN(const float log_mul, f.get_f32_or(key(hp, "rope.scaling.yarn_log_multiplier"), 0.0f));
  if (log_mul != 0.0f)
    return make_error(ErrorCode::kUnsupported, "%s %g is not supported",
                      key(hp, "rope.scaling.yarn_log_multiplier").c_str(), log_mul);
  KILN_ASSIGN_OR_RETURN(const float attn_factor, f.get_f32_or(key(hp, "rope.scaling.attn_factor"), 1.0f));
  if (!(attn_factor > 0))
    return make_error(ErrorCode::kInvalidFile, "%s is %g: must be > 0", key(hp, "rope.scaling.attn_factor").c_str(),
                      attn_factor);
  KILN_ASSIGN_OR_RETURN(hp.n_ctx_orig_yarn, get_int_or(f, key(hp, "rope.scaling.original_context_length"), hp.n_ctx_train));
  if (hp.n_ctx_orig_yarn <= 0 || hp.n_ctx_orig_yarn > INT32_MAX)
    return make_error(ErrorCode::kInvalidFile, "%s is %lld: out of range",
                      key(hp, "rope.scaling.original_context_length").c_str(),
                      static_cast<long long>(hp.n_ctx_orig_yarn));
  hp.rope_freq_scale = 1.0f / factor;
  hp.rope_ext_factor = 1.0f;
  // llama.cpp: get_mscale(factor) / (1 + 0.1 ln factor), get_mscale = 1 + 0.1 ln factor above 1, else 1; the op
  // multiplies by 1 + 0.1 ln factor again.
  hp.rope_attn_factor = attn_factor * (factor > 1.0f ? 1.0f : 1.0f / (1.0f + 0.1f * std::log(factor)));
  return Status::ok();
}

Status read_common_hparams(const gguf::File& f, HParams& hp) {
  KILN_ASSIGN_OR_RETURN(hp.name, f.get_str_or("general.name", ""));
  KILN_ASSIGN_OR_RETURN(hp.n_ctx_train, get_int(f, key(hp, "context_length")));
  KILN_ASSIGN_OR_RETURN(hp.n_embd, get_int(f, key(hp, "embedding_length")));
  KILN_ASSIGN_OR_RETURN(hp.n_layer, get_int(f, key(hp, "block_count")));
  KILN_ASSIGN_OR_RETURN(hp.n_ff, get_int(f, key(hp, "feed_forward_length")));
  KILN_ASSIGN_OR_RETURN(hp.n_head, get_int(f, key(hp, "attention.head_count")));
  KILN_ASSIGN_OR_RETURN(hp.n_head_kv, get_int_or(f, key(hp, "attention.head_count_kv"), hp.n_head));
  if (hp.n_head <= 0)
    return make_error(ErrorCode::kInvalidFile, "%s is %lld: need at least one attention head",
                      key(hp, "attention.head_count").c_str(), static_cast<long long>(hp.n_head));
  KILN_ASSIGN_OR_RETURN(hp.head_dim_k, get_int_or(f, key(hp, "attention.key_length"), hp.n_embd / hp.n_head));
  KILN_ASSIGN_OR_RETURN(hp.head_dim_v, get_int_or(f, key(hp, "attention.value_length"), hp.head_dim_k));
  // Encoders give the epsilon of their layer norms instead (read again by their architecture).
  const std::string rms_key = key(hp, "attention.layer_norm_rms_epsilon"), ln_key = key(hp, "attention.layer_norm_epsilon");
  KILN_ASSIGN_OR_RETURN(hp.rms_eps, f.get_f32(!f.has(rms_key) && f.has(ln_key) ? ln_key : rms_key));
  KILN_ASSIGN_OR_RETURN(hp.n_rot, get_int_or(f, key(hp, "rope.dimension_count"), hp.head_dim_k));
  KILN_ASSIGN_OR_RETURN(hp.rope_freq_base, f.get_f32_or(key(hp, "rope.freq_base"), 10000.0f));
  KILN_ASSIGN_OR_RETURN(const std::string scaling, f.get_str_or(key(hp, "rope.scaling.type"), "none"));
  hp.rope_freq_scale = 1.0f;
  if (scaling == "linear") {
    KILN_ASSIGN_OR_RETURN(const float factor, f.get_f32(key(hp, "rope.scaling.factor")));
    if (!(factor > 0))
      return make_error(ErrorCode::kInvalidFile, "%s is %g: must be > 0", key(hp, "rope.scaling.factor").c_str(),
                        factor);
    hp.rope_freq_scale = 1.0f / factor;
  } else if (scaling == "yarn") {
    KILN_TRY(read_yarn(f, hp));
  } else if (scaling != "none" && scaling != "llama3") {
    // llama3 scaling is carried by rope_freqs.weight; longrope is not implemented.
    return make_error(ErrorCode::kUnsupported, "%s '%s' is not supported (none, linear, llama3, yarn)",
                      key(hp, "rope.scaling.type").c_str(), scaling.c_str());
  }
  // Vocabulary size: explicit key, else the tokenizer's token list, else token_embd's rows (checked against
  // token_embd.weight below and again by the manifest).
  std::string vocab_source;
  if (f.has(key(hp, "vocab_size"))) {
    vocab_source = key(hp, "vocab_size");
    KILN_ASSIGN_OR_RETURN(hp.n_vocab, get_int(f, vocab_source));
  } else if (const gguf::Value* toks = f.find("tokenizer.ggml.tokens"); toks && toks->is_array()) {
    vocab_source = "tokenizer.ggml.tokens";
    hp.n_vocab = static_cast<int64_t>(toks->arr().items.size());
  } else if (const gguf::TensorInfo* te = f.find_tensor("token_embd.weight")) {
    vocab_source = "token_embd.weight";
    hp.n_vocab = te->ne[1];
  } else {
    return make_error(ErrorCode::kNotFound, "cannot tell the vocabulary size: no '%s', no tokenizer.ggml.tokens, "
                      "no token_embd.weight", key(hp, "vocab_size").c_str());
  }
  // Against the file first (the more telling message: what the file holds), then the fixed bounds; architectures
  // may adjust values in their read_hparams, so validate_hparams repeats the bounds afterwards.
  KILN_TRY(check_against_file(f, hp, vocab_source));
  return check_bounds(hp);
}

Status validate_hparams(const HParams& hp) {
  struct Pos { const char* k; int64_t v; };
  const Pos pos[] = {{"context_length", hp.n_ctx_train}, {"embedding_length", hp.n_embd},
                     {"block_count", hp.n_layer},        {"feed_forward_length", hp.n_ff},
                     {"attention.head_count", hp.n_head}, {"attention.head_count_kv", hp.n_head_kv},
                     {"attention.key_length", hp.head_dim_k}, {"attention.value_length", hp.head_dim_v},
                     {"rope.dimension_count", hp.n_rot}};
  for (const Pos& p : pos)
    if (p.v <= 0)
      return make_error(ErrorCode::kInvalidFile, "%s.%s is %lld: must be > 0", hp.arch.c_str(), p.k,
                        static_cast<long long>(p.v));
  KILN_TRY(check_bounds(hp));
  if (hp.n_vocab <= 0)
    return make_error(ErrorCode::kInvalidFile, "vocabulary size is %lld: must be > 0", static_cast<long long>(hp.n_vocab));
  if (hp.n_vocab > INT32_MAX)
    return make_error(ErrorCode::kUnsupported, "vocabulary size %lld exceeds int32 token ids",
                      static_cast<long long>(hp.n_vocab));
  if (hp.n_head % hp.n_head_kv != 0)
    return make_error(ErrorCode::kInvalidFile, "%s.attention.head_count %lld is not a multiple of "
                      "%s.attention.head_count_kv %lld", hp.arch.c_str(), static_cast<long long>(hp.n_head),
                      hp.arch.c_str(), static_cast<long long>(hp.n_head_kv));
  if (hp.n_rot > hp.head_dim_k || hp.n_rot % 2 != 0)
    return make_error(ErrorCode::kInvalidFile, "%s.rope.dimension_count %lld must be even and <= the head size %lld",
                      hp.arch.c_str(), static_cast<long long>(hp.n_rot), static_cast<long long>(hp.head_dim_k));
  if (!(hp.rms_eps > 0) || !(hp.rope_freq_base > 0))
    return make_error(ErrorCode::kInvalidFile, "%s: rms epsilon %g and rope freq_base %g must be > 0",
                      hp.arch.c_str(), hp.rms_eps, hp.rope_freq_base);
  return Status::ok();
}

std::vector<TensorSpec> standard_manifest(const HParams& hp, Weights& w, bool dense_ffn) {
  using K = TensorSpec::Kind;
  const int64_t e = hp.n_embd, q = hp.n_head * hp.head_dim_k, kk = hp.n_head_kv * hp.head_dim_k,
                v = hp.n_head_kv * hp.head_dim_v, o = hp.n_head * hp.head_dim_v;
  std::vector<TensorSpec> m = {
      {K::kEmbedding, "token_embd.weight", {e, hp.n_vocab}, &w.tok_embd, true},
      {K::kF32, "output_norm.weight", {e}, &w.output_norm, true},
      {K::kMatrix, "output.weight", {e, hp.n_vocab}, &w.output, false},
  };
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    m.push_back({K::kF32, b + "attn_norm.weight", {e}, &L.attn_norm, true});
    m.push_back({K::kMatrix, b + "attn_q.weight", {e, q}, &L.wq, true});
    m.push_back({K::kMatrix, b + "attn_k.weight", {e, kk}, &L.wk, true});
    m.push_back({K::kMatrix, b + "attn_v.weight", {e, v}, &L.wv, true});
    m.push_back({K::kMatrix, b + "attn_output.weight", {o, e}, &L.wo, true});
    m.push_back({K::kF32, b + "ffn_norm.weight", {e}, &L.ffn_norm, true});
    if (!dense_ffn) continue;
    m.push_back({K::kMatrix, b + "ffn_gate.weight", {e, hp.n_ff}, &L.w_gate, true});
    m.push_back({K::kMatrix, b + "ffn_up.weight", {e, hp.n_ff}, &L.w_up, true});
    m.push_back({K::kMatrix, b + "ffn_down.weight", {hp.n_ff, e}, &L.w_down, true});
  }
  return m;
}

void add_qkv_bias_specs(const HParams& hp, Weights& w, bool required, std::vector<TensorSpec>& m) {
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    m.push_back({TensorSpec::kF32, b + "attn_q.bias", {hp.n_head * hp.head_dim_k}, &L.bq, required});
    m.push_back({TensorSpec::kF32, b + "attn_k.bias", {hp.n_head_kv * hp.head_dim_k}, &L.bk, required});
    m.push_back({TensorSpec::kF32, b + "attn_v.bias", {hp.n_head_kv * hp.head_dim_v}, &L.bv, required});
  }
}

void add_qk_norm_specs(const HParams& hp, Weights& w, bool required, std::vector<TensorSpec>& m) {
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    m.push_back({TensorSpec::kF32, b + "attn_q_norm.weight", {hp.head_dim_k}, &L.q_norm, required});
    m.push_back({TensorSpec::kF32, b + "attn_k_norm.weight", {hp.head_dim_k}, &L.k_norm, required});
  }
}

void add_moe_specs(const HParams& hp, Weights& w, std::vector<TensorSpec>& m) {
  const int64_t e = hp.n_embd, f = hp.n_ff_exp, x = hp.n_expert;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    m.push_back({TensorSpec::kMatrix, b + "ffn_gate_inp.weight", {e, x}, &L.ffn_gate_inp, true});
    m.push_back({TensorSpec::kExperts, b + "ffn_gate_exps.weight", {e, f, x}, &L.ffn_gate_exps, true});
    m.push_back({TensorSpec::kExperts, b + "ffn_up_exps.weight", {e, f, x}, &L.ffn_up_exps, true});
    m.push_back({TensorSpec::kExperts, b + "ffn_down_exps.weight", {f, e, x}, &L.ffn_down_exps, true});
  }
}

Status read_sliding_window(const gguf::File& f, HParams& hp) {
  const std::string a = hp.arch + ".";
  KILN_ASSIGN_OR_RETURN(const int64_t window, read_int_or(f, a + "attention.sliding_window", 0));
  if (window < 0 || window > INT32_MAX)
    return make_error(ErrorCode::kInvalidFile, "%sattention.sliding_window is %lld: out of range", a.c_str(),
                      static_cast<long long>(window));
  hp.sliding_window = static_cast<int32_t>(window);
  return Status::ok();
}

Status read_swa_layers(const gguf::File& f, HParams& hp, int64_t fallback_pattern, float fallback_base) {
  const std::string a = hp.arch + ".";
  KILN_ASSIGN_OR_RETURN(const int64_t pattern, read_int_or(f, a + "attention.sliding_window_pattern", fallback_pattern));
  if (pattern < 0)
    return make_error(ErrorCode::kInvalidFile, "%sattention.sliding_window_pattern is %lld", a.c_str(),
                      static_cast<long long>(pattern));
  hp.layer_swa.assign(static_cast<size_t>(hp.n_layer), 0);
  for (int64_t il = 0; il < hp.n_layer; ++il) hp.layer_swa[il] = pattern == 0 || il % pattern < pattern - 1;
  KILN_ASSIGN_OR_RETURN(hp.rope_freq_base_swa, f.get_f32_or(a + "rope.freq_base_swa", fallback_base));
  if (!(hp.rope_freq_base_swa > 0))
    return make_error(ErrorCode::kInvalidFile, "%srope.freq_base_swa %g must be > 0", a.c_str(), hp.rope_freq_base_swa);
  return Status::ok();
}

Status read_moe_hparams(const gguf::File& f, HParams& hp) {
  constexpr int64_t kMaxExperts = 1024;  // llama.cpp's LLAMA_MAX_EXPERTS
  const std::string count = key(hp, "expert_count"), used = key(hp, "expert_used_count"),
                    width = key(hp, "expert_feed_forward_length");
  KILN_ASSIGN_OR_RETURN(hp.n_expert, get_int(f, count));
  KILN_ASSIGN_OR_RETURN(hp.n_expert_used, get_int(f, used));
  if (hp.n_expert < 1 || hp.n_expert > kMaxExperts)
    return make_error(ErrorCode::kInvalidFile, "%s is %lld: must be in [1, %lld]", count.c_str(),
                      static_cast<long long>(hp.n_expert), static_cast<long long>(kMaxExperts));
  if (hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert)
    return make_error(ErrorCode::kInvalidFile, "%s is %lld: must be in [1, %s = %lld]", used.c_str(),
                      static_cast<long long>(hp.n_expert_used), count.c_str(), static_cast<long long>(hp.n_expert));
  KILN_ASSIGN_OR_RETURN(hp.n_ff_exp, get_int_or(f, width, hp.n_ff / hp.n_expert_used));
  if (hp.n_ff_exp < 1 || hp.n_ff_exp > kMaxDim)
    return make_error(ErrorCode::kInvalidFile, "%s is %lld: must be in [1, %lld]%s", width.c_str(),
                      static_cast<long long>(hp.n_ff_exp), static_cast<long long>(kMaxDim),
                      f.has(width) ? "" : " (the default: feed_forward_length / expert_used_count)");
  return Status::ok();
}

Status tie_output_to_embedding(const HParams&, Weights& w, HParams& hp) {
  hp.tied_embeddings = !w.output.valid();
  if (hp.tied_embeddings) w.output = w.tok_embd;
  return Status::ok();
}

}  // namespace kiln
