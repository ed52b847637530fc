#include "backend/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace kiln::cpu {

namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.bmi2 = __builtin_cpu_supports("bmi2");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
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

SimdLevel detect_level() {
  SimdLevel level = cpu_simd_level();
  if (const char* cap = std::getenv("KILN_CPU_SIMD")) {
    SimdLevel c = level;
    if (std::strcmp(cap, "scalar") == 0) c = SimdLevel::kScalar;
    else if (std::strcmp(cap, "avx2") == 0) c = SimdLevel::kAvx2;
    else if (std::strcmp(cap, "avx512") == 0) c = SimdLevel::kAvx512;
    if (c < level) level = c;
  }
  return level;
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

SimdLevel matmul_simd_level() {
  static const SimdLevel level = detect_level();
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
