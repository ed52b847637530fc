// The numerics model of the CUDA backend's mmf GEMM (backend/cuda/mmf.cuh): the f16 weights it forms from a GGUF
// row, for the op tests and dev/cuda/mmf_bench. No test framework here: the benchmark includes it too.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/dtype.h"
#include "util/fp16.h"

namespace kiln::test {

// The f16 weights CUDA's mmf forms from a Q4_K row (backend/cuda/mmf.cuh numerics): per sub-block s = f16(d * sc)
// and n = f16(-(dmin * m)) from f32 products, each weight f16(q * s + n) with one rounding (q * s + n is exact in f32:
// a 4-bit q times an 11-bit s, added to n of at most s's exponent range plus 6 bits).
inline std::vector<double> mmf_weights_q4k(const uint8_t* row, int64_t n_in) {
  std::vector<double> w(static_cast<size_t>(n_in));
  for (int64_t b = 0; b < n_in / 256; ++b) {
    const uint8_t* blk = row + b * 144;
    uint16_t dh, mh;
    std::memcpy(&dh, blk, 2);
    std::memcpy(&mh, blk + 2, 2);
    const float d = fp16_to_f32(dh), dmin = fp16_to_f32(mh);
    const uint8_t* sc = blk + 4;
    for (int j = 0; j < 8; ++j) {
      const int s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
      const int m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
      const float s16 = fp16_to_f32(f32_to_fp16(d * static_cast<float>(s)));
      const float n16 = fp16_to_f32(f32_to_fp16(-(dmin * static_cast<float>(m))));
      for (int l = 0; l < 32; ++l) {
        const uint8_t byte = blk[16 + 32 * (j / 2) + l];
        const int q = (j % 2) ? byte >> 4 : byte & 0xF;
        w[static_cast<size_t>(b * 256 + 32 * j + l)] =
            fp16_to_f32(f32_to_fp16(static_cast<float>(q) * s16 + n16));
      }
    }
  }
  return w;
}

// ... and from a Q6_K row: s = f16(d * sc) per 16 elements, each weight f16((q - 32) * s) (the product is exact in f32).
inline std::vector<double> mmf_weights_q6k(const uint8_t* row, int64_t n_in) {
  std::vector<double> w(static_cast<size_t>(n_in));
  for (int64_t b = 0; b < n_in / 256; ++b) {
    const uint8_t* blk = row + b * 210;
    uint16_t dh;
    std::memcpy(&dh, blk + 208, 2);
    const float d = fp16_to_f32(dh);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t lo_byte = blk[64 * h + l + 32 * (k % 2)];
      const int lo = (k / 2) ? (lo_byte >> 4) : (lo_byte & 0xF);
      const int hi = (blk[128 + 32 * h + l] >> (2 * k)) & 3;
      const int q = (lo | (hi << 4)) - 32;
      const float s16 = fp16_to_f32(f32_to_fp16(d * static_cast<float>(static_cast<int8_t>(blk[192 + e / 16]))));
      w[static_cast<size_t>(b * 256 + e)] = fp16_to_f32(f32_to_fp16(static_cast<float>(q) * s16));
    }
  }
  return w;
}
inline std::vector<double> mmf_weights(DType t, const uint8_t* row, int64_t n_in) {
  return t == DType::Q6_K ? mmf_weights_q6k(row, n_in) : mmf_weights_q4k(row, n_in);
}

}  // namespace kiln::test
