// Random tensor data for `kiln synth`.
//
// Scale choice: a weight matrix with n_in inputs gets element std sigma = 1/sqrt(n_in) (the caller decides), so
// y = W x keeps O(1) activations for O(1) inputs (var(y) = n_in * sigma^2 * var(x)). Per type, sigma maps to the
// f16 block scale d through the std of the random quant values:
//   Q8_0  x = d*q,          q uniform in [-127, 127]       std(q) = sqrt((255^2-1)/12) = 73.6
//   Q4_0  x = d*(q-8),      q uniform in [0, 15]           std    = sqrt((16^2-1)/12)  = 4.61
//   Q5_0  x = d*(q-16),     q uniform in [0, 31]           std    = sqrt((32^2-1)/12)  = 9.23
//   Q5_1  x = d*q + m,      q uniform in [0, 31], m = -15.5 d  (the same centred values as Q5_0)
//   Q4_K  x = d*sc*q - dmin*m, sc = m in [8, 15], dmin = 7.5 d  ->  x = d*sc*(q-7.5), std ~ d * 11.5 * 4.61
//   Q5_K  x = d*sc*q - dmin*m, q in [0, 31], sc = m in [8, 15], dmin = 15.5 d  ->  std ~ d * 11.5 * 9.23
//   Q6_K  x = d*sc*(q-32),  q uniform in [0, 63], sc in [2, 5]  std ~ d * 3.5 * 18.5
//   IQ4_NL x = d*v,          v a uniform pick of the 16 codebook values  rms(v) = sqrt(72768/16) = 67.4
//   IQ4_XS x = d*(ls-32)*v,  ls - 32 in [8, 15]             std ~ d * 11.5 * 67.4
//   MXFP4 x = 2^(e-128)*v,   v a uniform pick of the doubled FP4 values  rms(v) = sqrt(34.25) = 5.85; the scale is
//         a power of two: e = 128 + round(log2(sigma / 5.85)), minus 1 on a random half of the blocks
//   TQ1_0 / TQ2_0 x = d*(t-1), t uniform in {0, 1, 2}          std = sqrt(2/3) = 0.816
//   Q2_K  x = d*sc*q - dmin*m, q uniform in [0, 3], sc = m in [8, 15], dmin = 1.5 d  ->  std ~ d * 11.5 * 1.118
//   IQ2_XXS / IQ2_XS  x = d/8*(2 ls + 1)*g*sign, g a uniform pick of the grid's magnitudes (rms from the table,
//         ~27), ls in [8, 15], sign patterns uniform  ->  std ~ d * 3 * rms(g)
//   IQ1_S / IQ1_M  x = d*(2 ls + 1)*(g +- 1/8), g a uniform pick of the grid's {-1, 0, 1} values, ls in [4, 7]
//         ->  std ~ d * 12 * sqrt(E g^2 + 1/64)
// The i-quant blocks are random codes (uniform grid indices, sign patterns and delta signs), as the other types'
// blocks are random quants: every index a file can hold is a valid one.
// so even sigma = 1/sqrt(14336) (Llama 3 8B ffn_down) keeps every d above f16's smallest normal (6.1e-5).
// Each block's scale is jittered by +-25% so blocks differ.
#include <cmath>
#include <cstring>

#include "cli/synth.h"
#include "quant/blocks.h"
#include "quant/iq_grids.h"
#include "util/fp16.h"

namespace kiln::cli::synth {
namespace {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// splitmix64 stream for one block.
struct Rng {
  uint64_t s;
  Rng(uint64_t key, uint64_t block) : s(mix64(key ^ (block * 0xd1b54a32d192ed03ull))) {}
  uint64_t next() { return mix64(s += 0x9e3779b97f4a7c15ull); }
  void bytes(uint8_t* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t r = next();
      std::memcpy(dst + i, &r, 8);
    }
    if (i < n) {
      uint64_t r = next();
      std::memcpy(dst + i, &r, n - i);
    }
  }
  // Uniform in [0.75, 1.25).
  float jitter() { return 0.75f + static_cast<float>(next() >> 40) * (0.5f / 16777216.0f); }
};

uint16_t f16(float x) { return f32_to_fp16(x); }

// The rms of a grid's element values over all its entries (8 elements a u64: int8 when `signed_bytes`, else u8).
template <size_t N>
float grid_rms(const uint64_t (&grid)[N], bool signed_bytes) {
  double s = 0;
  for (const uint64_t e : grid)
    for (int j = 0; j < 8; ++j) {
      const uint8_t b = static_cast<uint8_t>(e >> (8 * j));
      const double v = signed_bytes ? static_cast<int8_t>(b) : b;
      s += v * v;
    }
  return static_cast<float>(std::sqrt(s / (8.0 * N)));
}

// IQ1 values: rms of g +- 1/8 over the grid (the delta's sign uniform).
float iq1_rms() {
  const float g = grid_rms(kIq1sGrid, true);
  return std::sqrt(g * g + kIq1Delta * kIq1Delta);
}

template <class Block, class Make>
gguf::Writer::FillFn blocks(uint64_t key, Make make) {
  return [key, make](uint8_t* dst, uint64_t begin, uint64_t n) {
    const uint64_t b0 = begin / sizeof(Block);
    const uint64_t nb = n / sizeof(Block);
    for (uint64_t i = 0; i < nb; ++i) {
      Block blk;
      Rng rng(key, b0 + i);
      make(blk, rng);
      std::memcpy(dst + i * sizeof(Block), &blk, sizeof(Block));
    }
  };
}

// Element e's 16 random bits: four elements share one hash (deterministic per element, independent of chunking).
inline uint32_t bits16(uint64_t key, uint64_t e) {
  return static_cast<uint32_t>(mix64(key ^ ((e >> 2) * 0xd1b54a32d192ed03ull)) >> (16 * (e & 3))) & 0xffff;
}
inline float unit(uint32_t b16) { return static_cast<float>(b16) * (2.0f / 65536.0f) - 1.0f; }  // [-1, 1)

}  // namespace

gguf::Writer::FillFn uniform_f32(uint64_t key, float center, float spread) {
  return [key, center, spread](uint8_t* dst, uint64_t begin, uint64_t n) {
    const uint64_t e0 = begin / 4;
    for (uint64_t i = 0; i < n / 4; ++i) {
      const float x = center + spread * unit(bits16(key, e0 + i));
      std::memcpy(dst + 4 * i, &x, 4);
    }
  };
}

Result<gguf::Writer::FillFn> random_weights(DType type, uint64_t key, float sigma) {
  switch (type) {
    case DType::F32:
      // Uniform in [-a, a] has std a/sqrt(3).
      return uniform_f32(key, 0.0f, sigma * std::sqrt(3.0f));
    case DType::F16: {
      const float a = sigma * std::sqrt(3.0f);
      return gguf::Writer::FillFn([key, a](uint8_t* dst, uint64_t begin, uint64_t n) {
        const uint64_t e0 = begin / 2;
        for (uint64_t i = 0; i < n / 2; ++i) {
          const uint16_t h = f16(a * unit(bits16(key, e0 + i)));
          std::memcpy(dst + 2 * i, &h, 2);
        }
      });
    }
    case DType::Q8_0: {
      const float d = sigma / 73.6f;
      return blocks<block_q8_0>(key, [d](block_q8_0& b, Rng& r) {
        r.bytes(reinterpret_cast<uint8_t*>(b.qs), sizeof(b.qs));
        for (int8_t& q : b.qs) q = q == -128 ? -127 : q;
        b.d = f16(d * r.jitter());
      });
    }
    case DType::Q4_0: {
      const float d = sigma / 4.61f;
      return blocks<block_q4_0>(key, [d](block_q4_0& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        b.d = f16(d * r.jitter());
      });
    }
    case DType::Q5_0: {
      const float d = sigma / 9.23f;
      return blocks<block_q5_0>(key, [d](block_q5_0& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        r.bytes(b.qh, sizeof(b.qh));
        b.d = f16(d * r.jitter());
      });
    }
    case DType::Q5_1: {
      const float d = sigma / 9.23f;
      return blocks<block_q5_1>(key, [d](block_q5_1& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        r.bytes(b.qh, sizeof(b.qh));
        b.d = f16(d * r.jitter());
        b.m = f16(-15.5f * fp16_to_f32(b.d));
      });
    }
    case DType::Q4_K: {
      const float d = sigma / (11.5f * 4.61f);
      return blocks<block_q4_K>(key, [d](block_q4_K& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        // 8 sub-blocks, scale sc_j = min m_j in [8, 15] (4 bits, so the 6-bit packing's high bits stay 0):
        // j < 4: scales[j] = sc_j, scales[j+4] = m_j; j >= 4: scales[j+4] = sc_j | m_j << 4.
        const uint64_t bits = r.next();
        for (int j = 0; j < 8; ++j) {
          const uint8_t sc = static_cast<uint8_t>(8 + ((bits >> (4 * j)) & 7));
          if (j < 4) {
            b.scales[j] = sc;
            b.scales[j + 4] = sc;
          } else {
            b.scales[j + 4] = static_cast<uint8_t>(sc | (sc << 4));
          }
        }
        const float dj = d * r.jitter();
        b.d = f16(dj);
        b.dmin = f16(7.5f * fp16_to_f32(b.d));
      });
    }
    case DType::Q5_K: {
      const float d = sigma / (11.5f * 9.23f);
      return blocks<block_q5_K>(key, [d](block_q5_K& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        r.bytes(b.qh, sizeof(b.qh));
        const uint64_t bits = r.next();  // scales packed as for Q4_K (sc = m in [8, 15])
        for (int j = 0; j < 8; ++j) {
          const uint8_t sc = static_cast<uint8_t>(8 + ((bits >> (4 * j)) & 7));
          if (j < 4) {
            b.scales[j] = sc;
            b.scales[j + 4] = sc;
          } else {
            b.scales[j + 4] = static_cast<uint8_t>(sc | (sc << 4));
          }
        }
        b.d = f16(d * r.jitter());
        b.dmin = f16(15.5f * fp16_to_f32(b.d));
      });
    }
    case DType::IQ4_NL: {
      const float d = sigma / 67.4f;
      return blocks<block_iq4_nl>(key, [d](block_iq4_nl& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        b.d = f16(d * r.jitter());
      });
    }
    case DType::IQ4_XS: {
      const float d = sigma / (11.5f * 67.4f);
      return blocks<block_iq4_xs>(key, [d](block_iq4_xs& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        const uint64_t bits = r.next();  // ls = 40 + 3 random bits: low nibble 8..15, high bits 2
        b.scales_h = 0xAAAA;
        for (int s = 0; s < 8; s += 2)
          b.scales_l[s / 2] = static_cast<uint8_t>((8 + ((bits >> (3 * s)) & 7)) | ((8 + ((bits >> (3 * s + 3)) & 7)) << 4));
        b.d = f16(d * r.jitter());
      });
    }
    case DType::MXFP4: {
      const int e = 128 + static_cast<int>(std::lround(std::log2(sigma / 5.85f)));
      if (e < 2 || e > 254) return make_error(ErrorCode::kInvalidArgument, "synth: MXFP4 scale for std %g", sigma);
      return blocks<block_mxfp4>(key, [e](block_mxfp4& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        b.e = static_cast<uint8_t>(e - static_cast<int>(r.next() & 1));
      });
    }
    case DType::Q6_K: {
      const float d = sigma / (3.5f * 18.5f);
      return blocks<block_q6_K>(key, [d](block_q6_K& b, Rng& r) {
        r.bytes(b.ql, sizeof(b.ql));
        r.bytes(b.qh, sizeof(b.qh));
        const uint64_t bits = r.next();
        for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(2 + ((bits >> (2 * j)) & 3));
        b.d = f16(d * r.jitter());
      });
    }
    case DType::TQ1_0: {
      const float d = sigma / 0.816f;
      return blocks<block_tq1_0>(key, [d](block_tq1_0& b, Rng& r) {
        // base-3 numbers of 5 (qh: 4, shifted up one trit) uniform trits, packed as blocks.h says
        for (uint8_t& q : b.qs) q = static_cast<uint8_t>((r.next() % 243 * 256 + 242) / 243);
        for (uint8_t& q : b.qh) q = static_cast<uint8_t>((r.next() % 81 * 3 * 256 + 242) / 243);
        b.d = f16(d * r.jitter());
      });
    }
    case DType::TQ2_0: {
      const float d = sigma / 0.816f;
      return blocks<block_tq2_0>(key, [d](block_tq2_0& b, Rng& r) {
        for (uint8_t& q : b.qs) {
          const uint64_t v = r.next();
          q = static_cast<uint8_t>(v % 3 | (v / 3 % 3) << 2 | (v / 9 % 3) << 4 | (v / 27 % 3) << 6);
        }
        b.d = f16(d * r.jitter());
      });
    }
    case DType::Q2_K: {
      const float d = sigma / (11.5f * 1.118f);
      return blocks<block_q2_K>(key, [d](block_q2_K& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        const uint64_t bits = r.next();
        for (int j = 0; j < 16; ++j) {
          const uint8_t sc = static_cast<uint8_t>(8 + ((bits >> (3 * j)) & 7));
          b.scales[j] = static_cast<uint8_t>(sc | (sc << 4));
        }
        b.d = f16(d * r.jitter());
        b.dmin = f16(1.5f * fp16_to_f32(b.d));
      });
    }
    case DType::IQ2_XXS: {
      const float d = sigma / (3.0f * grid_rms(kIq2xxsGrid, false));
      return blocks<block_iq2_xxs>(key, [d](block_iq2_xxs& b, Rng& r) {
        for (int s = 0; s < 8; ++s) {  // 4 index bytes, then 4 x 7 sign-index bits and ls in [8, 15]
          const uint64_t v = r.next();
          const uint32_t aux = static_cast<uint32_t>(v >> 32) & 0x0FFFFFFFu;
          const uint32_t ls = 8 + (static_cast<uint32_t>(v >> 60) & 7);
          const uint32_t w[2] = {static_cast<uint32_t>(v), aux | ls << 28};
          std::memcpy(&b.qs[4 * s], w, 8);
        }
        b.d = f16(d * r.jitter());
      });
    }
    case DType::IQ2_XS: {
      const float d = sigma / (3.0f * grid_rms(kIq2xsGrid, false));
      return blocks<block_iq2_xs>(key, [d](block_iq2_xs& b, Rng& r) {
        r.bytes(reinterpret_cast<uint8_t*>(b.qs), sizeof(b.qs));  // 9-bit index | 7-bit sign index: any 16 bits
        const uint64_t bits = r.next();
        for (int s = 0; s < 8; ++s)
          b.scales[s] = static_cast<uint8_t>((8 + ((bits >> (6 * s)) & 7)) | (8 + ((bits >> (6 * s + 3)) & 7)) << 4);
        b.d = f16(d * r.jitter());
      });
    }
    case DType::IQ1_S: {
      const float d = sigma / (12.0f * iq1_rms());
      return blocks<block_iq1_s>(key, [d](block_iq1_s& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        for (uint16_t& h : b.qh) {  // 12 index bits, ls in [4, 7] at bits 12-14, the delta's sign at bit 15
          const uint64_t v = r.next();
          h = static_cast<uint16_t>((v & 0x0FFF) | (4 + ((v >> 12) & 3)) << 12 | ((v >> 14) & 1) << 15);
        }
        b.d = f16(d * r.jitter());
      });
    }
    case DType::IQ1_M: {
      const float d = sigma / (12.0f * iq1_rms());
      return blocks<block_iq1_m>(key, [d](block_iq1_m& b, Rng& r) {
        r.bytes(b.qs, sizeof(b.qs));
        r.bytes(b.qh, sizeof(b.qh));  // per group: 3 index bits and the delta's sign
        const uint16_t dh = f16(d * r.jitter());
        const uint64_t bits = r.next();
        for (int k = 0; k < 4; ++k) {  // 4 scales of 3 bits in [4, 7], then 4 bits of d
          uint16_t u = static_cast<uint16_t>(((dh >> (4 * k)) & 0xF) << 12);
          for (int j = 0; j < 4; ++j) u |= static_cast<uint16_t>((4 + ((bits >> (8 * k + 2 * j)) & 3)) << (3 * j));
          std::memcpy(&b.scales[2 * k], &u, 2);
        }
      });
    }
    default:
      return make_error(ErrorCode::kUnsupported, "synth cannot generate %s tensors", dtype_name(type));
  }
}

}  // namespace kiln::cli::synth
