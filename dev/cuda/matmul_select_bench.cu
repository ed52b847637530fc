// The measurement behind the matmul selector's crossover tables (src/backend/cuda/matmul_select.cu): mmq (q8_1
// quantization + the mma.sync GEMM, split-K where its grid is small, with the backend's workspace) against blas
// (dequantize to f16 + cuBLAS, gemm_blas.cu) and, up to kGemvMaxTok tokens, the GEMV (mmvq) on the llama3-8b
// projections (q/o 4096x4096, k/v 1024x4096, gate/up 14336x4096, down 4096x14336) per weight type and token count.
// Each case: both outputs checked against each other (they differ only in the activations' rounding, q8_1 vs f16:
// NMSE <= 1e-3) and a CPU f64 spot check of 8 rows x 4 tokens (<= 1e-3); then the median of 9 event-timed launches
// after 3 warm-ups, weights rotated over three copies (> the 60 MB L2 for the large shapes) so that the weight
// reads come from memory as in a model. Last, per type and token count, the time of one llama3-8b layer's products
// (2 q/o + 2 k/v + 2 gate/up + 1 down) on each path and the ratio: the selector takes blas from the smallest count
// beyond which blas stays faster.
// Build: the CMake target matmul_select_bench (KILN_CUDA=ON); run: matmul_select_bench [types [n_toks]]
//   types: e.g. Q4_K,F16 (default Q4_K,Q5_K,Q6_K,Q8_0,Q4_0,F16,BF16); n_toks: e.g. 33,64,512
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/launch.h"
#include "bench_util.cuh"
#include "quant/dtype.h"
#include "quant/reference.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

std::vector<int64_t> parse_list(const char* s, std::vector<int64_t> def) {
  if (!s) return def;
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) v.push_back(std::atoll(tok.c_str()));
  return v;
}

std::string strprintf_ms(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4f", ms);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  struct Shape { const char* name; int64_t n_out, n_in; int per_layer; };
  const Shape shapes[] = {{"q/o", 4096, 4096, 2}, {"k/v", 1024, 4096, 2}, {"gate/up", 14336, 4096, 2},
                          {"down", 4096, 14336, 1}};
  const DType all_types[] = {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::F16,
                             DType::BF16};
  const char* only = argc > 1 ? argv[1] : nullptr;
  const std::vector<int64_t> toks =
      parse_list(argc > 2 ? argv[2] : nullptr, {8, 16, 32, 33, 64, 128, 256, 512, 1024, 2048, 4096});
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int cc = prop.major * 10 + prop.minor;
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  void* ws = nullptr;
  CK(cudaMalloc(&ws, kBlasWorkspaceBytes));
  void* handle = nullptr;
  SK(blas_create(&handle, ws, kBlasWorkspaceBytes));
  void *sw = nullptr, *sx = nullptr;
  // CHUNK_MIB: the dequantized-weight scratch (rows per cuBLAS call), default the backend's kBlasChunkBytes
  const char* chunk = std::getenv("CHUNK_MIB");
  const size_t sw_bytes = chunk ? static_cast<size_t>(std::atoll(chunk)) << 20 : kBlasChunkBytes;
  const size_t sx_bytes = size_t{4096} * 14336 * 2;
  std::printf("weight scratch: %zu MiB\n", sw_bytes >> 20);
  CK(cudaMalloc(&sw, sw_bytes));
  CK(cudaMalloc(&sx, sx_bytes));
  const BlasScratch sc{handle, sw, sw_bytes, sx, sx_bytes};
  MmqSplitWs split{};  // as CudaBackend::mmq_split_ws
  CK(cudaMalloc(&split.sem, kMmqSplitSems * sizeof(unsigned)));
  CK(cudaMemset(split.sem, 0, kMmqSplitSems * sizeof(unsigned)));
  CK(cudaMalloc(&split.part, kMmqSplitBytes));
  split.part_floats = kMmqSplitBytes / sizeof(float);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  int fails = 0;
  struct Row { DType t; int64_t n_tok; double mmq_ms, blas_ms, gemv_ms; };
  std::vector<Row> rows;
  std::printf("%-5s %-8s %6s  %9s %8s  %9s %8s  %7s %9s %9s %9s\n", "type", "shape", "n_tok", "mmq ms", "TFLOP/s",
              "blas ms", "TFLOP/s", "blas/mmq", "gemv ms", "nmse_mb", "nmse_cpu");
  for (DType t : all_types) {
    if (only && !strcasestr(only, dtype_name(t))) continue;  // Q4_K or q4_K (GGUF spelling)
    const bool q = t != DType::F16 && t != DType::BF16;
    const size_t first = rows.size();
    for (int64_t n_tok : toks) rows.push_back(Row{t, n_tok, 0, 0, 0});
    for (const Shape& sh : shapes) {
      const int64_t n_in = sh.n_in, n_out = sh.n_out;
      const auto wb = random_weights(t, n_in, n_out, rng);
      const size_t rb = dtype_row_bytes(t, n_in).value();
      uint8_t* wcopy[3] = {};
      for (auto& c : wcopy) {
        CK(cudaMalloc(&c, wb.size()));
        CK(cudaMemcpy(c, wb.data(), wb.size(), cudaMemcpyHostToDevice));
      }
      for (size_t ti = 0; ti < toks.size(); ++ti) {
        const int64_t n_tok = toks[ti];
        std::vector<float> x(static_cast<size_t>(n_in * n_tok));
        for (auto& v : x) v = nd(rng);
        BenchMatmul bm = bench_matmul_alloc(std::vector<uint8_t>(16), x, n_in, n_out, n_tok, q);
        MatmulParams p{t, wcopy[0], rb, n_in, n_out, n_tok, bm.x, static_cast<size_t>(n_in), nullptr, bm.y,
                       static_cast<size_t>(n_out), false};
        p.split = split;
        MatmulParams p2 = p;
        p2.y = bm.y2;
        if (!mmq_usable(p) || !blas_usable(p, cc)) {
          std::printf("%-5s %-8s: mmq or blas not usable on this device\n", dtype_name(t), sh.name);
          return 1;
        }
        SK(launch_mmq(p, bm.a, 0));
        SK(launch_blas(p2, sc, 0));
        CK(cudaDeviceSynchronize());
        std::vector<float> y(n_out * n_tok), y2(n_out * n_tok);
        CK(cudaMemcpy(y.data(), bm.y, y.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(y2.data(), bm.y2, y2.size() * 4, cudaMemcpyDeviceToHost));
        const double e_mb = nmse(y, std::vector<double>(y2.begin(), y2.end()));
        const double e_cpu = cpu_spot_nmse(t, wb, x, y2, n_in, n_out, n_tok);
        const bool ok = e_mb <= 1e-3 && e_cpu <= 1e-3;
        fails += !ok;
        int rot = 0;
        const float ms_mmq = median_ms([&] {
          p.w = wcopy[rot++ % 3];
          if (q) SK(launch_quantize_act(bm.x, static_cast<size_t>(n_in), bm.a, 0));
          SK(launch_mmq(p, bm.a, 0));
        });
        const float ms_blas = median_ms([&] {
          p2.w = wcopy[rot++ % 3];
          SK(launch_blas(p2, sc, 0));
        });
        // the GEMV where the selector may take it (quantized: mmvq; F16/BF16: mmvf on f32 x)
        float ms_gemv = 0;
        if (n_tok <= kGemvMaxTok) {
          MatmulParams p3 = p2;
          ms_gemv = median_ms([&] {
            p3.w = wcopy[rot++ % 3];
            if (q) {
              SK(launch_quantize_act(bm.x, static_cast<size_t>(n_in), bm.a, 0));
              SK(launch_mmvq(p3, bm.a, 0));
            } else {
              SK(launch_mmvf(p3, 0));
            }
          });
        }
        const double fl = 2.0 * n_out * n_in * n_tok;
        std::printf("%-5s %-8s %6lld  %9.4f %8.1f  %9.4f %8.1f  %7.2f %9.4f %9.2e %9.2e%s\n", dtype_name(t), sh.name,
                    static_cast<long long>(n_tok), ms_mmq, fl / ms_mmq * 1e-9, ms_blas, fl / ms_blas * 1e-9,
                    ms_blas / ms_mmq, ms_gemv, e_mb, e_cpu, ok ? "" : "  FAIL");
        std::fflush(stdout);
        rows[first + ti].mmq_ms += sh.per_layer * ms_mmq;
        rows[first + ti].blas_ms += sh.per_layer * ms_blas;
        rows[first + ti].gemv_ms += sh.per_layer * ms_gemv;
        bench_matmul_free(bm);
      }
      for (auto& c : wcopy) CK(cudaFree(c));
    }
  }
  std::printf("\none llama3-8b layer's products (2 q/o + 2 k/v + 2 gate/up + 1 down), ms:\n");
  std::printf("| type | n_tok | gemv | mmq | blas | blas / mmq |\n|---|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows)
    std::printf("| %s | %lld | %s | %.4f | %.4f | %.2f |\n", dtype_name(r.t), static_cast<long long>(r.n_tok),
                r.gemv_ms > 0 ? strprintf_ms(r.gemv_ms).c_str() : "-", r.mmq_ms, r.blas_ms, r.blas_ms / r.mmq_ms);
  std::printf("crossover (smallest n_tok from which blas stays faster):");
  for (DType t : all_types) {
    int64_t from = 0;
    for (auto it = rows.rbegin(); it != rows.rend(); ++it) {
      if (it->t != t) continue;
      if (it->blas_ms < it->mmq_ms) from = it->n_tok;
      else break;
    }
    bool any = false;
    for (const Row& r : rows) any = any || r.t == t;
    if (any) std::printf(" %s %lld;", dtype_name(t), static_cast<long long>(from));
  }
  std::printf("\n%s\n", fails ? "matmul_select_bench: a check FAILED" : "matmul_select_bench: all checks passed");
  blas_destroy(handle);
  CK(cudaFree(split.sem));
  CK(cudaFree(split.part));
  return fails ? 1 : 0;
}
