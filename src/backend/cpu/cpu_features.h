// x86 CPU features relevant to the CPU backend's SIMD kernels, read once from CPUID and XGETBV (a feature counts
// only when the OS also saves its registers), and the SIMD level the matmul
// dispatches to: avx512 (F/BW/VL/DQ + VNNI) -> avx2 (AVX2 + FMA + F16C) -> scalar, capped by KILN_CPU_SIMD.
#pragma once

namespace kiln::cpu {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false;
};

const CpuFeatures& cpu_features();

enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The best level this CPU supports (avx512 needs F/BW/VL/DQ/VNNI, avx2 needs AVX2/FMA/F16C/BMI2).
SimdLevel cpu_simd_level();
// cpu_simd_level() capped by the environment variable KILN_CPU_SIMD=scalar|avx2|avx512 (read once
// at first use; an unknown value is ignored).
SimdLevel matmul_simd_level();
// The cap KILN_CPU_SIMD sets (kAvx512 = no cap), for the other ops' own dispatch.
SimdLevel env_simd_cap();
const char* simd_level_name(SimdLevel level);  // "scalar", "avx2", "avx512"

}  // namespace kiln::cpu
