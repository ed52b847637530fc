// CudaBackend's entries of the ops beyond the llama family (checks + unpacking; the launchers are in launch.h): the
// hybrid models' conv1d_silu and gated_delta_net (Qwen3.5: ssm.cu) and the encoders' layer_norm (norm.cu) and gelu
// (elementwise.cu).
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/op_checks.h"

namespace kiln::cuda {
namespace {

size_t fstride(const Tensor& t) { return t.nb[1] / sizeof(float); }

using op_checks::check;
using op_checks::same_shape;

// The per-sequence arrays of a step (I32, at least n_seq entries each), as device pointers.
Status seq_arrays(const char* op, const AttnBatch& m, SeqArrays* out) {
  if (m.n_seq < 0) return make_error(ErrorCode::kInvalidArgument, "%s: n_seq %d must be >= 0", op, m.n_seq);
  const Tensor* ts[] = {&m.seq_row, &m.seq_q_start, &m.seq_q_len, &m.seq_reset};
  const char* names[] = {"seq_row", "seq_q_start", "seq_q_len", "seq_reset"};
  for (int i = 0; i < 4 && m.n_seq > 0; ++i)
    if (!ts[i]->valid() || ts[i]->dtype != DType::I32 || ts[i]->n_elements() < m.n_seq)
      return make_error(ErrorCode::kInvalidArgument, "%s: meta.%s must be I32 with at least n_seq = %d entries", op,
                        names[i], m.n_seq);
  *out = SeqArrays{static_cast<const int32_t*>(m.seq_row.data), static_cast<const int32_t*>(m.seq_q_start.data),
                   static_cast<const int32_t*>(m.seq_q_len.data), static_cast<const int32_t*>(m.seq_reset.data),
                   m.n_seq};
  return Status::ok();
}

// A [d, h, n] f32 view with contiguous elements and whole-float head / token strides (q/k/v of gated_delta_net).
Status f32_heads(const char* op, const char* name, const Tensor& t, int64_t d, int64_t h, int64_t n) {
  if (!t.valid()) return make_error(ErrorCode::kInvalidArgument, "%s: %s is not set", op, name);
  if (t.dtype != DType::F32 || t.nb[0] != sizeof(float) || t.nb[1] % sizeof(float) || t.nb[2] % sizeof(float))
    return make_error(ErrorCode::kUnsupported, "%s: %s must be f32 with contiguous elements", op, name);
  if (t.ne[0] != d || t.ne[1] != h || t.ne[2] != n || t.ne[3] != 1)
    return make_error(ErrorCode::kInvalidArgument, "%s: %s %s must be [%lld, %lld, %lld]", op, name,
                      t.shape_string().c_str(), static_cast<long long>(d), static_cast<long long>(h),
                      static_cast<long long>(n));
  return Status::ok();
}

}  // namespace

// Shapes as backend.h (and CpuBackend::conv1d_silu, whose checks these mirror).
Status CudaBackend::conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state, const AttnBatch& m,
                                const Tensor& dst) {
  const char* op = "conv1d_silu";
  KILN_TRY(check(op, "x", x, DType::F32));
  KILN_TRY(check(op, "w", w, DType::F32));
  KILN_TRY(check(op, "state", state, DType::F32));
  KILN_TRY(check(op, "dst", dst, DType::F32));
  const int64_t C = x.ne[0], n = x.n_rows(), K = w.ne[0];
  if (K < 1 || w.n_rows() != C)
    return make_error(ErrorCode::kInvalidArgument, "%s: w %s must be [K, %lld]", op, w.shape_string().c_str(),
                      static_cast<long long>(C));
  if (K > kConvMaxK)
    return make_error(ErrorCode::kUnsupported, "%s: kernel size %lld (the CUDA kernels take 1..%d)", op,
                      static_cast<long long>(K), kConvMaxK);
  if (state.ne[0] != (K - 1) * C)
    return make_error(ErrorCode::kInvalidArgument, "%s: state %s rows must hold (K-1) x C = %lld values", op,
                      state.shape_string().c_str(), static_cast<long long>((K - 1) * C));
  if (dst.ne[0] != C || dst.n_rows() != n)
    return make_error(ErrorCode::kInvalidArgument, "%s: dst %s must be [%lld, %lld]", op, dst.shape_string().c_str(),
                      static_cast<long long>(C), static_cast<long long>(n));
  if (dst.data == x.data) return make_error(ErrorCode::kInvalidArgument, "%s: dst must not alias x", op);
  Conv1dParams p{};
  KILN_TRY(seq_arrays(op, m, &p.seq));
  p.x = static_cast<const float*>(x.data);
  p.x_stride = fstride(x);
  p.w = static_cast<const float*>(w.data);
  p.w_stride = fstride(w);
  p.state = static_cast<float*>(state.data);
  p.state_stride = fstride(state);
  p.dst = static_cast<float*>(dst.data);
  p.dst_stride = fstride(dst);
  p.C = C;
  p.K = static_cast<int>(K);
  KILN_TRY(use());
  return launch_conv1d_silu(p, m.max_q_len, stream_);
}

// Shapes as backend.h (and CpuBackend::gated_delta_net, whose checks these mirror).
Status CudaBackend::gated_delta_net(const DeltaNetArgs& a, const AttnBatch& m, const Tensor& dst) {
  const char* op = "gated_delta_net";
  if (!a.q.valid() || !a.v.valid()) return make_error(ErrorCode::kInvalidArgument, "%s: q/v are not set", op);
  const int64_t S_k = a.q.ne[0], S_v = a.v.ne[0], H_k = a.q.ne[1], H_v = a.v.ne[1], n = a.v.ne[2];
  KILN_TRY(f32_heads(op, "q", a.q, S_k, H_k, n));
  KILN_TRY(f32_heads(op, "k", a.k, S_k, H_k, n));
  KILN_TRY(f32_heads(op, "v", a.v, S_v, H_v, n));
  if (H_k <= 0 || H_v % H_k != 0)
    return make_error(ErrorCode::kInvalidArgument, "%s: %lld value heads are not a multiple of %lld key heads", op,
                      static_cast<long long>(H_v), static_cast<long long>(H_k));
  for (const auto& [t, name] : {std::pair{&a.alpha, "alpha"}, std::pair{&a.beta, "beta"}}) {
    KILN_TRY(check(op, name, *t, DType::F32));
    if (t->ne[0] != H_v || t->n_rows() != n)
      return make_error(ErrorCode::kInvalidArgument, "%s: %s %s must be [%lld, %lld]", op, name,
                        t->shape_string().c_str(), static_cast<long long>(H_v), static_cast<long long>(n));
  }
  for (const auto& [t, name] : {std::pair{&a.A, "A"}, std::pair{&a.dt_bias, "dt_bias"}}) {
    KILN_TRY(check(op, name, *t, DType::F32));
    if (t->n_elements() != H_v || !t->is_contiguous())
      return make_error(ErrorCode::kInvalidArgument, "%s: %s %s must be [%lld]", op, name, t->shape_string().c_str(),
                        static_cast<long long>(H_v));
  }
  KILN_TRY(check(op, "state", a.state, DType::F32));
  if (a.state.ne[0] != S_v * S_k * H_v)
    return make_error(ErrorCode::kInvalidArgument, "%s: state %s rows must hold S_v x S_k x H_v = %lld values", op,
                      a.state.shape_string().c_str(), static_cast<long long>(S_v * S_k * H_v));
  KILN_TRY(check(op, "dst", dst, DType::F32));
  if (!dst.is_contiguous() || dst.ne[0] != S_v || dst.ne[1] != H_v || dst.ne[2] != n)
    return make_error(ErrorCode::kInvalidArgument, "%s: dst %s must be contiguous [%lld, %lld, %lld]", op,
                      dst.shape_string().c_str(), static_cast<long long>(S_v), static_cast<long long>(H_v),
                      static_cast<long long>(n));
  if (!(a.l2_eps >= 0)) return make_error(ErrorCode::kInvalidArgument, "%s: l2_eps %g must be >= 0", op, a.l2_eps);
  if (S_v > INT32_MAX / 2 || H_v > 65535 || !delta_net_supports(static_cast<int>(S_k), static_cast<int>(S_v)))
    return make_error(ErrorCode::kUnsupported, "%s: head sizes S_k %lld / S_v %lld, %lld value heads (the CUDA "
                      "kernel takes S_k 32, 64, 128 or 256 and at most 65535 heads)", op, static_cast<long long>(S_k),
                      static_cast<long long>(S_v), static_cast<long long>(H_v));
  DeltaNetParams p{};
  KILN_TRY(seq_arrays(op, m, &p.seq));
  auto f = [](size_t bytes) { return bytes / sizeof(float); };
  p.q = static_cast<const float*>(a.q.data);
  p.k = static_cast<const float*>(a.k.data);
  p.v = static_cast<const float*>(a.v.data);
  p.alpha = static_cast<const float*>(a.alpha.data);
  p.beta = static_cast<const float*>(a.beta.data);
  p.A = static_cast<const float*>(a.A.data);
  p.dt_bias = static_cast<const float*>(a.dt_bias.data);
  p.q_head = f(a.q.nb[1]), p.q_tok = f(a.q.nb[2]);
  p.k_head = f(a.k.nb[1]), p.k_tok = f(a.k.nb[2]);
  p.v_head = f(a.v.nb[1]), p.v_tok = f(a.v.nb[2]);
  p.alpha_stride = fstride(a.alpha), p.beta_stride = fstride(a.beta);
  p.state = static_cast<float*>(a.state.data);
  p.state_stride = fstride(a.state);
  p.dst = static_cast<float*>(dst.data);
  p.S_k = static_cast<int>(S_k), p.S_v = static_cast<int>(S_v), p.H_k = static_cast<int>(H_k);
  p.H_v = static_cast<int>(H_v);
  p.scale = a.scale;
  p.l2_eps = a.l2_eps;
  KILN_TRY(use());
  return launch_gated_delta_net(p, stream_);
}

// ---- encoder ops (bert) ------------------------------------------------------------------------------------------

// Shapes as backend.h (and CpuBackend::layer_norm, whose checks these mirror): x, dst F32 [d, n]; w, b F32 [d] or
// unset.
Status CudaBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& dst) {
  LayerNormParams p{};
  KILN_TRY(rms_params("layer_norm", x, w, eps, dst, &p.r));
  if (b.valid()) {
    KILN_TRY(check("layer_norm", "b", b, DType::F32));
    if (b.ne[0] != x.ne[0] || b.n_rows() != 1)
      return make_error(ErrorCode::kInvalidArgument, "layer_norm: b %s must be [%lld]", b.shape_string().c_str(),
                        static_cast<long long>(x.ne[0]));
    p.b = static_cast<const float*>(b.data);
  }
  KILN_TRY(use());
  return launch_layer_norm(p, stream_);
}

Status CudaBackend::gelu(const Tensor& x, const Tensor& dst) {
  KILN_TRY(check("gelu", "x", x, DType::F32));
  KILN_TRY(check("gelu", "dst", dst, DType::F32));
  KILN_TRY(same_shape("gelu", "x", x, "dst", dst));
  KILN_TRY(use());
  EwParams p{EwOp::kGelu, static_cast<const float*>(x.data), fstride(x), nullptr, 0, static_cast<float*>(dst.data),
             fstride(dst), x.ne[0], x.n_rows(), 0.0f};
  return launch_elementwise(p, stream_);
}

}  // namespace kiln::cuda
