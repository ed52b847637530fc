// Micro-benchmark of the decode GEMVs (issue 13): GB/s of weight bytes read per weight type for 4096x14336 and
// 14336x4096 (n_out x n_in) at 1, 2, 4, 8, 16 and 32 tokens, next to the device's copy bandwidth measured here.
// The launchers are the backend's (launch_mmvq: mmvq_fast.cuh / mmvq_mma.cuh for Q4_K and Q6_K, mmvq.cuh for the
// other quantized types; launch_mmvf for F16), so a row is what a decode step's matmul costs on its own.
// Random weights (sane scales) and activations (never zeros); per case the output is poisoned (NaN) first and
// checked against the f32 GEMM of gemm.cu on the same q8_1 activations (quantized types: the same function,
// NMSE <= 1e-8; F16: f32 activations on both, NMSE <= 1e-8), then 3 warm-up launches and the median of 9
// event-timed ones. GB/s = weight bytes / time (activations and outputs are not counted: at 32 tokens they are
// <= 1% of the bytes). Bytes counted before timing: rows x dtype_row_bytes(type, n_in).
// Build: the CMake target gemv_bench (KILN_CUDA=ON); run: build/<dir>/dev/cuda/gemv_bench [types] (e.g. Q4_K,F16).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/launch.h"
#include "bench_util.cuh"
#include "quant/dtype.h"

using namespace kiln;
using namespace kiln::cuda;

// Device-to-device copy of 1 GiB (read + write counted), median of 5: the ceiling the GB/s column is set against.
static double copy_gbs() {
  const size_t n = size_t{1} << 30;
  void *a, *b;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  CK(cudaMemset(a, 1, n));
  const float ms = median_ms([&] { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0)); }, 2, 5);
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * static_cast<double>(n) / (ms * 1e6);
}

int main(int argc, char** argv) {
  struct Shape { int64_t n_out, n_in; };
  const Shape shapes[] = {{4096, 14336}, {14336, 4096}};
  const DType types[] = {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::Q5_K, DType::F16};
  const int toks[] = {1, 2, 4, 8, 16, 32};
  const char* only = argc > 1 ? argv[1] : nullptr;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const double ceil_gbs = copy_gbs();
  std::printf("device: %s (sm_%d%d, %d SMs), copy %.0f GB/s, tensor-core GEMV %s\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, ceil_gbs, mmvq_mma_on() ? "on" : "off");
  std::printf("%-5s %6s %6s %4s  %9s %8s %6s  %9s\n", "type", "n_out", "n_in", "tok", "us", "GB/s", "%copy", "nmse");
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  int fails = 0;
  const int max_tok = toks[sizeof(toks) / sizeof(toks[0]) - 1];
  for (DType t : types) {
    if (only && !strcasestr(only, dtype_name(t))) continue;  // Q4_K or q4_K (GGUF spelling)
    for (const Shape& sh : shapes) {
      const int64_t n_in = sh.n_in, n_out = sh.n_out;
      const size_t rb = dtype_row_bytes(t, n_in).value();
      const double bytes = static_cast<double>(rb) * static_cast<double>(n_out);
      const auto wb = random_weights(t, n_in, n_out, rng);
      std::vector<float> x(static_cast<size_t>(n_in * max_tok));
      for (auto& v : x) v = nd(rng);
      const bool q = t != DType::F16;
      BenchMatmul bm = bench_matmul_alloc(wb, x, n_in, n_out, max_tok, q);
      uint8_t* dw = bm.w;
      float *dx = bm.x, *dy = bm.y, *dy2 = bm.y2;
      const ActQ& a = bm.a;
      for (int nt : toks) {
        MatmulParams p{t, dw, rb, n_in, n_out, nt, dx, static_cast<size_t>(n_in), nullptr, dy,
                       static_cast<size_t>(n_out), false};
        MatmulParams p2 = p;
        p2.y = dy2;
        ActQ an = act_rows(a, 0, nt);
        const auto run = [&](const MatmulParams& mp) { return q ? launch_mmvq(mp, an, 0) : launch_mmvf(mp, 0); };
        CK(cudaMemset(dy, 0xFF, n_out * nt * 4));  // NaN: a row the kernel does not write fails the check
        SK(run(p));
        SK(launch_gemm(p2, q ? an : ActQ{}, 0));
        CK(cudaDeviceSynchronize());
        std::vector<float> y(n_out * nt), y2(n_out * nt);
        CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(y2.data(), dy2, y2.size() * 4, cudaMemcpyDeviceToHost));
        const double e = nmse(y, std::vector<double>(y2.begin(), y2.end()));
        const bool ok = std::isfinite(e) && e <= 1e-8;
        fails += !ok;
        const float ms = median_ms([&] { SK(run(p)); });
        const double gbs = bytes / (ms * 1e6);
        std::printf("%-5s %6lld %6lld %4d  %9.2f %8.0f %5.0f%%  %9.2e%s\n", dtype_name(t),
                    static_cast<long long>(n_out), static_cast<long long>(n_in), nt, ms * 1e3, gbs,
                    100.0 * gbs / ceil_gbs, e, ok ? "" : "  FAIL");
      }
      bench_matmul_free(bm);
    }
  }
  std::printf("%s\n", fails ? "REFERENCE CHECK FAILED" : "all reference checks passed");
  return fails ? 1 : 0;
}
