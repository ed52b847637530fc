// The tensor-core GEMM (backend/cuda/mmq.cuh, forced: the selector prefers cuBLAS for many tokens) through the
// backend's matmul entries, every type
// it takes, on awkward shapes: token counts around the 64-token tile (17 .. 129, 512), row counts that are not tile
// multiples (67, 200, 1000, 8400), n_in of one block / sub-stage tails (32, 96 for the 32-element types) and several
// super-blocks (256, 512, 4096), bias, accumulate (matmul_add), strided x and y; quantized types with the kernel's
// tile chosen by its rule and forced to each of the fourteen tiles (mmq.cuh MmqTile; 8400 x 200 is a shape the rule
// sends to a big tile on a 132-SM GPU). Skipped (visibly) without a GPU.
// Checks, per case:
//   (a) the numerics model: quantized weights — the q8_1 activations of quantize.cu computed here on the host
//       (d = amax/127 in f32, q = round(x * (1/d)) clamped to +-127), y = sum_i w_i * d_a * q_a,i in double, which
//       equals the kernel's per-half d_w*d_a*isum + m_w*d_a*sum(q_a) exactly in real arithmetic: NMSE <= 1e-10 (f32
//       rounding and summation order only). F16 / BF16 — x rounded to nearest f16 / bf16, exact products, double
//       sums: NMSE <= 1e-10 (the tensor core's f32 accumulation, truncating, ~n * 2^-46 relative^2);
//   (b) the exact product (f64 of the dequantized weights and f32 x): NMSE <= 1e-3 for q8_1 activations (test_backend_
//       cuda_ops.cpp's argument); for F16/BF16 3x an upper bound of the mean squared relative rounding error of x
//       ((2^-10)^2/3 = 3.3e-7 and (2^-7)^2/3 = 2e-5; the expected values are ~4e-8 and ~3e-6): 1e-6 and 6e-5;
//   (c) quantized types: a token's GEMM output equals the GEMV's (the same matmul run with that token alone,
//       n_tok = 1 -> mmvq) within f32 summation order: NMSE <= 1e-10. (F16/BF16 GEMV keeps f32 activations, so (c)
//       does not hold for them by design: prefill rounds x to the weight type.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "common/backend_test_util.h"

#include "quant/reference.h"
#include "util/fp16.h"

#ifdef KILN_HAVE_CUDA
namespace kiln::cuda {
void mmq_set_tile_override(int tile);  // mmq.cu: 0 = the rule, else MmqTile (1 64x64, 2 64x128, 3 128x64, 4 128x128,
                                       // 5-12 the pipelined kernels' configurations)
void matmul_set_override(const char* name);  // matmul_select.cu: force a kernel where it runs ("" = the rule)
}  // namespace kiln::cuda
namespace {
// Forces the matmul kernel this file tests (the selector sends many-token products to cuBLAS by default).
void force(const char* name) { kiln::cuda::matmul_set_override(name); }
}  // namespace
#else
namespace {
void force(const char*) {}
}  // namespace
#endif

namespace kiln {
namespace {

using test::random_weights;

#define NEED_GPU() KILN_NEED_GPU()

struct Dev {
  std::unique_ptr<Buffer> buf;
  Tensor t;
};

// rows of ne0 f32 with a row pitch of `pitch` floats (>= ne0): a strided view.
Dev dev_f32(Backend& be, const float* host, int64_t ne0, int64_t rows, int64_t pitch) {
  Dev d;
  const size_t bytes = static_cast<size_t>(pitch * rows) * 4;
  auto b = be.alloc(std::max<size_t>(bytes, 64));
  EXPECT_TRUE(b.is_ok());
  d.buf = std::move(b).value();
  d.t = Tensor::make(DType::F32, d.buf->data(), &be, ne0, rows);
  d.t.nb[1] = static_cast<size_t>(pitch) * 4;
  d.t.nb[2] = d.t.nb[3] = d.t.nb[1] * static_cast<size_t>(rows);
  if (host) {
    std::vector<float> full(static_cast<size_t>(pitch * rows), 0.0f);
    for (int64_t r = 0; r < rows; ++r) std::memcpy(&full[r * pitch], host + r * ne0, ne0 * 4);
    EXPECT_TRUE(be.write(d.t, 0, full.data(), bytes).is_ok());
  }
  return d;
}

std::vector<float> read_f32(Backend& be, const Dev& d, int64_t ne0, int64_t rows, int64_t pitch) {
  std::vector<float> full(static_cast<size_t>(pitch * rows)), out(static_cast<size_t>(ne0 * rows));
  EXPECT_TRUE(be.read(d.t, 0, full.data(), full.size() * 4).is_ok());
  for (int64_t r = 0; r < rows; ++r) std::memcpy(&out[r * ne0], &full[r * pitch], ne0 * 4);
  return out;
}


// One product's operands: random weights of type t (GGUF bytes wb, their values wf) uploaded as w, bias, x
// [nt][n_in] and an accumulator y0 [nt][n_out]. w is invalid when the upload failed (reported).
struct Product {
  std::vector<uint8_t> wb;
  std::vector<float> wf, bias, x, y0;
  Tensor w;
};
Product make_product(Backend& be, DType t, int64_t n_in, int64_t n_out, int64_t nt, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  Product p;
  p.wb = random_weights(t, n_in, n_out, rng);
  const size_t rb = dtype_row_bytes(t, n_in).value();
  p.wf.resize(static_cast<size_t>(n_in * n_out));
  for (int64_t r = 0; r < n_out; ++r)
    EXPECT_TRUE(dequantize_row(t, p.wb.data() + r * rb, p.wf.data() + r * n_in, n_in).is_ok());
  const int64_t ne[4] = {n_in, n_out, 1, 1};
  auto w = be.import_weight(t, ne, p.wb.data(), p.wb.size());
  EXPECT_TRUE(w.is_ok()) << w.status().to_string();
  if (w.is_ok()) p.w = w.value();
  p.bias.resize(static_cast<size_t>(n_out));
  p.x.resize(static_cast<size_t>(n_in * nt));
  p.y0.resize(static_cast<size_t>(n_out * nt));
  for (auto& b : p.bias) b = nd(rng);
  for (auto& v : p.x) v = 1.5f * nd(rng);
  for (auto& v : p.y0) v = nd(rng);
  return p;
}

// One product in one of three modes: 0 matmul + bias, contiguous; 1 matmul_add onto y0, x and y strided; 2 matmul,
// no bias, strided x. `got` is y; rm / re are the model and exact references (mdl, ex: [n_tok][n_out] without bias
// or accumulator) plus what the mode adds. `got` is empty when the op failed (the failure is reported).
struct ModeRun {
  std::vector<float> got;
  std::vector<double> rm, re;
};
ModeRun run_mode(Backend& be, const Tensor& w, int mode, const std::vector<float>& x, const std::vector<float>& y0,
                 const std::vector<float>& bias, const std::vector<double>& mdl, const std::vector<double>& ex,
                 int64_t n_in, int64_t n_out, int64_t nt) {
  const int64_t xp = mode == 0 ? n_in : n_in + 24, yp = mode == 1 ? n_out + 5 : n_out;
  Dev xd = dev_f32(be, x.data(), n_in, nt, xp);
  Dev yd = dev_f32(be, y0.data(), n_out, nt, yp);
  Dev bd = dev_f32(be, bias.data(), n_out, 1, n_out);
  Dev tmp = dev_f32(be, nullptr, n_out, nt, n_out);
  const Status st = mode == 0   ? be.matmul(w, xd.t, bd.t, yd.t)
                    : mode == 1 ? be.matmul_add(w, xd.t, Tensor{}, tmp.t, yd.t)
                                : be.matmul(w, xd.t, Tensor{}, yd.t);
  ModeRun r;
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  if (!st.is_ok()) return r;
  r.got = read_f32(be, yd, n_out, nt, yp);
  r.rm.resize(r.got.size());
  r.re.resize(r.got.size());
  for (int64_t k = 0; k < nt; ++k)
    for (int64_t r0 = 0; r0 < n_out; ++r0) {
      const size_t i = static_cast<size_t>(k * n_out + r0);
      const double add = mode == 0 ? bias[r0] : mode == 1 ? y0[i] : 0.0;
      r.rm[i] = mdl[i] + add;
      r.re[i] = ex[i] + add;
    }
  return r;
}

bool is_float(DType t) { return t == DType::F16 || t == DType::BF16; }

// x as the kernel sees it: q8_1 of quantize.cu (quantized types) or rounded to the weight type (F16 / BF16).
std::vector<double> model_x(DType t, const float* x, int64_t n) {
  std::vector<double> a(static_cast<size_t>(n));
  // F16/BF16 rows of n % 8 != 0 take the f32 tiled GEMM (mmq_usable: 16-byte fragments), which keeps x exact.
  if ((t == DType::F16 || t == DType::BF16) && n % 8 != 0) {
    for (int64_t i = 0; i < n; ++i) a[i] = x[i];
  } else if (t == DType::F16) {
    for (int64_t i = 0; i < n; ++i) a[i] = fp16_to_f32(f32_to_fp16(x[i]));
  } else if (t == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) a[i] = bf16_to_f32(f32_to_bf16(x[i]));
  } else {
    for (int64_t k = 0; k < n / 32; ++k) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * k + j]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      for (int j = 0; j < 32; ++j) {
        const float q = std::fmin(std::fmax(std::round(x[32 * k + j] * id), -127.0f), 127.0f);
        a[32 * k + j] = static_cast<double>(d) * q;
      }
    }
  }
  return a;
}

const DType kMmqTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,  DType::Q2_K, DType::Q3_K,
                           DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4, DType::F16,  DType::BF16};
// The types cuBLAS takes (dequantized to f16 rows): mmq's and the codebook types, which have no mmq kernel.
const DType kBlasTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0,   DType::Q5_1,   DType::Q8_0,
                            DType::Q2_K, DType::Q3_K, DType::Q4_K,   DType::Q5_K,   DType::Q6_K,
                            DType::F16,  DType::BF16, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4};

struct Shape {
  int64_t n_in, n_out, n_tok;
};

// Shapes per type: n_in in units of the type's block (1 block, a 64-element stage tail, several super-blocks).
std::vector<Shape> shapes_for(DType t) {
  const int64_t bs = dtype_block_size(t);
  std::vector<Shape> s;
  if (bs == 256) {
    s = {{256, 67, 17}, {256, 1000, 512}, {512, 200, 31}, {512, 200, 32}, {512, 67, 33}, {512, 200, 100},
         {512, 67, 127}, {512, 200, 128}, {512, 67, 129}, {4096, 200, 129}, {256, 8400, 200}};
  } else if (bs == 32) {
    s = {{32, 67, 17}, {96, 200, 33}, {256, 1000, 512}, {512, 200, 31}, {512, 200, 32}, {512, 67, 100},
         {512, 67, 127}, {512, 200, 128}, {512, 67, 129}, {4096, 200, 129}, {256, 8400, 200}};
  } else {  // F16 / BF16 (n_in 1 and 12: not a multiple of 8 -> the f32 GEMM fallback, still checked)
    s = {{1, 67, 17}, {12, 67, 31}, {8, 67, 33}, {40, 200, 100}, {256, 1000, 512}, {512, 200, 31},
         {512, 200, 32}, {512, 67, 127}, {512, 200, 128}, {512, 67, 129}, {4096, 200, 129}};
  }
  return s;
}

TEST(CudaMmq, EveryTypeMatchesModelExactAndGemv) {
  NEED_GPU();
  std::mt19937 rng(11);
  int checked = 0;
  force("mmq");
  for (DType t : kMmqTypes) {
    if (!gpu.supports(Op::kMatmul, t)) continue;
    for (const Shape& sh : shapes_for(t)) {
      const int64_t n_in = sh.n_in, n_out = sh.n_out, nt = sh.n_tok;
      Product pr = make_product(gpu, t, n_in, n_out, nt, rng);
      if (!pr.w.valid()) continue;
      const std::vector<float>&wf = pr.wf, &bias = pr.bias, &x = pr.x, &y0 = pr.y0;
      const Tensor* w = &pr.w;
      // the two references per (token, row): the numerics model and exact math (without bias / accumulator)
      std::vector<double> mdl(y0.size()), ex(y0.size());
      for (int64_t k = 0; k < nt; ++k) {
        const std::vector<double> a = model_x(t, x.data() + k * n_in, n_in);
        for (int64_t r = 0; r < n_out; ++r) {
          double sm = 0, se = 0;
          const float* wr = wf.data() + r * n_in;
          for (int64_t i = 0; i < n_in; ++i) sm += static_cast<double>(wr[i]) * a[i], se += static_cast<double>(wr[i]) * x[k * n_in + i];
          mdl[k * n_out + r] = sm;
          ex[k * n_out + r] = se;
        }
      }
      const double lim_ex = t == DType::F16 ? 1e-6 : t == DType::BF16 ? 6e-5 : 1e-3;
      // mode 0: matmul + bias, contiguous; 1: matmul_add onto y0, x and y strided; 2: matmul, no bias, strided x;
      // each with the quantized kernel's tile chosen by the rule (0) and forced to each of the fourteen (mmq.cuh MmqTile;
      // types without a tile take their default)
#ifdef KILN_HAVE_CUDA
      const int n_tiles = 15;  // F16/BF16: 1-4 are mmq_f_kernel, 5-14 the pipelined mmq_fp_kernel
#else
      const int n_tiles = 1;
#endif
      for (int tile = 0; tile < n_tiles; ++tile)
      for (int mode = 0; mode < 3; ++mode) {
#ifdef KILN_HAVE_CUDA
        cuda::mmq_set_tile_override(tile);
#endif
        const ModeRun mr = run_mode(gpu, *w, mode, x, y0, bias, mdl, ex, n_in, n_out, nt);
        if (mr.got.empty()) continue;
        const std::vector<float>& got = mr.got;
        const std::vector<double>&rm = mr.rm, &re = mr.re;
        std::ostringstream what;
        what << dtype_name(t) << " n_in " << n_in << " n_out " << n_out << " n_tok " << nt << " mode " << mode
             << " tile " << tile;
        EXPECT_LE(test::nmse_d(got, rm), 1e-10) << what.str() << " (vs the numerics model)";
        EXPECT_LE(test::nmse_d(got, re), lim_ex) << what.str() << " (vs exact math)";
        ++checked;
        // (c) GEMM row == GEMV of that token alone (first, a middle one, last), quantized types, mode 0
        if (mode == 0 && !is_float(t)) {
          Dev bd = dev_f32(gpu, bias.data(), n_out, 1, n_out);
          for (int64_t k : {int64_t{0}, nt / 2, nt - 1}) {
            Dev x1 = dev_f32(gpu, x.data() + k * n_in, n_in, 1, n_in);
            Dev y1 = dev_f32(gpu, nullptr, n_out, 1, n_out);
            force("mmvq");
            ASSERT_TRUE(gpu.matmul(*w, x1.t, bd.t, y1.t).is_ok());
            force("mmq");
            const std::vector<float> gv = read_f32(gpu, y1, n_out, 1, n_out);
            const std::vector<float> gm(got.begin() + k * n_out, got.begin() + (k + 1) * n_out);
            std::vector<double> gvd(gv.begin(), gv.end());
            EXPECT_LE(test::nmse_d(gm, gvd), 1e-10) << what.str() << " token " << k << " (GEMM vs GEMV)";
          }
        }
      }
#ifdef KILN_HAVE_CUDA
      cuda::mmq_set_tile_override(0);
#endif
    }
  }
  force("");
  EXPECT_GT(checked, 0) << "no matmul type supported on cuda:0";
}

// A batch that mixes the GEMM's tile boundaries with the row gaps of a strided dst: bytes between dst rows stay
// untouched (the epilogue writes exactly n_out floats per token).
TEST(CudaMmq, StridedDstGapsUntouched) {
  NEED_GPU();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const char* kernel : {"mmq", "blas"})
  for (DType t : {DType::Q4_K, DType::Q8_0, DType::F16}) {
    force(kernel);
    const int64_t n_in = 512, n_out = 67, nt = 129, yp = 80;
    const auto wb = random_weights(t, n_in, n_out, rng);
    const int64_t ne[4] = {n_in, n_out, 1, 1};
    auto w = gpu.import_weight(t, ne, wb.data(), wb.size());
    ASSERT_TRUE(w.is_ok());
    std::vector<float> x(static_cast<size_t>(n_in * nt));
    for (auto& v : x) v = nd(rng);
    Dev xd = dev_f32(gpu, x.data(), n_in, nt, n_in);
    Dev yd = dev_f32(gpu, nullptr, n_out, nt, yp);
    std::vector<float> sentinel(static_cast<size_t>(yp * nt), 12345.0f);
    ASSERT_TRUE(gpu.write(yd.t, 0, sentinel.data(), sentinel.size() * 4).is_ok());
    ASSERT_TRUE(gpu.matmul(*w, xd.t, Tensor{}, yd.t).is_ok());
    std::vector<float> full(sentinel.size());
    ASSERT_TRUE(gpu.read(yd.t, 0, full.data(), full.size() * 4).is_ok());
    int touched = 0, written = 0;
    for (int64_t k = 0; k < nt; ++k) {
      for (int64_t r = n_out; r < yp; ++r) touched += full[k * yp + r] != 12345.0f;
      for (int64_t r = 0; r < n_out; ++r) written += full[k * yp + r] != 12345.0f;
    }
    EXPECT_EQ(touched, 0) << kernel << " " << dtype_name(t) << ": floats between dst rows were written";
    EXPECT_EQ(written, n_out * nt) << kernel << " " << dtype_name(t) << ": outputs not written";
  }
  force("");
}

// Split-K (backend/cuda/mmq_common.cuh mmq_finish): a grid of few output tiles over a long K runs up to 16 blocks
// per tile whose partials the last block to arrive sums in a fixed order. Checks: the same product twice gives the
// same bits with other products (other tile counts and splits) in between, i.e. the tile counters reset themselves
// and the order does not depend on which block arrives last; and it is the numerics model's result (NMSE <= 1e-10,
// the bound of EveryTypeMatchesModelExactAndGemv, whose 4096-wide shapes split too).
TEST(CudaMmq, SplitKDeterministicAcrossLaunches) {
  NEED_GPU();
  std::mt19937 rng(21);
  force("mmq");
  int checked = 0;
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::F16}) {
    if (!gpu.supports(Op::kMatmul, t)) continue;
    const int64_t n_in = 8192, n_out = 96, nt = 40;  // 1-2 row tiles x 1 token tile: the largest split
    Product a = make_product(gpu, t, n_in, n_out, nt, rng);
    Product b = make_product(gpu, t, 1024, 1000, 70, rng);
    if (!a.w.valid() || !b.w.valid()) continue;
    const auto run = [&](const Product& pr, int64_t ni, int64_t no, int64_t k) {
      Dev xd = dev_f32(gpu, pr.x.data(), ni, k, ni);
      Dev yd = dev_f32(gpu, nullptr, no, k, no);
      Dev bd = dev_f32(gpu, pr.bias.data(), no, 1, no);
      EXPECT_TRUE(gpu.matmul(pr.w, xd.t, bd.t, yd.t).is_ok());
      return read_f32(gpu, yd, no, k, no);
    };
    const std::vector<float> first = run(a, n_in, n_out, nt);
    run(b, 1024, 1000, 70);
    const std::vector<float> second = run(a, n_in, n_out, nt);
    ASSERT_EQ(first.size(), second.size());
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * 4), 0)
        << dtype_name(t) << ": a split product differs between two launches";
    std::vector<double> mdl(first.size());
    for (int64_t k = 0; k < nt; ++k) {
      const std::vector<double> xa = model_x(t, a.x.data() + k * n_in, n_in);
      for (int64_t r = 0; r < n_out; ++r) {
        double sm = 0;
        for (int64_t i = 0; i < n_in; ++i) sm += static_cast<double>(a.wf[r * n_in + i]) * xa[i];
        mdl[k * n_out + r] = sm + a.bias[r];
      }
    }
    EXPECT_LE(test::nmse_d(first, mdl), 1e-10) << dtype_name(t) << " (split-K vs the numerics model)";
    ++checked;
  }
  force("");
  EXPECT_GT(checked, 0);
}

// The dequantize + cuBLAS path (backend/cuda/gemm_blas.cu) forced on every type it takes, from one token up,
// contiguous and strided, bias and accumulate; one shape whose f16 copy is larger than one chunk
// (launch.h kBlasChunkBytes: 128 MiB = 16384 rows of 4096). Checks per case:
//   (a) the numerics model: each weight the reference dequantizer's f32 value rounded to nearest f16 (F16 / BF16
//       weights: as stored), x rounded to f16 (bf16 for BF16 weights), exact products, double sums: NMSE <= 1e-9
//       (f32 accumulation ~1e-10; the device's fused d*q+m and the host's dl*q-ml round to different f16 in ~2^-12
//       of the weights: ~6e-11);
//   (b) exact math on the dequantized weights and f32 x: weights and x each rounded to f16 (2^-11 relative:
//       (2^-11)^2/3 = 8e-8 each): NMSE <= 1e-6; BF16 x: 6e-5 (the mmq test's bound).
TEST(CudaBlas, EveryTypeMatchesModelAndExact) {
  NEED_GPU();
  std::mt19937 rng(13);
  int checked = 0;
  struct Case { DType t; Shape sh; };
  std::vector<Case> cases;
  for (DType t : kBlasTypes) {
    const int64_t bs = is_float(t) ? 8 : dtype_block_size(t);
    for (const Shape& sh : std::vector<Shape>{{bs == 256 ? 256 : 96 - 96 % bs, 67, 1}, {512, 1000, 33},
                                              {512, 200, 100}, {4096, 200, 129}, {256, 8400, 200}})
      cases.push_back({t, sh});
  }
  cases.push_back({DType::Q4_K, {4096, 16640, 2}});  // two chunks of rows
  cases.push_back({DType::F16, {4096, 16640, 2}});   // float weights: one call, no scratch copy
  force("blas");
  for (const Case& c : cases) {
    const DType t = c.t;
    if (!gpu.supports(Op::kMatmul, t)) continue;
    const int64_t n_in = c.sh.n_in, n_out = c.sh.n_out, nt = c.sh.n_tok;
    Product pr = make_product(gpu, t, n_in, n_out, nt, rng);
    if (!pr.w.valid()) continue;
    const std::vector<float>&wf = pr.wf, &bias = pr.bias, &x = pr.x, &y0 = pr.y0;
    const Tensor* w = &pr.w;
    std::vector<float> w16(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) w16[i] = is_float(t) ? wf[i] : fp16_to_f32(f32_to_fp16(wf[i]));
    std::vector<double> mdl(y0.size()), ex(y0.size());
    for (int64_t k = 0; k < nt; ++k) {
      const float* xk = x.data() + k * n_in;
      for (int64_t r = 0; r < n_out; ++r) {
        double sm = 0, se = 0;
        const float* wr = wf.data() + r * n_in;
        const float* wm = w16.data() + r * n_in;
        for (int64_t i = 0; i < n_in; ++i) {
          const double xm = t == DType::BF16 ? bf16_to_f32(f32_to_bf16(xk[i])) : fp16_to_f32(f32_to_fp16(xk[i]));
          sm += static_cast<double>(wm[i]) * xm;
          se += static_cast<double>(wr[i]) * xk[i];
        }
        mdl[k * n_out + r] = sm;
        ex[k * n_out + r] = se;
      }
    }
    const double lim_ex = t == DType::BF16 ? 6e-5 : 1e-6;
    for (int mode = 0; mode < 3; ++mode) {  // as EveryTypeMatchesModelExactAndGemv
      const ModeRun mr = run_mode(gpu, *w, mode, x, y0, bias, mdl, ex, n_in, n_out, nt);
      if (mr.got.empty()) continue;
      const std::vector<float>& got = mr.got;
      const std::vector<double>&rm = mr.rm, &re = mr.re;
      std::ostringstream what;
      what << dtype_name(t) << " n_in " << n_in << " n_out " << n_out << " n_tok " << nt << " mode " << mode;
      EXPECT_LE(test::nmse_d(got, rm), 1e-9) << what.str() << " (vs the numerics model)";
      EXPECT_LE(test::nmse_d(got, re), lim_ex) << what.str() << " (vs exact math)";
      ++checked;
    }
  }
  force("");
  EXPECT_GT(checked, 0) << "no matmul type supported on cuda:0";
}

}  // namespace
}  // namespace kiln
