// Micro-benchmark of the tensor-core prefill GEMM (src/backend/cuda/mmq.cuh) on the llama3-8b projection shapes at
// n_tok = 512: q/o 4096x4096, k/v 1024x4096, gate/up 14336x4096, down 4096x14336, in Q4_K, Q6_K, Q8_0, Q4_0, Q5_K
// and F16; also each tile forced (mmq_set_tile_override: mmq_q_kernel's / mmq_f_kernel's and the pipelined
// kernels' configurations, mmq.cuh MmqTile), each with its reference check.
// Random weights (sane scales) and activations; per shape: a reference check (the old f32 GEMM of gemm.cu, which
// computes the same q8_1 function for quantized weights: NMSE <= 1e-8; F16: f32 vs f16-rounded activations,
// NMSE <= 1e-5; and a CPU spot check of 8 rows x 4 tokens against f64 math on the dequantized weights:
// NMSE <= 1e-3), then 3 warm-up launches and the median of 9 event-timed launches, printed as TFLOP/s
// (2 * n_out * n_in * n_tok / time), with the old GEMM's time for comparison.
// Build: the CMake target mmq_bench (KILN_CUDA=ON), run: build/<dir>/dev/cuda/mmq_bench [n_tok [types [shape]]]
// (types: a list such as Q4_K,Q6_K; shape: q/o, k/v, gate/up or down)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/launch.h"
#include "backend/cuda/mmq.cuh"
#include "bench_util.cuh"
#include "quant/dtype.h"
#include "quant/reference.h"
#include "util/fp16.h"

using namespace kiln;
using namespace kiln::cuda;

int main(int argc, char** argv) {
  const int64_t n_tok = argc > 1 ? std::atoll(argv[1]) : 512;
  struct Shape { const char* name; int64_t n_out, n_in; };
  const Shape shapes[] = {{"q/o", 4096, 4096}, {"k/v", 1024, 4096}, {"gate/up", 14336, 4096}, {"down", 4096, 14336}};
  const DType types[] = {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::Q5_K, DType::F16};
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs), n_tok = %lld\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, static_cast<long long>(n_tok));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  int fails = 0;
  std::printf("%-5s %-8s %6s %6s  %9s %8s  %9s %8s  %9s %9s %9s\n", "type", "shape", "n_out", "n_in", "mmq ms",
              "TFLOP/s", "gemm ms", "TFLOP/s", "speedup", "nmse_ref", "nmse_cpu");
  const char* only = argc > 2 ? argv[2] : nullptr;  // e.g. "Q4_K,Q6_K": only these types
  const char* only_shape = argc > 3 ? argv[3] : nullptr;  // e.g. "q/o": only this shape
  for (DType t : types) {
    if (only && !strcasestr(only, dtype_name(t))) continue;  // Q4_K or q4_K (GGUF spelling)
    for (const Shape& sh : shapes) {
      if (only_shape && std::strcmp(only_shape, sh.name) != 0) continue;
      const int64_t n_in = sh.n_in, n_out = sh.n_out;
      const auto wb = random_weights(t, n_in, n_out, rng);
      std::vector<float> x(static_cast<size_t>(n_in * n_tok));
      for (auto& v : x) v = nd(rng);
      const bool q = t != DType::F16;
      BenchMatmul bm = bench_matmul_alloc(wb, x, n_in, n_out, n_tok, q);
      uint8_t* dw = bm.w;
      float *dx = bm.x, *dy = bm.y, *dy2 = bm.y2;
      const ActQ& a = bm.a;
      MatmulParams p{t, dw, dtype_row_bytes(t, n_in).value(), n_in, n_out, n_tok, dx, static_cast<size_t>(n_in),
                     nullptr, dy, static_cast<size_t>(n_out), false};
      MatmulParams p2 = p;
      p2.y = dy2;
      if (!mmq_usable(p)) {
        std::printf("%-5s %-8s: mmq not usable on this device\n", dtype_name(t), sh.name);
        continue;
      }
      SK(launch_mmq(p, a, 0));
      SK(launch_gemm(p2, a, 0));
      CK(cudaDeviceSynchronize());
      std::vector<float> y(n_out * n_tok), y2(n_out * n_tok);
      CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(y2.data(), dy2, y2.size() * 4, cudaMemcpyDeviceToHost));
      const double e_ref = nmse(y, std::vector<double>(y2.begin(), y2.end()));
      const double e_cpu = cpu_spot_nmse(t, wb, x, y, n_in, n_out, n_tok);  // 8 rows x 4 tokens, f64
      const double lim_ref = q ? 1e-8 : 1e-5;
      const bool ok = e_ref <= lim_ref && e_cpu <= 1e-3;
      fails += !ok;
      const float ms = median_ms([&] { SK(launch_mmq(p, a, 0)); });
      // each tile forced (mmq.cuh MmqTile; Q6_K has 64 x 64 and 128 x 128 only, F16 mmq_f_kernel's 64 x 64 and the
      // pipelined tiles; P* = the pipelined kernels):
      // its time and its reference check
      static const char* const kTileName[] = {"",          "64x64",      "64x128",   "128x64",    "128x128",
                                              "P64x64",    "P128x64",    "P128x128", "P2_64x64",  "P2_128x64",
                                              "PU128x64",  "PD64x64",    "PD128x128", "P64x16",
                                              "P64x32"};
      char tiles[800] = "";
      {
        int pos = 0;
        for (int tile = kMmqTileS; tile <= kMmqTileP32; ++tile) {
          const bool pipelined =
              t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0 || t == DType::F16;
          const bool pd = t == DType::Q6_K || t == DType::Q8_0;  // mmq_p6_kernel: P64x64 and P128x128 only
          if ((t == DType::Q6_K || !q) && (tile == kMmqTileN || tile == kMmqTileM)) continue;
          if (!q && tile == kMmqTileL) continue;  // F16: tiles 1-4 are all mmq_f_kernel's 64 x 64
          if (tile >= kMmqTilePS && !pipelined) continue;
          if (pd && tile >= kMmqTilePM && tile != kMmqTilePL && tile < kMmqTileP16) continue;
          if ((tile == kMmqTilePDS || tile == kMmqTilePDL) && t != DType::Q4_K) continue;  // Q4_K on mmq_p6_kernel
          if (tile >= kMmqTileP16 && !q) continue;  // F16: = P2S
          mmq_set_tile_override(tile);
          SK(launch_mmq(p, a, 0));
          CK(cudaDeviceSynchronize());
          std::vector<float> yt(n_out * n_tok);
          CK(cudaMemcpy(yt.data(), dy, yt.size() * 4, cudaMemcpyDeviceToHost));
          const double e_t = nmse(yt, std::vector<double>(y2.begin(), y2.end()));
          const bool ok_t = e_t <= lim_ref;
          fails += !ok_t;
          const float mt = median_ms([&] { SK(launch_mmq(p, a, 0)); });
          pos += std::snprintf(tiles + pos, sizeof(tiles) - pos, "  %s %.4f ms %.1f%s", kTileName[tile], mt, 2.0 * n_out * n_in * n_tok / mt * 1e-9,
                               ok_t ? "" : " FAIL");
        }
        mmq_set_tile_override(0);
      }
      const float ms2 = median_ms([&] { SK(launch_gemm(p2, a, 0)); }, 1, 5);
      const double fl = 2.0 * n_out * n_in * n_tok;
      std::printf("%-5s %-8s %6lld %6lld  %9.4f %8.1f  %9.4f %8.1f  %8.1fx %9.2e %9.2e%s\n", dtype_name(t), sh.name,
                  static_cast<long long>(n_out), static_cast<long long>(n_in), ms, fl / ms * 1e-9, ms2,
                  fl / ms2 * 1e-9, ms2 / ms, e_ref, e_cpu, ok ? "" : "  FAIL");
      if (tiles[0]) std::printf("      tiles:%s\n", tiles);
      bench_matmul_free(bm);
    }
  }
  std::printf("%s\n", fails ? "mmq_bench: reference check FAILED" : "mmq_bench: all reference checks passed");
  return fails ? 1 : 0;
}
