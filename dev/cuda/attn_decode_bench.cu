// Decode attention micro-benchmark: attention.cu's decode kernels, each forced in turn (attention_force_decode):
// attn_vec_kernel (a lane per position: each lane reads its position's whole K row), attn_krow_kernel with 4 blocks
// per SM (HD/8 lanes per K row, coalesced; registers capped at 128) and with 1 (no cap), and what the selector picks.
// Then the split-KV second pass alone: launch_attention_combine against the serial pass attention.cu had before
// (combine_serial below: each thread walks the splits three times, one dependent load after another), on the same
// partials.
// f16 cache in shuffled 16-position blocks, 8 KV heads, n_rep 1/2/4/8 (llama3-8b: 4), hd 64/128/256, ragged lengths.
// Prints per shape: ms and KV GB/s of each kernel (KV bytes read once per KV head), NMSE against attn_vec_kernel
// (~1e-13: only the summation order of q.k differs), and the device copy bandwidth (cudaMemcpy D2D, read + write)
// as the ceiling. Usage: attn_decode_bench
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"
#include "bench_fill.cuh"
#include "bench_util.cuh"

using namespace kiln;
using namespace kiln::cuda;

namespace {

// The serial second pass attention.cu had (each thread walks the splits three times, one dependent load after
// another): the A/B against launch_attention_combine.
__global__ void combine_serial(AttnParams p, int n_split, int R, const float* part) {
  const size_t th = blockIdx.x;
  const int Dv = p.hd_v;
  const float* base = part + th * n_split * R;
  float M = -INFINITY;
  for (int s = 0; s < n_split; ++s)
    if (base[s * R + Dv + 1] != 0.0f) M = fmaxf(M, base[s * R + Dv]);
  float L = 0.0f;
  for (int s = 0; s < n_split; ++s) {
    const float l = base[s * R + Dv + 1];
    if (l != 0.0f) L += l * expf(base[s * R + Dv] - M);
  }
  for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < n_split; ++s) {
      const float l = base[s * R + Dv + 1];
      if (l != 0.0f) o += base[s * R + d] * expf(base[s * R + Dv] - M);
    }
    p.dst[th * Dv + d] = L != 0.0f ? o / L : 0.0f;
  }
}

template <typename F>
double median_ms(F&& f, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int reps) {
  std::vector<float> ms;
  for (int i = 0; i < reps + 1; ++i) {
    CK(cudaEventRecord(e0, st));
    f();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (i > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  SK(attention_init(prop.sharedMemPerBlockOptin));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  {  // the ceiling: a 1 GiB device-to-device copy, read + write bytes
    const size_t n = size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    const double ms = median_ms([&] { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st)); }, st, e0, e1, 5);
    std::printf("device %s, %d SMs; copy %.0f GB/s (read + write)\n", prop.name, prop.multiProcessorCount,
                2.0 * n / (ms * 1e-3) / 1e9);
    cudaFree(a), cudaFree(b);
  }
  std::printf("%-3s %-2s %-5s %-7s %-5s| %15s | %23s | %23s | %15s | %17s\n", "hd", "nr", "n_seq", "depth", "split",
              "vec: ms GB/s", "krow 4: ms GB/s nmse", "krow 1", "selected", "combine us: new / serial");
  struct D { int hd, nr, n_seq, depth; };
  const D shapes[] = {{128, 4, 1, 2048},  {128, 4, 1, 8192},  {128, 4, 1, 32768}, {128, 4, 1, 131072},
                      {128, 4, 2, 32768}, {128, 4, 4, 32768}, {128, 4, 8, 32768}, {128, 4, 32, 8192},
                      {128, 4, 64, 512},  {128, 1, 1, 32768}, {128, 2, 1, 32768}, {128, 8, 1, 32768},
                      {128, 8, 8, 32768}, {64, 4, 1, 32768},  {64, 4, 8, 32768},  {64, 8, 1, 32768},
                      {256, 2, 1, 32768}};
  for (const D& d : shapes) {
    const int hd = d.hd, n_kv = 8, n_head = n_kv * d.nr, bs = 16, n_blocks = (d.depth + bs - 1) / bs;
    const size_t kv_row = static_cast<size_t>(n_kv) * hd, n_slots = static_cast<size_t>(d.n_seq) * n_blocks * bs;
    __half *k = nullptr, *v = nullptr;
    float *q = nullptr, *o = nullptr, *scratch = nullptr;
    int32_t *table = nullptr, *tok_table = nullptr, *kv_len = nullptr;
    CK(cudaMalloc(&k, n_slots * kv_row * 2));
    CK(cudaMalloc(&v, n_slots * kv_row * 2));
    const size_t qn = static_cast<size_t>(d.n_seq) * n_head * hd;
    CK(cudaMalloc(&q, qn * 4));
    CK(cudaMalloc(&o, qn * 4));
    fill_f16<<<1024, 256, 0, st>>>(k, n_slots * kv_row, 1);
    fill_f16<<<1024, 256, 0, st>>>(v, n_slots * kv_row, 2);
    fill_f32<<<1024, 256, 0, st>>>(q, qn, 3, 2.0f);
    std::vector<int32_t> tb(static_cast<size_t>(d.n_seq) * n_blocks), tt(d.n_seq), kl(d.n_seq);
    std::iota(tb.begin(), tb.end(), 0);
    std::shuffle(tb.begin(), tb.end(), std::mt19937(5));
    for (int s = 0; s < d.n_seq; ++s) tt[s] = s, kl[s] = std::max(1, d.depth - 7 * s);  // ragged ends
    CK(cudaMalloc(&table, tb.size() * 4));
    CK(cudaMalloc(&tok_table, tt.size() * 4));
    CK(cudaMalloc(&kv_len, kl.size() * 4));
    CK(cudaMemcpy(table, tb.data(), tb.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tok_table, tt.data(), tt.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(kv_len, kl.data(), kl.size() * 4, cudaMemcpyHostToDevice));
    AttnParams p{};
    p.q = q, p.q_tok_stride = static_cast<size_t>(n_head) * hd, p.q_head_stride = hd, p.dst = o;
    p.k = reinterpret_cast<const uint8_t*>(k), p.v = reinterpret_cast<const uint8_t*>(v);
    p.k_slot_bytes = p.v_slot_bytes = kv_row * 2, p.k_head_bytes = p.v_head_bytes = static_cast<size_t>(hd) * 2;
    p.kv_type = DType::F16, p.n_tok = d.n_seq, p.n_head = n_head, p.n_head_kv = n_kv, p.hd_k = p.hd_v = hd;
    p.block_size = bs, p.tables = table, p.table_stride = n_blocks, p.tok_table = tok_table, p.kv_len = kv_len;
    p.scale = 1.0f / std::sqrt(static_cast<float>(hd)), p.max_kv_len = d.depth, p.n_sm = prop.multiProcessorCount;
    const size_t sc = attention_scratch_floats(p);
    if (sc) CK(cudaMalloc(&scratch, sc * 4));
    const int n_split = sc ? static_cast<int>(sc / (static_cast<size_t>(d.n_seq) * n_head * attention_part_row(hd))) : 1;
    std::vector<float> ref(qn), got(qn);
    auto nmse = [&] {
      CK(cudaMemcpy(got.data(), o, qn * 4, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (size_t i = 0; i < qn; ++i) num += (got[i] - ref[i]) * double(got[i] - ref[i]), den += ref[i] * double(ref[i]);
      return den > 0 ? num / den : num;
    };
    double bytes = 0;
    for (int s = 0; s < d.n_seq; ++s) bytes += 2.0 * 2.0 * kl[s] * n_kv * hd;
    auto gbs = [&](double ms) { return bytes / (ms * 1e-3) / 1e9; };
    std::printf("%-3d %-2d %-5d %-7d %-5d", hd, d.nr, d.n_seq, d.depth, n_split);
    // forced 0 (the reference), 1, 2, then the selector (-1)
    for (int f : {0, 1, 2, -1}) {
      if (hd > 128 && (f == 1 || f == 2)) {
        std::printf("| %23s ", "-");
        continue;
      }
      attention_force_decode(f);
      const double ms = median_ms([&] { SK(launch_attention(p, scratch, st)); }, st, e0, e1, 7);
      if (f == 0) {
        CK(cudaMemcpy(ref.data(), o, qn * 4, cudaMemcpyDeviceToHost));
        std::printf("| %8.4f %6.0f ", ms, gbs(ms));
      } else if (f > 0) {
        std::printf("| %8.4f %6.0f %7.1e ", ms, gbs(ms), nmse());
      } else {
        std::printf("| %8.4f %6.0f ", ms, gbs(ms));
      }
    }
    attention_force_decode(-1);
    if (n_split > 1) {  // the second pass alone, on the partials the selector's launch left
      const int R = attention_part_row(hd);
      const double tn = median_ms([&] { SK(launch_attention_combine(p, n_split, scratch, st)); }, st, e0, e1, 9);
      std::vector<float> fast(qn);
      CK(cudaMemcpy(fast.data(), o, qn * 4, cudaMemcpyDeviceToHost));
      const double ts = median_ms([&] { combine_serial<<<d.n_seq * n_head, 128, 0, st>>>(p, n_split, R, scratch); }, st, e0, e1, 9);
      CK(cudaGetLastError());
      CK(cudaMemcpy(got.data(), o, qn * 4, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (size_t i = 0; i < qn; ++i) num += (got[i] - fast[i]) * double(got[i] - fast[i]), den += fast[i] * double(fast[i]);
      std::printf("| %6.1f / %6.1f %7.1e", tn * 1e3, ts * 1e3, den > 0 ? num / den : num);
    }
    std::printf("\n");
    std::fflush(stdout);
    cudaFree(k), cudaFree(v), cudaFree(q), cudaFree(o), cudaFree(table), cudaFree(tok_table), cudaFree(kv_len);
    if (scratch) cudaFree(scratch);
  }
  return 0;
}
