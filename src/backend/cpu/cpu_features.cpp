#include "backend/cpu/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace kiln::cpu {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// XCR0: which register states the OS saves on context switch (XGETBV leaf 0).
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif

// CPUID + XGETBV directly (not __builtin_cpu_supports, whose feature names differ between gcc and clang): a
// feature counts only when the CPU has it AND the OS saves its registers (YMM state for AVX*, opmask/ZMM state
// for AVX-512).
CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool ymm_ok = avx && (xcr0 & 0x6) == 0x6;
  const bool zmm_ok = ymm_ok && (xcr0 & 0xE0) == 0xE0;
  f.fma = ymm_ok && (c & (1u << 12));
  f.f16c = ymm_ok && (c & (1u << 29));
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = ymm_ok && (b & (1u << 5));
    f.bmi2 = b & (1u << 8);
    f.avx512f = zmm_ok && (b & (1u << 16));
    f.avx512dq = zmm_ok && (b & (1u << 17));
    f.avx512bw = zmm_ok && (b & (1u << 30));
    f.avx512vl = zmm_ok && (b & (1u << 31));
    f.avx512vnni = zmm_ok && (c & (1u << 11));
    const unsigned max_sub = a;
    if (max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      f.avx512bf16 = zmm_ok && (a & (1u << 5));
    }
  }
#endif
  return f;
}

SimdLevel detect_cpu_level() {
  const CpuFeatures& f = cpu_features();
  SimdLevel level = SimdLevel::kScalar;
  if (f.avx2 && f.fma && f.f16c && f.bmi2) level = SimdLevel::kAvx2;
  if (level == SimdLevel::kAvx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni)
    level = SimdLevel::kAvx512;
  return level;
}

SimdLevel read_env_cap() {
  const char* cap = std::getenv("KILN_CPU_SIMD");
  if (!cap) return SimdLevel::kAvx512;
  if (std::strcmp(cap, "scalar") == 0) return SimdLevel::kScalar;
  if (std::strcmp(cap, "avx2") == 0) return SimdLevel::kAvx2;
  return SimdLevel::kAvx512;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

SimdLevel cpu_simd_level() {
  static const SimdLevel level = detect_cpu_level();
  return level;
}

SimdLevel env_simd_cap() {
  static const SimdLevel cap = read_env_cap();
  return cap;
}

SimdLevel matmul_simd_level() {
  static const SimdLevel level = std::min(cpu_simd_level(), env_simd_cap());
  return level;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace kiln::cpu
