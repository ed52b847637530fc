// CPU ops of the Gated DeltaNet (linear-attention) layers: the causal depthwise conv1d with a per-sequence state
// (conv1d_silu) and the gated delta rule (gated_delta_net). Contracts: backend/backend.h.
//
// Both ops walk the step's sequences (AttnBatch seq_row / seq_q_start / seq_q_len / seq_reset); a sequence's state
// row is read at the start (or taken as zero when seq_reset) and written back at the end, so a prompt split over
// several steps continues where the last step stopped.
//
// gated_delta_net, three evaluations of one recurrence (per sequence, per value head; S the [S_k, S_v] state,
// stored as S_v rows M[j] = column j of S):
//   reference (CpuBackendOptions::reference): token by token, scalar, as the contract states it (llama.cpp's CPU
//     path computes exactly this sequence).
//   fast, one token (decode): the same recurrence, one pass per state row with the SIMD dot/axpy kernels:
//     M[j] *= e^g;  d_j = b (v_j - M[j].k);  M[j] += d_j k;  o_j = scale M[j].q.
//   fast, several tokens (prefill): chunks of kChunk = 64 tokens. With G_t = g_1 + ... + g_t (cumulative log
//     decay inside the chunk, <= 0) and S0 the state before the chunk, the recurrence unrolls to
//       S_t = e^{G_t} S0 + sum_{i<=t} e^{G_t - G_i} k_i d_i^T
//       d_t = b_t (v_t - e^{G_t} S0^T k_t) - b_t sum_{i<t} e^{G_t - G_i} (k_t . k_i) d_i   (triangular solve)
//       o_t = scale (e^{G_t} S0^T q_t + sum_{i<=t} e^{G_t - G_i} (q_t . k_i) d_i)
//       S_C = e^{G_C} S0 + sum_i e^{G_C - G_i} k_i d_i^T                                  (state to the next chunk)
//     Every exponent is a difference G_t - G_i <= 0 (never e^{-G_i}), so nothing overflows on long chunks. The
//     result equals the recurrence up to f32 summation order (tests/unit/test_backend_ops_next.cpp checks both
//     against an independent double-precision recurrence, and the qwen35 fixtures at -b 64/7/1 against
//     llama.cpp's token-by-token kernel).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/ops.h"

namespace kiln::cpu {
namespace {

constexpr int kChunk = 64;

Status f32_rows(const char* op, const char* name, const Tensor& t) {
  if (!t.valid()) return make_error(ErrorCode::kInvalidArgument, "%s: %s is not set", op, name);
  if (t.dtype != DType::F32)
    return make_error(ErrorCode::kUnsupported, "%s: %s must be f32, got %s", op, name, dtype_name(t.dtype));
  if (!t.rows_uniform())
    return make_error(ErrorCode::kUnsupported, "%s: %s %s must have contiguous rows with one row stride", op, name,
                      t.shape_string().c_str());
  return Status::ok();
}

// A [d, h, n] f32 view with contiguous elements and any head / token strides.
Status f32_heads(const char* op, const char* name, const Tensor& t, int64_t d, int64_t h, int64_t n) {
  if (!t.valid()) return make_error(ErrorCode::kInvalidArgument, "%s: %s is not set", op, name);
  if (t.dtype != DType::F32 || t.nb[0] != sizeof(float))
    return make_error(ErrorCode::kUnsupported, "%s: %s must be f32 with contiguous elements", op, name);
  if (t.ne[0] != d || t.ne[1] != h || t.ne[2] != n || t.ne[3] != 1)
    return make_error(ErrorCode::kInvalidArgument, "%s: %s %s must be [%lld, %lld, %lld]", op, name,
                      t.shape_string().c_str(), static_cast<long long>(d), static_cast<long long>(h),
                      static_cast<long long>(n));
  return Status::ok();
}

Status seq_arrays(const char* op, const AttnBatch& m) {
  if (m.n_seq < 0) return make_error(ErrorCode::kInvalidArgument, "%s: n_seq %d must be >= 0", op, m.n_seq);
  const Tensor* ts[] = {&m.seq_row, &m.seq_q_start, &m.seq_q_len, &m.seq_reset};
  const char* names[] = {"seq_row", "seq_q_start", "seq_q_len", "seq_reset"};
  for (int i = 0; i < 4; ++i) {
    if (m.n_seq == 0) break;
    if (!ts[i]->valid() || ts[i]->dtype != DType::I32 || ts[i]->n_elements() < m.n_seq)
      return make_error(ErrorCode::kInvalidArgument, "%s: meta.%s must be I32 with at least n_seq = %d entries", op,
                        names[i], m.n_seq);
  }
  return Status::ok();
}

inline const int32_t* ints(const Tensor& t) { return static_cast<const int32_t*>(t.data); }
inline float* at(const Tensor& t, int64_t i1, int64_t i2 = 0) {
  return reinterpret_cast<float*>(static_cast<char*>(t.data) + i1 * t.nb[1] + i2 * t.nb[2]);
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// y = x / sqrt(sum x^2 + eps) (the sum of squares in double, as the rms norm).
void l2_normalize(const float* x, float* y, int64_t n, float eps, const VecKernels& vk) {
  const float inv = static_cast<float>(1.0 / std::sqrt(vk.sum_sq(x, n) + static_cast<double>(eps)));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv;
}

struct DnShape {
  int64_t S_k, S_v, H_k, H_v, n;
};

}  // namespace

// ---- conv1d_silu --------------------------------------------------------------------------------------------

Status CpuBackend::conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state, const AttnBatch& m,
                               const Tensor& dst) {
  KILN_TRY(f32_rows("conv1d_silu", "x", x));
  KILN_TRY(f32_rows("conv1d_silu", "w", w));
  KILN_TRY(f32_rows("conv1d_silu", "state", state));
  KILN_TRY(f32_rows("conv1d_silu", "dst", dst));
  const int64_t C = x.ne[0], n = x.n_rows(), K = w.ne[0];
  if (K < 1 || w.n_rows() != C)
    return make_error(ErrorCode::kInvalidArgument, "conv1d_silu: w %s must be [K, %lld]", w.shape_string().c_str(),
                      static_cast<long long>(C));
  if (state.ne[0] != (K - 1) * C)
    return make_error(ErrorCode::kInvalidArgument, "conv1d_silu: state %s rows must hold (K-1) x C = %lld values",
                      state.shape_string().c_str(), static_cast<long long>((K - 1) * C));
  if (dst.ne[0] != C || dst.n_rows() != n)
    return make_error(ErrorCode::kInvalidArgument, "conv1d_silu: dst %s must be [%lld, %lld]",
                      dst.shape_string().c_str(), static_cast<long long>(C), static_cast<long long>(n));
  if (dst.data == x.data) return make_error(ErrorCode::kInvalidArgument, "conv1d_silu: dst must not alias x");
  KILN_TRY(seq_arrays("conv1d_silu", m));
  const int32_t *row = ints(m.seq_row), *q0 = ints(m.seq_q_start), *ql = ints(m.seq_q_len), *rs = ints(m.seq_reset);
#ifndef NDEBUG  // values are the planner's to check (backend.h)
  for (int32_t s = 0; s < m.n_seq; ++s)
    if (ql[s] > 0 && (q0[s] < 0 || q0[s] + ql[s] > n || row[s] < 0 || row[s] >= state.n_rows()))
      return make_error(ErrorCode::kInternal, "conv1d_silu: sequence %d (row %d, tokens %d+%d) is out of range", s,
                        row[s], q0[s], ql[s]);
#endif
  const float* wv = static_cast<const float*>(w.data);
  const size_t wstride = w.nb[1] / sizeof(float);
  // Channels [cb, ce) of every sequence: in(u) for u < 0 is state element (K-1+u) * C + c.
  auto run = [&](int64_t cb, int64_t ce) {
    for (int32_t s = 0; s < m.n_seq; ++s) {
      const int64_t len = ql[s];
      if (len <= 0) continue;
      float* st = at(state, row[s]);
      const bool zero = rs[s] != 0;
      auto in = [&](int64_t u, int64_t c) -> float {
        if (u >= 0) return at(x, q0[s] + u)[c];
        return zero ? 0.0f : st[(K - 1 + u) * C + c];
      };
      for (int64_t t = 0; t < len; ++t) {
        float* y = at(dst, q0[s] + t);
        if (t >= K - 1) {  // the whole window inside this step's tokens
          for (int64_t c = cb; c < ce; ++c) {
            const float* wc = wv + c * wstride;
            float acc = 0;
            for (int64_t j = 0; j < K; ++j) acc += wc[j] * at(x, q0[s] + t - (K - 1) + j)[c];
            y[c] = silu(acc);
          }
        } else {
          for (int64_t c = cb; c < ce; ++c) {
            const float* wc = wv + c * wstride;
            float acc = 0;
            for (int64_t j = 0; j < K; ++j) acc += wc[j] * in(t - (K - 1) + j, c);
            y[c] = silu(acc);
          }
        }
      }
      // New state: the last K-1 inputs. Ascending j reads in(len-(K-1)+j), an element at or after j: not yet
      // overwritten.
      for (int64_t j = 0; j < K - 1; ++j)
        for (int64_t c = cb; c < ce; ++c) st[j * C + c] = in(len - (K - 1) + j, c);
    }
  };
  if (reference_ || pool_.size() == 1 || C < 64)
    run(0, C);
  else
    pool_.parallel_for(C, run);
  return Status::ok();
}

// ---- gated_delta_net ----------------------------------------------------------------------------------------

namespace {

struct DnView {
  const Backend::DeltaNetArgs* a;
  DnShape sh;
  const float *A, *dt;
  float* dst;
  // q or k of token t as value head h reads it (key head h mod H_k).
  const float* qk(const Tensor& x, int64_t t, int64_t h) const {
    return reinterpret_cast<const float*>(static_cast<const char*>(x.data) + t * x.nb[2] + (h % sh.H_k) * x.nb[1]);
  }
  const float* v(int64_t t, int64_t h) const {
    return reinterpret_cast<const float*>(static_cast<const char*>(a->v.data) + t * a->v.nb[2] + h * a->v.nb[1]);
  }
  float g(int64_t t, int64_t h) const { return A[h] * softplus(at(a->alpha, t)[h] + dt[h]); }
  float b(int64_t t, int64_t h) const { return sigmoid(at(a->beta, t)[h]); }
  float* o(int64_t t, int64_t h) const { return dst + (t * sh.H_v + h) * sh.S_v; }
};

// The contract's recurrence, token by token, scalar (the reference and the spec of the fast paths).
void delta_ref(const DnView& V, float* M, int64_t t0, int64_t len, int64_t h, float* qn, float* kn) {
  const DnShape& s = V.sh;
  const VecKernels& vk = vec_kernels_scalar();
  for (int64_t t = t0; t < t0 + len; ++t) {
    l2_normalize(V.qk(V.a->q, t, h), qn, s.S_k, V.a->l2_eps, vk);
    l2_normalize(V.qk(V.a->k, t, h), kn, s.S_k, V.a->l2_eps, vk);
    const float e = std::exp(V.g(t, h)), b = V.b(t, h);
    const float* v = V.v(t, h);
    for (int64_t i = 0; i < s.S_v * s.S_k; ++i) M[i] *= e;
    for (int64_t j = 0; j < s.S_v; ++j) {
      float* r = M + j * s.S_k;
      float dot = 0;
      for (int64_t i = 0; i < s.S_k; ++i) dot += r[i] * kn[i];
      const float d = (v[j] - dot) * b;
      for (int64_t i = 0; i < s.S_k; ++i) r[i] += d * kn[i];
    }
    float* o = V.o(t, h);
    for (int64_t j = 0; j < s.S_v; ++j) {
      const float* r = M + j * s.S_k;
      float dot = 0;
      for (int64_t i = 0; i < s.S_k; ++i) dot += r[i] * qn[i];
      o[j] = dot * V.a->scale;
    }
  }
}

// Fast one-token recurrence: one pass per state row.
void delta_step(const DnView& V, float* M, int64_t t, int64_t h, float* qn, float* kn, const VecKernels& vk) {
  const DnShape& s = V.sh;
  l2_normalize(V.qk(V.a->q, t, h), qn, s.S_k, V.a->l2_eps, vk);
  l2_normalize(V.qk(V.a->k, t, h), kn, s.S_k, V.a->l2_eps, vk);
  const float e = std::exp(V.g(t, h)), b = V.b(t, h);
  const float* v = V.v(t, h);
  float* o = V.o(t, h);
  for (int64_t j = 0; j < s.S_v; ++j) {
    float* r = M + j * s.S_k;
    vk.scale_f32(r, e, s.S_k);
    const float d = (v[j] - vk.dot_f32(r, kn, s.S_k)) * b;
    vk.axpy_f32(r, kn, d, s.S_k);
    o[j] = vk.dot_f32(r, qn, s.S_k) * V.a->scale;
  }
}

// Scratch floats of one chunk: Q, K [C][S_k]; W, U, D [C][S_v]; KK, QK [C][C]; G, b [C].
size_t chunk_scratch(const DnShape& s) {
  return static_cast<size_t>(kChunk) * (2 * s.S_k + 3 * s.S_v + 2 * kChunk + 2);
}

// One chunk of c <= kChunk tokens starting at t0 (see the top of the file).
void delta_chunk(const DnView& V, float* M, int64_t t0, int c, int64_t h, float* scr, const VecKernels& vk) {
  const DnShape& s = V.sh;
  const int64_t Sk = s.S_k, Sv = s.S_v;
  float* Q = scr;
  float* K = Q + kChunk * Sk;
  float* W = K + kChunk * Sk;
  float* U = W + kChunk * Sv;
  float* D = U + kChunk * Sv;
  float* KK = D + kChunk * Sv;
  float* QK = KK + kChunk * kChunk;
  float* G = QK + kChunk * kChunk;
  float* B = G + kChunk;
  float acc = 0;
  for (int t = 0; t < c; ++t) {
    l2_normalize(V.qk(V.a->q, t0 + t, h), Q + t * Sk, Sk, V.a->l2_eps, vk);
    l2_normalize(V.qk(V.a->k, t0 + t, h), K + t * Sk, Sk, V.a->l2_eps, vk);
    acc += V.g(t0 + t, h);
    G[t] = acc;
    B[t] = V.b(t0 + t, h);
  }
  // W[t][j] = (S0^T k_t)_j, U[t][j] = (S0^T q_t)_j.
  for (int t = 0; t < c; ++t)
    for (int64_t j = 0; j < Sv; ++j) {
      W[t * Sv + j] = vk.dot_f32(M + j * Sk, K + t * Sk, Sk);
      U[t * Sv + j] = vk.dot_f32(M + j * Sk, Q + t * Sk, Sk);
    }
  for (int t = 0; t < c; ++t)
    for (int i = 0; i <= t; ++i) {
      KK[t * kChunk + i] = vk.dot_f32(K + t * Sk, K + i * Sk, Sk);
      QK[t * kChunk + i] = vk.dot_f32(Q + t * Sk, K + i * Sk, Sk);
    }
  // Forward substitution for d_t, then o_t.
  for (int t = 0; t < c; ++t) {
    float* d = D + t * Sv;
    const float* v = V.v(t0 + t, h);
    const float et = std::exp(G[t]);
    for (int64_t j = 0; j < Sv; ++j) d[j] = B[t] * (v[j] - et * W[t * Sv + j]);
    for (int i = 0; i < t; ++i) vk.axpy_f32(d, D + i * Sv, -B[t] * std::exp(G[t] - G[i]) * KK[t * kChunk + i], Sv);
    float* o = V.o(t0 + t, h);
    for (int64_t j = 0; j < Sv; ++j) o[j] = et * U[t * Sv + j];
    for (int i = 0; i <= t; ++i) vk.axpy_f32(o, D + i * Sv, std::exp(G[t] - G[i]) * QK[t * kChunk + i], Sv);
    vk.scale_f32(o, V.a->scale, Sv);
  }
  // State to the next chunk: M[j] = e^{G_C} M[j] + sum_i e^{G_C - G_i} d_i[j] k_i.
  float* f = W;  // W is free now: the per-token factors e^{G_C - G_i}
  for (int i = 0; i < c; ++i) f[i] = std::exp(G[c - 1] - G[i]);
  const float ec = std::exp(G[c - 1]);
  for (int64_t j = 0; j < Sv; ++j) {
    float* r = M + j * Sk;
    vk.scale_f32(r, ec, Sk);
    for (int i = 0; i < c; ++i) vk.axpy_f32(r, K + i * Sk, f[i] * D[i * Sv + j], Sk);
  }
}

}  // namespace

Status CpuBackend::gated_delta_net(const DeltaNetArgs& a, const AttnBatch& m, const Tensor& dst) {
  const char* op = "gated_delta_net";
  if (!a.q.valid() || !a.v.valid()) return make_error(ErrorCode::kInvalidArgument, "%s: q/v are not set", op);
  DnShape s{a.q.ne[0], a.v.ne[0], a.q.ne[1], a.v.ne[1], a.v.ne[2]};
  KILN_TRY(f32_heads(op, "q", a.q, s.S_k, s.H_k, s.n));
  KILN_TRY(f32_heads(op, "k", a.k, s.S_k, s.H_k, s.n));
  KILN_TRY(f32_heads(op, "v", a.v, s.S_v, s.H_v, s.n));
  if (s.H_k <= 0 || s.H_v % s.H_k != 0)
    return make_error(ErrorCode::kInvalidArgument, "%s: %lld value heads are not a multiple of %lld key heads", op,
                      static_cast<long long>(s.H_v), static_cast<long long>(s.H_k));
  for (const auto& [t, name] : {std::pair{&a.alpha, "alpha"}, std::pair{&a.beta, "beta"}}) {
    KILN_TRY(f32_rows(op, name, *t));
    if (t->ne[0] != s.H_v || t->n_rows() != s.n)
      return make_error(ErrorCode::kInvalidArgument, "%s: %s %s must be [%lld, %lld]", op, name,
                        t->shape_string().c_str(), static_cast<long long>(s.H_v), static_cast<long long>(s.n));
  }
  for (const auto& [t, name] : {std::pair{&a.A, "A"}, std::pair{&a.dt_bias, "dt_bias"}}) {
    KILN_TRY(f32_rows(op, name, *t));
    if (t->n_elements() != s.H_v)
      return make_error(ErrorCode::kInvalidArgument, "%s: %s %s must be [%lld]", op, name, t->shape_string().c_str(),
                        static_cast<long long>(s.H_v));
  }
  KILN_TRY(f32_rows(op, "state", a.state));
  if (a.state.ne[0] != s.S_v * s.S_k * s.H_v)
    return make_error(ErrorCode::kInvalidArgument, "%s: state %s rows must hold S_v x S_k x H_v = %lld values", op,
                      a.state.shape_string().c_str(), static_cast<long long>(s.S_v * s.S_k * s.H_v));
  KILN_TRY(f32_rows(op, "dst", dst));
  if (!dst.is_contiguous() || dst.ne[0] != s.S_v || dst.ne[1] != s.H_v || dst.ne[2] != s.n)
    return make_error(ErrorCode::kInvalidArgument, "%s: dst %s must be contiguous [%lld, %lld, %lld]", op,
                      dst.shape_string().c_str(), static_cast<long long>(s.S_v), static_cast<long long>(s.H_v),
                      static_cast<long long>(s.n));
  if (!(a.l2_eps >= 0)) return make_error(ErrorCode::kInvalidArgument, "%s: l2_eps %g must be >= 0", op, a.l2_eps);
  KILN_TRY(seq_arrays(op, m));
  const int32_t *row = ints(m.seq_row), *q0 = ints(m.seq_q_start), *ql = ints(m.seq_q_len), *rs = ints(m.seq_reset);
#ifndef NDEBUG
  for (int32_t i = 0; i < m.n_seq; ++i)
    if (ql[i] > 0 && (q0[i] < 0 || q0[i] + ql[i] > s.n || row[i] < 0 || row[i] >= a.state.n_rows()))
      return make_error(ErrorCode::kInternal, "%s: sequence %d (row %d, tokens %d+%d) is out of range", op, i, row[i],
                        q0[i], ql[i]);
#endif
  DnView V{&a, s, static_cast<const float*>(a.A.data), static_cast<const float*>(a.dt_bias.data),
           static_cast<float*>(dst.data)};
  const int64_t per_head = s.S_v * s.S_k;
  const int64_t n_items = static_cast<int64_t>(m.n_seq) * s.H_v;
  auto state_of = [&](int64_t item) {
    const int32_t sq = static_cast<int32_t>(item / s.H_v);
    float* M = at(a.state, row[sq]) + (item % s.H_v) * per_head;
    if (rs[sq]) std::fill_n(M, per_head, 0.0f);
    return M;
  };
  if (reference_) {
    std::vector<float> qn(s.S_k), kn(s.S_k);
    for (int64_t item = 0; item < n_items; ++item) {
      const int32_t sq = static_cast<int32_t>(item / s.H_v);
      if (ql[sq] <= 0) continue;
      delta_ref(V, state_of(item), q0[sq], ql[sq], item % s.H_v, qn.data(), kn.data());
    }
    return Status::ok();
  }
  const VecKernels& vk = vec_kernels();
  const size_t need = chunk_scratch(s) + 2 * static_cast<size_t>(s.S_k);
  if (ssm_scratch_.size() < static_cast<size_t>(pool_.size())) ssm_scratch_.resize(pool_.size());
  for (auto& v : ssm_scratch_)
    if (v.size() < need) v.resize(need);
  pool_.run([&](int ith, int nth) {
    float* scr = ssm_scratch_[ith].data();
    float* qn = scr + chunk_scratch(s);
    float* kn = qn + s.S_k;
    for (int64_t item = ith; item < n_items; item += nth) {
      const int32_t sq = static_cast<int32_t>(item / s.H_v);
      const int64_t len = ql[sq], h = item % s.H_v;
      if (len <= 0) continue;
      float* M = state_of(item);
      if (len == 1) {
        delta_step(V, M, q0[sq], h, qn, kn, vk);
        continue;
      }
      for (int64_t t = 0; t < len; t += kChunk)
        delta_chunk(V, M, q0[sq] + t, static_cast<int>(std::min<int64_t>(kChunk, len - t)), h, scr, vk);
    }
  });
  return Status::ok();
}

}  // namespace kiln::cpu
