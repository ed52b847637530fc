// Shared pieces of the dev/cuda micro-benchmarks (mmq_bench, gemv_bench): checked CUDA / Status calls that exit
// with file and line, random weights of a type with sane scales, NMSE, and the median of event-timed launches.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/launch.h"
#include "quant/dtype.h"
#include "quant/reference.h"
#include "util/fp16.h"
#include "util/status.h"

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
#define SK(x)                                                                             \
  do {                                                                                    \
    Status s_ = (x);                                                                      \
    if (!s_.is_ok()) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_.to_string().c_str()); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace kiln {

inline std::vector<uint8_t> random_weights(DType t, int64_t n_in, int64_t rows, std::mt19937& rng) {
  const size_t rb = dtype_row_bytes(t, n_in).value();
  std::vector<uint8_t> w(rb * rows);
  if (t == DType::F16 || t == DType::BF16) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < n_in * rows; ++i) {
      const uint16_t h = t == DType::F16 ? f32_to_fp16(u(rng)) : f32_to_bf16(u(rng));
      std::memcpy(&w[2 * i], &h, 2);
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const int64_t bs = dtype_type_size(t), nb = static_cast<int64_t>(w.size()) / bs;
  std::uniform_real_distribution<float> sd(0.001f, 0.02f);
  auto put = [&](int64_t blk, int off) {
    const uint16_t h = f32_to_fp16(sd(rng));
    std::memcpy(&w[blk * bs + off], &h, 2);
  };
  for (int64_t b = 0; b < nb; ++b) {
    if (t == DType::Q4_K || t == DType::Q5_K) put(b, 0), put(b, 2);
    else if (t == DType::Q6_K) put(b, 208);
    else put(b, 0);  // Q8_0, Q4_0
  }
  return w;
}

inline double nmse(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - ref[i]) * (a[i] - ref[i]), den += ref[i] * ref[i];
  return den > 0 ? num / den : num;
}

// CPU spot check of a product y [n_tok][n_out] of weights wb (GGUF bytes, type t) and x [n_tok][n_in]: NMSE of 8
// rows x 4 tokens against f64 math on the dequantized weights.
inline double cpu_spot_nmse(DType t, const std::vector<uint8_t>& wb, const std::vector<float>& x,
                            const std::vector<float>& y, int64_t n_in, int64_t n_out, int64_t n_tok) {
  const size_t rb = dtype_row_bytes(t, n_in).value();
  std::vector<float> wr(n_in), gs;
  std::vector<double> cs;
  for (int i = 0; i < 8; ++i) {
    const int64_t r = (i * 7919) % n_out;
    SK(dequantize_row(t, wb.data() + r * rb, wr.data(), n_in));
    for (int k = 0; k < 4; ++k) {
      const int64_t tk = (k * 131 + 3) % n_tok;
      double s = 0;
      for (int64_t j = 0; j < n_in; ++j) s += static_cast<double>(wr[j]) * x[tk * n_in + j];
      cs.push_back(s);
      gs.push_back(y[tk * n_out + r]);
    }
  }
  return nmse(gs, cs);
}

// The median over `reps` samples of one launch's time, each sample `inner` launches back to back between two events
// divided by `inner`: the GPU's time per launch including the gaps between kernels as a CUDA graph replays them,
// without the host's launch latency (a single launch between two events measures mostly that for kernels of
// ~10-50 us).
template <class F>
inline float median_ms(F&& launch, int warm = 3, int reps = 9, int inner = 10) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < warm; ++i) launch();
  CK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(e0));
    for (int j = 0; j < inner; ++j) launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float m = 0;
    CK(cudaEventElapsedTime(&m, e0, e1));
    ms.push_back(m / static_cast<float>(inner));
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return ms[ms.size() / 2];
}

// One matmul's device buffers: weights wb and activations x ([n_tok][n_in]) uploaded, outputs y and y2 (a
// reference) of [n_tok][n_out] floats, and the q8_1 activations of x when `quantize` (ActQ, as the backend lays
// them out).
struct BenchMatmul {
  uint8_t* w = nullptr;
  float *x = nullptr, *y = nullptr, *y2 = nullptr;
  cuda::ActQ a{};
};
inline BenchMatmul bench_matmul_alloc(const std::vector<uint8_t>& wb, const std::vector<float>& x, int64_t n_in,
                                      int64_t n_out, int64_t n_tok, bool quantize) {
  BenchMatmul m;
  CK(cudaMalloc(&m.w, wb.size()));
  CK(cudaMemcpy(m.w, wb.data(), wb.size(), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&m.x, x.size() * 4));
  CK(cudaMemcpy(m.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&m.y, n_out * n_tok * 4));
  CK(cudaMalloc(&m.y2, n_out * n_tok * 4));
  m.a.n_in = n_in, m.a.n_tok = n_tok;
  m.a.qs_stride = static_cast<size_t>((n_in + 15) / 16 * 16);
  m.a.ds_stride = static_cast<size_t>(n_in / 32);
  CK(cudaMalloc(&m.a.qs, m.a.qs_stride * n_tok));
  CK(cudaMalloc(&m.a.ds, m.a.ds_stride * n_tok * sizeof(float4)));
  if (quantize) SK(cuda::launch_quantize_act(m.x, static_cast<size_t>(n_in), m.a, 0));
  return m;
}
inline void bench_matmul_free(BenchMatmul& m) {
  CK(cudaFree(m.w));
  CK(cudaFree(m.x));
  CK(cudaFree(m.y));
  CK(cudaFree(m.y2));
  CK(cudaFree(m.a.qs));
  CK(cudaFree(m.a.ds));
}

}  // namespace kiln
