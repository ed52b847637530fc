// The numerics of every backend op, on every backend of this build (tests/common/backend_test_util.h: "cpu",
// "cpu_ref", and "cuda_N" in a CUDA build — skipped with the reason where there is no GPU). Tensors are allocated,
// written and read through the backend under test only; inputs are random (never zero); outputs are poisoned with
// NaN bytes before each op, so an op that leaves an element unwritten fails. Every op is compared with a scalar
// oracle written here (double accumulation), never with another backend. The error contract and supports() are in
// test_backend_ops_contract.cpp.
//
// Thresholds, argued per op from its numerics (u = 2^-24, the f32 unit roundoff). None is tuned to pass.
//   - exact (0): get_rows of F32/F16/BF16/Q4_0/Q5_0/Q8_0/Q8_1/IQ4_NL/IQ4_XS/MXFP4/TQ1_0/TQ2_0/IQ2_XXS..IQ1_M (every value is an
//     f16 scale times a small integer, exact in f32: IQ4_XS's f16 d times a 6-bit scale times a 7-bit codebook value
//     has 24 significant bits at most; MXFP4's is a power of two times an integer; the ternary types' d times -1..2;
//     the i-quant grid types' d times (2 ls + 1) / 8 (or / 4, or 1) times a grid value of <= 6 bits: <= 22 bits);
//     add, mul, scale (one f32 operation
//     per element); argmax; copy/convert (round-to-nearest-even
//     f32 -> f16/bf16, exact widening); kv_store to every cache type, K and V each its own (f32 bits, f16/bf16
//     nearest even, the quantized types' spec quantizer: the cache bits are what the parity tests compare across
//     backends); rope at position 0 and on dims past n_rot; attention of a token that sees one position (its weight
//     is exp(0)/exp(0) = 1: the output is that V row).
//   - get_rows of Q4_1/Q5_1/k-quants: d*q + m and d*sc*q - dmin*m round twice; a device may contract them into an
//     FMA: |err| <= 2^-20 * max|row| (a few ulp of the row's largest value).
//   - rms_norm: squares summed in double (CPU) or an f32 tree reduction (<= (log2 d + 16) u on the sum, halved by
//     the square root), then ~6 f32 roundings: relative 2e-6 per element.
//   - matmul: two checks.
//     (1) Every backend, against exact math on the dequantized weights and the unquantized f32 activations. A
//         matmul may quantize its activations: to 8 bits in blocks of 32 with an f16 scale (Q8_0; Q8_1 adds the
//         f16 block sum s = d * sum q) or blocks of 256 with an f32 scale (Q8_K), to f16 for F16 weights, to bf16
//         for BF16. Per element of x that is an error of at most E = 0.57 * amax32/127 (half a step plus the f16
//         rounding of the scale: 127 * 2^-11 = 0.062 of a step) or 0.51 * amax256/127 for 8 bits, 2^-11 |x| for
//         f16, 2^-8 |x| for bf16, 0 for f32. The bound per output is sum_i |w_i| E_i, plus 2^-11 * max|w_block| *
//         sum|x_block| per block for the rounded Q8_1 sum (it multiplies the weights' offset: q4_0's 8d, q4_1's m,
//         the k-quants' dmin*m, each at most max|w_block|), plus (n_in + 16) u sum (|w_i| + max|w_block|) |x_i| for
//         the f32 accumulation of the block terms. It holds for every input, never flakes, and catches a wrong
//         block, scale or row. Its statistical twin: a rounding error is uniform within half a step D (8 bits:
//         D = amax/127 of the coarser block, 32 or 256; f16: D <= 2^-10 |x|; bf16: D <= 2^-7 |x|; f32: 0), variance
//         D^2/12, so an output's expected squared error is sum_i w_i^2 D_i^2/12; the NMSE threshold is 3x the sum of
//         these over all outputs divided by sum y^2 (>= 37 outputs averaged: the estimate's spread is ~23%), plus
//         1e-10 for the f32 accumulation. (For Gaussian x that is ~7e-5 for 8-bit blocks of 32, ~1.4e-4 for 256,
//         ~2.4e-7 for f16, ~1.5e-5 for bf16; heavier-tailed x, e.g. rms_norm(x) * gamma, has larger block maxima and
//         gets a larger threshold from the same formula.)
//     (2) Where the backend documents its activation quantization, against that exact quantization (spec
//         quantizer, quant/reference.h) with the dot products in double: the CPU (backend/cpu/matmul.h: Q8_0 for
//         Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4, Q8_1 for Q4_1/Q5_1 (the oracle uses the block's stored f16 sum s, as the
//         kernel does), Q8_K for Q2_K..Q6_K, IQ4_XS, TQ1_0/TQ2_0 and the i-quant grid types, f16 / bf16 / f32 for F16 / BF16 / F32) differs only by
//         the f32 rounding of its
//         per-block terms and their sum: NMSE 1e-10. The GPU GEMM path (documented for the CUDA backend) quantizes
//         activations to Q8_1 for every quantized weight type — blocks of 32, an f16 scale d and an f16 sum s =
//         d * sum q — and runs integer dot products (dp4a / int8 MMA) per block, the weight offsets (q4_0's -8,
//         q4_1's m, the k-quants' mins) applied through s; its error vs exact math is that of 8-bit activations,
//         check (1), and vs the Q8_1 model it differs by the f16 rounding of s (relative 2^-12 on average, times an
//         offset of the size of the block's largest weight): NMSE ~2.4e-7 -> 1e-6.
//   - matmul_group: each product bit for bit the backend's own matmul (the contract), and check (1).
//   - rope: the angle theta_i = pos * base^(-2i/n_rot) * freq_scale / ff_i is built in f32 (ggml: a powf, then i
//     repeated multiplications): |d theta| <= theta (3i + 6) u, cos/sin add 4u; an exact rotation of a pair of norm
//     r moved by that angle: |err| <= (|d theta| + 8u) r per element (at position 4095 this is ~1e-3 r: f32 angles,
//     as in llama.cpp).
//   - attention: exact math in double on the cache values as stored (f32; f16/bf16-rounded; the quantized types
//     dequantized by the spec; K and V each of its own type). A score
//     s_j off by at most delta changes each softmax weight by a factor within e^(+-2 delta), so per element
//     |err| <= (e^(2 delta) - 1 + eps_p + (kv_len + 8) 2u) sum_j p_j |v_j|, with delta = scale * sum_i |q_i k_i|
//     * (eps_q + (hd + 4) u) (eps_q: the rounding the backend applies to q before q.k: 0 on the CPU, which keeps q
//     f32 as llama.cpp's tiled CPU attention does, 2^-11 on f16 caches on a GPU, which rounds q to f16; eps_p:
//     probabilities rounded to f16 before P.V on a GPU, 0 on the CPU). NMSE: f32 q.k: 1e-10; q in f16: the score error has std
//     scale * sqrt(sum_i (q_i k_i)^2) * 2^-11/sqrt(3) = 2 * 2.8e-4 = 5.6e-4 for our q (sigma 2) and k (sigma 1),
//     and the output's relative error is about that (softmax weights move by that factor): NMSE ~3e-7 -> 3e-6.
//     (A GPU that quantizes q to Q8_1 for a q8_0 cache: step amax32(q)/127 ~ 0.033, score error std ~0.0095,
//     NMSE ~9e-5 -> 1e-3.) And against exact math on the f32 K/V before storage, the error each cache type's
//     rounding predicts: with eta / eps the K / V storage errors of a row (independent, zero mean, of that head
//     row's measured mean square), to first order output i moves by sum_j p_j (delta_j (v_ji - o_i) + eps_ji),
//     delta_j = scale q . eta_j, so E[err_i^2] = sum_j p_j^2 (E[delta_j^2] (v_ji - o_i)^2 + E[eps_j^2]); the NMSE
//     threshold is 3x the sum of these over all outputs / sum o^2 (measured within 25% of it for every type, from
//     f16's ~1e-7 to q4_0's ~2e-2), plus the arithmetic's NMSE threshold above.
//   - swiglu: exp within 2 ulp (CPU SIMD polynomial; expf on a GPU), then an add, a division and two products:
//     relative 1e-6 per element (16 u).
//   - softmax: x_i - max rounds with |err| <= u |x_i - max|, which exp turns into a relative error of the same
//     size; exp adds 2u, the sum of d positive terms in f32 at most d u, the normalization u: per element
//     |err| <= y (u |x_i - max| + (d + 16) u).
//   - fused ops: the decomposition's thresholds vs the oracle (matmul_swiglu: the products' bounds carried through
//     silu, |silu'| <= 1.1), and vs the backend's own decomposition: bit for bit on the CPU (it keeps the
//     defaults), else NMSE 1e-10 (the same activation quantization, another summation order).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <sstream>

#include "common/backend_test_util.h"
#include "quant/blocks.h"

#ifdef KILN_HAVE_CUDA
namespace kiln::cuda {
const char* matmul_kernel_for(DType t, int64_t n_in, int64_t n_out, int64_t n_tok);  // matmul_select.cu
}  // namespace kiln::cuda
#endif

namespace kiln {
namespace {

using test::BackendOpsTest;
using test::DevTensor;
using test::dev_alloc;
using test::dev_f32;
using test::dev_i32;
using test::dev_read;
using test::dev_read_bytes;
using test::dev_read_whole;
using test::dev_upload;
using test::kU;
using test::nmse_d;
using test::randn;

class BackendOps : public BackendOpsTest {};

// ---- independent scalar conversions (not util/fp16.h) ----------------------------------------------------------
float round_f16(float x) {
#if defined(__FLT16_MAX__)
  return static_cast<float>(static_cast<_Float16>(x));  // the compiler's IEEE conversion: nearest even
#else
  return fp16_to_f32(f32_to_fp16(x));
#endif
}
uint16_t f16_bits(float x) {
#if defined(__FLT16_MAX__)
  const _Float16 h = static_cast<_Float16>(x);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
#else
  return f32_to_fp16(x);
#endif
}
float f16_value(uint16_t b) {
#if defined(__FLT16_MAX__)
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
#else
  return fp16_to_f32(b);
#endif
}
// bf16: the top 16 bits of f32 rounded to nearest even; NaN stays NaN (quiet).
uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t lsb = (u >> 16) & 1;
  return static_cast<uint16_t>((u + 0x7FFF + lsb) >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float round_bf16(float x) { return bf16_value(bf16_bits(x)); }

// Counts elements with |got - ref| > tol(i) (NaN counts) and reports the worst few.
template <class Tol>
void expect_close(const std::vector<float>& got, const std::vector<double>& ref, Tol tol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0;
  std::ostringstream os;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double t = tol(i);
    if (!(err <= t)) {
      if (bad < 4) os << "\n  [" << i << "] got " << got[i] << " want " << ref[i] << " |err| " << err << " > " << t;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size() << " elements out of tolerance" << os.str();
}
void expect_exact(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && !(std::isnan(got[i]) && std::isnan(want[i])))
      if (bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " differ; first [" << first << "] got "
                     << (bad ? got[first] : 0.f) << " want " << (bad ? want[first] : 0.f);
}

// The 27 types with a spec dequantizer and the 25 matmul weight types (backend/cpu/matmul.h). The i-quant grid
// types have no kiln quantizer: their weights are random blocks (test::weight_rows).
const DType kDequantTypes[] = {DType::F32,     DType::F16,    DType::BF16,    DType::Q4_0,   DType::Q4_1,
                               DType::Q5_0,    DType::Q5_1,   DType::Q8_0,    DType::Q8_1,   DType::Q2_K,
                               DType::Q3_K,    DType::Q4_K,   DType::Q5_K,    DType::Q6_K,   DType::Q8_K,
                               DType::IQ4_NL,  DType::IQ4_XS, DType::MXFP4,   DType::TQ1_0,  DType::TQ2_0,
                               DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,   DType::IQ3_XXS, DType::IQ3_S,
                               DType::IQ1_S,   DType::IQ1_M};
const DType kMatmulTypes[] = {DType::F32,     DType::F16,    DType::BF16,   DType::Q4_0,    DType::Q4_1,
                              DType::Q5_0,    DType::Q5_1,   DType::Q8_0,   DType::Q2_K,    DType::Q3_K,
                              DType::Q4_K,    DType::Q5_K,   DType::Q6_K,   DType::IQ4_NL,  DType::IQ4_XS,
                              DType::MXFP4,   DType::TQ1_0,  DType::TQ2_0,  DType::IQ2_XXS, DType::IQ2_XS,
                              DType::IQ2_S,   DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S,   DType::IQ1_M};

// ================================================================================================================
// get_rows
// ================================================================================================================
TEST_P(BackendOps, GetRowsEveryDequantizableType) {
  const int64_t rows = 11;
  const std::vector<int32_t> ids = {10, 0, 3, 3, 7, 1, 10, 5, 9};
  for (DType t : kDequantTypes) {
    if (!be().supports(Op::kGetRows, t)) continue;  // (the contract test checks supports() against the op)
    const int64_t d = dtype_block_size(t) == 256 ? 512 : 288 + (dtype_block_size(t) == 1 ? 5 : 0);
    const std::vector<float> src = randn(static_cast<size_t>(d * rows), 100 + static_cast<uint32_t>(t));
    const std::vector<uint8_t> w = test::weight_rows(t, src, d);
    const std::vector<float> deq = test::dequantize_rows(t, w, d);  // the format's values (spec dequantizer)
    const DevTensor wt = dev_upload(be(), t, w, d, rows);
    const DevTensor it = dev_i32(be(), ids);
    const DevTensor out = dev_alloc(be(), DType::F32, d, static_cast<int64_t>(ids.size()));
    KILN_ASSERT_OK(be().get_rows(wt.t, it.t, out.t));
    const std::vector<float> got = dev_read<float>(be(), out);
    const bool exact = t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q4_0 ||
                       t == DType::Q5_0 || t == DType::Q8_0 || t == DType::Q8_1 || t == DType::IQ4_NL ||
                       t == DType::IQ4_XS || t == DType::MXFP4 || t == DType::TQ1_0 || t == DType::TQ2_0 ||
                       is_iquant_grid(t);
    std::vector<double> want(got.size());
    std::vector<float> wantf(got.size());
    double rowmax = 0;
    for (size_t r = 0; r < ids.size(); ++r)
      for (int64_t i = 0; i < d; ++i) {
        wantf[r * d + i] = deq[ids[r] * d + i];
        want[r * d + i] = wantf[r * d + i];
        rowmax = std::max(rowmax, std::fabs(want[r * d + i]));
      }
    if (exact)
      expect_exact(got, wantf, std::string("get_rows ") + dtype_name(t));
    else
      expect_close(got, want, [&](size_t) { return std::ldexp(rowmax, -20); }, std::string("get_rows ") + dtype_name(t));
  }
}

// ================================================================================================================
// rms_norm
// ================================================================================================================
TEST_P(BackendOps, RmsNorm) {
  for (int64_t d : {1, 17, 64, 255, 4096})
    for (int64_t n : {1, 3, 33})
      for (bool with_w : {false, true})
        for (bool in_place : {false, true}) {
          const float eps = d == 17 ? 1e-2f : 1e-6f;
          const std::vector<float> x = randn(static_cast<size_t>(d * n), 2 + static_cast<uint32_t>(d + n), 3.0f);
          const std::vector<float> w = randn(static_cast<size_t>(d), 5);
          const DevTensor xt = dev_f32(be(), x, d, n), wt = dev_f32(be(), w, d);
          const DevTensor out = in_place ? DevTensor{} : dev_alloc(be(), DType::F32, d, n);
          const Tensor& dst = in_place ? xt.t : out.t;
          KILN_ASSERT_OK(be().rms_norm(xt.t, with_w ? wt.t : Tensor{}, eps, dst));
          const std::vector<float> got = dev_read<float>(be(), in_place ? xt : out);
          std::vector<double> want(x.size());
          for (int64_t r = 0; r < n; ++r) {
            double ss = 0;
            for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[r * d + i]) * x[r * d + i];
            const double s = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
            for (int64_t i = 0; i < d; ++i) want[r * d + i] = x[r * d + i] * s * (with_w ? w[i] : 1.0);
          }
          std::ostringstream what;
          what << "rms_norm d=" << d << " n=" << n << " w=" << with_w << " in_place=" << in_place;
          expect_close(got, want, [&](size_t i) { return 2e-6 * std::fabs(want[i]); }, what.str());
        }
}

// ================================================================================================================
// matmul
// ================================================================================================================

// The activation quantization a backend documents for weight type w (check (2) in the header), with its NMSE.
struct ActModel {
  DType act;    // F32: none; F16 / BF16: rounded; Q8_0 / Q8_1 / Q8_K: quantized with the spec quantizer
  double nmse;  // the threshold vs the model
  // Q8_1 with the scale and the block sum kept in f32 (the CUDA GEMV: backend/cuda/quantize.cu): d = amax / 127,
  // q = round(x * (1/d)) clamped to +-127, s = d * sum(q) exactly; no f16 rounding anywhere.
  bool f32_scales = false;
  // Weights rounded to f16 before the products (the CUDA many-token path dequantizes into f16 rows).
  bool w_f16 = false;
  // The weights CUDA's mmf forms (two f16 roundings: the sub-block scale, then the weight; mmf_weights_q4k).
  bool w_mmf = false;
};
std::optional<ActModel> act_model(const std::string& backend, DType w, int64_t n_in, int64_t n_out, int64_t n_tok) {
  const bool quantized = dtype_traits(w).is_quantized;
  if (backend == "cpu" || backend == test::kCpuRefId) {
    switch (w) {
      case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: case DType::IQ4_NL: case DType::MXFP4:
        return ActModel{DType::Q8_0, 1e-10};
      case DType::Q4_1: case DType::Q5_1: return ActModel{DType::Q8_1, 1e-10};
      case DType::F32: case DType::F16: case DType::BF16: return ActModel{w, 1e-10};
      default: return ActModel{DType::Q8_K, 1e-10};
    }
  }
  // CUDA, the GEMVs and the GEMM (matmul_select.cu: mmvq, mmq): q8_1 blocks of 32 with f32 scales and sums, integer
  // dot products, f32 scaling (quantize.cu, mmvq.cu, mmq.cuh). Modelled exactly up to f32 summation order: 1e-10 as
  // for the CPU. Where the selector takes dequantize + cuBLAS (gemm_blas.cu): weights and x rounded to f16, f32
  // accumulation; 1e-9: the device's fused d*q+m and the host dequantizer's dl*q-ml round to different f16 in
  // ~2^-12 of the weights (~6e-11), plus f32 accumulation.
  // Where it takes mmf (mmf.cuh): x rounded to f16, the weights as mmf forms them, f32 accumulation: 1e-10.
  if (backend.rfind("cuda", 0) == 0 && quantized) {
#ifdef KILN_HAVE_CUDA
    const std::string k = cuda::matmul_kernel_for(w, n_in, n_out, n_tok);
#else
    const std::string k = n_tok > 32 ? "blas" : "mmq";
#endif
    if (k == "mmf") return ActModel{DType::F16, 1e-10, false, false, true};
    return k == "blas" ? ActModel{DType::F16, 1e-9, false, true} : ActModel{DType::Q8_1, 1e-10, true};
  }
  return std::nullopt;
}

// x row (n values) as the model's activation type sees it; *corr gets, for Q8_1 with offset weights, the block
// sums' f16 rounding that the kernel applies through s (per block b: s16_b - d16_b * sum q_b).
std::vector<double> model_activation(DType act, const float* x, int64_t n, std::vector<double>* sum_err,
                                     bool f32_scales = false) {
  std::vector<double> a(static_cast<size_t>(n));
  sum_err->assign(static_cast<size_t>(n / 32), 0.0);
  if (act == DType::Q8_1 && f32_scales) {
    for (int64_t k = 0; k < n / 32; ++k) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * k + j]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      for (int j = 0; j < 32; ++j) {
        const float q = std::fmin(std::fmax(std::round(x[32 * k + j] * id), -127.0f), 127.0f);
        a[32 * k + j] = static_cast<double>(d) * q;  // s = d * sum(q) exactly: no sum error
      }
    }
  } else if (act == DType::F32) {
    for (int64_t i = 0; i < n; ++i) a[i] = x[i];
  } else if (act == DType::F16) {
    for (int64_t i = 0; i < n; ++i) a[i] = round_f16(x[i]);
  } else if (act == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) a[i] = round_bf16(x[i]);
  } else {
    const std::vector<float> xv(x, x + n);
    const std::vector<uint8_t> q = test::quantize_rows(act, xv, n);
    const std::vector<float> deq = test::dequantize_rows(act, q, n);
    for (int64_t i = 0; i < n; ++i) a[i] = deq[i];
    if (act == DType::Q8_1) {
      const block_q8_1* b = reinterpret_cast<const block_q8_1*>(q.data());
      for (int64_t k = 0; k < n / 32; ++k) {
        int sum = 0;
        for (int j = 0; j < 32; ++j) sum += b[k].qs[j];
        (*sum_err)[k] = static_cast<double>(f16_value(b[k].s)) - static_cast<double>(f16_value(b[k].d)) * sum;
      }
    }
  }
  return a;
}

// The offset of weight block k (32 values) of row o for the Q8_1 sum correction: q4_1/q5_1's m (the CPU kernels
// use s only there); 0 for other types.
double weight_block_offset(DType t, const uint8_t* row, int64_t k) {
  if (t == DType::Q4_1) return f16_value(reinterpret_cast<const block_q4_1*>(row)[k].m);
  if (t == DType::Q5_1) return f16_value(reinterpret_cast<const block_q5_1*>(row)[k].m);
  return 0.0;
}

struct MatmulCase {
  DType t;
  int64_t n_in, n_out, n_tok;
  std::vector<uint8_t> w;    // GGUF bytes
  std::vector<float> wdeq;   // [n_out][n_in] the weights' values
  std::vector<float> x;      // [n_tok][n_in]
  std::vector<float> bias;   // [n_out] or empty
};

MatmulCase make_matmul_case(DType t, int64_t n_tok, bool bias, uint32_t seed, int64_t n_out = 37) {
  MatmulCase c;
  c.t = t;
  c.n_in = dtype_block_size(t) == 256 ? 768 : dtype_block_size(t) == 32 ? 288 : 300;
  c.n_out = n_out;
  c.n_tok = n_tok;
  c.w = test::weight_rows(t, randn(static_cast<size_t>(c.n_in * n_out), seed, 0.5f), c.n_in);
  c.wdeq = test::dequantize_rows(t, c.w, c.n_in);
  c.x = randn(static_cast<size_t>(c.n_in * n_tok), seed + 1, 1.5f);
  if (bias) c.bias = randn(static_cast<size_t>(n_out), seed + 2);
  return c;
}

// Check (1): exact math on the dequantized weights: per output the value, the rigorous bound and the expected
// squared error of the activation rounding (header).
struct ExactMatmul {
  std::vector<double> want, bound, var;
};
ExactMatmul exact_matmul(const MatmulCase& c) {
  const bool q = dtype_traits(c.t).is_quantized;
  const int64_t n = c.n_in;
  ExactMatmul r;
  r.want.resize(static_cast<size_t>(c.n_out * c.n_tok)), r.bound.resize(r.want.size()), r.var.resize(r.want.size());
  std::vector<double> E(static_cast<size_t>(n)), V(static_cast<size_t>(n));  // max error and variance per x_i
  for (int64_t t = 0; t < c.n_tok; ++t) {
    const float* x = c.x.data() + t * n;
    for (int64_t i = 0; i < n; ++i) {
      const double ax = std::fabs(static_cast<double>(x[i]));
      if (!q) {
        E[i] = c.t == DType::F16 ? std::ldexp(ax, -11) : c.t == DType::BF16 ? std::ldexp(ax, -8) : 0.0;
        const double step = c.t == DType::F16 ? std::ldexp(ax, -10) : c.t == DType::BF16 ? std::ldexp(ax, -7) : 0.0;
        V[i] = step * step / 12;
        continue;
      }
      double a32 = 0, a256 = 0;
      for (int64_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j) a32 = std::max(a32, std::fabs(static_cast<double>(x[j])));
      if (n % 256 == 0)
        for (int64_t j = i / 256 * 256; j < i / 256 * 256 + 256; ++j) a256 = std::max(a256, std::fabs(static_cast<double>(x[j])));
      E[i] = std::max(0.57 * a32 / 127, 0.51 * a256 / 127);
      const double step = std::max(a32, a256) / 127;
      V[i] = step * step / 12;
    }
    for (int64_t o = 0; o < c.n_out; ++o) {
      const float* w = c.wdeq.data() + o * n;
      double y = 0, b = 0, acc = 0, var = 0;
      for (int64_t k = 0; k < (n + 31) / 32; ++k) {
        double wmax = 0, xsum = 0;
        const int64_t e = std::min<int64_t>(n, 32 * k + 32);
        for (int64_t i = 32 * k; i < e; ++i) wmax = std::max(wmax, std::fabs(static_cast<double>(w[i])));
        for (int64_t i = 32 * k; i < e; ++i) {
          y += static_cast<double>(w[i]) * x[i];
          b += std::fabs(w[i]) * E[i];
          var += static_cast<double>(w[i]) * w[i] * V[i];
          acc += (std::fabs(w[i]) + (q ? wmax : 0.0)) * std::fabs(x[i]);
          xsum += std::fabs(x[i]);
        }
        if (q) b += std::ldexp(wmax * xsum * 1.01, -11);
      }
      if (!c.bias.empty()) y += c.bias[o];
      r.want[t * c.n_out + o] = y;
      // F16 / BF16 on CUDA for n_tok > 32 (backend/cuda/mmq.cuh: tensor-core mma with f32 accumulation): x is
      // rounded to the weight type there as on the CPU (the E term above) and the products are exact in f32, but the
      // tensor core's accumulation is not round-to-nearest: the addends of one MMA are aligned to the largest
      // exponent and truncated. Modelled as chopped arithmetic (error of an addition < 1 ulp = 2u instead of RN's
      // u), the recursive-summation term doubles: 2 (n + 16) u acc for these two types (the CPU's RN sums stay well
      // inside it). The NMSE check (expected activation-rounding variance) is unchanged and still catches a wrong
      // result.
      const double acc_u = (c.t == DType::F16 || c.t == DType::BF16) ? 2 * kU : kU;
      r.bound[t * c.n_out + o] = b + (n + 16) * acc_u * acc + 2 * kU * std::fabs(y) + 1e-30;
      r.var[t * c.n_out + o] = var;
    }
  }
  return r;
}

// NMSE threshold from the expected squared errors: 3x their sum (the estimate averages >= 37 outputs: its relative
// spread is ~sqrt(2/37) = 23%), plus the f32 accumulation floor.
double nmse_threshold(const std::vector<double>& want, const std::vector<double>& var) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) num += var[i], den += want[i] * want[i];
  return 3 * num / den + 1e-10;
}

// acc0 (optional): values added to every output (matmul_add's accumulator), exact in the oracle.
void check_matmul_exact(const MatmulCase& c, const std::vector<float>& got, const std::string& what,
                        const std::vector<float>* acc0 = nullptr) {
  ExactMatmul r = exact_matmul(c);
  if (acc0)
    for (size_t i = 0; i < r.want.size(); ++i) r.want[i] += (*acc0)[i], r.bound[i] += 2 * kU * std::fabs((*acc0)[i]);
  expect_close(got, r.want, [&](size_t i) { return r.bound[i]; }, what + " (vs exact math)");
  EXPECT_LE(nmse_d(got, r.want), nmse_threshold(r.want, r.var)) << what << " (NMSE vs exact math)";
}

// Check (2): the backend's documented activation quantization, dot products in double.
void check_matmul_model(const std::string& backend, const MatmulCase& c, const std::vector<float>& got,
                        const std::string& what) {
  const std::optional<ActModel> m = act_model(backend, c.t, c.n_in, c.n_out, c.n_tok);
  if (!m) return;
  const int64_t n = c.n_in;
  const size_t rb = static_cast<size_t>(dtype_row_bytes(c.t, n).value());
  std::vector<double> want(static_cast<size_t>(c.n_out * c.n_tok)), sum_err;
  std::vector<double> wm(static_cast<size_t>(c.n_out * n));  // the weights the model multiplies
  for (int64_t o = 0; o < c.n_out; ++o) {
    const std::vector<double> mw = m->w_mmf ? test::mmf_weights(c.t, c.w.data() + o * rb, n) : std::vector<double>();
    for (int64_t i = 0; i < n; ++i)
      wm[o * n + i] = m->w_mmf ? mw[i] : m->w_f16 ? round_f16(c.wdeq[o * n + i]) : static_cast<double>(c.wdeq[o * n + i]);
  }
  for (int64_t t = 0; t < c.n_tok; ++t) {
    const std::vector<double> a = model_activation(m->act, c.x.data() + t * n, n, &sum_err, m->f32_scales);
    for (int64_t o = 0; o < c.n_out; ++o) {
      double y = 0;
      for (int64_t i = 0; i < n; ++i) y += wm[o * n + i] * a[i];
      if (m->act == DType::Q8_1)
        for (int64_t k = 0; k < n / 32; ++k) y += weight_block_offset(c.t, c.w.data() + o * rb, k) * sum_err[k];
      if (!c.bias.empty()) y += c.bias[o];
      want[t * c.n_out + o] = y;
    }
  }
  EXPECT_LE(nmse_d(got, want), m->nmse) << what << " (NMSE vs the " << dtype_name(m->act) << "-activation model)";
}

TEST_P(BackendOps, MatmulEveryWeightTypeAndBatchSize) {
  for (DType t : kMatmulTypes) {
    if (!be().supports(Op::kMatmul, t)) continue;
    for (int64_t n_tok : {1, 2, 3, 8, 16, 17, 64})
      for (bool bias : {false, true}) {
        const MatmulCase c = make_matmul_case(t, n_tok, bias, 1000 + 7 * static_cast<uint32_t>(t) + static_cast<uint32_t>(n_tok));
        // x with padded rows for one batch size (a view of a wider activation buffer), dst with padded rows too.
        const size_t pad = n_tok == 17 ? 64 : 0;
        const DevTensor wt = dev_upload(be(), t, c.w, c.n_in, c.n_out);
        const DevTensor xt = dev_f32(be(), c.x, c.n_in, n_tok, 1, pad);
        const DevTensor bt = bias ? dev_f32(be(), c.bias, c.n_out) : DevTensor{};
        const DevTensor out = dev_alloc(be(), DType::F32, c.n_out, n_tok, 1, pad);
        KILN_ASSERT_OK(be().matmul(wt.t, xt.t, bias ? bt.t : Tensor{}, out.t));
        const std::vector<float> got = dev_read<float>(be(), out);
        std::ostringstream what;
        what << "matmul " << dtype_name(t) << " n_tok=" << n_tok << " bias=" << bias;
        check_matmul_exact(c, got, what.str());
        check_matmul_model(GetParam(), c, got, what.str());
        if (pad) {  // the row gaps of dst are not written
          const std::vector<uint8_t> raw = dev_read_whole(be(), out);
          size_t touched = 0;
          for (int64_t r = 0; r < n_tok; ++r)
            for (size_t b = out.t.row_bytes(); b < out.t.nb[1]; ++b) touched += raw[r * out.t.nb[1] + b] != 0xFF;
          EXPECT_EQ(touched, 0u) << what.str() << ": bytes between dst rows were written";
        }
      }
  }
}

TEST_P(BackendOps, MatmulGroupEqualsMatmulBitForBit) {
  // q/k/v-like (same activation type), gate/up-like, a mix of activation types, and more products than the CPU
  // runs in one region (9).
  const std::vector<std::vector<DType>> groups = {
      {DType::Q4_K, DType::Q4_K, DType::Q6_K}, {DType::Q8_0, DType::Q4_0}, {DType::F16, DType::Q5_1, DType::Q8_0},
      {DType::Q4_0, DType::Q4_0, DType::Q4_0, DType::Q4_0, DType::Q4_0, DType::Q4_0, DType::Q4_0, DType::Q4_0,
       DType::Q4_0}};
  for (const auto& g : groups)
    for (int64_t n_tok : {1, 5, 64}) {
      bool ok = true;
      for (DType t : g) ok = ok && be().supports(Op::kMatmul, t);
      if (!ok) continue;
      const int64_t n_in = g[0] == DType::Q4_K ? 768 : 288;  // one shared input width per group
      const std::vector<float> x = randn(static_cast<size_t>(n_in * n_tok), 77 + static_cast<uint32_t>(n_tok), 1.5f);
      const DevTensor xt = dev_f32(be(), x, n_in, n_tok);
      std::vector<MatmulCase> cs;
      std::vector<DevTensor> wts, bts, outs, refs;
      std::vector<Backend::MatmulOut> mo;
      for (size_t i = 0; i < g.size(); ++i) {
        MatmulCase c;
        c.t = g[i], c.n_in = n_in, c.n_out = 24 + 8 * static_cast<int64_t>(i), c.n_tok = n_tok, c.x = x;
        c.w = test::quantize_rows(c.t, randn(static_cast<size_t>(n_in * c.n_out), 300 + static_cast<uint32_t>(i), 0.5f), n_in);
        c.wdeq = test::dequantize_rows(c.t, c.w, n_in);
        if (i == 1) c.bias = randn(static_cast<size_t>(c.n_out), 400);
        wts.push_back(dev_upload(be(), c.t, c.w, n_in, c.n_out));
        bts.push_back(c.bias.empty() ? DevTensor{} : dev_f32(be(), c.bias, c.n_out));
        outs.push_back(dev_alloc(be(), DType::F32, c.n_out, n_tok));
        refs.push_back(dev_alloc(be(), DType::F32, c.n_out, n_tok));
        cs.push_back(std::move(c));
      }
      for (size_t i = 0; i < g.size(); ++i)
        mo.push_back({wts[i].t, bts[i].buf ? bts[i].t : Tensor{}, outs[i].t});
      KILN_ASSERT_OK(be().matmul_group(xt.t, mo.data(), static_cast<int>(mo.size())));
      for (size_t i = 0; i < g.size(); ++i) {
        KILN_ASSERT_OK(be().matmul(mo[i].w, xt.t, mo[i].bias, refs[i].t));
        const std::vector<float> got = dev_read<float>(be(), outs[i]);
        std::ostringstream what;
        what << "matmul_group[" << i << "] of " << g.size() << " " << dtype_name(g[i]) << " n_tok=" << n_tok;
        expect_exact(got, dev_read<float>(be(), refs[i]), what.str() + " vs matmul");
        check_matmul_exact(cs[i], got, what.str());
      }
    }
}

// ================================================================================================================
// rope
// ================================================================================================================
struct RopeCase {
  RopeMode mode;
  int hd, n_rot;
  bool factors;
};

// Rotates host x [hd, n_head, n_tok] (rows nb1/nb2 floats apart) as the oracle; returns want and per-element bound.
void rope_oracle(const std::vector<float>& x, int hd, int64_t n_head, int64_t n_tok, size_t s1, size_t s2,
                 const std::vector<int32_t>& pos, const RopeParams& p, const std::vector<float>& ff,
                 std::vector<double>* want, std::vector<double>* bound) {
  want->assign(x.begin(), x.end());
  bound->assign(x.size(), 0.0);
  const int half = p.n_rot / 2;
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t h = 0; h < n_head; ++h) {
      const size_t base = t * s2 + h * s1;
      for (int i = 0; i < half; ++i) {
        double theta = p.freq_scale * pos[t] * std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_rot);
        if (!ff.empty()) theta /= ff[i];
        const int i0 = p.mode == RopeMode::kNeox ? i : 2 * i, i1 = p.mode == RopeMode::kNeox ? i + half : 2 * i + 1;
        const double a0 = x[base + i0], a1 = x[base + i1];
        (*want)[base + i0] = a0 * std::cos(theta) - a1 * std::sin(theta);
        (*want)[base + i1] = a0 * std::sin(theta) + a1 * std::cos(theta);
        const double tol = (theta * (3 * i + 6) * kU + 12 * kU) * std::hypot(a0, a1);
        (*bound)[base + i0] = (*bound)[base + i1] = tol;
      }
    }
}

TEST_P(BackendOps, Rope) {
  const std::vector<int32_t> pos = {0, 1, 7, 1000, 2047, 4095};
  const int64_t n_tok = static_cast<int64_t>(pos.size()), n_head = 3;
  for (RopeMode mode : {RopeMode::kNormal, RopeMode::kNeox})
    for (int hd : {64, 128})
      for (int n_rot : {hd, hd / 2, 24})
        for (bool factors : {false, true})
          for (bool strided : {false, true}) {
            // strided: the heads of a token are a view into a wider row (q inside a fused qkv row): nb[2] >
            // n_head * nb[1]; the gap must stay untouched.
            const int64_t row = strided ? (n_head + 2) * hd : n_head * hd;
            const std::vector<float> x = randn(static_cast<size_t>(row * n_tok), 11 + hd + n_rot);
            std::vector<float> ff(n_rot / 2);
            for (int i = 0; i < n_rot / 2; ++i) ff[i] = 1.0f + 0.25f * static_cast<float>(i % 5);
            const DevTensor xb = dev_f32(be(), x, row, n_tok);
            Tensor xt = Tensor::make(DType::F32, xb.t.data, &be(), hd, n_head, n_tok);
            xt.nb[2] = static_cast<size_t>(row) * sizeof(float);
            const DevTensor pt = dev_i32(be(), pos), ft = dev_f32(be(), ff, n_rot / 2);
            RopeParams p;
            p.mode = mode, p.n_rot = n_rot, p.freq_base = 500000.0f, p.freq_scale = 0.5f;
            if (factors) p.freq_factors = ft.t;
            KILN_ASSERT_OK(be().rope(xt, pt.t, p));
            const std::vector<float> got = dev_read<float>(be(), xb);
            std::vector<double> want, bound;
            rope_oracle(x, hd, n_head, n_tok, hd, row, pos, p, factors ? ff : std::vector<float>{}, &want, &bound);
            std::ostringstream what;
            what << "rope " << (mode == RopeMode::kNeox ? "neox" : "normal") << " hd=" << hd << " n_rot=" << n_rot
                 << " factors=" << factors << " strided=" << strided;
            expect_close(got, want, [&](size_t i) { return bound[i]; }, what.str());
            // Exact: position 0 is the identity, dims past n_rot and the gap pass through.
            size_t changed = 0;
            for (int64_t t = 0; t < n_tok; ++t)
              for (int64_t i = 0; i < row; ++i) {
                const bool rotated = pos[t] != 0 && i < n_head * hd && i % hd < n_rot;
                if (!rotated) changed += std::memcmp(&got[t * row + i], &x[t * row + i], 4) != 0;
              }
            EXPECT_EQ(changed, 0u) << what.str() << ": position 0, dims past n_rot or the gap changed";
          }
}

// ================================================================================================================
// kv_store
// ================================================================================================================

// The cache row the spec says a kv_store of x (d values) writes: f32 bits, f16 / bf16 nearest-even (this file's
// conversions), the quantized types' spec blocks (quant/reference.h's quantize_row: llama.cpp's reference rounding
// for q8_0, q4_0, q4_1, q5_0, q5_1; kiln's documented search for iq4_nl).
std::vector<uint8_t> cache_row(DType ct, const float* x, int64_t d) {
  const std::vector<float> v(x, x + d);
  if (ct == DType::F32) {
    std::vector<uint8_t> b(static_cast<size_t>(d) * 4);
    std::memcpy(b.data(), x, b.size());
    return b;
  }
  if (ct == DType::F16 || ct == DType::BF16) {
    std::vector<uint8_t> b(static_cast<size_t>(d) * 2);
    for (int64_t i = 0; i < d; ++i) {
      const uint16_t h = ct == DType::F16 ? f16_bits(x[i]) : bf16_bits(x[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
    return b;
  }
  return test::quantize_rows(ct, v, d);
}

// K/V type pairs the cache tests run: every cache type for both, and mixed pairs (a backend runs those it supports).
std::vector<std::pair<DType, DType>> cache_type_pairs() {
  std::vector<std::pair<DType, DType>> v;
  for (DType t : kKvCacheTypes) v.emplace_back(t, t);
  v.insert(v.end(), {{DType::Q8_0, DType::F16}, {DType::F16, DType::Q4_0}, {DType::BF16, DType::IQ4_NL},
                     {DType::Q5_1, DType::F32}, {DType::Q4_1, DType::Q5_0}});
  return v;
}

TEST_P(BackendOps, KvStorePaddingWritesNothing) {
  for (const auto& [ck, cv] : cache_type_pairs())
    for (int hd : {64, 128}) {
      if (!be().supports(Op::kKvStore, ck, cv)) continue;
      const int n_head_kv = 2, n_slots = 40;
      const int64_t d = n_head_kv * hd;
      const std::vector<int32_t> slots = {5, -1, 0, 39, -1, 17, 6};  // -1: padded tokens
      const int64_t n = static_cast<int64_t>(slots.size());
      const std::vector<float> k = randn(static_cast<size_t>(d * n), 21, 3.0f), v = randn(static_cast<size_t>(d * n), 22);
      DevTensor kc = dev_alloc(be(), ck, d, n_slots), vc = dev_alloc(be(), cv, d, n_slots);  // poisoned
      KvLayer l;
      l.k = kc.t, l.v = vc.t, l.n_head_kv = n_head_kv, l.head_dim_k = hd, l.head_dim_v = hd, l.block_size = 8;
      const DevTensor kt = dev_f32(be(), k, d, n), vt = dev_f32(be(), v, d, n), st = dev_i32(be(), slots);
      KILN_ASSERT_OK(be().kv_store(kt.t, vt.t, l, st.t));
      const std::vector<uint8_t> gk = dev_read_bytes(be(), kc), gv = dev_read_bytes(be(), vc);
      const size_t rbk = kc.t.row_bytes(), rbv = vc.t.row_bytes();
      const std::string what = std::string("kv_store k ") + dtype_name(ck) + " v " + dtype_name(cv) + " hd=" +
                               std::to_string(hd);
      for (int s = 0; s < n_slots; ++s) {
        int64_t tok = -1;
        for (int64_t t = 0; t < n; ++t)
          if (slots[t] == s) tok = t;
        std::vector<uint8_t> wk(rbk, 0xFF), wv(rbv, 0xFF);
        if (tok >= 0) wk = cache_row(ck, k.data() + tok * d, d), wv = cache_row(cv, v.data() + tok * d, d);
        EXPECT_EQ(0, std::memcmp(gk.data() + s * rbk, wk.data(), rbk))
            << what << " k slot " << s << (tok < 0 ? " (must be untouched)" : "");
        EXPECT_EQ(0, std::memcmp(gv.data() + s * rbv, wv.data(), rbv))
            << what << " v slot " << s << (tok < 0 ? " (must be untouched)" : "");
      }
    }
}

// ================================================================================================================
// attention over a paged cache
// ================================================================================================================

// How a backend rounds q (and the probabilities) inside attention (the header's eps_q / eps_p).
struct AttnPrecision {
  double eps_q = 0, eps_p = 0;
  bool q8_q = false;  // q quantized to Q8_1 blocks of 32 for the q.k of a q8_0 cache
};
AttnPrecision attn_precision(const std::string& backend, DType ct) {
  AttnPrecision a;
  if (backend.rfind("cuda", 0) == 0) {
    if (ct == DType::F16) a.eps_q = a.eps_p = std::ldexp(1.0, -11);
    if (ct == DType::Q8_0) a.q8_q = true;
  }
  return a;
}

struct AttnShape {
  DType kt, vt;  // K and V cache types
  int hd_k, hd_v, n_head, n_head_kv, bs;
};

std::string attn_name(const AttnShape& s) {
  std::ostringstream os;
  os << "k " << dtype_name(s.kt) << " v " << dtype_name(s.vt) << " hd " << s.hd_k << "/" << s.hd_v << " heads " << s.n_head << "/" << s.n_head_kv
     << " block " << s.bs;
  return os.str();
}

// Three sequences over a shuffled block pool, their K/V stored through kv_store (with padded tokens at slot -1),
// then two attention steps: a prefill of every token of all three (plus two padded tokens: kv_len 0 -> zero rows,
// and a padded sequence entry of q_len 0) and a decode (one token per sequence, in another order, max_kv_len a
// bucket above the real maximum).
void run_attention(Backend& be, const std::string& backend, const AttnShape& s) {
  const int bs = s.bs, n_blocks = 24, n_slots = n_blocks * bs;
  const int dk = s.n_head_kv * s.hd_k, dv = s.n_head_kv * s.hd_v, rep = s.n_head / s.n_head_kv;
  const std::vector<int> lens = {1, 2 * bs + 3, 5 * bs - 1};
  const int n_seq = 3, max_blocks = 7, n_tables = 4;  // table row 3: unused (all -1)
  std::vector<int32_t> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(3 + bs));
  std::vector<int32_t> tables(static_cast<size_t>(n_tables * max_blocks), -1);
  int next = 0;
  for (int q = 0; q < n_seq; ++q)
    for (int b = 0; b < (lens[q] + bs - 1) / bs; ++b) tables[q * max_blocks + b] = perm[next++];
  auto slot_of = [&](int q, int p) { return tables[q * max_blocks + p / bs] * bs + p % bs; };

  // K/V of every position of every sequence, plus two padded tokens (slot -1) in the middle of the batch.
  std::vector<int32_t> slots;
  std::vector<std::pair<int, int>> who;  // (seq, pos) per stored token; (-1, -1) padded
  for (int q = 0; q < n_seq; ++q)
    for (int p = 0; p < lens[q]; ++p) {
      slots.push_back(slot_of(q, p));
      who.emplace_back(q, p);
      if (q == 1 && p == 2) slots.push_back(-1), who.emplace_back(-1, -1), slots.push_back(-1), who.emplace_back(-1, -1);
    }
  const int64_t n_st = static_cast<int64_t>(slots.size());
  const std::vector<float> k = randn(static_cast<size_t>(dk * n_st), 21 + bs), v = randn(static_cast<size_t>(dv * n_st), 22 + bs);
  DevTensor kc = dev_alloc(be, s.kt, dk, n_slots), vc = dev_alloc(be, s.vt, dv, n_slots);
  KvLayer l;
  l.k = kc.t, l.v = vc.t, l.n_head_kv = s.n_head_kv, l.head_dim_k = s.hd_k, l.head_dim_v = s.hd_v, l.block_size = bs;
  {
    const DevTensor kt = dev_f32(be, k, dk, n_st), vt = dev_f32(be, v, dv, n_st), st = dev_i32(be, slots);
    KILN_ASSERT_OK(be.kv_store(kt.t, vt.t, l, st.t));
  }
  // The cache values as stored (the spec of each cache type) and as given (f32), per (seq, pos): [d] rows; the mean
  // squared storage error of each head row (quantization noise, for the comparison with exact f32 attention).
  std::vector<std::vector<float>> K(n_seq), V(n_seq), Kx(n_seq), Vx(n_seq);
  std::vector<std::vector<double>> Ke(n_seq), Ve(n_seq);  // [pos][kv head]
  for (int q = 0; q < n_seq; ++q) {
    K[q].resize(static_cast<size_t>(lens[q]) * dk), V[q].resize(static_cast<size_t>(lens[q]) * dv);
    Kx[q] = K[q], Vx[q] = V[q];
    Ke[q].resize(static_cast<size_t>(lens[q]) * s.n_head_kv), Ve[q] = Ke[q];
  }
  for (int64_t t = 0; t < n_st; ++t) {
    if (who[t].first < 0) continue;
    const auto [q, p] = who[t];
    const std::vector<float> kr = test::dequantize_rows(s.kt, cache_row(s.kt, k.data() + t * dk, dk), dk);
    const std::vector<float> vr = test::dequantize_rows(s.vt, cache_row(s.vt, v.data() + t * dv, dv), dv);
    std::copy(kr.begin(), kr.end(), K[q].begin() + static_cast<size_t>(p) * dk);
    std::copy(vr.begin(), vr.end(), V[q].begin() + static_cast<size_t>(p) * dv);
    std::copy(k.begin() + t * dk, k.begin() + (t + 1) * dk, Kx[q].begin() + static_cast<size_t>(p) * dk);
    std::copy(v.begin() + t * dv, v.begin() + (t + 1) * dv, Vx[q].begin() + static_cast<size_t>(p) * dv);
    for (int g = 0; g < s.n_head_kv; ++g) {
      double ek = 0, ev = 0;
      for (int i = g * s.hd_k; i < (g + 1) * s.hd_k; ++i) ek += std::pow(static_cast<double>(kr[i]) - k[t * dk + i], 2);
      for (int i = g * s.hd_v; i < (g + 1) * s.hd_v; ++i) ev += std::pow(static_cast<double>(vr[i]) - v[t * dv + i], 2);
      Ke[q][static_cast<size_t>(p) * s.n_head_kv + g] = ek / s.hd_k;
      Ve[q][static_cast<size_t>(p) * s.n_head_kv + g] = ev / s.hd_v;
    }
  }
  const DevTensor bt = dev_upload(be, DType::I32, tables, max_blocks, n_tables);
  const AttnPrecision prec = attn_precision(backend, s.kt);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd_k));

  for (int step = 0; step < 2; ++step) {
    // Token list: (seq, pos) or (-1, -1) for a padded token.
    std::vector<std::pair<int, int>> toks;
    std::vector<int32_t> seq_row, seq_q_start, seq_q_len, seq_kv_len;
    const std::vector<int> order = step == 0 ? std::vector<int>{0, 1, 2} : std::vector<int>{2, 0, 1};
    for (int q : order) {
      seq_row.push_back(q);
      seq_q_start.push_back(static_cast<int32_t>(toks.size()));
      const int first = step == 0 ? 0 : lens[q] - 1;
      for (int p = first; p < lens[q]; ++p) toks.emplace_back(q, p);
      seq_q_len.push_back(lens[q] - first);
      seq_kv_len.push_back(lens[q]);
    }
    toks.emplace_back(-1, -1), toks.emplace_back(-1, -1);  // padded tokens (outside every sequence)
    seq_row.push_back(3), seq_q_start.push_back(static_cast<int32_t>(toks.size())), seq_q_len.push_back(0),
        seq_kv_len.push_back(0);  // a padded sequence entry
    const int64_t n = static_cast<int64_t>(toks.size());
    std::vector<int32_t> tok_table, kv_len;
    for (const auto& [q, p] : toks) tok_table.push_back(q < 0 ? 3 : q), kv_len.push_back(q < 0 ? 0 : p + 1);
    const std::vector<float> qv = randn(static_cast<size_t>(s.hd_k * s.n_head * n), 23 + step + bs, 2.0f);
    const DevTensor qt = dev_f32(be, qv, s.hd_k, s.n_head, n), out = dev_alloc(be, DType::F32, s.hd_v, s.n_head, n);
    const DevTensor tt = dev_i32(be, tok_table), kl = dev_i32(be, kv_len), sr = dev_i32(be, seq_row),
                    sqs = dev_i32(be, seq_q_start), sql = dev_i32(be, seq_q_len), skl = dev_i32(be, seq_kv_len);
    AttnBatch m;
    m.block_tables = bt.t, m.tok_table = tt.t, m.kv_len = kl.t;
    m.seq_row = sr.t, m.seq_q_start = sqs.t, m.seq_q_len = sql.t, m.seq_kv_len = skl.t;
    m.n_seq = static_cast<int32_t>(seq_row.size());
    const int32_t real_max = *std::max_element(kv_len.begin(), kv_len.end());
    m.max_kv_len = step == 0 ? real_max : (real_max + 63) / 64 * 64;  // decode: a bucket
    m.max_q_len = *std::max_element(seq_q_len.begin(), seq_q_len.end());
    KILN_ASSERT_OK(be.attention(qt.t, l, m, scale, out.t));
    const std::vector<float> got = dev_read<float>(be, out);

    std::vector<double> want(got.size(), 0.0), bound(got.size(), 0.0);
    // Exact attention on the f32 K/V as given, and the expected squared error of an output from the storage noise.
    std::vector<double> want_x(got.size(), 0.0), noise(got.size(), 0.0);
    std::vector<float> exact_rows;  // kv_len 1 (and 0) rows must be exact
    std::vector<size_t> exact_idx;
    for (int64_t t = 0; t < n; ++t) {
      const auto [q, p] = toks[t];
      const int L = q < 0 ? 0 : p + 1;
      for (int h = 0; h < s.n_head; ++h) {
        const int g = h / rep;
        const float* qh = qv.data() + (t * s.n_head + h) * s.hd_k;
        double* o = want.data() + (t * s.n_head + h) * s.hd_v;
        double* ob = bound.data() + (t * s.n_head + h) * s.hd_v;
        if (L == 0) {
          for (int i = 0; i < s.hd_v; ++i) exact_idx.push_back((t * s.n_head + h) * s.hd_v + i), exact_rows.push_back(0.0f);
          continue;
        }
        std::vector<double> sc(L), delta(L);
        double mx = -INFINITY, dmax = 0;
        std::vector<double> Eq(s.hd_k, 0.0);
        if (prec.q8_q)
          for (int i = 0; i < s.hd_k; ++i) {
            double a = 0;
            for (int j = i / 32 * 32; j < i / 32 * 32 + 32; ++j) a = std::max(a, std::fabs(static_cast<double>(qh[j])));
            Eq[i] = 0.57 * a / 127;
          }
        for (int j = 0; j < L; ++j) {
          const float* kr = K[q].data() + static_cast<size_t>(j) * dk + g * s.hd_k;
          double d = 0, mag = 0, qerr = 0;
          for (int i = 0; i < s.hd_k; ++i) {
            d += static_cast<double>(qh[i]) * kr[i];
            mag += std::fabs(static_cast<double>(qh[i]) * kr[i]);
            qerr += Eq[i] * std::fabs(kr[i]);
          }
          sc[j] = d * scale;
          delta[j] = scale * (mag * (prec.eps_q + (s.hd_k + 4) * kU) + qerr) + 2 * kU * std::fabs(sc[j]);
          mx = std::max(mx, sc[j]);
          dmax = std::max(dmax, delta[j]);
        }
        double sum = 0;
        for (int j = 0; j < L; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
        const double f = std::expm1(2 * dmax) + prec.eps_p + (L + 8) * 2 * kU;
        for (int j = 0; j < L; ++j) {
          const float* vr = V[q].data() + static_cast<size_t>(j) * dv + g * s.hd_v;
          for (int i = 0; i < s.hd_v; ++i) {
            o[i] += sc[j] / sum * vr[i];
            ob[i] += f * sc[j] / sum * std::fabs(vr[i]);
          }
        }
        for (int i = 0; i < s.hd_v; ++i) ob[i] += 1e-30;
        // First order in the storage errors (K: eta, V: eps, independent, zero mean, of the row's measured mean
        // square): delta_j = scale * q . eta_j moves output i by sum_j p_j delta_j (v_ji - o_i), eps by
        // sum_j p_j eps_ji, so E[err_i^2] = sum_j p_j^2 (E[delta_j^2] (v_ji - o_i)^2 + E[eps_j^2]).
        double q2 = 0;
        for (int i = 0; i < s.hd_k; ++i) q2 += static_cast<double>(qh[i]) * qh[i];
        std::vector<double> sx(L);
        double mxx = -INFINITY, sumx = 0;
        for (int j = 0; j < L; ++j) {
          const float* kr = Kx[q].data() + static_cast<size_t>(j) * dk + g * s.hd_k;
          double d = 0;
          for (int i = 0; i < s.hd_k; ++i) d += static_cast<double>(qh[i]) * kr[i];
          mxx = std::max(mxx, sx[j] = d * scale);
        }
        for (int j = 0; j < L; ++j) sumx += (sx[j] = std::exp(sx[j] - mxx));
        double* ox = want_x.data() + (t * s.n_head + h) * s.hd_v;
        double* on = noise.data() + (t * s.n_head + h) * s.hd_v;
        for (int j = 0; j < L; ++j) {
          const float* vx = Vx[q].data() + static_cast<size_t>(j) * dv + g * s.hd_v;
          const float* vr = V[q].data() + static_cast<size_t>(j) * dv + g * s.hd_v;
          const double pj = sc[j] / sum, dvar = scale * scale * q2 * Ke[q][static_cast<size_t>(j) * s.n_head_kv + g];
          const double evar = Ve[q][static_cast<size_t>(j) * s.n_head_kv + g];
          for (int i = 0; i < s.hd_v; ++i) {
            ox[i] += sx[j] / sumx * vx[i];
            on[i] += pj * pj * (dvar * std::pow(vr[i] - o[i], 2) + evar);
          }
        }
        if (L == 1)  // + 0.0f: the output is +0 + 1 * v, so a stored -0 (q4_0's (8 - 8) * d, d < 0) comes out +0
          for (int i = 0; i < s.hd_v; ++i)
            exact_idx.push_back((t * s.n_head + h) * s.hd_v + i), exact_rows.push_back(V[q][g * s.hd_v + i] + 0.0f);
      }
    }
    const std::string what = std::string(step == 0 ? "attention prefill " : "attention decode ") + attn_name(s);
    expect_close(got, want, [&](size_t i) { return bound[i]; }, what);
    const double thr = prec.q8_q ? 1e-3 : prec.eps_q > 0 ? 3e-6 : 1e-10;
    EXPECT_LE(nmse_d(got, want), thr) << what << " (NMSE)";
    // Against exact attention on the unrounded f32 K/V: the error the storage type's rounding predicts (3x its
    // expected NMSE, as the matmul's statistical check), plus the NMSE allowed above for the arithmetic.
    double pred = 0, den = 0;
    for (size_t i = 0; i < want_x.size(); ++i) pred += noise[i], den += want_x[i] * want_x[i];
    const double e_x = nmse_d(got, want_x);
    EXPECT_LE(e_x, 3 * pred / den + thr) << what << " vs f32 K/V (NMSE; expected from the storage rounding "
                                         << pred / den << ")";
    std::printf("[attention] %s %s: NMSE vs f32 K/V %.3e, expected from the storage rounding %.3e\n",
                step == 0 ? "prefill" : "decode", attn_name(s).c_str(), e_x, pred / den);
    std::vector<float> ge;
    for (size_t i : exact_idx) ge.push_back(got[i]);
    expect_exact(ge, exact_rows, what + ": rows with kv_len 0 (zero) and kv_len 1 (that V row)");
  }
}

TEST_P(BackendOps, AttentionPagedGqaEveryCacheType) {
  using D = DType;
  const AttnShape shapes[] = {
      {D::F16, D::F16, 64, 64, 8, 2, 16},      {D::F16, D::F16, 128, 128, 4, 1, 7},
      {D::F16, D::F16, 256, 256, 4, 2, 5},
      {D::F16, D::F16, 40, 24, 4, 4, 5},       // widths that leave SIMD tails, no GQA
      {D::F32, D::F32, 64, 64, 6, 3, 3},       {D::F32, D::F32, 128, 128, 4, 2, 16},
      {D::F32, D::F32, 256, 256, 2, 1, 9},     {D::BF16, D::BF16, 64, 64, 4, 2, 16},
      {D::BF16, D::BF16, 40, 24, 4, 2, 5},     // bf16 is a plain type: any width
      {D::Q8_0, D::Q8_0, 64, 32, 8, 2, 16},    {D::Q8_0, D::Q8_0, 128, 128, 6, 2, 11},
      {D::Q8_0, D::Q8_0, 256, 256, 4, 4, 4},   {D::Q4_0, D::Q4_0, 64, 64, 8, 2, 16},
      {D::Q4_0, D::Q4_0, 128, 128, 4, 1, 7},   {D::Q4_1, D::Q4_1, 64, 32, 4, 2, 16},
      {D::Q5_0, D::Q5_0, 128, 128, 4, 2, 16},  {D::Q5_1, D::Q5_1, 64, 64, 6, 3, 5},
      {D::IQ4_NL, D::IQ4_NL, 64, 64, 8, 2, 16}, {D::IQ4_NL, D::IQ4_NL, 256, 256, 2, 1, 9},
      // K and V of different types: each side read as its own (one converted, the other in place, or both)
      {D::Q8_0, D::F16, 64, 64, 8, 2, 16},     {D::F16, D::Q4_0, 128, 128, 4, 2, 7},
      {D::BF16, D::IQ4_NL, 64, 64, 4, 4, 16},  {D::Q4_1, D::F32, 64, 32, 4, 1, 5},
      {D::F32, D::Q5_1, 128, 64, 6, 2, 16},    {D::Q5_0, D::Q8_0, 64, 64, 8, 2, 11},
  };
  for (const AttnShape& s : shapes) {
    if (!be().supports(Op::kAttention, s.kt, s.vt) || !be().supports(Op::kKvStore, s.kt, s.vt)) continue;
    SCOPED_TRACE(attn_name(s));
    run_attention(be(), GetParam(), s);
  }
}

// ================================================================================================================
// elementwise ops and reductions
// ================================================================================================================
TEST_P(BackendOps, Swiglu) {
  for (int64_t d : {1, 15, 1000})
    for (int64_t n : {1, 4})
      for (bool in_place : {false, true}) {
        const std::vector<float> g = randn(static_cast<size_t>(d * n), 31, 6.0f), u = randn(static_cast<size_t>(d * n), 32);
        const DevTensor gt = dev_f32(be(), g, d, n), ut = dev_f32(be(), u, d, n);
        const DevTensor out = in_place ? DevTensor{} : dev_alloc(be(), DType::F32, d, n);
        KILN_ASSERT_OK(be().swiglu(gt.t, ut.t, in_place ? gt.t : out.t));
        const std::vector<float> got = dev_read<float>(be(), in_place ? gt : out);
        std::vector<double> want(g.size());
        for (size_t i = 0; i < g.size(); ++i) want[i] = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
        expect_close(got, want, [&](size_t i) { return 1e-6 * std::fabs(want[i]) + 1e-37; },
                     "swiglu d=" + std::to_string(d) + " n=" + std::to_string(n) + (in_place ? " in place" : ""));
      }
}

TEST_P(BackendOps, AddMulScaleExact) {
  for (int64_t d : {1, 15, 1000})
    for (int64_t n : {1, 4})
      for (bool bc : {false, true})
        for (bool in_place : {false, true}) {
          const std::vector<float> x = randn(static_cast<size_t>(d * n), 41, 6.0f);
          const std::vector<float> y = randn(static_cast<size_t>(bc ? d : d * n), 42);
          const std::string what = " d=" + std::to_string(d) + " n=" + std::to_string(n) + (bc ? " broadcast" : "") +
                                   (in_place ? " in place" : "");
          for (int op = 0; op < 3; ++op) {
            const DevTensor xt = dev_f32(be(), x, d, n), yt = dev_f32(be(), y, d, bc ? 1 : n);
            const DevTensor out = in_place ? DevTensor{} : dev_alloc(be(), DType::F32, d, n);
            const Tensor& dst = in_place ? xt.t : out.t;
            const float s = 0.37f;
            if (op == 0) KILN_ASSERT_OK(be().add(xt.t, yt.t, dst));
            if (op == 1) KILN_ASSERT_OK(be().mul(xt.t, yt.t, dst));
            if (op == 2) KILN_ASSERT_OK(be().scale(xt.t, s, dst));
            std::vector<float> want(x.size());
            for (int64_t r = 0; r < n; ++r)
              for (int64_t i = 0; i < d; ++i) {
                const float a = x[r * d + i], b = y[(bc ? 0 : r) * d + i];
                want[r * d + i] = op == 0 ? a + b : op == 1 ? a * b : a * s;
              }
            expect_exact(dev_read<float>(be(), in_place ? xt : out), want,
                         std::string(op == 0 ? "add" : op == 1 ? "mul" : "scale") + what);
            if (op == 2 && bc) break;  // scale has no broadcast variant
          }
        }
}

TEST_P(BackendOps, Softmax) {
  for (int64_t d : {1, 15, 1000})
    for (int64_t n : {1, 4})
      for (bool in_place : {false, true}) {
        const std::vector<float> x = randn(static_cast<size_t>(d * n), 51, 6.0f);
        const DevTensor xt = dev_f32(be(), x, d, n);
        const DevTensor out = in_place ? DevTensor{} : dev_alloc(be(), DType::F32, d, n);
        KILN_ASSERT_OK(be().softmax(xt.t, in_place ? xt.t : out.t));
        const std::vector<float> got = dev_read<float>(be(), in_place ? xt : out);
        std::vector<double> want(x.size()), bound(x.size());
        for (int64_t r = 0; r < n; ++r) {
          double mx = -INFINITY, sum = 0;
          for (int64_t i = 0; i < d; ++i) mx = std::max(mx, static_cast<double>(x[r * d + i]));
          for (int64_t i = 0; i < d; ++i) sum += std::exp(x[r * d + i] - mx);
          for (int64_t i = 0; i < d; ++i) {
            want[r * d + i] = std::exp(x[r * d + i] - mx) / sum;
            bound[r * d + i] = want[r * d + i] * (kU * std::fabs(x[r * d + i] - mx) + (d + 16) * kU) + 1e-37;
          }
        }
        expect_close(got, want, [&](size_t i) { return bound[i]; },
                     "softmax d=" + std::to_string(d) + " n=" + std::to_string(n) + (in_place ? " in place" : ""));
      }
}

TEST_P(BackendOps, ArgmaxFirstMaxAndNanRule) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int64_t d = 1000;
  std::vector<std::vector<float>> rows;
  std::vector<int32_t> want;
  auto add = [&](std::vector<float> r, int32_t w) { rows.push_back(std::move(r)), want.push_back(w); };
  const std::vector<float> base = randn(d, 61);
  const int32_t base_max = static_cast<int32_t>(std::max_element(base.begin(), base.end()) - base.begin());
  add(base, base_max);
  {  // ties: the first of equal maxima, at both ends and in a SIMD tail
    std::vector<float> r = base;
    r[d - 1] = r[3] = r[999 - 5] = 100.0f;
    add(r, 3);
    r[0] = 100.0f;
    add(r, 0);
  }
  {  // NaN before, at and after the maximum: never chosen while the row holds a number
    std::vector<float> r = base;
    r[0] = nan, r[1] = nan, r[400] = 50.0f, r[401] = nan, r[d - 1] = nan;
    add(r, 400);
  }
  add(std::vector<float>(d, nan), 0);  // all NaN: 0
  {
    std::vector<float> r(d, nan);
    r[d - 2] = -inf;  // NaN and one -inf: the number
    add(r, static_cast<int32_t>(d - 2));
  }
  add(std::vector<float>(d, -inf), 0);  // all -inf: the first
  {
    std::vector<float> r = base;
    r[500] = inf, r[700] = inf;  // +inf is a number: the first
    add(r, 500);
  }
  {
    std::vector<float> r = base;
    for (float& x : r) x = -std::fabs(x) - 1.0f;  // all negative
    r[17] = -0.5f;
    add(r, 17);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  for (int64_t width : {d, int64_t{7}}) {  // 7: one short row of each (the first 7 values)
    std::vector<float> x;
    std::vector<int32_t> w;
    for (int64_t r = 0; r < n; ++r) {
      x.insert(x.end(), flat.begin() + r * d, flat.begin() + r * d + width);
      int32_t best = 0;  // the rule, written again for the short rows
      while (best < width && std::isnan(x[r * width + best])) ++best;
      if (best == width) best = 0;
      for (int64_t i = best + 1; i < width; ++i)
        if (x[r * width + i] > x[r * width + best]) best = static_cast<int32_t>(i);
      w.push_back(width == d ? want[r] : best);
      if (width == d) {
        EXPECT_EQ(best, want[r]) << "test table row " << r;
      }
    }
    const DevTensor xt = dev_f32(be(), x, width, n);
    const DevTensor out = dev_alloc(be(), DType::I32, n);
    KILN_ASSERT_OK(be().argmax(xt.t, out.t));
    const std::vector<int32_t> got = dev_read<int32_t>(be(), out);
    for (int64_t r = 0; r < n; ++r) EXPECT_EQ(got[r], w[r]) << "argmax row " << r << " width " << width;
  }
}

// ================================================================================================================
// copy / convert
// ================================================================================================================
TEST_P(BackendOps, CopyConvertF32F16Bf16) {
  const int64_t d = 37, n = 5;
  std::vector<float> x = randn(static_cast<size_t>(d * n), 71, 100.0f);
  x[0] = 65504.0f * 2;   // overflows f16 -> inf
  x[1] = 1e-8f;          // f16 subnormal
  x[2] = -3e-6f;         // f16 subnormal
  x[3] = 65519.0f;       // rounds to f16 max
  x[4] = std::numeric_limits<float>::infinity();
  x[5] = -std::numeric_limits<float>::infinity();
  x[6] = 1.0f + std::ldexp(1.0f, -11);  // a tie: nearest even (1.0) in f16
  x[7] = 1.0f + std::ldexp(1.0f, -8);   // a tie in bf16
  x[8] = 3e38f;                         // bf16 rounding up to inf? (no: 3e38 < bf16 max rounding bound)
  x[9] = std::numeric_limits<float>::quiet_NaN();
  auto conv = [](DType t, float v) -> uint16_t { return t == DType::F16 ? f16_bits(v) : bf16_bits(v); };
  auto value = [](DType t, uint16_t b) -> float { return t == DType::F16 ? f16_value(b) : bf16_value(b); };
  for (size_t pad : {size_t{0}, size_t{12}}) {  // contiguous and with padded rows on both sides
    const DevTensor xt = dev_f32(be(), x, d, n, 1, pad);
    for (DType t : {DType::F16, DType::BF16}) {
      const std::string what = std::string(dtype_name(t)) + (pad ? " strided" : "");
      const DevTensor h = dev_alloc(be(), t, d, n, 1, pad);
      KILN_ASSERT_OK(be().copy(xt.t, h.t));
      const std::vector<uint16_t> got = dev_read<uint16_t>(be(), h);
      std::vector<uint16_t> want(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        want[i] = conv(t, x[i]);
        if (std::isnan(x[i]))
          EXPECT_TRUE(std::isnan(value(t, got[i]))) << "f32 -> " << what << " NaN at " << i;
        else
          EXPECT_EQ(got[i], want[i]) << "f32 -> " << what << " at " << i << " (" << x[i] << ")";
      }
      // widening back is exact
      const DevTensor back = dev_alloc(be(), DType::F32, d, n, 1, pad);
      KILN_ASSERT_OK(be().copy(h.t, back.t));
      std::vector<float> wb(x.size());
      for (size_t i = 0; i < x.size(); ++i) wb[i] = value(t, got[i]);
      expect_exact(dev_read<float>(be(), back), wb, what + " -> f32");
      // f16 <-> bf16 (through f32: the value is rounded once, to the destination)
      const DType o = t == DType::F16 ? DType::BF16 : DType::F16;
      const DevTensor other = dev_alloc(be(), o, d, n, 1, pad);
      KILN_ASSERT_OK(be().copy(h.t, other.t));
      const std::vector<uint16_t> g2 = dev_read<uint16_t>(be(), other);
      for (size_t i = 0; i < x.size(); ++i)
        if (!std::isnan(wb[i])) {
          EXPECT_EQ(g2[i], conv(o, wb[i])) << what << " -> " << dtype_name(o) << " at " << i;
        }
    }
  }
  // A byte copy of a type to itself, block types included.
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_K}) {
    const int64_t dd = t == DType::Q4_K ? 256 : 64;
    const std::vector<uint8_t> src = test::quantize_rows(t, randn(static_cast<size_t>(dd * 3), 72), dd);
    const DevTensor a = dev_upload(be(), t, src, dd, 3), b = dev_alloc(be(), t, dd, 3);
    KILN_ASSERT_OK(be().copy(a.t, b.t));
    EXPECT_EQ(dev_read_bytes(be(), b), src) << "copy " << dtype_name(t) << " to itself";
  }
}

// ================================================================================================================
// fused ops vs their decomposition
// ================================================================================================================
TEST_P(BackendOps, FusedMatmulAdd) {
  for (DType t : {DType::Q4_0, DType::Q6_K, DType::F16})
    for (int64_t n_tok : {1, 17})
      for (bool bias : {false, true}) {
        if (!be().supports(Op::kMatmul, t)) continue;
        const MatmulCase c = make_matmul_case(t, n_tok, bias, 500 + static_cast<uint32_t>(n_tok));
        const std::vector<float> acc0 = randn(static_cast<size_t>(c.n_out * n_tok), 501, 2.0f);
        const DevTensor wt = dev_upload(be(), t, c.w, c.n_in, c.n_out), xt = dev_f32(be(), c.x, c.n_in, n_tok);
        const DevTensor bt = bias ? dev_f32(be(), c.bias, c.n_out) : DevTensor{};
        const DevTensor acc = dev_f32(be(), acc0, c.n_out, n_tok), tmp = dev_alloc(be(), DType::F32, c.n_out, n_tok);
        KILN_ASSERT_OK(be().matmul_add(wt.t, xt.t, bias ? bt.t : Tensor{}, tmp.t, acc.t));
        const std::vector<float> got = dev_read<float>(be(), acc);
        // decomposition on the same backend
        const DevTensor acc2 = dev_f32(be(), acc0, c.n_out, n_tok), tmp2 = dev_alloc(be(), DType::F32, c.n_out, n_tok);
        KILN_ASSERT_OK(be().matmul(wt.t, xt.t, bias ? bt.t : Tensor{}, tmp2.t));
        KILN_ASSERT_OK(be().add(acc2.t, tmp2.t, acc2.t));
        const std::vector<float> dec = dev_read<float>(be(), acc2);
        const std::string what = std::string("matmul_add ") + dtype_name(t) + " n_tok=" + std::to_string(n_tok) +
                                 " bias=" + std::to_string(bias);
        std::vector<double> decd(dec.begin(), dec.end());
        EXPECT_LE(nmse_d(got, decd), 1e-10) << what << " vs matmul + add";
        if (is_cpu()) expect_exact(got, dec, what + " vs matmul + add (the CPU keeps the default)");
        check_matmul_exact(c, got, what, &acc0);
      }
}

TEST_P(BackendOps, FusedMatmulSwiglu) {
  for (DType t : {DType::Q4_K, DType::Q8_0})
    for (int64_t n_tok : {1, 16}) {
      if (!be().supports(Op::kMatmul, t)) continue;
      const MatmulCase cg = make_matmul_case(t, n_tok, false, 600), cu = make_matmul_case(t, n_tok, false, 610);
      const DevTensor wg = dev_upload(be(), t, cg.w, cg.n_in, cg.n_out), wu = dev_upload(be(), t, cu.w, cu.n_in, cu.n_out);
      const DevTensor xt = dev_f32(be(), cg.x, cg.n_in, n_tok);
      const DevTensor g = dev_alloc(be(), DType::F32, cg.n_out, n_tok), u = dev_alloc(be(), DType::F32, cg.n_out, n_tok);
      KILN_ASSERT_OK(be().matmul_swiglu(wg.t, wu.t, xt.t, g.t, u.t));
      const std::vector<float> got = dev_read<float>(be(), g);
      const DevTensor g2 = dev_alloc(be(), DType::F32, cg.n_out, n_tok), u2 = dev_alloc(be(), DType::F32, cg.n_out, n_tok);
      KILN_ASSERT_OK(be().matmul(wg.t, xt.t, Tensor{}, g2.t));
      KILN_ASSERT_OK(be().matmul(wu.t, xt.t, Tensor{}, u2.t));
      KILN_ASSERT_OK(be().swiglu(g2.t, u2.t, g2.t));
      const std::vector<float> dec = dev_read<float>(be(), g2);
      const std::string what = std::string("matmul_swiglu ") + dtype_name(t) + " n_tok=" + std::to_string(n_tok);
      EXPECT_LE(nmse_d(got, std::vector<double>(dec.begin(), dec.end())), 1e-10) << what << " vs matmul, matmul, swiglu";
      if (is_cpu()) expect_exact(got, dec, what + " vs the decomposition (the CPU keeps the default)");
      // vs exact math: g = silu(a) b with a = Wg x, b = Wu x exact. With the products' bounds Ba, Bb (check (1))
      // and |silu'| <= 1.1: |err| <= 1.1 Ba (|b| + Bb) + |silu(a)| Bb, plus swiglu's own 1e-6; the expected squared
      // error silu'(a)^2 b^2 var_a + silu(a)^2 var_b.
      const ExactMatmul ea = exact_matmul(cg), eb = exact_matmul([&] { MatmulCase c = cu; c.x = cg.x; return c; }());
      std::vector<double> want(got.size()), bound(got.size()), var(got.size());
      for (size_t i = 0; i < got.size(); ++i) {
        const double a = ea.want[i], b = eb.want[i], sg = 1 / (1 + std::exp(-a)), silu = a * sg;
        const double dsilu = sg * (1 + a * (1 - sg));
        want[i] = silu * b;
        bound[i] = 1.1 * ea.bound[i] * (std::fabs(b) + eb.bound[i]) + std::fabs(silu) * eb.bound[i] + 1e-6 * std::fabs(want[i]);
        var[i] = dsilu * dsilu * b * b * ea.var[i] + silu * silu * eb.var[i];
      }
      expect_close(got, want, [&](size_t i) { return bound[i]; }, what + " (vs exact math)");
      EXPECT_LE(nmse_d(got, want), nmse_threshold(want, var)) << what << " (NMSE vs exact math)";
    }
}

TEST_P(BackendOps, FusedRopeKvStore) {
  for (const auto& [ck, cv] : cache_type_pairs()) {
    if (!be().supports(Op::kKvStore, ck, cv)) continue;
    const int hd = 64, n_head = 4, n_head_kv = 2, n_slots = 32;
    const std::vector<int32_t> pos = {3, 4, 4095, 0}, slots = {9, -1, 31, 0};
    const int64_t n = static_cast<int64_t>(pos.size());
    const std::vector<float> q = randn(static_cast<size_t>(hd * n_head * n), 81), k = randn(static_cast<size_t>(hd * n_head_kv * n), 82),
                             v = randn(static_cast<size_t>(hd * n_head_kv * n), 83);
    RopeParams p;
    p.mode = RopeMode::kNeox, p.n_rot = hd, p.freq_base = 1e6f;
    struct Run {
      DevTensor q, k, v, kc, vc;
    };
    auto setup = [&]() {
      Run r;
      r.q = dev_f32(be(), q, hd, n_head, n), r.k = dev_f32(be(), k, hd, n_head_kv, n), r.v = dev_f32(be(), v, hd * n_head_kv, n);
      r.kc = dev_alloc(be(), ck, hd * n_head_kv, n_slots), r.vc = dev_alloc(be(), cv, hd * n_head_kv, n_slots);
      return r;
    };
    auto layer = [&](const Run& r) {
      KvLayer l;
      l.k = r.kc.t, l.v = r.vc.t, l.n_head_kv = n_head_kv, l.head_dim_k = hd, l.head_dim_v = hd, l.block_size = 8;
      return l;
    };
    const DevTensor pt = dev_i32(be(), pos), st = dev_i32(be(), slots);
    Run f = setup(), d = setup();
    KILN_ASSERT_OK(be().rope_kv_store(f.q.t, f.k.t, f.v.t, pt.t, p, layer(f), st.t));
    KILN_ASSERT_OK(be().rope(d.q.t, pt.t, p));
    KILN_ASSERT_OK(be().rope(d.k.t, pt.t, p));
    KILN_ASSERT_OK(be().kv_store(d.k.t.reshape(hd * n_head_kv, n), d.v.t, layer(d), st.t));
    const std::string what = std::string("rope_kv_store k ") + dtype_name(ck) + " v " + dtype_name(cv);
    // q and k vs the rope oracle; an f32 / f16 cache vs kv_store of the oracle's k within the same bound (+ f16
    // rounding); a cache of another type holds the spec bytes of the k the op rotated (which the oracle checked).
    std::vector<double> wq, bq, wk, bk;
    rope_oracle(q, hd, n_head, n, hd, static_cast<size_t>(hd) * n_head, pos, p, {}, &wq, &bq);
    rope_oracle(k, hd, n_head_kv, n, hd, static_cast<size_t>(hd) * n_head_kv, pos, p, {}, &wk, &bk);
    expect_close(dev_read<float>(be(), f.q), wq, [&](size_t i) { return bq[i]; }, what + " q");
    const std::vector<float> gk = dev_read<float>(be(), f.k);
    expect_close(gk, wk, [&](size_t i) { return bk[i]; }, what + " k");
    const std::vector<uint8_t> kb = dev_read_bytes(be(), f.kc), vb = dev_read_bytes(be(), f.vc);
    const int64_t dk = hd * n_head_kv;
    const size_t rbk = f.kc.t.row_bytes(), rbv = f.vc.t.row_bytes();
    for (int64_t t = 0; t < n; ++t) {
      if (slots[t] < 0) continue;
      const std::vector<uint8_t> row(kb.begin() + slots[t] * rbk, kb.begin() + (slots[t] + 1) * rbk);
      if (ck == DType::F32 || ck == DType::F16) {
        const std::vector<float> got = test::dequantize_rows(ck, row, dk);
        std::vector<double> w(wk.begin() + t * dk, wk.begin() + (t + 1) * dk);
        expect_close(got, w, [&](size_t i) { return bk[t * dk + i] + (ck == DType::F16 ? std::ldexp(std::fabs(w[i]), -11) : 0.0); },
                     what + " cached k slot " + std::to_string(slots[t]));
      } else {
        EXPECT_EQ(row, cache_row(ck, gk.data() + t * dk, dk)) << what << " cached k slot " << slots[t];
      }
      EXPECT_EQ(0, std::memcmp(vb.data() + slots[t] * rbv, cache_row(cv, v.data() + t * dk, dk).data(), rbv)) << what << " v";
    }
    // padding slot wrote nothing: slot 1..8 never targeted
    for (int s = 1; s < 9; ++s) {
      EXPECT_TRUE(std::all_of(kb.begin() + s * rbk, kb.begin() + (s + 1) * rbk, [](uint8_t b) { return b == 0xFF; })) << what << " k slot " << s;
      EXPECT_TRUE(std::all_of(vb.begin() + s * rbv, vb.begin() + (s + 1) * rbv, [](uint8_t b) { return b == 0xFF; })) << what << " v slot " << s;
    }
    if (is_cpu()) {  // the CPU keeps the default: bit for bit the decomposition
      expect_exact(dev_read<float>(be(), f.q), dev_read<float>(be(), d.q), what + " q vs decomposition");
      EXPECT_EQ(kb, dev_read_bytes(be(), d.kc)) << what << " k cache vs decomposition";
      EXPECT_EQ(vb, dev_read_bytes(be(), d.vc)) << what << " v cache vs decomposition";
    }
  }
}

TEST_P(BackendOps, FusedRmsNormForMatmul) {
  for (DType next : {DType::Q4_0, DType::Q4_K, DType::F16, DType::Q8_0}) {
    if (!be().supports(Op::kMatmul, next)) continue;
    const MatmulCase c = make_matmul_case(next, 8, false, 700);
    const std::vector<float> w = randn(static_cast<size_t>(c.n_in), 701);
    const DevTensor xt = dev_f32(be(), c.x, c.n_in, 8), wt = dev_f32(be(), w, c.n_in);
    const DevTensor y = dev_alloc(be(), DType::F32, c.n_in, 8), y2 = dev_alloc(be(), DType::F32, c.n_in, 8);
    KILN_ASSERT_OK(be().rms_norm_for_matmul(xt.t, wt.t, 1e-5f, y.t, next));
    KILN_ASSERT_OK(be().rms_norm(xt.t, wt.t, 1e-5f, y2.t));
    const std::vector<float> got = dev_read<float>(be(), y), dec = dev_read<float>(be(), y2);
    const std::string what = std::string("rms_norm_for_matmul ") + dtype_name(next);
    // dst holds the f32 result: within rms_norm's bound of the oracle.
    std::vector<double> want(got.size());
    for (int64_t r = 0; r < 8; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < c.n_in; ++i) ss += static_cast<double>(c.x[r * c.n_in + i]) * c.x[r * c.n_in + i];
      const double s = 1.0 / std::sqrt(ss / static_cast<double>(c.n_in) + 1e-5);
      for (int64_t i = 0; i < c.n_in; ++i) want[r * c.n_in + i] = c.x[r * c.n_in + i] * s * w[i];
    }
    expect_close(got, want, [&](size_t i) { return 2e-6 * std::fabs(want[i]); }, what);
    if (is_cpu()) expect_exact(got, dec, what + " vs rms_norm (the CPU keeps the default)");
    // A matmul of that type on dst (which may reuse a quantization made in the norm) is the matmul of the values.
    const DevTensor wm = dev_upload(be(), next, c.w, c.n_in, c.n_out), out = dev_alloc(be(), DType::F32, c.n_out, 8);
    KILN_ASSERT_OK(be().matmul(wm.t, y.t, Tensor{}, out.t));
    MatmulCase cy = c;
    cy.x = got;
    check_matmul_exact(cy, dev_read<float>(be(), out), what + " then matmul");
    check_matmul_model(GetParam(), cy, dev_read<float>(be(), out), what + " then matmul");
  }
}

KILN_INSTANTIATE_BACKENDS(BackendOps);

}  // namespace
}  // namespace kiln
