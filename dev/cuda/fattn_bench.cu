// Attention prefill micro-benchmark: the flash-attention prefill kernels (sm90a/fattn_wgmma.cu on 9.0 devices for
// hd 64/128, and fattn_mma.cu's mma.sync kernel) vs attention.cu (the split-KV kernel), one sequence of q_len
// tokens after `depth` cached positions, causal, f16 cache, random inputs, block size 16 (shuffled blocks).
// Shapes: hd 128 with 32 query / 8 KV heads (llama3-8b), hd 256 with 16 / 8 (Gemma 3 / Qwen3.5 class), hd 64 with
// 32 / 8; q_len 512, 4096, 16384 from position 0, and 512 at depth 32768 / 131072 (a prefill chunk deep in a long
// prompt). Median of >= 5 timed runs after a warm-up (CUDA events); TFLOP/s counts the causal work
// 4 * q_len * (depth + q_len / 2) * hd * n_head (two matmuls of 2 flops per multiply-add).
// Columns: the selected kernel's median ms and TFLOP/s, then TFLOP/s of each wgmma variant (fattn_mma.cuh
// FaWgVariant: 1 or 2 warpgroups per CTA, with or without the software pipeline; 0: not on this device / head dim),
// mma.sync (fattn_set_wgmma(false)) and attention.cu; and where kv <= 4096 the NMSE of each against attention.cu
// (expected ~1e-7: the prefill kernels round P to f16; a layout bug shows as ~1).
// Decode at depth has its own benchmark (attn_decode_bench).
// Usage: fattn_bench [--quick | --only I]   (--quick: skip attention.cu where kv reaches 16384, which takes seconds
// per run; --only I: shape I of the table alone, for a profiler)
// Built by dev/cuda/CMakeLists.txt when KILN_CUDA=ON (target fattn_bench).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/fattn_mma.cuh"
#include "backend/cuda/launch.h"
#include "bench_fill.cuh"
#include "bench_util.cuh"

using namespace kiln;
using namespace kiln::cuda;

namespace {

struct Shape {
  int hd, n_head, n_kv, q_len, depth;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int only = argc > 2 && std::strcmp(argv[1], "--only") == 0 ? std::atoi(argv[2]) : -1;  // one shape (profiling)
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  const int cc = prop.major * 10 + prop.minor;
  if (!attention_init(prop.sharedMemPerBlockOptin).is_ok()) return std::printf("attention_init failed\n"), 1;
  std::printf("device %s (sm_%d, %d SMs)\n", prop.name, cc, prop.multiProcessorCount);
  std::printf("%-5s %-7s %-6s %-7s %9s %8s %8s %8s %8s %8s %8s %8s %8s   (TFLOP/s)\n", "hd", "heads", "q_len",
              "depth", "sel ms", "sel", "wg1", "wg1pipe", "wg2", "wg2pipe", "ws", "mma", "attn");
  const Shape shapes[] = {{128, 32, 8, 512, 0},      {128, 32, 8, 4096, 0},    {128, 32, 8, 16384, 0},
                          {128, 32, 8, 512, 32768},  {128, 32, 8, 512, 131072}, {256, 16, 8, 512, 0},
                          {256, 16, 8, 4096, 0},     {256, 16, 8, 16384, 0},  {64, 32, 8, 512, 0},
                          {64, 32, 8, 4096, 0},      {64, 32, 8, 16384, 0}};
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const Shape& s : shapes) {
    if (only >= 0 && &s - shapes != only) continue;
    const int bs = 16, kv_total = s.depth + s.q_len, n_blocks = (kv_total + bs - 1) / bs;
    const size_t n_slots = static_cast<size_t>(n_blocks) * bs, kv_row = static_cast<size_t>(s.n_kv) * s.hd;
    __half *k = nullptr, *v = nullptr;
    float *q = nullptr, *o = nullptr, *scratch = nullptr;
    int32_t *table = nullptr, *tok_table = nullptr, *kv_len = nullptr, *seq = nullptr;
    CK(cudaMalloc(&k, n_slots * kv_row * 2));
    CK(cudaMalloc(&v, n_slots * kv_row * 2));
    const size_t qn = static_cast<size_t>(s.q_len) * s.n_head * s.hd;
    CK(cudaMalloc(&q, qn * 4));
    CK(cudaMalloc(&o, qn * 4));
    fill_f16<<<1024, 256, 0, st>>>(k, n_slots * kv_row, 1);
    fill_f16<<<1024, 256, 0, st>>>(v, n_slots * kv_row, 2);
    fill_f32<<<1024, 256, 0, st>>>(q, qn, 3, 2.0f);
    std::vector<int32_t> tb(n_blocks);
    std::iota(tb.begin(), tb.end(), 0);
    std::shuffle(tb.begin(), tb.end(), std::mt19937(5));
    std::vector<int32_t> tt(s.q_len, 0), kl(s.q_len);
    for (int t = 0; t < s.q_len; ++t) kl[t] = s.depth + t + 1;
    const int32_t sq[3] = {0, 0, s.q_len};  // seq_row, seq_q_start, seq_q_len
    CK(cudaMalloc(&table, tb.size() * 4));
    CK(cudaMalloc(&tok_table, tt.size() * 4));
    CK(cudaMalloc(&kv_len, kl.size() * 4));
    CK(cudaMalloc(&seq, sizeof(sq)));
    CK(cudaMemcpy(table, tb.data(), tb.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tok_table, tt.data(), tt.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(kv_len, kl.data(), kl.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(seq, sq, sizeof(sq), cudaMemcpyHostToDevice));
    AttnParams p{};
    p.q = q, p.q_tok_stride = static_cast<size_t>(s.n_head) * s.hd, p.q_head_stride = s.hd, p.dst = o;
    p.k = reinterpret_cast<const uint8_t*>(k), p.v = reinterpret_cast<const uint8_t*>(v);
    p.k_slot_bytes = p.v_slot_bytes = kv_row * 2, p.k_head_bytes = p.v_head_bytes = static_cast<size_t>(s.hd) * 2;
    p.kv_type = DType::F16, p.n_tok = s.q_len, p.n_head = s.n_head, p.n_head_kv = s.n_kv, p.hd_k = p.hd_v = s.hd;
    p.block_size = bs, p.tables = table, p.table_stride = n_blocks, p.tok_table = tok_table, p.kv_len = kv_len;
    p.scale = 1.0f / std::sqrt(static_cast<float>(s.hd)), p.max_kv_len = kv_total, p.n_sm = prop.multiProcessorCount;
    p.seq_row = seq, p.seq_q_start = seq + 1, p.seq_q_len = seq + 2, p.n_seq = 1, p.max_q_len = s.q_len;
    const size_t sc = attention_scratch_floats(p);
    if (sc) CK(cudaMalloc(&scratch, sc * 4));
    const double flops = 4.0 * s.q_len * (s.depth + s.q_len / 2.0) * s.hd * s.n_head;
    // which: 0 attention.cu, 1 the prefill kernel launch_fattn_mma selects
    auto time = [&](int which, int reps) -> double {
      std::vector<float> ms;
      for (int i = 0; i < reps + 1; ++i) {
        CK(cudaEventRecord(e0, st));
        const Status r = which == 1 ? launch_fattn_mma(p, st) : launch_attention(p, scratch, st);
        if (!r.is_ok()) return std::printf("launch failed: %s\n", r.to_string().c_str()), -1.0;
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (i > 0) ms.push_back(t);  // run 0: warm-up
      }
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    };
    const bool fa_ok = fattn_mma_selected(p, cc, prop.sharedMemPerBlockOptin);
    const bool small = kv_total <= 4096;
    auto grab = [&](std::vector<float>& out) {
      if (!small) return;
      out.resize(qn);
      CK(cudaMemcpy(out.data(), o, qn * 4, cudaMemcpyDeviceToHost));
    };
    std::vector<float> o_var[kFaWgVariantCount], o_mma, o_ref;
    double t_sel = -1.0, t_var[kFaWgVariantCount] = {-1.0, -1.0, -1.0, -1.0, -1.0}, t_mma = -1.0;
    if (fa_ok) {
      fattn_set_wgmma(true);
      t_sel = time(1, 7);
      for (int i = 0; i < kFaWgVariantCount; ++i) {
        fattn_force_wg_variant(i);
        if (fattn_wg_selected(p)) t_var[i] = time(1, 7), grab(o_var[i]);
      }
      fattn_force_wg_variant(-1);
      fattn_set_wgmma(false);
      t_mma = time(1, 7), grab(o_mma);
      fattn_set_wgmma(true);
    }
    const bool skip_ref = quick && kv_total >= 16384;
    const double t_ref = skip_ref ? -1.0 : time(0, 5);
    if (!skip_ref) grab(o_ref);
    auto nmse = [&](const std::vector<float>& a) {  // a prefill kernel vs attention.cu (a sanity check, not the test)
      if (a.empty() || o_ref.empty()) return -1.0;
      double num = 0, den = 0;
      for (size_t i = 0; i < qn; ++i) num += (a[i] - o_ref[i]) * double(a[i] - o_ref[i]), den += o_ref[i] * double(o_ref[i]);
      return den > 0 ? num / den : num;
    };
    auto tf = [&](double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
    char hs[16];
    std::snprintf(hs, sizeof hs, "%d/%d", s.n_head, s.n_kv);
    std::printf("%-5d %-7s %-6d %-7d %9.3f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f", s.hd, hs, s.q_len, s.depth,
                t_sel, tf(t_sel), tf(t_var[0]), tf(t_var[1]), tf(t_var[2]), tf(t_var[3]), tf(t_var[4]), tf(t_mma), tf(t_ref));
    for (int i = 0; i < kFaWgVariantCount; ++i)
      if (nmse(o_var[i]) >= 0) std::printf(" nmse%d %.1e", i, nmse(o_var[i]));
    if (nmse(o_mma) >= 0) std::printf(" nmse-mma %.1e", nmse(o_mma));
    std::printf("\n");
    std::fflush(stdout);
    cudaFree(k), cudaFree(v), cudaFree(q), cudaFree(o), cudaFree(table), cudaFree(tok_table), cudaFree(kv_len);
    cudaFree(seq);
    if (scratch) cudaFree(scratch);
  }
  CK(cudaGetLastError());
  return 0;
}
