#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kiln {

const char* op_name(Op op) {
  switch (op) {
    case Op::kGetRows: return "get_rows";
    case Op::kRmsNorm: return "rms_norm";
    case Op::kMatmul: return "matmul";
    case Op::kRope: return "rope";
    case Op::kKvStore: return "kv_store";
    case Op::kAttention: return "attention";
    case Op::kSwiglu: return "swiglu";
    case Op::kAdd: return "add";
    case Op::kMul: return "mul";
    case Op::kScale: return "scale";
    case Op::kSoftmax: return "softmax";
    case Op::kArgmax: return "argmax";
    case Op::kCopy: return "copy";
    case Op::kGeglu: return "geglu";
    case Op::kSigmoidMul: return "sigmoid_mul";
    case Op::kAttentionWindow: return "attention_window";
    case Op::kConv1dSilu: return "conv1d_silu";
    case Op::kDeltaNet: return "gated_delta_net";
    case Op::kMoeFfn: return "moe_ffn";
    case Op::kLayerNorm: return "layer_norm";
    case Op::kGelu: return "gelu";
    case Op::kAttentionNonCausal: return "attention_non_causal";
    case Op::kRopeYarn: return "rope_yarn";
    case Op::kAttentionSinks: return "attention_sinks";
    case Op::kArgmaxMasked: return "argmax_masked";
  }
  return "?";
}

YarnTerms yarn_terms(const RopeParams& p) {
  YarnTerms y;
  y.mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) {
    auto corr = [&](float beta) {
      const float ratio = static_cast<float>(p.n_ctx_orig) / (beta * 2 * static_cast<float>(M_PI));
      return static_cast<float>(p.n_rot) * std::log(ratio) / (2 * std::log(p.freq_base));
    };
    y.lo = std::max(0.0f, std::floor(corr(p.beta_fast)));
    y.hi = std::min(static_cast<float>(p.n_rot - 1), std::ceil(corr(p.beta_slow)));
    y.mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
  }
  return y;
}

Status copy_between(const Tensor& src, const Tensor& dst, void* bounce, size_t bounce_bytes) {
  if (!src.valid() || !dst.valid() || !src.backend || !dst.backend)
    return make_error(ErrorCode::kInvalidArgument, "copy_between: tensor not set");
  if (src.backend == dst.backend) return src.backend->copy(src, dst);
  if (src.dtype != dst.dtype || !src.is_contiguous() || !dst.is_contiguous() || src.n_bytes() != dst.n_bytes())
    return make_error(ErrorCode::kUnsupported, "copy_between: %s %s -> %s %s (same type and shape, contiguous)",
                      dtype_name(src.dtype), src.shape_string().c_str(), dtype_name(dst.dtype),
                      dst.shape_string().c_str());
  const size_t n = src.n_bytes();
  Backend& sb = *src.backend;
  Backend& db = *dst.backend;
  if (db.host_memory()) return sb.read(src, 0, dst.data, n);  // read() waits for src's work
  if (sb.host_memory()) {
    KILN_TRY(sb.synchronize());
    return db.write(dst, 0, src.data, n);
  }
  if (!bounce || bounce_bytes < n)
    return make_error(ErrorCode::kInvalidArgument, "copy_between: %s -> %s needs %zu bytes of host staging", sb.name(),
                      db.name(), n);
  KILN_TRY(sb.read(src, 0, bounce, n));
  KILN_TRY(db.write(dst, 0, bounce, n));
  return db.synchronize();  // the bounce buffer is reused by the next boundary
}

std::string stored_cache_types(const Backend& be) {
  std::vector<const char*> names;
  for (DType t : kKvCacheTypes)
    if (be.supports(Op::kKvStore, t, t) && be.supports(Op::kAttention, t, t)) names.push_back(dtype_name(t));
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += std::string(i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s.empty() ? "no" : s;
}

}  // namespace kiln
