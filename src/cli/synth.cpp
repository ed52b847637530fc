// kiln synth --shape S --type T -o FILE: writes a random-weight model in llama.cpp's GGUF conventions (keys,
// tensor names, shapes, quantization mixes), at disk speed (writer chunks generated in parallel).
#include <sys/statvfs.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/args.h"
#include "cli/synth.h"
#include "quant/reference.h"
#include "util/thread_pool.h"
#include "util/timer.h"

namespace kiln::cli {
namespace {

struct Shape {
  const char* name;
  const char* arch;  // llama | qwen2 | qwen3 | gemma3 | qwen35 | qwen3moe | gpt-oss
  int64_t n_embd, n_layer, n_ff, n_head, n_head_kv;
  int64_t head_dim;  // 0: n_embd / n_head
  int64_t n_vocab, n_ctx;
  bool tied;
  float rope_base, rms_eps;
  bool llama3_rope;  // rope_freqs.weight with Llama 3.x long-context factors
  // gemma3: sliding window of the local layers (5 of every 6) and their RoPE base; gpt-oss: the window of the
  // even layers (the odd ones global, llama.cpp's default pattern of 2), the base shared with the global layers
  int64_t window = 0;
  float rope_base_swa = 0;
  // qwen35: Gated DeltaNet value / key heads (head size 128, conv kernel 4), a full-attention layer every 4th,
  // partial rotary of 64 dims
  int64_t ssm_v_heads = 0, ssm_k_heads = 0;
  // qwen3moe, gpt-oss: experts per layer, experts routed per token, expert FFN width (n_ff is then only the
  // metadata's feed_forward_length, as in the published files)
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  // gpt-oss: YaRN RoPE scaling (rope_scaling.factor, original_max_position_embeddings); 0: none
  float yarn_factor = 0;
  int64_t yarn_orig_ctx = 0;
  // qwen35 (--mtp N): multi-token-prediction blocks after the trunk, as llama.cpp's converter writes Qwen3.5's
  // (model/arch/qwen35.cpp): block_count counts them, nextn_predict_layers says how many
  int64_t n_nextn = 0;
};

// clang-format off
constexpr Shape kShapes[] = {
  // name         arch     embd  layer  ff     head kv  hd   vocab   ctx     tied   rope      eps   llama3
  {"tiny",        "llama", 256,  2,     768,   4,   2,  0,   1024,   2048,   false, 10000.f,  1e-5f, false},
  {"tiny-qwen2",  "qwen2", 256,  2,     768,   4,   2,  0,   1024,   2048,   false, 1e6f,     1e-6f, false},
  {"tiny-qwen3",  "qwen3", 256,  2,     768,   4,   2,  128, 1024,   2048,   true,  1e6f,     1e-6f, false},
  {"llama3-1b",   "llama", 2048, 16,    8192,  32,  8,  0,   128256, 131072, true,  500000.f, 1e-5f, true},
  {"llama3-8b",   "llama", 4096, 32,    14336, 32,  8,  0,   128256, 131072, false, 500000.f, 1e-5f, true},
  {"qwen3-0.6b",  "qwen3", 1024, 28,    3072,  16,  8,  128, 151936, 40960,  true,  1e6f,     1e-6f, false},
  {"qwen3-8b",    "qwen3", 4096, 36,    12288, 32,  8,  128, 151936, 40960,  false, 1e6f,     1e-6f, false},
  // The published dense shapes (text decoders; Gemma 3 vocabularies as llama.cpp's GGUFs hold them).
  {"gemma3-4b",   "gemma3", 2560, 34,   10240, 8,   4,  256, 262144, 131072, true,  1e6f,     1e-6f, false, 1024, 1e4f},
  {"gemma3-12b",  "gemma3", 3840, 48,   15360, 16,  8,  256, 262144, 131072, true,  1e6f,     1e-6f, false, 1024, 1e4f},
  {"gemma3-27b",  "gemma3", 5376, 62,   21504, 32,  16, 128, 262144, 131072, true,  1e6f,     1e-6f, false, 1024, 1e4f},
  {"qwen3.5-0.8b", "qwen35", 1024, 24,  3584,  8,   2,  256, 248320, 262144, true,  1e7f,     1e-6f, false, 0, 0, 16, 16},
  {"qwen3.5-9b",  "qwen35", 4096, 32,   12288, 16,  4,  256, 248320, 262144, false, 1e7f,     1e-6f, false, 0, 0, 32, 16},
  {"qwen3.5-27b", "qwen35", 5120, 64,   17408, 24,  4,  256, 248320, 262144, false, 1e7f,     1e-6f, false, 0, 0, 48, 16},
  // Mixture of experts: the fixture's shape (8 experts, top 2) and Qwen3-30B-A3B (128 experts, top 8, width 768).
  {"tiny-qwen3moe", "qwen3moe", 256, 2, 512,   4,   2,  128, 1024,   2048,   false, 1e6f,     1e-6f, false, 0, 0, 0, 0, 8, 2, 256},
  {"qwen3moe-30b-a3b", "qwen3moe", 2048, 48, 6144, 32, 4, 128, 151936, 40960, false, 1e6f,   1e-6f, false, 0, 0, 0, 0, 128, 8, 768},
  // gpt-oss (openai/gpt-oss-20b and -120b config.json as llama.cpp's GptOssModel converts it): hidden 2880,
  // intermediate 2880 (dense and expert width), 64 heads / 8 KV heads of 64, vocab 201088, 131072 positions,
  // rope_theta 150000, rms eps 1e-5, sliding_window 128 on the even layers, 4 experts per token of 32 (20b: 24
  // layers) or 128 (120b: 36 layers), YaRN factor 32 over 4096 positions. tiny-gptoss: the same features at a
  // small size, with widths that are not multiples of 256 as 2880 is (the K-quant mixes fall back per tensor).
  {"tiny-gptoss", "gpt-oss", 288, 4,     288,   8,   2,  64,  1024,   131072, false, 150000.f, 1e-5f, false, 16, 0, 0, 0, 16, 4, 288, 32.f, 4096},
  {"gpt-oss-20b", "gpt-oss", 2880, 24,   2880,  64,  8,  64,  201088, 131072, false, 150000.f, 1e-5f, false, 128, 0, 0, 0, 32, 4, 2880, 32.f, 4096},
  {"gpt-oss-120b", "gpt-oss", 2880, 36,  2880,  64,  8,  64,  201088, 131072, false, 150000.f, 1e-5f, false, 128, 0, 0, 0, 128, 4, 2880, 32.f, 4096},
};
constexpr int64_t kSsmHead = 128, kSsmConv = 4, kFullAttnInterval = 4, kQwen35Rot = 64;
// clang-format on

// --type values: the llama.cpp file type (general.file_type) and the base tensor type.
struct TypeRecipe {
  const char* name;
  uint32_t file_type;
  DType base;
};
constexpr TypeRecipe kTypes[] = {
    {"f16", 1, DType::F16},           {"q8_0", 7, DType::Q8_0},         {"q4_0", 2, DType::Q4_0},
    {"q4_k_m", 15, DType::Q4_K},      {"q6_k", 18, DType::Q6_K},        {"iq4_nl", 25, DType::IQ4_NL},
    {"iq4_xs", 30, DType::IQ4_XS},    {"mxfp4", 38, DType::MXFP4},      {"tq1_0", 36, DType::TQ1_0},
    {"tq2_0", 37, DType::TQ2_0},      {"iq2_xxs", 19, DType::IQ2_XXS},  {"iq2_xs", 20, DType::IQ2_XS},
    {"iq1_s", 24, DType::IQ1_S},      {"iq1_m", 31, DType::IQ1_M},
};
constexpr const char* kTypeList =
    "f16, q8_0, q4_0, q4_k_m, q6_k, iq4_nl, iq4_xs, mxfp4, tq1_0, tq2_0, iq2_xxs, iq2_xs, iq1_s, iq1_m";

// The 2-bit and 1-bit i-quant file types (llama.cpp's IQ2_XXS, IQ2_XS, IQ1_S, IQ1_M), which share one mix.
bool low_bit_iquant(DType t) {
  return t == DType::IQ2_XXS || t == DType::IQ2_XS || t == DType::IQ1_S || t == DType::IQ1_M;
}

// llama.cpp's "more bits" layers of the _M mixes (llama-quant.cpp, use_more_bits).
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// kFfnDown covers ffn_down_exps too (llama.cpp's quantizer matches the name); kExperts: ffn_gate/up_exps.
enum class Role { kEmbed, kOutput, kAttnK, kAttnV, kAttnOut, kFfnDown, kExperts, kMatrix };

// The tensor type llama.cpp's quantizer picks for a weight matrix (norms, biases and the MoE router stay F32
// elsewhere). IQ4_NL / IQ4_XS without an importance matrix: Q5_K for attn_v where 4+ query heads share a KV head and
// for ffn_down of the first n_layer/8 layers. Files of exactly 8 experts: attn_k and attn_v Q8_0, attn_output Q5_K
// in the 4-bit mixes. mxfp4 (llama.cpp's MXFP4_MOE): a MoE shape gets MXFP4 experts and Q8_0 dense matrices as that
// file type writes them; a dense shape gets every matrix MXFP4 so that it exercises the type; the output Q8_0.
// TQ1_0 / TQ2_0: every matrix ternary but the output (Q6_K) and an untied token_embd (Q4_K). The 2- and 1-bit
// i-quants (low_bit_iquant): output Q5_K, untied token_embd Q2_K, attn_v Q4_K with 4+ query heads per KV head or 4+
// experts (else Q2_K), attn_k Q4_K with 8 experts, ffn_down of the first n_layer/8 layers Q2_K, attn_output Q5_K
// with 8 experts and IQ2_XXS in the IQ1 types.
DType matrix_type(const TypeRecipe& t, Role role, int64_t layer, int64_t n_layer, int64_t n_gqa, int64_t n_expert) {
  const bool expert = role == Role::kExperts || (role == Role::kFfnDown && n_expert > 0);
  if (t.base == DType::F16 || t.base == DType::Q8_0) return t.base;
  if (low_bit_iquant(t.base)) {
    const bool iq1 = t.base == DType::IQ1_S || t.base == DType::IQ1_M;
    switch (role) {
      case Role::kOutput: return DType::Q5_K;
      case Role::kEmbed: return DType::Q2_K;
      case Role::kAttnV: return n_gqa >= 4 || n_expert >= 4 ? DType::Q4_K : DType::Q2_K;
      case Role::kAttnK: return n_expert == 8 ? DType::Q4_K : t.base;
      case Role::kFfnDown: return layer < n_layer / 8 ? DType::Q2_K : t.base;
      case Role::kAttnOut: return n_expert == 8 ? DType::Q5_K : iq1 ? DType::IQ2_XXS : t.base;
      default: return t.base;
    }
  }
  if (t.base == DType::TQ1_0 || t.base == DType::TQ2_0)
    return role == Role::kOutput ? DType::Q6_K : role == Role::kEmbed ? DType::Q4_K : t.base;
  if (t.base == DType::MXFP4)
    return role == Role::kOutput || (n_expert > 0 && !expert) ? DType::Q8_0 : DType::MXFP4;
  if (n_expert == 8 && (role == Role::kAttnK || role == Role::kAttnV)) return DType::Q8_0;
  if (t.base == DType::Q6_K) return t.base;
  if (role == Role::kOutput) return DType::Q6_K;  // output.weight, or token_embd when tied
  const bool mix4 = t.base == DType::Q4_K || t.base == DType::IQ4_NL || t.base == DType::IQ4_XS;
  if (n_expert == 8 && role == Role::kAttnOut && mix4) return DType::Q5_K;
  if (t.base == DType::IQ4_NL || t.base == DType::IQ4_XS) {
    if ((role == Role::kAttnV && n_gqa >= 4) || (role == Role::kFfnDown && layer < n_layer / 8)) return DType::Q5_K;
    return t.base;
  }
  if (t.base == DType::Q4_K && (role == Role::kAttnV || role == Role::kFfnDown) && use_more_bits(layer, n_layer))
    return DType::Q6_K;
  return t.base;
}

// A matrix whose rows (n_in) are not whole blocks of the chosen type gets the type llama.cpp's quantizer falls back
// to (llama-quant.cpp, tensor_type_fallback): the 256-element K / i-quants to a 32-element type. gpt-oss's 2880-wide
// rows are such a case in every K-quant mix.
DType fallback_type(DType t, int64_t n_in) {
  if (n_in % dtype_block_size(t) == 0) return t;
  switch (t) {
    case DType::Q4_K: return DType::Q5_0;
    case DType::Q5_K: return DType::Q5_1;
    case DType::Q6_K: return DType::Q8_0;
    case DType::IQ4_XS: return DType::IQ4_NL;
    case DType::TQ1_0:
    case DType::TQ2_0:
    case DType::Q2_K: return DType::Q4_0;
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ1_S:
    case DType::IQ1_M: return DType::IQ4_NL;
    default: return t;  // a 32-element type: add_matrix reports the row length
  }
}

// Llama 3.x RoPE frequency factors (scale 32, low/high frequency factors 1 and 4, original context 8192), as
// convert_hf_to_gguf stores them in rope_freqs.weight: 1 for high frequencies, 32 for low, smooth between.
std::vector<float> llama3_rope_factors(int64_t head_dim, float base) {
  const double factor = 32, low = 1, high = 4, old_ctx = 8192;
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  std::vector<float> f;
  for (int64_t i = 0; i < head_dim; i += 2) {
    const double freq = 1.0 / std::pow(static_cast<double>(base), static_cast<double>(i) / head_dim);
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      f.push_back(static_cast<float>(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return f;
}

struct Options {
  std::string shape, type = "f16", out, vocab;
  int64_t layers = 0, embd = 0, ff = 0, heads = 0, kv_heads = 0, head_dim = 0, n_vocab = 0, ctx = 0;
  int64_t experts = 0, experts_used = 0, expert_ff = 0;
  int64_t mtp = 0;
  uint64_t seed = 42;
  int threads = 0;
};

class ModelBuilder {
 public:
  ModelBuilder(const Shape& s, const TypeRecipe& t, uint64_t seed) : s_(s), t_(t), seed_(seed) {}

  // A matrix [n_in, n_out], or a stack of n_expert of them [n_in, n_out, n_expert] (0: no expert dimension).
  Status add_matrix(const std::string& name, Role role, int64_t layer, int64_t n_in, int64_t n_out,
                    int64_t n_expert = 0) {
    const DType type =
        fallback_type(matrix_type(t_, role, layer, s_.n_layer, s_.n_head / s_.n_head_kv, s_.n_expert), n_in);
    if (n_in % dtype_block_size(type) != 0)
      return make_error(ErrorCode::kInvalidArgument, "%s: row length %lld is not a multiple of %s's block size %lld",
                        name.c_str(), static_cast<long long>(n_in), dtype_name(type),
                        static_cast<long long>(dtype_block_size(type)));
    KILN_ASSIGN_OR_RETURN(auto fill, synth::random_weights(type, next_key(), 1.0f / std::sqrt(static_cast<float>(n_in))));
    std::vector<int64_t> ne = {n_in, n_out};
    if (n_expert > 0) ne.push_back(n_expert);
    return w_.add_tensor(name, type, std::move(ne), std::move(fill));
  }
  // The MoE router [n_embd, n_expert], f32 as llama.cpp's quantizer keeps it; logits of standard deviation ~3 for
  // unit-RMS inputs, so that routing is decisive.
  Status add_router(const std::string& name) {
    KILN_ASSIGN_OR_RETURN(auto fill,
                          synth::random_weights(DType::F32, next_key(), 3.0f / std::sqrt(static_cast<float>(s_.n_embd))));
    return w_.add_tensor(name, DType::F32, {s_.n_embd, s_.n_expert}, std::move(fill));
  }
  Status add_vector(const std::string& name, int64_t n, float center, float spread) {
    return w_.add_tensor(name, DType::F32, {n}, synth::uniform_f32(next_key(), center, spread));
  }
  // F32 [n0, n1] uniform in [-spread, spread] (the per-expert biases).
  Status add_f32_matrix(const std::string& name, int64_t n0, int64_t n1, float spread) {
    return w_.add_tensor(name, DType::F32, {n0, n1}, synth::uniform_f32(next_key(), 0.0f, spread));
  }
  Status add_values(const std::string& name, std::vector<float> v) {
    auto data = std::make_shared<std::vector<float>>(std::move(v));
    const int64_t n = static_cast<int64_t>(data->size());
    return w_.add_tensor(name, DType::F32, {n}, [data](uint8_t* dst, uint64_t b, uint64_t len) {
      std::memcpy(dst, reinterpret_cast<const uint8_t*>(data->data()) + b, len);
    });
  }

  Status build() {
    set_keys();
    KILN_TRY(add_matrix("token_embd.weight", s_.tied ? Role::kOutput : Role::kEmbed, 0, s_.n_embd, s_.n_vocab));
    if (s_.llama3_rope) KILN_TRY(add_values("rope_freqs.weight", llama3_rope_factors(s_.head_dim, s_.rope_base)));
    for (int64_t i = 0; i < s_.n_layer; ++i)
      KILN_TRY(std::string_view(s_.arch) == "gpt-oss" ? add_gptoss_layer(i) : add_layer(i));
    for (int64_t i = s_.n_layer; i < s_.n_layer + s_.n_nextn; ++i) KILN_TRY(add_nextn_layer(i));
    KILN_TRY(add_vector("output_norm.weight", s_.n_embd, 1.0f, 0.1f));
    if (!s_.tied) KILN_TRY(add_matrix("output.weight", Role::kOutput, 0, s_.n_embd, s_.n_vocab));
    return Status::ok();
  }

  // The metadata keys llama.cpp's converter writes for the shape's architecture.
  void set_keys() {
    const std::string a = s_.arch;
    const int64_t hd = s_.head_dim;
    w_.set("general.architecture", a);
    w_.set("general.name", std::string("kiln-synth-") + s_.name);
    w_.set("general.description", "random-weight model written by kiln synth (not a trained model)");
    w_.set(a + ".context_length", static_cast<uint32_t>(s_.n_ctx));
    w_.set(a + ".embedding_length", static_cast<uint32_t>(s_.n_embd));
    w_.set(a + ".block_count", static_cast<uint32_t>(s_.n_layer + s_.n_nextn));
    if (s_.n_nextn > 0) w_.set(a + ".nextn_predict_layers", static_cast<uint32_t>(s_.n_nextn));
    w_.set(a + ".feed_forward_length", static_cast<uint32_t>(s_.n_ff));
    w_.set(a + ".attention.head_count", static_cast<uint32_t>(s_.n_head));
    w_.set(a + ".attention.head_count_kv", static_cast<uint32_t>(s_.n_head_kv));
    w_.set(a + ".attention.layer_norm_rms_epsilon", s_.rms_eps);
    w_.set(a + ".rope.freq_base", s_.rope_base);
    w_.set(a + ".rope.dimension_count", static_cast<uint32_t>(a == "qwen35" ? kQwen35Rot : hd));
    w_.set(a + ".attention.key_length", static_cast<uint32_t>(hd));
    w_.set(a + ".attention.value_length", static_cast<uint32_t>(hd));
    w_.set(a + ".vocab_size", static_cast<uint32_t>(s_.n_vocab));
    w_.set("general.file_type", t_.file_type);
    if (t_.base != DType::F16) w_.set("general.quantization_version", uint32_t{2});
    if (s_.n_expert > 0) {
      w_.set(a + ".expert_count", static_cast<uint32_t>(s_.n_expert));
      w_.set(a + ".expert_used_count", static_cast<uint32_t>(s_.n_expert_used));
      w_.set(a + ".expert_feed_forward_length", static_cast<uint32_t>(s_.n_ff_exp));
    }
    if (s_.window > 0) w_.set(a + ".attention.sliding_window", static_cast<uint32_t>(s_.window));
    if (s_.rope_base_swa > 0) w_.set(a + ".rope.freq_base_swa", s_.rope_base_swa);
    if (s_.yarn_factor > 0) {  // gpt-oss's rope_scaling: beta_fast 32 and beta_slow 1 (llama.cpp's defaults too)
      w_.set(a + ".rope.scaling.type", std::string("yarn"));
      w_.set(a + ".rope.scaling.factor", s_.yarn_factor);
      w_.set(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(s_.yarn_orig_ctx));
      w_.set(a + ".rope.scaling.yarn_beta_fast", 32.0f);
      w_.set(a + ".rope.scaling.yarn_beta_slow", 1.0f);
    }
    if (a == "qwen35") {
      const int64_t ssm_inner = s_.ssm_v_heads * kSsmHead;
      gguf::Array sec;
      sec.type = gguf::ValueType::I32;
      for (int32_t x : {11, 11, 10, 0}) sec.items.push_back(gguf::Value(x));
      w_.set(a + ".rope.dimension_sections", gguf::Value(std::move(sec)));
      w_.set(a + ".ssm.conv_kernel", static_cast<uint32_t>(kSsmConv));
      w_.set(a + ".ssm.state_size", static_cast<uint32_t>(kSsmHead));
      w_.set(a + ".ssm.group_count", static_cast<uint32_t>(s_.ssm_k_heads));
      w_.set(a + ".ssm.time_step_rank", static_cast<uint32_t>(s_.ssm_v_heads));
      w_.set(a + ".ssm.inner_size", static_cast<uint32_t>(ssm_inner));
      w_.set(a + ".full_attention_interval", static_cast<uint32_t>(kFullAttnInterval));
    }
  }

  // A qwen35 NextN block: a full-attention layer and the nextn.* tensors Qwen3.5's conversion writes (no
  // embed_tokens / shared_head_head: the trunk's are shared). eh_proj's input is [embedding | hidden].
  Status add_nextn_layer(int64_t i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    KILN_TRY(add_layer(i, true));
    KILN_TRY(add_matrix(p + "nextn.eh_proj.weight", Role::kMatrix, i, 2 * s_.n_embd, s_.n_embd));
    KILN_TRY(add_vector(p + "nextn.enorm.weight", s_.n_embd, 1.0f, 0.1f));
    KILN_TRY(add_vector(p + "nextn.hnorm.weight", s_.n_embd, 1.0f, 0.1f));
    return add_vector(p + "nextn.shared_head_norm.weight", s_.n_embd, 1.0f, 0.1f);
  }

  // Layer i of the llama / qwen2 / qwen3 / gemma3 / qwen35 / qwen3moe shapes (full_attn: a qwen35 NextN block's).
  Status add_layer(int64_t i, bool full_attn = false) {
    const std::string a = s_.arch, p = "blk." + std::to_string(i) + ".";
    const int64_t hd = s_.head_dim, q_dim = s_.n_head * hd, kv_dim = s_.n_head_kv * hd;
    KILN_TRY(add_vector(p + "attn_norm.weight", s_.n_embd, 1.0f, 0.1f));
    if (a == "qwen35") {  // hybrid: Gated DeltaNet layers, a gated full-attention layer every 4th
      if (!full_attn && (i + 1) % kFullAttnInterval != 0) {
        const int64_t hv = s_.ssm_v_heads, ssm_inner = hv * kSsmHead;
        const int64_t ssm_conv_dim = 2 * s_.ssm_k_heads * kSsmHead + ssm_inner;
        KILN_TRY(add_matrix(p + "attn_qkv.weight", Role::kMatrix, i, s_.n_embd, ssm_conv_dim));
        KILN_TRY(add_matrix(p + "attn_gate.weight", Role::kMatrix, i, s_.n_embd, ssm_inner));
        KILN_TRY(w_.add_tensor(p + "ssm_conv1d.weight", DType::F32, {kSsmConv, ssm_conv_dim},
                               synth::uniform_f32(next_key(), 0.0f, 0.5f)));
        KILN_TRY(add_vector(p + "ssm_a", hv, -1.0f, 0.5f));  // -exp(A_log): negative
        KILN_TRY(add_vector(p + "ssm_dt.bias", hv, 0.0f, 0.5f));
        KILN_TRY(add_matrix(p + "ssm_beta.weight", Role::kMatrix, i, s_.n_embd, hv));
        KILN_TRY(add_matrix(p + "ssm_alpha.weight", Role::kMatrix, i, s_.n_embd, hv));
        KILN_TRY(add_vector(p + "ssm_norm.weight", kSsmHead, 1.0f, 0.1f));
        KILN_TRY(add_matrix(p + "ssm_out.weight", Role::kMatrix, i, ssm_inner, s_.n_embd));
      } else {
        KILN_TRY(add_matrix(p + "attn_q.weight", Role::kMatrix, i, s_.n_embd, 2 * q_dim));  // query | gate
        KILN_TRY(add_matrix(p + "attn_k.weight", Role::kMatrix, i, s_.n_embd, kv_dim));
        KILN_TRY(add_matrix(p + "attn_v.weight", Role::kAttnV, i, s_.n_embd, kv_dim));
        KILN_TRY(add_matrix(p + "attn_output.weight", Role::kMatrix, i, q_dim, s_.n_embd));
        KILN_TRY(add_vector(p + "attn_q_norm.weight", hd, 1.0f, 0.1f));
        KILN_TRY(add_vector(p + "attn_k_norm.weight", hd, 1.0f, 0.1f));
      }
      KILN_TRY(add_vector(p + "post_attention_norm.weight", s_.n_embd, 1.0f, 0.1f));  // the pre-FFN norm
      KILN_TRY(add_matrix(p + "ffn_gate.weight", Role::kMatrix, i, s_.n_embd, s_.n_ff));
      KILN_TRY(add_matrix(p + "ffn_up.weight", Role::kMatrix, i, s_.n_embd, s_.n_ff));
      KILN_TRY(add_matrix(p + "ffn_down.weight", Role::kFfnDown, i, s_.n_ff, s_.n_embd));
      return Status::ok();
    }
    KILN_TRY(add_matrix(p + "attn_q.weight", Role::kMatrix, i, s_.n_embd, q_dim));
    KILN_TRY(add_matrix(p + "attn_k.weight", Role::kAttnK, i, s_.n_embd, kv_dim));
    KILN_TRY(add_matrix(p + "attn_v.weight", Role::kAttnV, i, s_.n_embd, kv_dim));
    if (a == "qwen2") {
      KILN_TRY(add_vector(p + "attn_q.bias", q_dim, 0.0f, 0.05f));
      KILN_TRY(add_vector(p + "attn_k.bias", kv_dim, 0.0f, 0.05f));
      KILN_TRY(add_vector(p + "attn_v.bias", kv_dim, 0.0f, 0.05f));
    }
    KILN_TRY(add_matrix(p + "attn_output.weight", Role::kAttnOut, i, q_dim, s_.n_embd));
    if (a == "qwen3" || a == "gemma3" || a == "qwen3moe") {
      KILN_TRY(add_vector(p + "attn_q_norm.weight", hd, 1.0f, 0.1f));
      KILN_TRY(add_vector(p + "attn_k_norm.weight", hd, 1.0f, 0.1f));
    }
    if (a == "gemma3") KILN_TRY(add_vector(p + "post_attention_norm.weight", s_.n_embd, 1.0f, 0.1f));
    KILN_TRY(add_vector(p + "ffn_norm.weight", s_.n_embd, 1.0f, 0.1f));
    if (s_.n_expert > 0) {  // routed experts instead of the dense FFN
      KILN_TRY(add_router(p + "ffn_gate_inp.weight"));
      KILN_TRY(add_matrix(p + "ffn_gate_exps.weight", Role::kExperts, i, s_.n_embd, s_.n_ff_exp, s_.n_expert));
      KILN_TRY(add_matrix(p + "ffn_up_exps.weight", Role::kExperts, i, s_.n_embd, s_.n_ff_exp, s_.n_expert));
      KILN_TRY(add_matrix(p + "ffn_down_exps.weight", Role::kFfnDown, i, s_.n_ff_exp, s_.n_embd, s_.n_expert));
      return Status::ok();
    }
    KILN_TRY(add_matrix(p + "ffn_gate.weight", Role::kMatrix, i, s_.n_embd, s_.n_ff));
    KILN_TRY(add_matrix(p + "ffn_up.weight", Role::kMatrix, i, s_.n_embd, s_.n_ff));
    KILN_TRY(add_matrix(p + "ffn_down.weight", Role::kFfnDown, i, s_.n_ff, s_.n_embd));
    if (a == "gemma3") KILN_TRY(add_vector(p + "post_ffw_norm.weight", s_.n_embd, 1.0f, 0.1f));
    return Status::ok();
  }

  // Layer i of gpt-oss: the tensors llama.cpp's LLM_ARCH_OPENAI_MOE loader requires, all of them. Biases, sinks and
  // router values keep generation finite and routing non-degenerate: q/k/v/o biases +-0.1, sinks (logits beside
  // the scaled q.k scores, O(1)) in [-1, 1], router logits of std ~3 plus a bias in [-0.5, 0.5], expert biases
  // +-0.1 (SwiGLU's clamps at +-7 then rarely bind).
  Status add_gptoss_layer(int64_t i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const int64_t e = s_.n_embd, q_dim = s_.n_head * s_.head_dim, kv_dim = s_.n_head_kv * s_.head_dim;
    const int64_t f = s_.n_ff_exp, x = s_.n_expert;
    KILN_TRY(add_vector(p + "attn_norm.weight", e, 1.0f, 0.1f));
    KILN_TRY(add_matrix(p + "attn_q.weight", Role::kMatrix, i, e, q_dim));
    KILN_TRY(add_vector(p + "attn_q.bias", q_dim, 0.0f, 0.1f));
    KILN_TRY(add_matrix(p + "attn_k.weight", Role::kAttnK, i, e, kv_dim));
    KILN_TRY(add_vector(p + "attn_k.bias", kv_dim, 0.0f, 0.1f));
    KILN_TRY(add_matrix(p + "attn_v.weight", Role::kAttnV, i, e, kv_dim));
    KILN_TRY(add_vector(p + "attn_v.bias", kv_dim, 0.0f, 0.1f));
    KILN_TRY(add_matrix(p + "attn_output.weight", Role::kAttnOut, i, q_dim, e));
    KILN_TRY(add_vector(p + "attn_output.bias", e, 0.0f, 0.1f));
    KILN_TRY(add_vector(p + "attn_sinks.weight", s_.n_head, 0.0f, 1.0f));
    KILN_TRY(add_vector(p + "post_attention_norm.weight", e, 1.0f, 0.1f));  // the FFN's pre-norm
    KILN_TRY(add_router(p + "ffn_gate_inp.weight"));
    KILN_TRY(add_vector(p + "ffn_gate_inp.bias", x, 0.0f, 0.5f));
    KILN_TRY(add_matrix(p + "ffn_gate_exps.weight", Role::kExperts, i, e, f, x));
    KILN_TRY(add_f32_matrix(p + "ffn_gate_exps.bias", f, x, 0.1f));
    KILN_TRY(add_matrix(p + "ffn_up_exps.weight", Role::kExperts, i, e, f, x));
    KILN_TRY(add_f32_matrix(p + "ffn_up_exps.bias", f, x, 0.1f));
    KILN_TRY(add_matrix(p + "ffn_down_exps.weight", Role::kFfnDown, i, f, e, x));
    return add_f32_matrix(p + "ffn_down_exps.bias", e, x, 0.1f);
  }

  gguf::Writer& writer() { return w_; }

 private:
  uint64_t next_key() { return seed_ * 0x9e3779b97f4a7c15ull + (++n_keys_) * 0xbf58476d1ce4e5b9ull; }

  const Shape& s_;
  const TypeRecipe& t_;
  uint64_t seed_;
  uint64_t n_keys_ = 0;
  gguf::Writer w_;
};

// Limits of the shape overrides: well above every published model of these families (Llama 3.1 405B: 126 layers,
// embd 16384, ff 53248, 128 heads; vocabularies up to ~262k), far below what would overflow a size computation.
// What the file needs is checked against the free disk space separately (check_disk_space).
struct Limit {
  const char* opt;
  int64_t max;
};
constexpr Limit kLimits[] = {{"--layers", 1024},       {"--embd", 1 << 16},      {"--ff", 1 << 20},
                             {"--heads", 1024},        {"--kv-heads", 1024},     {"--head-dim", 1024},
                             {"--n-vocab", 1 << 22},   {"--ctx", INT32_MAX},     {"--experts", 1024},
                             {"--experts-used", 1024}, {"--expert-ff", 1 << 20}};

Status check_range(const char* opt, int64_t v) {
  int64_t max = INT32_MAX;
  for (const Limit& l : kLimits)
    if (!std::strcmp(l.opt, opt)) max = l.max;
  if (v <= 0) return make_error(ErrorCode::kInvalidArgument, "%s %lld must be positive", opt, static_cast<long long>(v));
  if (v > max)
    return make_error(ErrorCode::kInvalidArgument, "%s %lld is too large (at most %lld)", opt,
                      static_cast<long long>(v), static_cast<long long>(max));
  return Status::ok();
}

std::string human_size(uint64_t b) {
  const double x = static_cast<double>(b);
  if (b >= (1ull << 40)) return strprintf("%.2f TiB", x / (1ull << 40));
  if (b >= (1ull << 30)) return strprintf("%.2f GiB", x / (1ull << 30));
  if (b >= (1ull << 20)) return strprintf("%.2f MiB", x / (1ull << 20));
  return strprintf("%.2f KiB", x / (1ull << 10));
}

// The file system holding `path` (the file when it exists, following symlinks, else its folder) must have room
// for `bytes` more: the writer fills a temporary file next to the target before replacing it.
Status check_disk_space(const std::string& path, uint64_t bytes) {
  struct statvfs st {};
  std::string where = path;
  if (::statvfs(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return Status::ok();  // the writer reports what is wrong with the path itself
    const size_t slash = path.rfind('/');
    where = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    if (::statvfs(where.c_str(), &st) != 0)
      return make_error(ErrorCode::kIo, "-o %s: folder '%s': %s", path.c_str(), where.c_str(), std::strerror(errno));
  }
  const unsigned __int128 avail = static_cast<unsigned __int128>(st.f_bavail) * st.f_frsize;
  if (bytes > avail)
    return make_error(ErrorCode::kIo, "-o %s: the model needs %s (%" PRIu64 " bytes), but the file system of '%s' "
                      "has only %s free (use smaller shape options or another folder)", path.c_str(),
                      human_size(bytes).c_str(), bytes, where.c_str(), human_size(static_cast<uint64_t>(avail)).c_str());
  return Status::ok();
}

// Applies the overrides to the shape and checks what llama.cpp and the block layouts need.
Result<Shape> resolve_shape(const Options& o, ArgParser& p, const TypeRecipe& t) {
  const Shape* base = nullptr;
  std::string names;
  for (const Shape& s : kShapes) {
    names += std::string(names.empty() ? "" : ", ") + s.name;
    if (o.shape == s.name) base = &s;
  }
  if (!base)
    return make_error(ErrorCode::kInvalidArgument, "--shape '%s' is not a known shape (%s)", o.shape.c_str(), names.c_str());
  Shape s = *base;
  struct Override {
    const char* opt;
    int64_t value;
    int64_t* field;
  } overrides[] = {{"--layers", o.layers, &s.n_layer},  {"--embd", o.embd, &s.n_embd},
                   {"--ff", o.ff, &s.n_ff},              {"--heads", o.heads, &s.n_head},
                   {"--kv-heads", o.kv_heads, &s.n_head_kv}, {"--head-dim", o.head_dim, &s.head_dim},
                   {"--n-vocab", o.n_vocab, &s.n_vocab}, {"--ctx", o.ctx, &s.n_ctx},
                   {"--experts", o.experts, &s.n_expert}, {"--experts-used", o.experts_used, &s.n_expert_used},
                   {"--expert-ff", o.expert_ff, &s.n_ff_exp}};
  for (const Override& ov : overrides) {
    if (!p.seen(ov.opt)) continue;
    KILN_TRY(check_range(ov.opt, ov.value));
    if (base->n_expert == 0 && std::string_view(ov.opt).find("expert") != std::string_view::npos) {
      std::string moe;
      for (const Shape& m : kShapes)
        if (m.n_expert > 0) moe += std::string(moe.empty() ? "" : ", ") + m.name;
      return make_error(ErrorCode::kInvalidArgument, "%s: shape %s has no experts (the MoE shapes: %s)", ov.opt,
                        s.name, moe.c_str());
    }
    *ov.field = ov.value;
  }
  if (p.seen("--mtp")) {
    if (o.mtp < 0 || o.mtp > 16)
      return make_error(ErrorCode::kInvalidArgument, "--mtp %lld must be in [0, 16]", static_cast<long long>(o.mtp));
    if (o.mtp > 0 && std::string_view(s.arch) != "qwen35")
      return make_error(ErrorCode::kInvalidArgument, "--mtp: shape %s (%s) has no multi-token-prediction layers (the "
                        "qwen35 shapes have)", s.name, s.arch);
    s.n_nextn = o.mtp;
  }
  if (s.n_expert_used > s.n_expert)
    return make_error(ErrorCode::kInvalidArgument, "--experts-used %lld is more than the %lld experts",
                      static_cast<long long>(s.n_expert_used), static_cast<long long>(s.n_expert));
  // Row lengths of the quantized matrices: n_embd (most), n_ff / n_ff_exp (ffn_down) and n_head * head_dim
  // (attn_output) must be whole blocks of 32, the block of every written type or of its fallback (fallback_type).
  const int64_t blk = t.base == DType::F16 ? 1 : 32;
  if (s.n_embd % blk != 0)
    return make_error(ErrorCode::kInvalidArgument, "--embd %lld must be a multiple of %lld for --type %s",
                      static_cast<long long>(s.n_embd), static_cast<long long>(blk), t.name);
  if (s.n_ff % blk != 0)
    return make_error(ErrorCode::kInvalidArgument, "--ff %lld must be a multiple of %lld for --type %s",
                      static_cast<long long>(s.n_ff), static_cast<long long>(blk), t.name);
  if (s.n_expert > 0 && s.n_ff_exp % blk != 0)  // ffn_down_exps rows
    return make_error(ErrorCode::kInvalidArgument, "--expert-ff %lld must be a multiple of %lld for --type %s",
                      static_cast<long long>(s.n_ff_exp), static_cast<long long>(blk), t.name);
  if (s.head_dim == 0) {
    if (s.n_embd % s.n_head != 0)
      return make_error(ErrorCode::kInvalidArgument, "--embd %lld is not a multiple of --heads %lld (or give --head-dim)",
                        static_cast<long long>(s.n_embd), static_cast<long long>(s.n_head));
    s.head_dim = s.n_embd / s.n_head;
  }
  if (s.head_dim % 2 != 0)
    return make_error(ErrorCode::kInvalidArgument, "head dim %lld (--head-dim, or --embd / --heads) must be even",
                      static_cast<long long>(s.head_dim));
  if (s.n_head % s.n_head_kv != 0)
    return make_error(ErrorCode::kInvalidArgument, "--heads %lld is not a multiple of --kv-heads %lld",
                      static_cast<long long>(s.n_head), static_cast<long long>(s.n_head_kv));
  if ((s.n_head * s.head_dim) % blk != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "--heads x head dim = %lld must be a multiple of %lld for --type %s (attn_output rows)",
                      static_cast<long long>(s.n_head * s.head_dim), static_cast<long long>(blk), t.name);
  return s;
}

int run_synth(int argc, char** argv) {
  Options o;
  ArgParser p("synth", "Writes a random-weight model (llama.cpp GGUF conventions) for tests and benchmarks.");
  std::string shape_help = "model shape:";
  for (const Shape& s : kShapes) shape_help += std::string(" ") + s.name;
  p.option({"--shape"}, &o.shape, "S", shape_help);
  p.option({"--type"}, &o.type, "T", std::string("weights: ") + kTypeList + " (default f16)");
  p.option({"-o", "--output"}, &o.out, "FILE", "output GGUF");
  p.option({"--vocab"}, &o.vocab, "FILE", "copy the tokenizer of this GGUF (default: a built-in byte-level BPE)");
  p.option({"--layers"}, &o.layers, "N", "override the layer count");
  p.option({"--embd"}, &o.embd, "N", "override the embedding width");
  p.option({"--ff"}, &o.ff, "N", "override the feed-forward width");
  p.option({"--heads"}, &o.heads, "N", "override the attention head count");
  p.option({"--kv-heads"}, &o.kv_heads, "N", "override the KV head count");
  p.option({"--head-dim"}, &o.head_dim, "N", "override the head size");
  p.option({"--n-vocab"}, &o.n_vocab, "N", "vocabulary size (default: the shape's, or the --vocab file's when larger)");
  p.option({"--ctx"}, &o.ctx, "N", "context length written to the metadata");
  p.option({"--experts"}, &o.experts, "N", "MoE shapes: override the expert count");
  p.option({"--experts-used"}, &o.experts_used, "N", "MoE shapes: override the experts routed per token");
  p.option({"--expert-ff"}, &o.expert_ff, "N", "MoE shapes: override the expert feed-forward width");
  p.option({"--mtp"}, &o.mtp, "N", "qwen35 shapes: N multi-token-prediction (NextN) blocks after the trunk "
           "(--spec-type draft-mtp; default 0)");
  p.option({"--seed"}, &o.seed, "N", "random seed (default 42); the output is deterministic for a seed");
  p.option({"-t", "--threads"}, &o.threads, "N", "threads (default: all cores)");
  if (Status st = p.parse(argc, argv); !st) return fail("synth", st);
  if (p.help_requested()) {
    std::printf("%s", p.usage().c_str());
    return 0;
  }
  if (o.shape.empty()) return fail("synth", make_error(ErrorCode::kInvalidArgument, "--shape is required"));
  // Threads: 0 = all cores; more than a few per core only costs memory (a chunk buffer each) and time.
  const int max_threads = 4 * default_thread_count();
  if (o.threads < 0)
    return fail("synth", make_error(ErrorCode::kInvalidArgument, "-t %d must be >= 0 (0: all cores)", o.threads));
  if (o.threads > max_threads) {
    std::fprintf(stderr, "kiln synth: warning: -t %d is more than 4 threads per core; using %d\n", o.threads,
                 max_threads);
    o.threads = max_threads;
  }
  const int threads = o.threads > 0 ? o.threads : default_thread_count();
  if (o.out.empty()) return fail("synth", make_error(ErrorCode::kInvalidArgument, "-o FILE is required"));
  const TypeRecipe* recipe = nullptr;
  for (const TypeRecipe& t : kTypes)
    if (o.type == t.name) recipe = &t;
  if (!recipe) {
    // The other i-quant grid types (IQ2_S, IQ3_XXS, IQ3_S) are decoded but not written: their file types' mixes
    // are not kiln's to guess.
    const std::optional<DType> named = dtype_from_name(o.type);
    if (named && is_iquant_grid(*named))
      return fail("synth", make_error(ErrorCode::kInvalidArgument,
                                      "--type '%s': kiln reads %s files but does not write them (make them with "
                                      "llama-quantize); --type is one of %s",
                                      o.type.c_str(), dtype_name(*named), kTypeList));
    return fail("synth", make_error(ErrorCode::kInvalidArgument,
                                    "--type '%s' is not one of %s", o.type.c_str(), kTypeList));
  }
  auto shape = resolve_shape(o, p, *recipe);
  if (!shape) return fail("synth", shape.status());
  Shape s = *shape;

  // Vocabulary: an explicit --n-vocab must hold the tokenizer; otherwise the shape's size grows to fit it.
  std::optional<gguf::File> vocab;
  const bool harmony = std::string_view(s.arch) == "gpt-oss";
  int64_t need = synth::builtin_vocab_size(harmony);
  if (!o.vocab.empty()) {
    auto v = gguf::File::open(o.vocab);
    if (!v) return fail("synth", v.status().with_context("--vocab"));
    auto n = synth::vocab_size(*v);
    if (!n) return fail("synth", n.status().with_context("--vocab"));
    need = *n;
    vocab = std::move(*v);
  }
  if (p.seen("--n-vocab")) {
    if (need > s.n_vocab)
      return fail("synth", make_error(ErrorCode::kInvalidArgument, "--n-vocab %lld is smaller than the %s (%lld tokens)",
                                      static_cast<long long>(s.n_vocab), vocab ? "--vocab file" : "built-in vocabulary",
                                      static_cast<long long>(need)));
  } else if (need > s.n_vocab) {
    std::fprintf(stderr, "kiln synth: using the vocabulary's size %lld (larger than shape %s's %lld)\n",
                 static_cast<long long>(need), s.name, static_cast<long long>(s.n_vocab));
    s.n_vocab = need;
  }

  ModelBuilder b(s, *recipe, o.seed);
  Status st = b.build();
  if (st.is_ok()) st = vocab ? synth::copy_vocab(b.writer(), *vocab, s.n_vocab) : synth::add_builtin_vocab(b.writer(), s.n_vocab, harmony);
  if (!st) return fail("synth", st);
  vocab.reset();

  auto size = b.writer().file_size();
  if (!size) return fail("synth", size.status());
  if (Status ds = check_disk_space(o.out, *size); !ds) return fail("synth", ds);

  Timer timer;
  st = b.writer().write(o.out, threads);
  if (!st) return fail("synth", st);
  const double secs = timer.seconds();
  const uint64_t bytes = *b.writer().file_size();
  std::fprintf(stderr,
               "kiln synth: wrote %s: %s %s (%lld layers, embd %lld, ff %lld, heads %lld/%lld, head dim %lld, vocab "
               "%lld%s), %zu tensors, %.2f GB in %.2f s (%.2f GB/s, %d threads)\n",
               o.out.c_str(), s.name, recipe->name, static_cast<long long>(s.n_layer), static_cast<long long>(s.n_embd),
               static_cast<long long>(s.n_ff), static_cast<long long>(s.n_head), static_cast<long long>(s.n_head_kv),
               static_cast<long long>(s.head_dim), static_cast<long long>(s.n_vocab),
               s.n_expert > 0 ? strprintf(", %lld of %lld experts of ff %lld", static_cast<long long>(s.n_expert_used),
                                          static_cast<long long>(s.n_expert), static_cast<long long>(s.n_ff_exp)).c_str()
                              : "",
               b.writer().n_tensors(),
               static_cast<double>(bytes) / 1e9, secs, secs > 0 ? static_cast<double>(bytes) / 1e9 / secs : 0.0,
               threads);
  return 0;
}

}  // namespace

KILN_REGISTER_COMMAND("synth", "write a random-weight model of a known shape and type", run_synth);

}  // namespace kiln::cli
