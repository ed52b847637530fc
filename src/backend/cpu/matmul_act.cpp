// The fast path's activation layout (matmul_kernels.h): construction from quant/reference.h's quantizers and the
// way back to standard blocks (for tests).
#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "quant/blocks.h"
#include "quant/reference.h"
#include "util/fp16.h"

namespace kiln::cpu::detail {

namespace {
inline size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }
}  // namespace

ActLayout act_layout(DType wtype, int64_t n_in, bool bias128) {
  ActLayout l;
  l.wtype = wtype;
  l.n_in = n_in;
  l.n_pad = (n_in + 63) / 64 * 64;
  const size_t np = static_cast<size_t>(l.n_pad);
  switch (wtype) {
    case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: case DType::IQ4_NL: case DType::MXFP4:
      l.kind = ActKind::kQ8Block32;
      l.bias128 = bias128;
      l.d_off = np;
      l.row_bytes = align64(np + np / 32 * 8 * sizeof(float));
      break;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ4_XS:
    case DType::TQ1_0: case DType::TQ2_0: case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S:
    case DType::IQ3_XXS: case DType::IQ3_S: case DType::IQ1_S: case DType::IQ1_M:
      l.kind = ActKind::kQ8K;
      l.d_off = np;
      l.bsum_off = align64(l.d_off + static_cast<size_t>(n_in / QK_K) * sizeof(float));
      l.row_bytes = align64(l.bsum_off + static_cast<size_t>(n_in / 16) * sizeof(int16_t));
      break;
    default:
      l.kind = ActKind::kFloat;
      l.row_bytes = np * sizeof(float);
      break;
  }
  return l;
}

void quantize_act_row_scalar(const ActLayout& l, const float* x, uint8_t* row) {
  std::memset(row, 0, l.row_bytes);
  switch (l.kind) {
    case ActKind::kFloat: {
      float* o = reinterpret_cast<float*>(row);
      for (int64_t i = 0; i < l.n_in; ++i) {
        if (l.wtype == DType::F16) o[i] = fp16_to_f32(f32_to_fp16(x[i]));
        else if (l.wtype == DType::BF16) o[i] = bf16_to_f32(f32_to_bf16(x[i]));
        else o[i] = x[i];
      }
      break;
    }
    case ActKind::kQ8Block32: {
      float* dexp = reinterpret_cast<float*>(row + l.d_off);
      for (int64_t b = 0; b < l.n_in / QK8_0; ++b) {
        block_q8_0 blk;
        (void)quantize_row(DType::Q8_0, x + b * QK8_0, &blk, QK8_0);
        for (int k = 0; k < QK8_0; ++k)
          row[b * QK8_0 + k] = static_cast<uint8_t>(blk.qs[k]) ^ (l.bias128 ? 0x80 : 0);
        for (int k = 0; k < 8; ++k) dexp[b * 8 + k] = fp16_to_f32(blk.d);
      }
      break;
    }
    case ActKind::kQ8K: {
      float* d = reinterpret_cast<float*>(row + l.d_off);
      int16_t* bs = reinterpret_cast<int16_t*>(row + l.bsum_off);
      for (int64_t b = 0; b < l.n_in / QK_K; ++b) {
        block_q8_K blk;
        (void)quantize_row(DType::Q8_K, x + b * QK_K, &blk, QK_K);
        std::memcpy(row + b * QK_K, blk.qs, QK_K);
        d[b] = blk.d;
        std::memcpy(bs + b * 16, blk.bsums, sizeof(blk.bsums));
      }
      break;
    }
  }
}

void act_row_to_blocks(const ActLayout& l, const uint8_t* row, void* blocks) {
  switch (l.kind) {
    case ActKind::kFloat: {
      const float* v = reinterpret_cast<const float*>(row);
      for (int64_t i = 0; i < l.n_in; ++i) {
        if (l.wtype == DType::F16) static_cast<uint16_t*>(blocks)[i] = f32_to_fp16(v[i]);
        else if (l.wtype == DType::BF16) static_cast<uint16_t*>(blocks)[i] = f32_to_bf16(v[i]);
        else static_cast<float*>(blocks)[i] = v[i];
      }
      break;
    }
    case ActKind::kQ8Block32: {
      const float* dexp = reinterpret_cast<const float*>(row + l.d_off);
      block_q8_0* out = static_cast<block_q8_0*>(blocks);
      for (int64_t b = 0; b < l.n_in / QK8_0; ++b) {
        out[b].d = f32_to_fp16(dexp[b * 8]);
        for (int k = 0; k < QK8_0; ++k)
          out[b].qs[k] = static_cast<int8_t>(row[b * QK8_0 + k] ^ (l.bias128 ? 0x80 : 0));
      }
      break;
    }
    case ActKind::kQ8K: {
      const float* d = reinterpret_cast<const float*>(row + l.d_off);
      const int16_t* bs = reinterpret_cast<const int16_t*>(row + l.bsum_off);
      block_q8_K* out = static_cast<block_q8_K*>(blocks);
      for (int64_t b = 0; b < l.n_in / QK_K; ++b) {
        out[b].d = d[b];
        std::memcpy(out[b].qs, row + b * QK_K, QK_K);
        std::memcpy(out[b].bsums, bs + b * 16, sizeof(out[b].bsums));
      }
      break;
    }
  }
}

}  // namespace kiln::cpu::detail
