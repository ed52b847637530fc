#include "backend/cpu/ops_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/ops.h"
#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln::cpu {
namespace {

inline const uint8_t* k_row(const AttnArgs& a, int64_t slot, int g) {
  return a.k + static_cast<size_t>(slot) * a.k_slot_bytes + static_cast<size_t>(g) * a.k_head_bytes;
}
inline const uint8_t* v_row(const AttnArgs& a, int64_t slot, int g) {
  return a.v + static_cast<size_t>(slot) * a.v_slot_bytes + static_cast<size_t>(g) * a.v_head_bytes;
}
inline int64_t slot_of(const AttnArgs& a, const int32_t* table, int64_t pos) {
  return static_cast<int64_t>(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
}

// Row of n elements of a cache type -> f32 (the quantized types and BF16 through the reference dequantizer; the
// caller checked that n is whole blocks).
inline void to_f32(DType t, const uint8_t* src, float* dst, int64_t n) {
  if (t == DType::F16) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(h[i]);
  } else if (t == DType::F32) {
    std::copy_n(reinterpret_cast<const float*>(src), n, dst);
  } else {
    (void)dequantize_row(t, src, dst, n);
  }
}

}  // namespace

void attention_ref(const AttnArgs& a) {
  const int n_rep = a.n_head / a.n_head_kv;
  std::vector<float> q(a.hd_k), kr(a.hd_k), vr(a.hd_v), s, out(a.hd_v);
  for (int t = 0; t < a.n_tok; ++t) {
    const int32_t* table = a.tables + static_cast<int64_t>(a.tok_table[t]) * a.table_stride;
    const int64_t len = a.kv_len[t];
    const int64_t lo = a.window > 0 ? std::max<int64_t>(0, len - a.window) : 0;  // first position in the window
    s.assign(len, 0.0f);
    for (int h = 0; h < a.n_head; ++h) {
      const int g = h / n_rep;
      const float* qs = a.q + t * a.q_tok_stride + h * a.q_head_stride;
      std::copy_n(qs, a.hd_k, q.data());
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = lo; j < len; ++j) {
        to_f32(a.k_type, k_row(a, slot_of(a, table, j), g), kr.data(), a.hd_k);
        float d = 0;
        for (int i = 0; i < a.hd_k; ++i) d += kr[i] * q[i];
        s[j] = d * a.scale;
        mx = std::max(mx, s[j]);
      }
      if (a.sinks) mx = std::max(mx, a.sinks[h]);
      float sum = a.sinks ? std::exp(a.sinks[h] - mx) : 0.0f;
      for (int64_t j = lo; j < len; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      std::fill(out.begin(), out.end(), 0.0f);
      for (int64_t j = lo; j < len; ++j) {
        to_f32(a.v_type, v_row(a, slot_of(a, table, j), g), vr.data(), a.hd_v);
        for (int i = 0; i < a.hd_v; ++i) out[i] += s[j] * vr[i];
      }
      float* d = a.dst + (static_cast<size_t>(t) * a.n_head + h) * a.hd_v;
      for (int i = 0; i < a.hd_v; ++i) d[i] = len > 0 ? out[i] / sum : 0.0f;  // kv_len 0 (padding): zeros
    }
  }
}

void attention_fast(const AttnArgs& a, ThreadPool& pool, std::vector<std::vector<float>>& scratch) {
  const VecKernels& vk = vec_kernels();
  const int n_rep = a.n_head / a.n_head_kv;
  const int bs = a.block_size;
  // Each side read in place (F16, F32) or converted a block at a time into kbuf / vbuf.
  const bool k16 = a.k_type == DType::F16, k32 = a.k_type == DType::F32, kconv = !k16 && !k32;
  const bool v16 = a.v_type == DType::F16, v32 = a.v_type == DType::F32, vconv = !v16 && !v32;
  // Per-thread floats: q [n_rep][hd_k], acc [n_rep][hd_v], M/S [n_rep], scores [bs], converted K [bs][hd_k] and
  // V [bs][hd_v] (each only when converted).
  const size_t need = static_cast<size_t>(n_rep) * (a.hd_k + a.hd_v + 2) + bs +
                      static_cast<size_t>(bs) * ((kconv ? a.hd_k : 0) + (vconv ? a.hd_v : 0));
  if (scratch.size() < static_cast<size_t>(pool.size())) scratch.resize(pool.size());
  for (auto& s : scratch)
    if (s.size() < need) s.resize(need);
  const int64_t n_items = static_cast<int64_t>(a.n_tok) * a.n_head_kv;

  pool.run([&](int ith, int nth) {
    float* base = scratch[ith].data();
    float* q = base;
    float* acc = q + static_cast<size_t>(n_rep) * a.hd_k;
    float* M = acc + static_cast<size_t>(n_rep) * a.hd_v;
    float* S = M + n_rep;
    float* sc = S + n_rep;
    float* kbuf = sc + bs;
    float* vbuf = kbuf + (kconv ? static_cast<size_t>(bs) * a.hd_k : 0);
    for (int64_t item = ith; item < n_items; item += nth) {
      const int t = static_cast<int>(item / a.n_head_kv);
      const int g = static_cast<int>(item % a.n_head_kv);
      const int32_t* table = a.tables + static_cast<int64_t>(a.tok_table[t]) * a.table_stride;
      const int64_t len = a.kv_len[t];
      for (int r = 0; r < n_rep; ++r) {
        const float* qs = a.q + t * a.q_tok_stride + (g * n_rep + r) * a.q_head_stride;
        float* qr = q + static_cast<size_t>(r) * a.hd_k;
        std::copy_n(qs, a.hd_k, qr);
        M[r] = -std::numeric_limits<float>::infinity();
        S[r] = 0;
      }
      std::fill_n(acc, static_cast<size_t>(n_rep) * a.hd_v, 0.0f);
      // Sliding window: blocks wholly before the window are never read; the first block read starts at j0.
      const int64_t lo = a.window > 0 ? std::max<int64_t>(0, len - a.window) : 0;
      for (int64_t start = lo / bs * bs; start < len; start += bs) {
        const int nj = static_cast<int>(std::min<int64_t>(bs, len - start));
        const int j0 = static_cast<int>(std::max<int64_t>(0, lo - start));
        const int64_t slot0 = static_cast<int64_t>(table[start / bs]) * bs;
        for (int j = j0; j < nj; ++j) {
          if (kconv) to_f32(a.k_type, k_row(a, slot0 + j, g), kbuf + static_cast<size_t>(j) * a.hd_k, a.hd_k);
          if (vconv) to_f32(a.v_type, v_row(a, slot0 + j, g), vbuf + static_cast<size_t>(j) * a.hd_v, a.hd_v);
        }
        for (int r = 0; r < n_rep; ++r) {
          const float* qr = q + static_cast<size_t>(r) * a.hd_k;
          float* ar = acc + static_cast<size_t>(r) * a.hd_v;
          float mx = -std::numeric_limits<float>::infinity();
          for (int j = j0; j < nj; ++j) {
            float d;
            if (k16)
              d = vk.dot_f16(reinterpret_cast<const uint16_t*>(k_row(a, slot0 + j, g)), qr, a.hd_k);
            else if (k32)
              d = vk.dot_f32(reinterpret_cast<const float*>(k_row(a, slot0 + j, g)), qr, a.hd_k);
            else
              d = vk.dot_f32(kbuf + static_cast<size_t>(j) * a.hd_k, qr, a.hd_k);
            sc[j] = d * a.scale;
            mx = std::max(mx, sc[j]);
          }
          if (mx > M[r]) {
            if (S[r] > 0) {
              const float f = std::exp(M[r] - mx);
              vk.scale_f32(ar, f, a.hd_v);
              S[r] *= f;
            }
            M[r] = mx;
          }
          for (int j = j0; j < nj; ++j) {
            const float p = std::exp(sc[j] - M[r]);
            S[r] += p;
            if (v16)
              vk.axpy_f16(ar, reinterpret_cast<const uint16_t*>(v_row(a, slot0 + j, g)), p, a.hd_v);
            else if (v32)
              vk.axpy_f32(ar, reinterpret_cast<const float*>(v_row(a, slot0 + j, g)), p, a.hd_v);
            else
              vk.axpy_f32(ar, vbuf + static_cast<size_t>(j) * a.hd_v, p, a.hd_v);
          }
        }
      }
      // Sinks (as llama.cpp's flash attention, after the last block): the sink logit joins the running max and sum.
      for (int r = 0; a.sinks && len > 0 && r < n_rep; ++r) {
        const float sk = a.sinks[g * n_rep + r];
        if (sk > M[r]) {
          const float f = std::exp(M[r] - sk);
          vk.scale_f32(acc + static_cast<size_t>(r) * a.hd_v, f, a.hd_v);
          S[r] = S[r] * f + 1.0f;
          M[r] = sk;
        } else {
          S[r] += std::exp(sk - M[r]);
        }
      }
      for (int r = 0; r < n_rep; ++r) {
        float* d = a.dst + (static_cast<size_t>(t) * a.n_head + g * n_rep + r) * a.hd_v;
        const float inv = len > 0 ? 1.0f / S[r] : 0.0f;  // kv_len 0 (padding): zeros
        const float* ar = acc + static_cast<size_t>(r) * a.hd_v;
        for (int i = 0; i < a.hd_v; ++i) d[i] = ar[i] * inv;
      }
    }
  });
}

}  // namespace kiln::cpu
