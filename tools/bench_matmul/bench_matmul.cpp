// CPU matmul benchmark on llama3-1b shapes: GEMV (n_tok = 1) in GB/s of weight bytes read, GEMM (n_tok = 128 by
// default) in GFLOP/s (2 * n_out * n_in * n_tok), median of --reps runs, for 1 and 2 threads.
//
//   bench_matmul [--types q4_K,q6_K,q8_0,f16] [--shapes 2048x2048,...] [--threads 1,2] [--reps 5] [--tok 128]
//                [--level scalar|avx2|avx512] [--mode both|gemv|gemm] [--gemv-tok 1]
//
// --gemv-tok N: the GEMV columns run N tokens per call, still rotating through the DRAM-resident copies (the
// batched decode step of N sequences); GB/s stays weight bytes per second, and GFLOP/s is printed next to it.
// Shapes are n_out x n_in. GEMV cycles through enough copies of the weight matrix (>= 96 MiB in all) that every
// run reads its weights from DRAM, as a decode step does; GEMM uses one copy (its weights are re-read from cache
// across activation tiles by design).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_kernels.h"
#include "util/fp16.h"
#include "util/timer.h"

using namespace kiln;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(sep, b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// Random bytes with every f16 scale field set to a small positive value (so no inf/NaN reaches the sums).
void fill_weights(DType t, uint8_t* w, size_t bytes, std::mt19937& rng) {
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    const uint32_t v = rng();
    std::memcpy(w + i, &v, 4);
  }
  const int64_t ts = dtype_type_size(t);
  std::vector<int> offs;
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q5_0: case DType::IQ4_NL: case DType::IQ4_XS: offs = {0}; break;
    case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S:
    case DType::IQ1_S:
      offs = {0};
      break;
    case DType::IQ1_M: {  // f16 d in the top nibbles of the 4 scale words (bytes 48..55)
      const uint16_t h = f32_to_fp16(0.004f);
      for (size_t b = 0; b + ts <= bytes; b += ts)
        for (int k = 0; k < 4; ++k) {
          uint8_t& hi = w[b + 49 + 2 * k];
          hi = static_cast<uint8_t>((hi & 0x0F) | (((h >> (4 * k)) & 0xF) << 4));
        }
      return;
    }
    case DType::MXFP4:  // E8M0 exponent byte: 2^-8
      for (size_t b = 0; b + 17 <= bytes; b += 17) w[b] = 120;
      return;
    case DType::Q4_K: case DType::Q5_K: offs = {0, 2}; break;
    case DType::Q6_K: offs = {208}; break;
    case DType::Q2_K: offs = {80, 82}; break;
    case DType::Q3_K: offs = {108}; break;
    case DType::Q4_1: case DType::Q5_1: offs = {0, 2}; break;
    case DType::F16: {
      for (size_t i = 0; i + 2 <= bytes; i += 2) {
        const uint16_t h = f32_to_fp16(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-3f);
        std::memcpy(w + i, &h, 2);
      }
      return;
    }
    case DType::BF16: {
      for (size_t i = 0; i + 2 <= bytes; i += 2) {
        const uint16_t h = f32_to_bf16(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-3f);
        std::memcpy(w + i, &h, 2);
      }
      return;
    }
    case DType::F32: {
      for (size_t i = 0; i + 4 <= bytes; i += 4) {
        const float f = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-3f;
        std::memcpy(w + i, &f, 4);
      }
      return;
    }
    default: break;
  }
  const uint16_t h = f32_to_fp16(0.004f);
  for (size_t b = 0; b + ts <= bytes; b += ts)
    for (int o : offs) std::memcpy(w + b + o, &h, 2);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string types = "q4_K,q6_K,q8_0,f16";
  std::string shapes = "2048x2048,512x2048,8192x2048,2048x8192,128256x2048";
  std::string threads = "1,2";
  int reps = 5;
  int64_t tok = 128, gemv_tok = 1;
  std::string level_name, mode = "both";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--types") types = v;
    else if (k == "--shapes") shapes = v;
    else if (k == "--threads") threads = v;
    else if (k == "--reps") reps = std::max(3, std::atoi(v.c_str()));
    else if (k == "--tok") tok = std::atoll(v.c_str());
    else if (k == "--level") level_name = v;
    else if (k == "--mode") mode = v;
    else if (k == "--gemv-tok") gemv_tok = std::max<int64_t>(1, std::atoll(v.c_str()));
    else {
      std::fprintf(stderr, "bench_matmul: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  cpu::SimdLevel level = cpu::matmul_simd_level();
  if (level_name == "scalar") level = cpu::SimdLevel::kScalar;
  if (level_name == "avx2") level = cpu::SimdLevel::kAvx2;
  if (level_name == "avx512") level = cpu::SimdLevel::kAvx512;
  std::printf("# simd level %s (cpu: %s), median of %d reps, GEMM n_tok = %lld\n", cpu::simd_level_name(level),
              cpu::simd_level_name(cpu::cpu_simd_level()), reps, static_cast<long long>(tok));
  std::printf("%-6s %-12s %3s %10s %10s %10s %10s %12s %12s\n", "type", "n_out x n_in", "thr", "GEMV us",
              "GEMV GB/s", "(best)", "GEMM ms", "GEMM GFLOP/s", "(best)");
  std::mt19937 rng(42);
  for (const std::string& tn : split(types, ',')) {
    const auto t = dtype_from_name(tn);
    if (!t || !cpu::matmul_supports(*t)) {
      std::fprintf(stderr, "bench_matmul: unsupported type %s\n", tn.c_str());
      return 2;
    }
    for (const std::string& sh : split(shapes, ',')) {
      const auto dims = split(sh, 'x');
      if (dims.size() != 2) {
        std::fprintf(stderr, "bench_matmul: bad shape %s (want n_outxn_in)\n", sh.c_str());
        return 2;
      }
      const int64_t n_out = std::atoll(dims[0].c_str()), n_in = std::atoll(dims[1].c_str());
      const auto rbr = dtype_row_bytes(*t, n_in);
      if (!rbr) {
        std::fprintf(stderr, "bench_matmul: %s\n", rbr.status().to_string().c_str());
        return 2;
      }
      const size_t rb = *rbr, wbytes = rb * n_out;
      const size_t copies = std::clamp<size_t>((size_t{96} << 20) / wbytes + 1, 1, 64);
      std::vector<std::vector<uint8_t>> w(copies, std::vector<uint8_t>(wbytes));
      for (auto& c : w) fill_weights(*t, c.data(), wbytes, rng);
      const int64_t x_tok = std::max(tok, gemv_tok);
      std::vector<float> x(n_in * x_tok), y(n_out * x_tok);
      std::normal_distribution<float> nd(0.f, 1.f);
      for (auto& v : x) v = nd(rng);
      for (const std::string& ths : split(threads, ',')) {
        ThreadPool pool(std::atoi(ths.c_str()));
        cpu::MatmulArgs a;
        a.wtype = *t;
        a.w_row_bytes = rb;
        a.n_out = n_out;
        a.n_in = n_in;
        a.x = x.data();
        a.x_stride = n_in;
        a.y = y.data();
        a.y_stride = n_out;
        // GEMV: rotate through the copies; enough runs per rep that a rep lasts >= ~20 ms.
        a.n_tok = gemv_tok;
        std::vector<double> gemv;
        size_t ci = 0;
        int inner = 1;
        for (int r = 0; r < (mode == "gemm" ? 1 : reps + 1); ++r) {
          Timer tm;
          for (int k = 0; k < inner; ++k) {
            a.w = w[ci++ % copies].data();
            if (Status s = cpu::detail::matmul_at_level(a, pool, level); !s) {
              std::fprintf(stderr, "bench_matmul: %s\n", s.to_string().c_str());
              return 1;
            }
          }
          const double sec = tm.seconds() / inner;
          if (r == 0) inner = std::max(1, static_cast<int>(0.02 / std::max(sec, 1e-7)));  // warm-up sizes the reps
          else gemv.push_back(sec);
        }
        // GEMM.
        a.n_tok = tok;
        a.w = w[0].data();
        std::vector<double> gemm;
        for (int r = 0; r < (mode == "gemv" ? 2 : reps + 1); ++r) {
          Timer tm;
          if (Status s = cpu::detail::matmul_at_level(a, pool, level); !s) {
            std::fprintf(stderr, "bench_matmul: %s\n", s.to_string().c_str());
            return 1;
          }
          if (r > 0) gemm.push_back(tm.seconds());
        }
        if (gemv.empty()) gemv.push_back(1e9);
        const double tv = median(gemv), tg = median(gemm);
        const double bv = *std::min_element(gemv.begin(), gemv.end()), bg = *std::min_element(gemm.begin(), gemm.end());
        const double flop = 2.0 * n_out * n_in * tok;
        std::printf("%-6s %-12s %3s %10.1f %10.2f %10.2f %10.3f %12.1f %12.1f", tn.c_str(), sh.c_str(), ths.c_str(),
                    tv * 1e6, wbytes / tv / 1e9, wbytes / bv / 1e9, tg * 1e3, flop / tg / 1e9, flop / bg / 1e9);
        if (gemv_tok > 1) std::printf("   GEMV x%lld: %.1f GFLOP/s", static_cast<long long>(gemv_tok),
                                      2.0 * n_out * n_in * gemv_tok / tv / 1e9);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
