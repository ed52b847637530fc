// Operand checks shared by every backend's op entries (shapes and dtypes only: values are the planner's, see
// backend.h). Each error names the op and the operand.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/tensor.h"
#include "util/status.h"

namespace kiln::op_checks {

// `t` (named `name` in op `op`) is set, of type `want`, with rows of ne[0] contiguous elements and one row stride
// that is a whole number of elements.
inline Status check(const char* op, const char* name, const Tensor& t, DType want) {
  if (!t.valid()) return make_error(ErrorCode::kInvalidArgument, "%s: %s is not set", op, name);
  if (t.dtype != want)
    return make_error(ErrorCode::kUnsupported, "%s: %s must be %s, got %s", op, name, dtype_name(want),
                      dtype_name(t.dtype));
  if (!t.rows_uniform())
    return make_error(ErrorCode::kUnsupported, "%s: %s %s must have contiguous rows with one row stride", op, name,
                      t.shape_string().c_str());
  if (t.nb[1] % static_cast<size_t>(dtype_type_size(want)) != 0)
    return make_error(ErrorCode::kUnsupported, "%s: %s row stride %zu is not a multiple of its element size", op,
                      name, t.nb[1]);
  return Status::ok();
}

// a and b hold the same rows of the same width.
inline Status same_shape(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  if (a.ne[0] != b.ne[0] || a.n_rows() != b.n_rows())
    return make_error(ErrorCode::kInvalidArgument, "%s: %s %s and %s %s differ in shape", op, an,
                      a.shape_string().c_str(), bn, b.shape_string().c_str());
  return Status::ok();
}

// An I32 index vector of n entries.
inline Status check_ids(const char* op, const char* name, const Tensor& ids, int64_t n) {
  KILN_TRY(check(op, name, ids, DType::I32));
  if (ids.ne[0] != n || ids.n_rows() != 1)
    return make_error(ErrorCode::kInvalidArgument, "%s: %s %s must be [%lld]", op, name, ids.shape_string().c_str(),
                      static_cast<long long>(n));
  return Status::ok();
}

// argmax_masked operands (Backend::argmax_masked): x F32 [d, n], mask I64 [ceil(d / 64), n], dst I32 [n].
inline Status argmax_masked_operands(const Tensor& x, const Tensor& mask, const Tensor& dst) {
  KILN_TRY(check("argmax_masked", "x", x, DType::F32));
  KILN_TRY(check("argmax_masked", "mask", mask, DType::I64));
  KILN_TRY(check_ids("argmax_masked", "dst", dst, x.n_rows()));
  if (mask.ne[0] != (x.ne[0] + 63) / 64 || mask.n_rows() != x.n_rows())
    return make_error(ErrorCode::kInvalidArgument, "argmax_masked: mask %s must be [%lld, %lld] for x %s",
                      mask.shape_string().c_str(), static_cast<long long>((x.ne[0] + 63) / 64),
                      static_cast<long long>(x.n_rows()), x.shape_string().c_str());
  return Status::ok();
}

inline bool is_float_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
// Any K and V of the op contract's cache types (backend.h, kKvCacheTypes), independently: a backend that reads
// every type gives this to supports_op.
inline bool any_cache_pair(DType k, DType v) { return is_kv_cache_type(k) && is_kv_cache_type(v); }

// Backend::supports for every backend (backend.h, Op): the operand types each op takes are the same everywhere;
// what differs is which weight types a backend's matmul and get_rows kernels read, which its own selectors say
// (the same functions its ops dispatch with), and which K/V cache type pairs its kv_store and attention store and
// read (cache_pair: a = K, b = V). Activations, norms and the hybrid-model ops are f32; copy converts between float
// types; moe_ffn takes the expert types moe_weight accepts (nullptr: a backend without moe_ffn).
// encoder_ops: the backend runs layer_norm, gelu and non-causal attention (with the caches it stores). oai_ops: its
// rope honours YaRN and its attention the sinks (gpt-oss). The CPU and CUDA backends have both.
inline bool supports_op(Op op, DType a, DType b, bool (*cache_pair)(DType, DType), bool (*matmul_weight)(DType),
                        bool (*get_rows_weight)(DType), bool (*moe_weight)(DType) = nullptr, bool encoder_ops = false,
                        bool oai_ops = false) {
  switch (op) {
    case Op::kRopeYarn: return oai_ops && a == DType::F32;
    case Op::kAttentionSinks: return oai_ops && is_kv_cache_type(a) && is_kv_cache_type(b) && cache_pair(a, b);
    case Op::kLayerNorm:
    case Op::kGelu: return encoder_ops && a == DType::F32;
    case Op::kAttentionNonCausal: return encoder_ops && is_kv_cache_type(a) && cache_pair(a, a);
    case Op::kMoeFfn: return moe_weight && moe_weight(a);
    case Op::kGetRows: return get_rows_weight(a);
    case Op::kMatmul: return matmul_weight(a);
    case Op::kKvStore:
    case Op::kAttention:
    case Op::kAttentionWindow: return is_kv_cache_type(a) && is_kv_cache_type(b) && cache_pair(a, b);
    case Op::kCopy: return a == b || (is_float_type(a) && is_float_type(b));
    case Op::kArgmax:
    case Op::kArgmaxMasked:
    case Op::kRmsNorm:
    case Op::kRope:
    case Op::kSwiglu:
    case Op::kAdd:
    case Op::kMul:
    case Op::kScale:
    case Op::kSoftmax:
    case Op::kGeglu:
    case Op::kSigmoidMul:
    case Op::kConv1dSilu:
    case Op::kDeltaNet: return a == DType::F32;
  }
  return false;
}

// matmul / matmul_group operands (Backend::matmul): w rows uniform and of a supported type (the backend's own
// supports() answer), x F32 [n_in, n_tok], dst F32 [n_out, n_tok] not aliasing x, bias F32 [n_out] or unset.
inline Status matmul_operands(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst,
                              bool type_supported) {
  if (!w.valid() || !w.rows_uniform())
    return make_error(ErrorCode::kInvalidArgument, "matmul: w must be a tensor with contiguous rows");
  if (!type_supported)
    return make_error(ErrorCode::kUnsupported, "matmul: weight type %s is not supported", dtype_name(w.dtype));
  KILN_TRY(check("matmul", "x", x, DType::F32));
  KILN_TRY(check("matmul", "dst", dst, DType::F32));
  if (x.ne[0] != w.ne[0])
    return make_error(ErrorCode::kInvalidArgument, "matmul: x %s rows do not match w %s (n_in %lld)",
                      x.shape_string().c_str(), w.shape_string().c_str(), static_cast<long long>(w.ne[0]));
  if (dst.ne[0] != w.n_rows() || dst.n_rows() != x.n_rows())
    return make_error(ErrorCode::kInvalidArgument, "matmul: dst %s must be [%lld, %lld]", dst.shape_string().c_str(),
                      static_cast<long long>(w.n_rows()), static_cast<long long>(x.n_rows()));
  if (x.data == dst.data) return make_error(ErrorCode::kInvalidArgument, "matmul: dst must not alias x");
  if (bias.valid()) {
    KILN_TRY(check("matmul", "bias", bias, DType::F32));
    if (bias.ne[0] != dst.ne[0] || bias.n_rows() != 1)
      return make_error(ErrorCode::kInvalidArgument, "matmul: bias %s must be [%lld]", bias.shape_string().c_str(),
                        static_cast<long long>(dst.ne[0]));
  }
  return Status::ok();
}

// moe_ffn operands (Backend::MoeFfnArgs): x F32 [n_embd, n_tok] and acc of the same shape, not aliasing; router
// [n_embd, n_expert] of a type matmul_weight accepts; gate/up [n_embd, n_ff, n_expert] and down
// [n_ff, n_embd, n_expert] of types moe_weight accepts, with uniform rows (expert e = rows [e * n_out, (e+1) * n_out));
// 1 <= k <= n_expert.
inline Status moe_ffn_operands(const Backend::MoeFfnArgs& a, const Tensor& acc, bool (*matmul_weight)(DType),
                               bool (*moe_weight)(DType)) {
  KILN_TRY(check("moe_ffn", "x", a.x, DType::F32));
  KILN_TRY(check("moe_ffn", "acc", acc, DType::F32));
  KILN_TRY(same_shape("moe_ffn", "x", a.x, "acc", acc));
  if (a.x.data == acc.data) return make_error(ErrorCode::kInvalidArgument, "moe_ffn: acc must not alias x");
  const int64_t d = a.x.ne[0];
  if (!a.router.valid()) return make_error(ErrorCode::kInvalidArgument, "moe_ffn: router is not set");
  if (!matmul_weight(a.router.dtype))
    return make_error(ErrorCode::kUnsupported, "moe_ffn: router type %s is not supported", dtype_name(a.router.dtype));
  if (!a.router.rows_uniform() || a.router.ne[0] != d || a.router.ne[2] != 1 || a.router.ne[3] != 1)
    return make_error(ErrorCode::kInvalidArgument, "moe_ffn: router %s must be [%lld, n_expert]",
                      a.router.shape_string().c_str(), static_cast<long long>(d));
  const int64_t n_expert = a.router.ne[1];
  if (!a.gate.valid() || !a.up.valid() || !a.down.valid())
    return make_error(ErrorCode::kInvalidArgument, "moe_ffn: gate, up and down must be set");
  const int64_t n_ff = a.gate.ne[1];
  const struct { const char* name; const Tensor& t; int64_t ne0, ne1; } w[] = {
      {"gate", a.gate, d, n_ff}, {"up", a.up, d, n_ff}, {"down", a.down, n_ff, d}};
  for (const auto& e : w) {
    if (!moe_weight(e.t.dtype))
      return make_error(ErrorCode::kUnsupported, "moe_ffn: %s type %s is not supported", e.name,
                        dtype_name(e.t.dtype));
    if (e.t.ne[0] != e.ne0 || e.t.ne[1] != e.ne1 || e.t.ne[2] != n_expert || e.t.ne[3] != 1 || !e.t.rows_uniform())
      return make_error(ErrorCode::kInvalidArgument, "moe_ffn: %s %s must be [%lld, %lld, n_expert %lld] with "
                        "uniform rows", e.name, e.t.shape_string().c_str(), static_cast<long long>(e.ne0),
                        static_cast<long long>(e.ne1), static_cast<long long>(n_expert));
  }
  if (a.k < 1 || a.k > n_expert)
    return make_error(ErrorCode::kInvalidArgument, "moe_ffn: k = %d must be in [1, n_expert %lld]", a.k,
                      static_cast<long long>(n_expert));
  if (a.gating != MoeGating::kSoftmax && a.gating != MoeGating::kSoftmaxWeight)
    return make_error(ErrorCode::kUnsupported, "moe_ffn: gating %d is not supported", static_cast<int>(a.gating));
  if (a.act != MoeActivation::kSwiglu && a.act != MoeActivation::kSwigluOai)
    return make_error(ErrorCode::kUnsupported, "moe_ffn: activation %d is not supported", static_cast<int>(a.act));
  const struct { const char* name; const Tensor& t; int64_t ne0; } b[] = {
      {"router_bias", a.router_bias, n_expert}, {"gate_bias", a.gate_bias, n_ff}, {"up_bias", a.up_bias, n_ff},
      {"down_bias", a.down_bias, d}};
  for (const auto& e : b) {
    if (!e.t.valid()) continue;
    KILN_TRY(check("moe_ffn", e.name, e.t, DType::F32));
    const int64_t rows = &e.t == &a.router_bias ? 1 : n_expert;
    if (e.t.ne[0] != e.ne0 || e.t.n_rows() != rows || !e.t.is_contiguous())
      return make_error(ErrorCode::kInvalidArgument, "moe_ffn: %s %s must be contiguous [%lld, %lld]", e.name,
                        e.t.shape_string().c_str(), static_cast<long long>(e.ne0), static_cast<long long>(rows));
  }
  return Status::ok();
}

// add / mul operands: a, dst F32 of one shape; b the same shape or one row (then *bcast = true).
inline Status binary_operands(const char* op, const Tensor& a, const Tensor& b, const Tensor& dst, bool* bcast) {
  KILN_TRY(check(op, "a", a, DType::F32));
  KILN_TRY(check(op, "b", b, DType::F32));
  KILN_TRY(check(op, "dst", dst, DType::F32));
  KILN_TRY(same_shape(op, "a", a, "dst", dst));
  *bcast = b.n_rows() == 1 && a.n_rows() != 1;
  if (b.ne[0] != a.ne[0] || (!*bcast && b.n_rows() != a.n_rows()))
    return make_error(ErrorCode::kInvalidArgument, "%s: b %s must match a %s or be one row", op,
                      b.shape_string().c_str(), a.shape_string().c_str());
  return Status::ok();
}

// The cache of `op` (kv_store or attention): K and V of types `be` stores (supports(op, k type, v type)), each head
// row a whole number of its type's blocks.
inline Status cache_operands(const char* op, const Backend& be, Op which, const KvLayer& c) {
  const DType kt = c.k.dtype, vt = c.v.dtype;
  if (!c.k.valid() || !c.v.valid()) return make_error(ErrorCode::kInvalidArgument, "%s: cache k / v is not set", op);
  if (!be.supports(which, kt, vt))
    return make_error(ErrorCode::kUnsupported, "%s: cache types k %s / v %s: backend %s stores %s caches%s", op,
                      dtype_name(kt), dtype_name(vt), be.name(), stored_cache_types(be).c_str(),
                      be.supports(which, kt, kt) && be.supports(which, vt, vt) ? ", K and V of one type" : "");
  if (c.head_dim_k % dtype_block_size(kt) || c.head_dim_v % dtype_block_size(vt))
    return make_error(ErrorCode::kUnsupported, "%s: head dims %d (k %s) / %d (v %s) are not whole blocks of their "
                      "types (%lld / %lld elements)", op, c.head_dim_k, dtype_name(kt), c.head_dim_v, dtype_name(vt),
                      static_cast<long long>(dtype_block_size(kt)), static_cast<long long>(dtype_block_size(vt)));
  return Status::ok();
}

// kv_store operands: k F32 [n_head_kv * hd_k, n], v F32 [n_head_kv * hd_v, n], a cache (cache_operands) whose rows
// match, slots I32 [n].
inline Status kv_store_operands(const Backend& be, const Tensor& k, const Tensor& v, const KvLayer& c,
                                const Tensor& slots) {
  KILN_TRY(check("kv_store", "k", k, DType::F32));
  KILN_TRY(check("kv_store", "v", v, DType::F32));
  KILN_TRY(cache_operands("kv_store", be, Op::kKvStore, c));
  const int64_t dk = static_cast<int64_t>(c.n_head_kv) * c.head_dim_k;
  const int64_t dv = static_cast<int64_t>(c.n_head_kv) * c.head_dim_v;
  if (k.ne[0] != dk || c.k.ne[0] != dk || v.ne[0] != dv || c.v.ne[0] != dv)
    return make_error(ErrorCode::kInvalidArgument, "kv_store: k %s / v %s rows do not match the cache (%lld / %lld)",
                      k.shape_string().c_str(), v.shape_string().c_str(), static_cast<long long>(dk),
                      static_cast<long long>(dv));
  if (v.n_rows() != k.n_rows())
    return make_error(ErrorCode::kInvalidArgument, "kv_store: k and v hold different token counts");
  return check_ids("kv_store", "slots", slots, k.n_rows());
}

// attention operands: q F32 [hd_k, n_head, n_tok] with contiguous heads, n_head a multiple of n_head_kv, dst
// contiguous F32 [hd_v, n_head, n_tok], a cache (cache_operands), block tables I32, tok_table and kv_len I32 [n_tok].
inline Status attention_operands(const Backend& be, const Tensor& q, const KvLayer& c, const AttnBatch& m,
                                 const Tensor& dst) {
  if (!q.valid() || q.dtype != DType::F32 || q.nb[0] != sizeof(float))
    return make_error(ErrorCode::kUnsupported, "attention: q must be f32 with contiguous heads");
  const int64_t n_head = q.ne[1], n_tok = q.ne[2];
  if (q.ne[0] != c.head_dim_k || q.ne[3] != 1)
    return make_error(ErrorCode::kInvalidArgument, "attention: q %s must be [head_dim_k %d, n_head, n_tok]",
                      q.shape_string().c_str(), c.head_dim_k);
  if (c.n_head_kv <= 0 || n_head % c.n_head_kv != 0)
    return make_error(ErrorCode::kInvalidArgument, "attention: n_head %lld is not a multiple of n_head_kv %d",
                      static_cast<long long>(n_head), c.n_head_kv);
  KILN_TRY(check("attention", "dst", dst, DType::F32));
  if (!dst.is_contiguous() || dst.ne[0] != c.head_dim_v || dst.ne[1] != n_head || dst.ne[2] != n_tok)
    return make_error(ErrorCode::kInvalidArgument, "attention: dst %s must be contiguous [%d, %lld, %lld]",
                      dst.shape_string().c_str(), c.head_dim_v, static_cast<long long>(n_head),
                      static_cast<long long>(n_tok));
  KILN_TRY(cache_operands("attention", be, c.window > 0 ? Op::kAttentionWindow : Op::kAttention, c));
  if (c.sinks.valid()) {
    if (!be.supports(Op::kAttentionSinks, c.k.dtype, c.v.dtype))
      return make_error(ErrorCode::kUnsupported, "attention: sinks are not supported by backend %s", be.name());
    KILN_TRY(check("attention", "sinks", c.sinks, DType::F32));
    if (c.sinks.ne[0] != n_head || c.sinks.n_rows() != 1)
      return make_error(ErrorCode::kInvalidArgument, "attention: sinks %s must be [n_head %lld]",
                        c.sinks.shape_string().c_str(), static_cast<long long>(n_head));
  }
  if (c.block_size <= 0) return make_error(ErrorCode::kInvalidArgument, "attention: block_size must be > 0");
  KILN_TRY(check("attention", "block_tables", m.block_tables, DType::I32));
  KILN_TRY(check_ids("attention", "tok_table", m.tok_table, n_tok));
  return check_ids("attention", "kv_len", m.kv_len, n_tok);
}

// rope operands: x F32 [head_dim, n_head, n_tok] with contiguous heads and whole-float strides that do not overlap,
// pos I32 [n_tok], n_rot even in (0, head_dim], freq_factors F32 with n_rot/2 values or unset, YaRN only where
// the backend supports(Op::kRopeYarn).
inline Status rope_operands(const Backend& be, const Tensor& x, const Tensor& pos, const RopeParams& p) {
  if (!x.valid() || x.dtype != DType::F32 || x.nb[0] != sizeof(float))
    return make_error(ErrorCode::kUnsupported, "rope: x must be f32 with contiguous heads");
  const int64_t hd = x.ne[0], n_head = x.ne[1], n_tok = x.ne[2];
  if (x.ne[3] != 1 || x.nb[1] < hd * sizeof(float) || x.nb[2] < static_cast<size_t>(n_head) * x.nb[1] ||
      x.nb[1] % sizeof(float) || x.nb[2] % sizeof(float))
    return make_error(ErrorCode::kInvalidArgument, "rope: x %s must be [head_dim, n_head, n_tok] without overlap",
                      x.shape_string().c_str());
  KILN_TRY(check_ids("rope", "pos", pos, n_tok));
  if (p.n_rot <= 0 || p.n_rot % 2 != 0 || p.n_rot > hd)
    return make_error(ErrorCode::kInvalidArgument, "rope: n_rot %d must be even and in (0, head_dim %lld]", p.n_rot,
                      static_cast<long long>(hd));
  if (p.freq_factors.valid()) {
    KILN_TRY(check("rope", "freq_factors", p.freq_factors, DType::F32));
    if (p.freq_factors.ne[0] < p.n_rot / 2)
      return make_error(ErrorCode::kInvalidArgument, "rope: freq_factors %s must hold n_rot/2 = %d values",
                        p.freq_factors.shape_string().c_str(), p.n_rot / 2);
  }
  if (p.yarn()) {
    if (!be.supports(Op::kRopeYarn, DType::F32))
      return make_error(ErrorCode::kUnsupported, "rope: YaRN scaling is not supported by backend %s", be.name());
    if (p.n_ctx_orig <= 0 || !(p.attn_factor > 0) || !(p.freq_scale > 0))
      return make_error(ErrorCode::kInvalidArgument, "rope: YaRN needs n_ctx_orig %d, attn_factor %g and "
                        "freq_scale %g > 0", p.n_ctx_orig, p.attn_factor, p.freq_scale);
  }
  return Status::ok();
}

}  // namespace kiln::op_checks
